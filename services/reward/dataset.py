"""The reward of a dataset task: a weighted sum of rule terms and the user's own functions.

A dataset task (``task.dataset``, ``services.tasks.dataset``) is single-turn: a request carries
the prompt, one action (the completion), the row's reference answer (``reference``) and the whole
row as JSON (``row_json``). ``reward.terms`` lists the terms; the reward is the sum of
``weight x value`` over them, in order:

- ``exact``: 1.0 when the completion equals the reference after stripping, collapsing whitespace
  and case-folding, else 0.0;
- ``numeric``: 1.0 when the completion's number equals the reference's exactly
  (``services.reward.verifiers.numeric_equal`` with the term's ``extract`` mode), else 0.0;
- ``format``: 1.0 when the term's ``pattern`` occurs in the completion (``re.search``, DOTALL),
  else 0.0;
- ``module:function``: your own function, imported at start-up (below).

A sample is correct when every term that judges correctness says so: ``exact`` and ``numeric``
(value 1.0), and your function when it returns ``correct``; ``format`` never judges. With no
judging term, a sample is correct when its reward is at least 1.0. Info (all strings):
``correct`` (``true``/``false``), ``term.<i>.<fn>`` with each term's unweighted value
(``repr`` of the float, e.g. ``1.0``), and ``fn.<key>`` for each extra key your functions
return (a later term's key replaces an earlier one's).

Your own reward function
------------------------
A term ``fn: "mymodule:myfunction"`` imports ``mymodule`` (with the directories of
``reward.python_path`` first on the import path, then the directory braid runs in) and calls
``myfunction`` once per sample, with keyword arguments only::

    myfunction(completion=<str>, answer=<str>, prompt=<str>, row=<dict>)

``completion`` is the model's text (end-of-sequence token excluded), ``answer`` the row's
reference answer as text (a number in the row arrives written with ``str``), ``prompt`` the
request's prompt text (the user message: ``task.dataset.template`` with the row's prompt in
place), ``row`` the whole dataset row as a dict (a fresh copy each call).
Declare ``**kwargs`` to ignore the arguments you do not use. It returns either

- a finite number (an int or float, or any other ``numbers.Real`` such as a numpy scalar, but
  not a bool, NaN or infinity): the term's value; or
- a mapping with ``"reward"`` (such a number), optionally ``"correct"`` (a bool: whether the
  sample is correct, for accuracy), and optionally other keys with str, int, float or bool
  values, reported as the sample's info ``fn.<key>``.

Anything else is an error of that sample (``BadRewardValue``), and so is an exception your
function raises: the reward worker answers the request with INTERNAL and the message (the
exception's type and text), and the run counts it as a failed reward. A function that runs
longer than ``reward.timeout_s`` is DEADLINE_EXCEEDED. The function must be deterministic and
thread-safe (a worker calls it from ``reward.threads`` threads at once). A spec that cannot be
loaded (no such module, an import that fails, no such function, not callable, or a signature
that cannot take those four keyword arguments) stops the reward worker at start-up with the
reason (``RewardUnavailable``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import numbers
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from services.common.reward_config import RewardConfig, RewardTermConfig
from services.common.task_config import MAX_ROW_JSON_CHARS
from services.reward.protocol import InvalidRequest, RewardRequest, RewardUnavailable, Scored
from services.reward.verifiers import compile_format, exact_equal, format_match, numeric_equal

ARGUMENTS = ("completion", "answer", "prompt", "row")  # what a user function is called with
_SHOWN = 80  # characters of a repr quoted in an error
_PATH_LOCK = threading.Lock()


class RewardFunctionError(ValueError):
    """A ``module:function`` spec that cannot be loaded; the message names the spec and the reason."""


class BadRewardValue(RuntimeError):
    """A user reward function returned something that is not a reward."""


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."


def add_python_path(python_path: Sequence[str]) -> None:
    """Put each directory first on ``sys.path`` (absolute, in the given order), once.

    An entry already on the path stays where it is, so calling this again changes nothing."""
    with _PATH_LOCK:
        for entry in reversed([os.path.abspath(p) for p in python_path]):
            if entry not in sys.path:
                sys.path.insert(0, entry)


def load_function(spec: str, python_path: Sequence[str] = ()) -> Callable[..., Any]:
    """The callable ``spec`` ('module:function') names, imported with ``python_path`` first on the import path."""
    module_name, sep, attr = spec.partition(":")
    if not (sep and module_name and attr):
        raise RewardFunctionError(f"reward function {spec!r} is not 'module:function'")
    add_python_path(python_path)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise RewardFunctionError(f"reward function {spec!r}: cannot import module {module_name!r}: {err} "
                                  f"(reward.python_path: {list(python_path)})") from err
    except Exception as err:  # the module's own code failed while importing
        raise RewardFunctionError(f"reward function {spec!r}: importing module {module_name!r} failed: "
                                  f"{type(err).__name__}: {err}") from err
    if not hasattr(module, attr):
        public = sorted(n for n, v in vars(module).items() if not n.startswith("_") and callable(v))
        raise RewardFunctionError(f"reward function {spec!r}: module {module_name!r} has no attribute {attr!r} "
                                  f"(its public callables: {public[:32]})")
    fn = getattr(module, attr)
    if not callable(fn):
        raise RewardFunctionError(f"reward function {spec!r}: {attr!r} is a {type(fn).__name__}, not callable")
    _check_signature(spec, fn)
    return fn


def _check_signature(spec: str, fn: Callable[..., Any]) -> None:
    """Refuse a function that cannot be called with the four keyword arguments (when its signature is known)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # some builtins and C callables have none
        return
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    missing = [] if takes_any else [a for a in ARGUMENTS if a not in named]
    required = [p.name for p in params if p.default is p.empty and p.name not in ARGUMENTS
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing or required:
        why = f"does not accept {missing}" if missing else f"requires {required}, which are not passed"
        raise RewardFunctionError(f"reward function {spec!r} {why}: it is called as fn(completion=, answer=, "
                                  "prompt=, row=); declare **kwargs for the arguments it ignores")


@dataclass(frozen=True)
class TermValue:
    value: float
    correct: bool | None  # None: the term does not judge correctness
    info: Mapping[str, str]


def _as_reward(spec: str, value: object, what: str) -> float:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            number = float(value)
        except (OverflowError, ValueError, TypeError):
            number = math.nan
        if math.isfinite(number):
            return number
    raise BadRewardValue(f"reward function {spec} returned {what}{_short(value)} ({type(value).__name__}); "
                         "expected a finite number or a mapping with 'reward'")


def _info_text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value) if isinstance(value, float) else str(value)


