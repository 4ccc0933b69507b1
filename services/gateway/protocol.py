"""OpenAI's request side of the wire, as the gateway checks it (pure; no I/O).

A request body is parsed by hand (bytes -> UTF-8 -> JSON -> an object), then validated by a strict
pydantic model (a JSON string is not an integer, as it is not for OpenAI) and by checks of the
fields a model cannot express (roles, content parts, prompts, stop sequences). Every refusal is an
``ApiError`` that the app writes as OpenAI's body ``{"error": {"message", "type", "param",
"code"}}`` with OpenAI's wording and codes: ``missing_required_parameter``, ``invalid_type``,
``invalid_value``, ``empty_array``, ``integer_below_min_value`` and the like; ``param`` names the
field as OpenAI does (``messages.[0].role``).

Fields that would change what is sampled (``temperature``, ``top_p``, penalties, ``logit_bias``,
``n``) or promise what the gateway cannot give (log-probs in the reply, a forced tool call, a JSON
schema, ``echo``, ``best_of``, ``suffix``) are refused with the reason; fields that change nothing
Braid records (``user``, ``seed``, ``metadata``, ``store``, ...) are accepted and ignored."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ROLES = ("system", "assistant", "user", "function", "tool", "developer")  # OpenAI's, in its error's order
MAX_STOPS = 4  # OpenAI's limit on stop sequences


class ApiError(Exception):
    """A refusal: the HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error body: ``type`` is ``invalid_request_error`` for every client error (401, 403 and
    404 included, as OpenAI sends them) and ``server_error`` for a failure of the server."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class _Base(BaseModel):
    # strict: "5" is not an integer and 1 is not a boolean; extra fields (user, seed, ...) are ignored
    model_config = ConfigDict(extra="allow", strict=True)
    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int | None = Field(None, ge=1, le=128)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, Any] | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    stop: Any = None  # a string or up to 4 strings (checked by ``stop_sequences``)


class ChatRequest(_Base):
    messages: list[Any] = Field(min_length=1)  # each checked by ``check_messages``
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None  # "auto" or "none"
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)


class CompletionRequest(_Base):
    prompt: Any  # one string or one array of token ids (``one_prompt``)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = None
    best_of: int | None = Field(None, ge=1, le=20)
    suffix: str | None = None


Request = TypeVar("Request", ChatRequest, CompletionRequest)

PARSE_ERROR = ("We could not parse the JSON body of your request: {}. The OpenAI API expects a JSON object "
               "encoded as UTF-8.")


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request's JSON object, or a 400 that says why the bytes are not one."""
    if not raw.strip():
        raise ApiError(400, PARSE_ERROR.format("the body is empty"))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, PARSE_ERROR.format(f"it is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at position "
                                               f"{exc.start})")) from exc
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise ApiError(400, PARSE_ERROR.format(f"it is not valid JSON ({exc})")) from exc
    if not isinstance(body, dict):
        raise ApiError(400, PARSE_ERROR.format(f"the body is {_kind(body)}, not an object"), None, "invalid_type")
    return body


def parse_request(cls: type[Request], raw: bytes) -> Request:
    """The validated request, or the first problem as OpenAI words it."""
    body = parse_body(raw)
    try:
        req = cls.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc.errors()[0]) from exc
    check_common(req)
    if isinstance(req, ChatRequest):
        check_messages(req.messages)
        check_chat(req)
    else:
        req.prompt = one_prompt(req.prompt)
        check_completion(req)
    return req


_EXPECTED = {"int_type": "an integer", "string_type": "a string", "bool_type": "a boolean",
             "float_type": "a number", "list_type": "an array", "dict_type": "an object", "model_type": "an object"}
_BOUND = {"greater_than_equal": ("below", ">=", "ge"), "greater_than": ("below", ">", "gt"),
          "less_than_equal": ("above", "<=", "le"), "less_than": ("above", "<", "lt")}


