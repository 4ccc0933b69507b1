"""Dataset rewards: the rule verifiers, the weighted terms, and the user's own functions by import path."""

from __future__ import annotations

import gzip
import json
import math
import re
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from services.common.reward_config import RewardConfig, RewardTermConfig
from services.reward.dataset import (
    BadRewardValue,
    DatasetReward,
    RewardFunctionError,
    add_python_path,
    check_returned,
    load_function,
)
from services.reward.protocol import InvalidRequest, RewardRequest, RewardUnavailable
from services.reward.verifiers import (
    answer_value,
    compile_format,
    exact_equal,
    extract_answer,
    format_match,
    numeric_equal,
    parse_number,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = str(REPO / "examples" / "rewards")
GSM8K = REPO.parent / "shared" / "data" / "gsm8k"


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))


def request(completion: str = "", reference: str = "", *, task: str = "gsm", row: object = None,
            actions: tuple[str, ...] | None = None, observations: tuple[str, ...] = (),
            prompt: str = "Q?") -> RewardRequest:
    row_json = "" if row is None else row if isinstance(row, str) else json.dumps(row)
    return RewardRequest("r1", task, 0, prompt, (completion,) if actions is None else actions, observations,
                         reference=reference, row_json=row_json)


def reward(*terms: RewardTermConfig, python_path: tuple[str, ...] = (EXAMPLES,),
           tasks: tuple[str, ...] = ("gsm",)) -> DatasetReward:
    return DatasetReward(RewardConfig(terms=list(terms), python_path=list(python_path)), tasks)


def write_module(tmp_path: Path, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(source)
    return str(tmp_path)


# --- parse_number ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "value"), [
    ("42", Fraction(42)), ("-42", Fraction(-42)), ("+7", Fraction(7)), ("\u22125", Fraction(-5)),
    ("1,234", Fraction(1234)), ("1,234,567.25", Fraction(123456725, 100)), ("$1,000", Fraction(1000)),
    ("0.5", Fraction(1, 2)), (".5", Fraction(1, 2)), ("-.25", Fraction(-1, 4)), ("72.00", Fraction(72)),
    ("3/4", Fraction(3, 4)), ("-3/4", Fraction(-3, 4)), ("\\frac{3}{4}", Fraction(3, 4)),
    ("\\dfrac{1}{2}", Fraction(1, 2)), ("\\tfrac{-1}{2}", Fraction(-1, 2)), ("-\\frac{1}{2}", Fraction(-1, 2)),
    ("\\frac{1,000}{4}", Fraction(250)), ("  42.  ", Fraction(42)), ("$ 42 $", Fraction(42)), ("\\$5", Fraction(5)),
    ("50%", Fraction(50)), ("50\\%", Fraction(50)), ("1\\,000", Fraction(1000)),
])
def test_parse_number_reads_numbers(text: str, value: Fraction) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize("text", [
    "", "   ", "abc", "42 apples", "1,23", "1234,567", "1/0", "\\frac{1}{0}", "--5", "- 5", "1e5", "3/4/5",
    "\\frac{x}{2}", "$", ".", "%", "1.2.3", "x = 5",
])
def test_parse_number_refuses_what_is_not_one_number(text: str) -> None:
    assert parse_number(text) is None


def test_parse_number_huge_numbers_are_exact() -> None:
    big = "9" * 4000
    assert parse_number(big) == Fraction(int(big))
    assert parse_number(big) != parse_number("9" * 3999 + "8")
    assert parse_number("1" + "0" * 300 + ".5") == Fraction(10**301 + 5, 10)
    assert parse_number("9" * 5000) is None  # over Python's integer-digit limit: no exception


# --- extract_answer -------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "mode", "expected"), [
    ("The answer is 42.", "last", "42"),
    ("42 apples and 3 pears", "last", "3"),
    ("It costs $1,000 in total", "last", "1,000"),
    ("the temperature is -7 degrees", "last", "-7"),
    ("10-3 = 7, so x-5", "last", "5"),
    ("half: 1/2", "last", "1/2"),
    ("half: \\frac{1}{2}", "last", "\\frac{1}{2}"),
    ("no number at all", "last", None),
    ("\\boxed{\\frac{1}{2}}", "boxed", "\\frac{1}{2}"),
    ("first \\boxed{3} then \\boxed{{4}+1} end", "boxed", "{4}+1"),
    ("\\fbox{12}", "boxed", "12"),
    ("\\boxed{5} and an unclosed \\boxed{6", "boxed", "5"),
    ("\\boxed{", "boxed", None),
    ("no box", "boxed", None),
    ("a\n#### 5\nb\n#### 1,000\ntrailing", "gsm8k", "1,000"),
    ("#### 72 dollars", "gsm8k", "72 dollars"),
    ("####   \n", "gsm8k", None),
    ("no hashes", "gsm8k", None),
    ("#### 9 and \\boxed{8}", "auto", "8"),
    ("work 5\n#### 9", "auto", "9"),
    ("work 5 then 6", "auto", "6"),
    ("####\n7", "auto", "7"),
])
def test_extract_answer(text: str, mode: str, expected: str | None) -> None:
    assert extract_answer(text, mode) == expected  # type: ignore[arg-type]