def check_returned(spec: str, returned: object) -> TermValue:
    """A user function's return value as a term value; ``BadRewardValue`` when it is none of the allowed shapes."""
    if not isinstance(returned, Mapping):
        return TermValue(_as_reward(spec, returned, ""), None, {})
    if "reward" not in returned:
        raise BadRewardValue(f"reward function {spec} returned {_short(returned)} ({type(returned).__name__}) "
                             "without 'reward'; expected a finite number or a mapping with 'reward'")
    value = _as_reward(spec, returned["reward"], "a mapping whose 'reward' is ")
    correct = returned.get("correct")
    if correct is not None and not isinstance(correct, bool):
        raise BadRewardValue(f"reward function {spec} returned a mapping whose 'correct' is {_short(correct)} "
                             f"({type(correct).__name__}); expected a bool")
    info: dict[str, str] = {}
    for key, item in returned.items():
        if key in ("reward", "correct"):
            continue
        if not isinstance(key, str) or not isinstance(item, (str, int, float, bool)):
            raise BadRewardValue(f"reward function {spec} returned a mapping with {_short(key)}: {_short(item)} "
                                 f"({type(item).__name__}); extra keys must be str with str, int, float or bool values")
        info[f"fn.{key}"] = _info_text(item)
    return TermValue(value, correct, info)