def validation_error(err: dict[str, Any]) -> ApiError:
    """One pydantic error as OpenAI's: the same message, ``param`` and ``code`` its API gives."""
    param = param_path(err["loc"])
    kind, value = err["type"], err.get("input")
    if kind == "missing":
        return ApiError(400, f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    if kind in _EXPECTED:
        return ApiError(400, f"Invalid type for '{param}': expected {_EXPECTED[kind]}, but got {_kind(value)} instead.",
                        param, "invalid_type")
    if kind in _BOUND:
        side, op, key = _BOUND[kind]
        number = "integer" if isinstance(value, int) and isinstance(err["ctx"][key], int) else "decimal"
        bound = "minimum" if side == "below" else "maximum"
        return ApiError(400, f"Invalid '{param}': {number} {side} {bound} value. Expected a value {op} "
                             f"{err['ctx'][key]:g}, but got {value:g} instead.", param,
                        f"{number}_{side}_{bound[:3]}_value")
    if kind == "too_short" and value == []:
        return ApiError(400, f"Invalid '{param}': empty array. Expected an array with minimum length 1, but got an "
                             "empty array instead.", param, "empty_array")
    return ApiError(400, f"Invalid '{param}': {err['msg']}.", param, "invalid_value")


def param_path(loc: tuple | list) -> str:
    """A field's path as OpenAI writes it: ``messages.[0].content.[1].type``."""
    return ".".join(f"[{p}]" if isinstance(p, int) else str(p) for p in loc)


def _kind(value: Any) -> str:
    """What a JSON value is, as OpenAI's messages say it."""
    if value is None:
        return "null"
    for typ, name in ((bool, "a boolean"), (int, "an integer"), (float, "a decimal"), (str, "a string"),
                      (list, "an array"), (dict, "an object")):
        if isinstance(value, typ):
            return name
    return type(value).__name__


def _invalid_type(param: str, expected: str, value: Any) -> ApiError:
    return ApiError(400, f"Invalid type for '{param}': expected {expected}, but got {_kind(value)} instead.", param,
                    "invalid_type")


def _unsupported(param: str, why: str) -> ApiError:
    return ApiError(400, f"Unsupported parameter: '{param}' {why}.", param, "unsupported_parameter")


def check_common(req: _Base) -> None:
    """The fields both endpoints share that a model's types do not settle."""
    if req.stream_options is not None:
        if not req.stream:
            raise ApiError(400, "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                           "stream_options", "invalid_value")
        usage = req.stream_options.get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise _invalid_type("stream_options.include_usage", "a boolean", usage)
    stop_sequences(req.stop)
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name):
            raise _unsupported(name, "is fixed by the training run at 0: sampling is the run's; leave it unset")
    if req.logit_bias:
        raise _unsupported("logit_bias", "is not applied: sampling is the run's; leave it unset")


def stop_sequences(stop: Any) -> tuple[str, ...]:
    """``stop`` as a tuple of non-empty strings (a string, an array of up to 4, or null)."""
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list):
        raise _invalid_type("stop", "one of a string or array of strings", stop)
    if len(stops) > MAX_STOPS:
        raise ApiError(400, f"Invalid 'stop': array too long. Expected an array with maximum length {MAX_STOPS}, but "
                            f"got an array with length {len(stops)} instead.", "stop", "array_above_max_length")
    for i, s in enumerate(stops):
        if not isinstance(s, str):
            raise _invalid_type(f"stop.[{i}]", "a string", s)
    return tuple(s for s in stops if s)


