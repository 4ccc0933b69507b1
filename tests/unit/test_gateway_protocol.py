"""The gateway's wire checks and framing as OpenAI's API has them (pure): each refusal's status,
message, ``param`` and ``code``; the chunks of a stream with and without ``include_usage``; stop
sequences cutting a turn at the fewest ids whose text holds one."""

from __future__ import annotations

import json

import pytest

from services.gateway.protocol import ApiError, ChatRequest, CompletionRequest, error_body, parse_request
from services.gateway.responses import chat_chunks, completion_chunks, cut_at_stop, sse, usage

HI = [{"role": "user", "content": "hi"}]


def _chat(**fields) -> bytes:
    return json.dumps({"model": "m", "messages": HI, **fields}).encode()


def _refusal(cls, raw: bytes) -> tuple[int, str, str | None, str | None]:
    with pytest.raises(ApiError) as err:
        parse_request(cls, raw)
    e = err.value
    return e.status, e.message, e.param, e.code


@pytest.mark.parametrize(("raw", "param", "code", "message"), [
    (_chat(messages=[{"role": "wizard", "content": "hi"}]), "messages.[0].role", "invalid_value",
     "Invalid value: 'wizard'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and "
     "'developer'."),
    (_chat(messages=[*HI, {"content": "x"}]), "messages.[1].role", "missing_required_parameter",
     "Missing required parameter: 'messages.[1].role'."),
    (_chat(messages=[]), "messages", "empty_array",
     "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead."),
    (_chat(messages=["hi"]), "messages.[0]", "invalid_type",
     "Invalid type for 'messages.[0]': expected an object, but got a string instead."),
    (_chat(messages=[{"role": "user", "content": None}]), "messages.[0].content", "invalid_type",
     "Invalid value for 'messages.[0].content': expected a string, got null."),
    (_chat(messages=[{"role": "user", "content": {"text": "hi"}}]), "messages.[0].content", "invalid_type",
     "Invalid type for 'messages.[0].content': expected one of a string or array of objects, but got an object "
     "instead."),
    (_chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     "messages.[0].content.[0].type", "invalid_value", "Invalid value: \"image_url\". Supported values are: 'text'"),
    (_chat(messages=[*HI, {"role": "tool", "content": "5"}]), "messages.[1].tool_call_id",
     "missing_required_parameter", "Missing required parameter: 'messages.[1].tool_call_id'."),
    (json.dumps({"messages": HI}).encode(), "model", "missing_required_parameter",
     "Missing required parameter: 'model'."),
    (_chat(max_tokens="5"), "max_tokens", "invalid_type",
     "Invalid type for 'max_tokens': expected an integer, but got a string instead."),
    (_chat(max_tokens=1.5), "max_tokens", "invalid_type",
     "Invalid type for 'max_tokens': expected an integer, but got a decimal instead."),
    (_chat(max_tokens=0), "max_tokens", "integer_below_min_value",
     "Invalid 'max_tokens': integer below minimum value. Expected a value >= 1, but got 0 instead."),
    (_chat(temperature=3), "temperature", "decimal_above_max_value",
     "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 3 instead."),
    (_chat(stream="true"), "stream", "invalid_type",
     "Invalid type for 'stream': expected a boolean, but got a string instead."),
    (_chat(stream_options={"include_usage": True}), "stream_options", "invalid_value",
     "The 'stream_options' parameter is only allowed when 'stream' is enabled."),
    (_chat(stop=["a", "b", "c", "d", "e"]), "stop", "array_above_max_length", "maximum length 4"),
    (_chat(stop=[1]), "stop.[0]", "invalid_type", "expected a string, but got an integer"),
    (_chat(response_format={"type": "json_object"}), "response_format", "unsupported_parameter",
     "cannot be constrained"),
    (_chat(tool_choice="required"), "tool_choice", "unsupported_parameter", "cannot force a tool call"),
    (_chat(logprobs=True), "logprobs", "unsupported_parameter", "does not return log-probs"),
    (_chat(presence_penalty=0.5), "presence_penalty", "unsupported_parameter", "sampling is the run's"),
])
def test_a_bad_chat_request_is_refused_as_openai_refuses_it(raw, param, code, message):
    status, got, got_param, got_code = _refusal(ChatRequest, raw)
    assert (status, got_param, got_code) == (400, param, code)
    assert got.startswith(message) if message[0].isupper() else message in got