def test_extract_answer_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="extract mode"):
        extract_answer("1", "first")  # type: ignore[arg-type]


def test_answer_value_takes_the_single_number_of_a_wordy_answer() -> None:
    assert answer_value("#### 72 dollars", "gsm8k") == 72
    assert answer_value("\\boxed{x = 5}", "boxed") == 5
    assert answer_value("\\boxed{3, 4}", "boxed") is None  # two numbers: no single answer
    assert answer_value("#### none", "gsm8k") is None


# --- numeric_equal / exact_equal / format_match --------------------------------------------------

@pytest.mark.parametrize(("completion", "reference", "mode"), [
    ("so the answer is 0.5", "1/2", "auto"),
    ("\\boxed{\\frac{1}{2}}", "0.5", "auto"),
    ("\\boxed{\\dfrac{1}{2}}", "#### .5", "boxed"),
    ("The answer is 72.", "72.00", "last"),
    ("#### 72.0", "She sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", "gsm8k"),
    ("#### 1234", "#### 1,234", "gsm8k"),
    ("It is $1,000.", "1000", "auto"),
    ("x = -3", "-3", "last"),
    ("x = \u22123", "-3", "last"),
    ("#### 72", "72", "gsm8k"),  # a plain reference falls back to auto
    ("\\boxed{72}", "72", "boxed"),
    ("#### " + "9" * 4000, "9" * 4000, "auto"),
])
def test_numeric_equal_true(completion: str, reference: str, mode: str) -> None:
    assert numeric_equal(completion, reference, mode)  # type: ignore[arg-type]


@pytest.mark.parametrize(("completion", "reference", "mode"), [
    ("42 apples and 3 pears", "42", "last"),
    ("no number at all", "42", "auto"),
    ("42", "no number at all", "auto"),
    ("", "", "auto"),
    ("the answer is 72", "72", "gsm8k"),  # the completion must write ####
    ("the answer is 72", "72", "boxed"),  # ... or a box
    ("#### 72", "-72", "auto"),
    ("\\boxed{3, 4}", "4", "boxed"),
    ("1/0", "1/0", "auto"),
    ("#### " + "9" * 4000, "9" * 3999 + "8", "auto"),
])
def test_numeric_equal_false(completion: str, reference: str, mode: str) -> None:
    assert not numeric_equal(completion, reference, mode)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["\\boxed{" * 2000, "}" * 4000, "#" * 4096, "-" * 4096, "1," * 2000,
                                  "\\frac{" * 1000, "\u0663", "\x00\ufffd", "$$$...%%%"])
def test_verifiers_never_raise(text: str) -> None:
    for mode in ("auto", "last", "gsm8k", "boxed"):
        numeric_equal(text, text, mode)  # type: ignore[arg-type]
        numeric_equal(text, "1", mode)  # type: ignore[arg-type]


def test_exact_equal_folds_whitespace_and_case() -> None:
    assert exact_equal("  Paris\n", "paris")
    assert exact_equal("New   York\tCity", "new york city")
    assert exact_equal("STRASSE", "straße")
    assert not exact_equal("Paris.", "Paris")
    assert not exact_equal("NewYork", "New York")


def test_format_match_searches_with_dotall() -> None:
    pattern = compile_format(r"<think>.*</think>")
    assert format_match("x <think>a\nb</think> 42", pattern)
    assert not format_match("<think>a", pattern)
    assert format_match("abc", re.compile("b"))


# --- DatasetReward: built-in terms ----------------------------------------------------------------

def test_numeric_term() -> None:
    fn = reward(RewardTermConfig(fn="numeric"))
    right = fn.score(request("so #### 72", "work\n#### 72"))
    assert right.reward == 1.0
    assert right.info == {"correct": "true", "term.0.numeric": "1.0"}
    wrong = fn.score(request("so #### 71", "72"))
    assert wrong.reward == 0.0
    assert wrong.info == {"correct": "false", "term.0.numeric": "0.0"}