def check_messages(messages: list[Any]) -> None:
    """Each chat message is an object with one of OpenAI's roles and content it can render (a string
    or text parts; null only for an assistant's reply), a tool result names its call."""
    for i, m in enumerate(messages):
        at = f"messages.[{i}]"
        if not isinstance(m, dict):
            raise _invalid_type(at, "an object", m)
        if "role" not in m:
            raise ApiError(400, f"Missing required parameter: '{at}.role'.", f"{at}.role", "missing_required_parameter")
        role = m["role"]
        if not isinstance(role, str):
            raise _invalid_type(f"{at}.role", "a string", role)
        if role not in ROLES:
            supported = ", ".join(f"'{r}'" for r in ROLES[:-1]) + f", and '{ROLES[-1]}'"
            raise ApiError(400, f"Invalid value: '{role}'. Supported values are: {supported}.", f"{at}.role",
                           "invalid_value")
        _check_content(m, role, at)
        for field in {"tool": ("tool_call_id",), "function": ("name",)}.get(role, ()):
            if field not in m:
                raise ApiError(400, f"Missing required parameter: '{at}.{field}'.", f"{at}.{field}",
                               "missing_required_parameter")
            if not isinstance(m[field], str):
                raise _invalid_type(f"{at}.{field}", "a string", m[field])
        calls = m.get("tool_calls")
        if calls is not None and (not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls)):
            raise _invalid_type(f"{at}.tool_calls", "an array of objects", calls)


def _check_content(m: dict[str, Any], role: str, at: str) -> None:
    content = m.get("content")
    if content is None:
        if role == "assistant":
            return
        if "content" not in m:
            raise ApiError(400, f"Missing required parameter: '{at}.content'.", f"{at}.content",
                           "missing_required_parameter")
        raise ApiError(400, f"Invalid value for '{at}.content': expected a string, got null.", f"{at}.content",
                       "invalid_type")
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _invalid_type(f"{at}.content", "one of a string or array of objects", content)
    for j, part in enumerate(content):
        where = f"{at}.content.[{j}]"
        if not isinstance(part, dict):
            raise _invalid_type(where, "an object", part)
        if part.get("type") != "text":
            raise ApiError(400, f"Invalid value: {json.dumps(part.get('type'))}. Supported values are: 'text' (this "
                                "gateway's model reads text only).", f"{where}.type", "invalid_value")
        if not isinstance(part.get("text"), str):
            raise _invalid_type(f"{where}.text", "a string", part.get("text"))


def check_chat(req: ChatRequest) -> None:
    """Chat fields that ask for what the gateway cannot give."""
    if req.tool_choice not in (None, "auto", "none"):
        raise _unsupported("tool_choice", "may be 'auto' or 'none' here: the run's sampling cannot force a tool call")
    if req.response_format is not None and req.response_format.get("type") != "text":
        raise _unsupported("response_format", "may only be {'type': 'text'} here: the run's sampling cannot be "
                                              "constrained to JSON")
    if req.logprobs or req.top_logprobs:
        raise _unsupported("logprobs", "is not available: this gateway does not return log-probs (Braid records them)")
    for legacy in ("functions", "function_call"):
        if (req.model_extra or {}).get(legacy) is not None:
            raise _unsupported(legacy, "is the deprecated form of tools: send 'tools' instead")


def check_completion(req: CompletionRequest) -> None:
    """Completion fields that ask for what the gateway cannot give."""
    if req.logprobs:
        raise _unsupported("logprobs", "is not available: this gateway does not return log-probs (Braid records them)")
    if req.echo:
        raise _unsupported("echo", "is not available: send the prompt's text yourself")
    if req.best_of not in (None, 1):
        raise _unsupported("best_of", "must be 1: one episode is one trajectory")
    if req.suffix:
        raise _unsupported("suffix", "is not available: the policy completes a prompt, it does not fill in")


def one_prompt(prompt: Any) -> str | list[int]:
    """A completion's prompt: a string or an array of token ids (an array holding one of them is that
    one; a batch of several is refused: one call is one turn of one trajectory)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if any(t < 0 for t in prompt):
            raise ApiError(400, "Invalid 'prompt': token ids must be non-negative integers.", "prompt", "invalid_value")
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str | list) for p in prompt):
        raise ApiError(400, f"Invalid 'prompt': this gateway takes one prompt per request (a string or an array of "
                            f"token ids), got a batch of {len(prompt)}.", "prompt", "invalid_value")
    raise _invalid_type("prompt", "one of a string or array of integers", prompt)