@pytest.mark.parametrize(("raw", "why"), [
    (b"", "the body is empty"), (b'{"model": "m", "messages": [\xff]}', "not valid UTF-8 (byte 0xff at position 28)"),
    (b"{not json", "not valid JSON"), (b"[1, 2]", "the body is an array, not an object"),
    (b'"hi"', "the body is a string, not an object"),
])
def test_a_body_that_is_not_a_json_object_says_why(raw, why):
    status, message, param, _ = _refusal(ChatRequest, raw)
    assert status == 400 and param is None
    assert message.startswith("We could not parse the JSON body of your request: ") and why in message


def test_completion_prompts_one_string_or_one_array_of_ids():
    def prompt(p):
        return parse_request(CompletionRequest, json.dumps({"model": "m", "prompt": p}).encode()).prompt

    assert prompt("2+3=") == "2+3=" and prompt([1, 2]) == [1, 2] and prompt(["2+3="]) == "2+3="
    assert prompt([[5, 6]]) == [5, 6]
    for bad, code in ((["a", "b"], "invalid_value"), ([1, True], "invalid_type"), ([-1], "invalid_value"),
                      (5, "invalid_type")):
        raw = json.dumps({"model": "m", "prompt": bad}).encode()
        assert _refusal(CompletionRequest, raw)[2:] == ("prompt", code), bad
    raw = json.dumps({"model": "m", "prompt": "x", "echo": True}).encode()
    assert _refusal(CompletionRequest, raw)[2:] == ("echo", "unsupported_parameter")


def test_requests_a_client_sends_pass():
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    req = parse_request(ChatRequest, _chat(
        messages=[{"role": "developer", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "2+3?"}]},
                  {"role": "assistant", "content": None, "tool_calls": [call]},
                  {"role": "tool", "content": "5", "tool_call_id": "c"}],
        temperature=1, max_tokens=None, stream=True, stream_options={"include_usage": True}, stop="\n", user="u",
        seed=3, tool_choice="auto", response_format={"type": "text"}))
    assert req.stream and req.temperature == 1.0 and req.model_extra == {"user": "u", "seed": 3}


def test_error_bodies_have_openai_four_fields():
    assert error_body(401, "no") == {"error": {"message": "no", "type": "invalid_request_error", "param": None,
                                               "code": None}}
    assert error_body(500, "boom", None, "generation_failed")["error"]["type"] == "server_error"


def _events(chunks) -> list:
    text = "".join(sse(chunks))
    assert text.endswith("data: [DONE]\n\n")
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    return [json.loads(e[6:]) for e in events[:-1]]


def test_a_streamed_chat_reply_is_framed_as_openai_frames_it():
    message = {"role": "assistant", "content": "5", "tool_calls": [{"id": "c0", "type": "function",
                                                                    "function": {"name": "f", "arguments": "{}"}}]}
    used = usage(7, 3)
    chunks = _events(chat_chunks("chatcmpl-1", "m", message, "tool_calls", used, include_usage=True))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and {c["id"] for c in chunks} == {"chatcmpl-1"}
    assert [c["choices"][0]["delta"] for c in chunks[:-1]] == [
        {"role": "assistant", "content": ""}, {"content": "5"},
        {"tool_calls": [{"index": 0, **message["tool_calls"][0]}]}, {}]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, None, "tool_calls"]
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 3,
                                                                    "total_tokens": 10}
    plain = _events(chat_chunks("chatcmpl-1", "m", {"role": "assistant", "content": "5"}, "stop", used, False))
    assert len(plain) == 3 and all("usage" not in c for c in plain)
    assert plain[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_streamed_completion_is_framed_as_openai_frames_it():
    chunks = _events(completion_chunks("cmpl-1", "m", " 5", "length", usage(4, 2), include_usage=True))
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in chunks[:-1]] == [(" 5", None),
                                                                                                 ("", "length")]
    assert [c["usage"] for c in chunks[:-1]] == [None, None]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 6


def _decode(ids) -> str:
    return "".join(chr(i) for i in ids)


def test_a_stop_sequence_cuts_the_turn_at_the_fewest_ids_that_hold_it():
    ids = [ord(c) for c in "Thought: add\nObservation: 5\nmore"]
    kept, text = cut_at_stop(ids, _decode, ["Observation:", "zzz"])
    assert text == "Thought: add\n" and _decode(ids[:kept]) == "Thought: add\nObservation:"
    assert cut_at_stop(ids, _decode, ["zzz"]) is None and cut_at_stop(ids, _decode, []) is None
    kept, text = cut_at_stop(ids, _decode, ["5", "add"])  # the earliest sequence in the text wins
    assert text == "Thought: " and kept == len("Thought: add")
    pairs = [ord("a"), 0x1F600, ord("b")]  # a multi-character token: the sequence inside it keeps it whole
    assert cut_at_stop(pairs, lambda ids: "".join("XY" if i == 0x1F600 else chr(i) for i in ids), ["Y"]) == (2, "aX")