def test_numeric_term_uses_its_extract_mode() -> None:
    boxed = reward(RewardTermConfig(fn="numeric", extract="boxed"))
    assert boxed.score(request("the answer is 5", "5")).reward == 0.0
    assert boxed.score(request("\\boxed{5}", "5")).reward == 1.0


def test_exact_term() -> None:
    fn = reward(RewardTermConfig(fn="exact"))
    assert fn.score(request(" PARIS ", "paris")).info == {"correct": "true", "term.0.exact": "1.0"}
    assert fn.score(request("Lyon", "paris")).info["correct"] == "false"


def test_format_term_does_not_judge_correctness() -> None:
    fn = reward(RewardTermConfig(fn="format", pattern=r"^<think>.*</think>", weight=0.5))
    scored = fn.score(request("<think>\nhm</think> 3", "4"))
    assert scored.reward == 0.5
    assert scored.info == {"correct": "false", "term.0.format": "1.0"}  # no judge: correct = reward >= 1
    doubled = reward(RewardTermConfig(fn="format", pattern="x", weight=2.0))
    assert doubled.score(request("x", "")).info["correct"] == "true"


def test_weights_sum_and_correctness_ands_the_judges() -> None:
    fn = reward(RewardTermConfig(fn="numeric", weight=1.0),
                RewardTermConfig(fn="format", pattern=r"####", weight=0.25),
                RewardTermConfig(fn="exact", weight=-0.5))
    scored = fn.score(request("#### 72", "72"))
    assert scored.reward == pytest.approx(1.25)
    assert scored.info == {"correct": "false", "term.0.numeric": "1.0", "term.1.format": "1.0", "term.2.exact": "0.0"}
    both = fn.score(request("72", "72"))
    assert both.reward == pytest.approx(0.5)
    assert both.info["correct"] == "true"  # numeric and exact both say so; format does not judge


# --- DatasetReward: user functions ---------------------------------------------------------------

def test_user_function_from_examples() -> None:
    fn = reward(RewardTermConfig(fn="brevity:correct_and_brief"))
    right = fn.score(request("It is 72", "work\n#### 72"))
    assert right.reward == 1.0
    assert right.info == {"correct": "true", "term.0.brevity:correct_and_brief": "1.0", "fn.chars": "8"}
    long = fn.score(request("x" * 300 + " 72", "72"))
    assert long.reward == pytest.approx(1.0 - 0.001 * 103)
    assert long.info["correct"] == "true"  # the function's verdict, not reward >= 1
    assert fn.score(request("71", "72")).info["correct"] == "false"


def test_user_function_with_builtin_terms() -> None:
    fn = reward(RewardTermConfig(fn="numeric"), RewardTermConfig(fn="brevity:correct_and_brief", weight=0.5))
    scored = fn.score(request("#### 72", "72"))
    assert scored.reward == 1.5
    assert scored.info["correct"] == "true"


def test_user_function_gets_keyword_arguments_and_the_row(tmp_path: Path) -> None:
    path = write_module(tmp_path, "rowfn_kw", (
        "def f(*, completion, answer, prompt, row):\n"
        "    row['seen'] = True\n"
        "    return {'reward': float(row['points']), 'echo': completion + '|' + answer + '|' + prompt,\n"
        "            'kind': type(row).__name__, 'ok': True, 'ratio': 0.25}\n"
    ))
    fn = reward(RewardTermConfig(fn="rowfn_kw:f"), RewardTermConfig(fn="rowfn_kw:f"), python_path=(path,))
    scored = fn.score(request("c", "a", prompt="p", row={"points": 2, "nested": [1, {"x": None}]}))
    assert scored.reward == 4.0  # each call gets its own copy of the row
    assert scored.info == {"correct": "true", "fn.echo": "c|a|p", "fn.kind": "dict", "fn.ok": "true",
                           "fn.ratio": "0.25", "term.0.rowfn_kw:f": "2.0", "term.1.rowfn_kw:f": "2.0"}


def test_user_function_without_row_gets_an_empty_dict(tmp_path: Path) -> None:
    path = write_module(tmp_path, "rowfn_empty", "def f(row, **_):\n    return len(row)\n")
    fn = reward(RewardTermConfig(fn="rowfn_empty:f"), python_path=(path,))
    assert fn.score(request("c", "a")).reward == 0.0


def test_user_function_plain_number_correctness_falls_back_to_reward(tmp_path: Path) -> None:
    path = write_module(tmp_path, "plainfn", "def one(**_):\n    return 1\n\ndef half(**_):\n    return 0.5\n")
    one = reward(RewardTermConfig(fn="plainfn:one"), python_path=(path,))
    half = reward(RewardTermConfig(fn="plainfn:half"), python_path=(path,))
    assert one.score(request("c")).info["correct"] == "true"
    assert half.score(request("c")).info["correct"] == "false"