class _Term:
    """One configured term, ready to evaluate: a built-in check or a loaded user function."""

    def __init__(self, cfg: RewardTermConfig, python_path: Sequence[str]) -> None:
        self.fn = cfg.fn
        self.weight = cfg.weight
        self.extract = cfg.extract
        self.pattern = compile_format(cfg.pattern) if cfg.pattern is not None else None
        self.user = load_function(cfg.fn, python_path) if ":" in cfg.fn else None

    def evaluate(self, request: RewardRequest, completion: str) -> TermValue:
        if self.fn == "exact":
            hit = exact_equal(completion, request.reference)
            return TermValue(float(hit), hit, {})
        if self.fn == "numeric":
            hit = numeric_equal(completion, request.reference, self.extract)
            return TermValue(float(hit), hit, {})
        if self.fn == "format":
            assert self.pattern is not None
            return TermValue(float(format_match(completion, self.pattern)), None, {})
        assert self.user is not None
        returned = self.user(completion=completion, answer=request.reference, prompt=request.prompt,
                             row=parse_row(request.row_json))
        return check_returned(self.fn, returned)


def parse_row(row_json: str) -> dict[str, Any]:
    """The request's dataset row: ``{}`` when empty; ``InvalidRequest`` when not a JSON object."""
    if not row_json:
        return {}
    if len(row_json) > MAX_ROW_JSON_CHARS:
        raise InvalidRequest(f"row_json of {len(row_json)} characters; the limit is {MAX_ROW_JSON_CHARS}")
    try:
        row = json.loads(row_json)
    except (json.JSONDecodeError, RecursionError) as err:
        raise InvalidRequest(f"row_json is not JSON: {err}") from None
    if not isinstance(row, dict):
        raise InvalidRequest(f"row_json is a JSON {type(row).__name__}, not an object")
    return row


class DatasetReward:
    """The rule reward of dataset tasks ``tasks``, from ``reward.terms`` and ``reward.python_path``."""

    kind: ClassVar[str] = "rule"
    judges: ClassVar[bool] = True

    def __init__(self, cfg: RewardConfig, tasks: Sequence[str]) -> None:
        if isinstance(tasks, str) or not tasks:
            raise RewardUnavailable(f"a dataset reward serves one or more task names, not {tasks!r}")
        self.tasks: tuple[str, ...] = tuple(tasks)
        try:
            self.terms = tuple(_Term(term, cfg.python_path) for term in cfg.terms)
        except RewardFunctionError as err:
            raise RewardUnavailable(str(err)) from err

    def score(self, request: RewardRequest) -> Scored:
        completion = self._check(request)
        reward, verdicts, info = 0.0, [], {}
        for i, term in enumerate(self.terms):
            result = term.evaluate(request, completion)
            reward += term.weight * result.value
            if result.correct is not None:
                verdicts.append(result.correct)
            info.update(result.info)
            info[f"term.{i}.{term.fn}"] = repr(result.value)
        correct = all(verdicts) if verdicts else reward >= 1.0
        return Scored(reward, {"correct": str(correct).lower(), **info})

    def _check(self, request: RewardRequest) -> str:
        """The completion of a valid single-turn request of a served task; ``InvalidRequest`` otherwise."""
        if request.task not in self.tasks:
            raise InvalidRequest(f"task {request.task[:64]!r} is not a dataset task of this reward; "
                                 f"served: {list(self.tasks)}")
        if len(request.actions) != 1:
            raise InvalidRequest(f"dataset task {request.task!r} is single-turn: one action (the completion), "
                                 f"not {len(request.actions)}")
        if len(request.observations) > 1 or any(request.observations):
            raise InvalidRequest(f"dataset task {request.task!r} has no observations: send none, or one empty string")
        parse_row(request.row_json)
        return request.actions[0]