def test_user_exception_propagates_unchanged() -> None:
    fn = reward(RewardTermConfig(fn="brevity:always_raises"))
    with pytest.raises(ValueError, match=r"^boom$"):
        fn.score(request("c", "a"))


def test_bad_value_from_the_example_module() -> None:
    fn = reward(RewardTermConfig(fn="brevity:bad_value"))
    with pytest.raises(BadRewardValue, match=r"reward function brevity:bad_value returned 'not a number' \(str\); "
                                             r"expected a finite number or a mapping with 'reward'"):
        fn.score(request("c", "a"))


@pytest.mark.parametrize(("returned", "message"), [
    ("abc", r"returned 'abc' \(str\)"),
    (None, r"returned None \(NoneType\)"),
    (math.nan, r"returned nan \(float\)"),
    (math.inf, r"returned inf \(float\)"),
    (-math.inf, r"returned -inf \(float\)"),
    (True, r"returned True \(bool\)"),
    (10**400, r"\(int\)"),
    ([1.0], r"returned \[1.0\] \(list\)"),
    ({"correct": True}, r"\(dict\) without 'reward'"),
    ({"reward": "1"}, r"a mapping whose 'reward' is '1' \(str\)"),
    ({"reward": None}, r"a mapping whose 'reward' is None"),
    ({"reward": math.nan}, r"a mapping whose 'reward' is nan"),
    ({"reward": False}, r"a mapping whose 'reward' is False \(bool\)"),
    ({"reward": 1.0, "correct": "yes"}, r"'correct' is 'yes' \(str\); expected a bool"),
    ({"reward": 1.0, "extra": [1]}, r"extra keys must be str"),
    ({"reward": 1.0, 3: "x"}, r"extra keys must be str"),
    ("x" * 500, r"returned 'x{76}\.\.\. \(str\)"),
])
def test_bad_returns(returned: object, message: str) -> None:
    with pytest.raises(BadRewardValue, match=message):
        check_returned("mymod:f", returned)


def test_good_returns() -> None:
    import numpy as np

    assert check_returned("m:f", 2).value == 2.0
    assert check_returned("m:f", np.float32(0.5)).value == 0.5
    assert check_returned("m:f", {"reward": -1, "correct": False}).correct is False
    assert check_returned("m:f", {"reward": 1, "correct": None}).correct is None
    with pytest.raises(BadRewardValue):
        check_returned("m:f", np.True_)


def test_bad_return_inside_score(tmp_path: Path) -> None:
    path = write_module(tmp_path, "nanfn", "def f(**_):\n    return float('nan')\n")
    with pytest.raises(BadRewardValue, match=r"reward function nanfn:f returned nan \(float\)"):
        reward(RewardTermConfig(fn="nanfn:f"), python_path=(path,)).score(request("c"))


# --- loading user functions -----------------------------------------------------------------------

def test_load_function_by_import_path() -> None:
    fn = load_function("brevity:correct_and_brief", [EXAMPLES])
    assert fn(completion="42", answer="#### 42", prompt="", row={})["correct"] is True


def test_python_path_is_prepended_once(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    add_python_path([a, b])
    add_python_path([a, b])
    assert sys.path[:2] == [a, b]
    assert sys.path.count(a) == 1 and sys.path.count(b) == 1


def test_load_missing_module() -> None:
    with pytest.raises(RewardFunctionError, match=r"'no_such_mod_xyz:f'.*cannot import module 'no_such_mod_xyz': "
                                                  r"No module named 'no_such_mod_xyz'"):
        load_function("no_such_mod_xyz:f", [EXAMPLES])


def test_load_module_whose_import_fails(tmp_path: Path) -> None:
    path = write_module(tmp_path, "needs_missing", "import not_installed_pkg_xyz\n")
    with pytest.raises(RewardFunctionError, match="No module named 'not_installed_pkg_xyz'"):
        load_function("needs_missing:f", [path])
    path = write_module(tmp_path, "raises_on_import", "raise RuntimeError('bad config')\n")
    with pytest.raises(RewardFunctionError, match="module 'raises_on_import' failed: RuntimeError: bad config"):
        load_function("raises_on_import:f", [path])
    path = write_module(tmp_path, "syntax_err", "def f(:\n")
    with pytest.raises(RewardFunctionError, match="SyntaxError"):
        load_function("syntax_err:f", [path])


def test_load_missing_attribute_lists_public_callables() -> None:
    with pytest.raises(RewardFunctionError, match=r"has no attribute 'nope' \(its public callables: .*'always_raises'.*"
                                                  r"'correct_and_brief'.*\)"):
        load_function("brevity:nope", [EXAMPLES])


def test_load_not_callable() -> None:
    with pytest.raises(RewardFunctionError, match="'FREE_CHARS' is a int, not callable"):
        load_function("brevity:FREE_CHARS", [EXAMPLES])


def test_load_bad_signature(tmp_path: Path) -> None:
    path = write_module(tmp_path, "sigs", (
        "def positional(completion, answer):\n    return 0\n"
        "def extra(completion, answer, prompt, row, scale):\n    return 0\n"
        "def fine(completion, answer, prompt, row, scale=1, *args):\n    return 0\n"
    ))
    with pytest.raises(RewardFunctionError, match=r"does not accept \['prompt', 'row'\].*\*\*kwargs"):
        load_function("sigs:positional", [path])
    with pytest.raises(RewardFunctionError, match=r"requires \['scale'\]"):
        load_function("sigs:extra", [path])
    load_function("sigs:fine", [path])


def test_load_not_a_spec() -> None:
    with pytest.raises(RewardFunctionError, match="not 'module:function'"):
        load_function("brevity", [EXAMPLES])


def test_broken_spec_makes_the_reward_unavailable() -> None:
    with pytest.raises(RewardUnavailable, match="no_such_mod_xyz"):
        reward(RewardTermConfig(fn="numeric"), RewardTermConfig(fn="no_such_mod_xyz:f"))
    with pytest.raises(RewardUnavailable, match="has no attribute 'nope'"):
        reward(RewardTermConfig(fn="brevity:nope"))
    with pytest.raises(RewardUnavailable, match="task names"):
        reward(RewardTermConfig(fn="numeric"), tasks=())


# --- requests -------------------------------------------------------------------------------------

def test_unknown_task_names_the_served_ones() -> None:
    fn = reward(RewardTermConfig(fn="numeric"), tasks=("gsm", "math"))
    assert fn.score(request("1", "1", task="math")).reward == 1.0
    with pytest.raises(InvalidRequest, match=r"'arith'.*served: \['gsm', 'math'\]"):
        fn.score(request("1", "1", task="arith"))


@pytest.mark.parametrize(("actions", "observations", "message"), [
    ((), (), "one action .*not 0"),
    (("a", "b"), (), "one action .*not 2"),
    (("a",), ("obs",), "no observations"),
    (("a",), ("", ""), "no observations"),
])
def test_single_turn_checks(actions: tuple[str, ...], observations: tuple[str, ...], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        reward(RewardTermConfig(fn="numeric")).score(request(actions=actions, observations=observations))


def test_one_empty_observation_is_allowed() -> None:
    fn = reward(RewardTermConfig(fn="numeric"))
    assert fn.score(request(actions=("1",), observations=("",), reference="1")).reward == 1.0


@pytest.mark.parametrize(("row_json", "message"), [
    ("[1, 2]", "JSON list, not an object"),
    ("3", "JSON int, not an object"),
    ("{not json", "not JSON"),
    ("[" * 100_000, "limit"),
    ("[" * 30_000 + "]" * 30_000, "not JSON"),  # nested deeper than the parser recurses
])
def test_row_json_must_be_an_object(row_json: str, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        reward(RewardTermConfig(fn="numeric")).score(request("1", "1", row=row_json))


# --- GSM8K ----------------------------------------------------------------------------------------

def test_gsm8k_reference_solutions_score_against_their_final_answers() -> None:
    if not GSM8K.is_dir():
        pytest.skip(f"GSM8K data not present at {GSM8K} (the shared data directory is absent)")
    rows = []
    for split in ("train", "test"):
        with gzip.open(GSM8K / f"{split}.jsonl.gz", "rt", encoding="utf-8") as f:
            rows += [json.loads(line) for line in f]
    assert len(rows) == 8792
    for mode in ("auto", "gsm8k"):
        failed = [row["answer"][-80:] for row in rows
                  if not numeric_equal(row["answer"], row["answer"].rsplit("####", 1)[1].strip(), mode)]
        assert not failed, f"mode {mode}: {len(failed)} solutions not equal to their final answer, e.g. {failed[:3]}"
    fn = reward(RewardTermConfig(fn="numeric", extract="gsm8k"))
    wrong = rows[0]["answer"].rsplit("####", 1)[0] + "#### 123456789"
    assert fn.score(request(wrong, rows[0]["answer"])).info["correct"] == "false"
