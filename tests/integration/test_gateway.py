"""The OpenAI-compatible gateway driven by the official ``openai`` client and by raw HTTP, in front
of a real SGS process serving SmolLM2-135M-Instruct (the hf engine: the gateway, not the engine, is
the subject; the SGS and its engine contract are tested elsewhere): chat (plain, streamed, with
tools), plain completions, a history edit, stop sequences, OpenAI's error bodies for every refusal
and its stream framing byte for byte; every generated token the transcript keeps is the SGS's own
(its streamed samples, compared id for id)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.conftest import FAST_ENGINE, start_sgs, stop_sgs

# `make test-long` (docs/testing.md): SmolLM2 behind a real SGS takes a minute to start; the fast tier
# keeps the gateway's pure checks (tests/unit/test_gateway_protocol.py)
pytestmark = pytest.mark.long

MODEL = "braid-policy"
MAX_NEW = 24
TOOLS = [{"type": "function", "function": {"name": "calc", "description": "evaluate an arithmetic expression",
                                           "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def gateway(smollm2, tmp_path_factory):
    from transformers import AutoTokenizer

    from services.agentic.runner import SgsGenerator
    from services.gateway.app import GatewaySettings
    from services.gateway.serve import GatewayServer, sgs_backend
    from services.gateway.sessions import Sessions
    from services.gateway.transcript import HFChatTokenizer
    from services.generation.client import GenerationClient

    ckpt, _ = smollm2
    sgs = start_sgs(tmp_path_factory.mktemp("gateway-sgs"), ckpt, [FAST_ENGINE, f"generation.max_new_tokens={MAX_NEW}"])
    client = GenerationClient(sgs.address)
    client.wait_ready()
    tok = AutoTokenizer.from_pretrained(ckpt)
    sessions = Sessions(HFChatTokenizer(tok))
    seen: dict[str, tuple[int, ...]] = {}
    with ThreadPoolExecutor(8) as ex:
        gen = SgsGenerator(client, ex, temperature=1.0, on_sample=lambda s: seen.__setitem__(s.prompt_id, s.token_ids))
        settings = GatewaySettings(model=MODEL, max_context=1024, max_new_tokens=MAX_NEW, temperature=1.0,
                                   eos_id=tok.eos_token_id)
        server = GatewayServer(sessions, sgs_backend(gen), settings).start()
        try:
            yield server, sessions, seen
        finally:
            server.stop()
            stop_sgs(sgs)


def _agent(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=key, max_retries=0, timeout=120)


def _own_tokens(session, seen) -> None:
    """Every generated id in the transcript is, in order, what the SGS streamed for that call."""
    for seg in session.transcript.segments:
        for n, call in enumerate(seg.calls):
            ids = tuple(seg.token_ids[call.gen_start: call.gen_start + call.gen_len])
            assert ids in seen.values(), (seg.index, n)
            assert set(seg.loss_mask[call.gen_start: call.gen_start + call.gen_len]) == {1}
        assert sum(seg.loss_mask) == sum(c.gen_len for c in seg.calls)  # nothing else is trained


def test_a_multi_turn_chat_with_tools_keeps_the_sgs_tokens_and_extends_one_segment(gateway):
    server, sessions, seen = gateway
    session = sessions.open("calculator", 7)
    agent = _agent(server, session.key)
    messages = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 2+3?"}]
    first = agent.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    assert first.choices[0].finish_reason in ("stop", "length", "tool_calls") and first.usage.completion_tokens >= 1
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Are you sure?"}]
    second = agent.chat.completions.create(model=MODEL, messages=messages, stream=True,
                                           stream_options={"include_usage": True})
    chunks = list(second)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-2].choices[0].finish_reason in ("stop", "length") and chunks[-2].usage is None
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1  # usage on a chunk of its own
    assert len(session.transcript.segments) == 1 and len(session.transcript.segments[0].calls) == 2
    seg = session.transcript.segments[0]
    call = seg.calls[1]
    text = sessions.tokenizer.decode_text(seg.token_ids[call.gen_start: call.gen_start + call.gen_len])
    assert streamed == text
    _own_tokens(session, seen)

    # a history edit: the agent rewrites the first answer; a new segment, the first kept
    messages[2] = {"role": "assistant", "content": "6"}
    agent.chat.completions.create(model=MODEL, messages=[*messages[:3], {"role": "user", "content": "Check it."}])
    assert len(session.transcript.segments) == 2 and len(session.transcript.segments[0].calls) == 2
    _own_tokens(session, seen)
    sessions.close(session.key, reward=1.0)
    with pytest.raises(openai.PermissionDeniedError, match="closed"):
        agent.chat.completions.create(model=MODEL, messages=messages)


def test_plain_completions_extend_by_text(gateway):
    server, sessions, seen = gateway
    session = sessions.open("calculator", 8)
    agent = _agent(server, session.key)
    first = agent.completions.create(model=MODEL, prompt="2 + 3 =", max_tokens=4)
    follow = "2 + 3 =" + first.choices[0].text + "\nAnd 4 + 4 ="
    agent.completions.create(model=MODEL, prompt=follow, max_tokens=4)
    assert len(session.transcript.segments) == 1 and len(session.transcript.calls) == 2
    _own_tokens(session, seen)


def test_bad_requests_get_openai_errors_and_never_reach_the_sgs(gateway):
    server, sessions, seen = gateway
    before = len(seen)
    with pytest.raises(openai.AuthenticationError, match="unknown session key"):
        _agent(server, "braid-nope").chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    session = sessions.open("calculator", 9)
    agent = _agent(server, session.key)
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        agent.chat.completions.create(model="gpt-4o", messages=hi)
    for kwargs, match in [({"temperature": 0.2}, "fixed by the training run"), ({"n": 2}, "n must be 1"),
                          ({"max_tokens": MAX_NEW + 1}, "at most"), ({"messages": []}, "messages")]:
        with pytest.raises(openai.BadRequestError, match=match) as err:
            agent.chat.completions.create(model=MODEL, **{"messages": hi, **kwargs})
        assert err.value.status_code == 400 and err.value.body["type"] == "invalid_request_error"
    raw = httpx.post(f"{server.url}/chat/completions", headers={"Authorization": f"Bearer {session.key}"},
                     content=b"{not json")
    assert raw.status_code == 400 and "error" in raw.json()
    assert agent.models.retrieve(MODEL).id == MODEL and [m.id for m in agent.models.list()] == [MODEL]
    assert len(seen) == before and not session.transcript.segments


def _post(server, path: str, key: str | None, body) -> httpx.Response:
    """A raw call: ``body`` as JSON, or bytes sent as they are."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    return httpx.post(server.url + path, headers=headers, content=content, timeout=120)


HI = [{"role": "user", "content": "hi"}]
# (method, path, body, status, param, code, the message's start) for a raw client's mistakes
RAW_REFUSALS = [
    ("POST", "/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 400,
     "messages.[0].role", "invalid_value", "Invalid value: 'wizard'. Supported values are: 'system', 'assistant', "),
    ("POST", "/chat/completions", b'{"model": "braid-policy", "messages": [{"role": "user", "content": "\xff"}]}',
     400, None, None, "We could not parse the JSON body of your request: it is not valid UTF-8 (byte 0xff"),
    ("POST", "/chat/completions", b"not json at all", 400, None, None,
     "We could not parse the JSON body of your request: it is not valid JSON"),
    ("POST", "/completions", b'["a", "b"]', 400, None, "invalid_type",
     "We could not parse the JSON body of your request: the body is an array, not an object"),
    ("POST", "/chat/completions", {"messages": HI}, 400, "model", "missing_required_parameter",
     "Missing required parameter: 'model'."),
    ("POST", "/chat/completions", {"model": MODEL, "messages": []}, 400, "messages", "empty_array",
     "Invalid 'messages': empty array."),
    ("POST", "/chat/completions", {"model": MODEL, "messages": HI, "max_tokens": "8"}, 400, "max_tokens",
     "invalid_type", "Invalid type for 'max_tokens': expected an integer, but got a string instead."),
    ("POST", "/chat/completions", {"model": MODEL, "messages": HI, "temperature": 2.5}, 400, "temperature",
     "decimal_above_max_value", "Invalid 'temperature': decimal above maximum value. Expected a value <= 2"),
    ("POST", "/chat/completions", {"model": MODEL, "messages": HI, "n": 3}, 400, "n", "invalid_value",
     "Invalid 'n': 3. n must be 1 here"),
    ("POST", "/chat/completions", {"model": MODEL, "messages": HI, "stream_options": {"include_usage": True}}, 400,
     "stream_options", "invalid_value", "The 'stream_options' parameter is only allowed when 'stream' is enabled."),
    ("POST", "/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, 400, "messages.[0].content.[0].type",
     "invalid_value", 'Invalid value: "image_url".'),
    ("POST", "/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt", "invalid_value",
     "Invalid 'prompt': this gateway takes one prompt per request"),
    ("POST", "/completions", {"model": "gpt-4o", "prompt": "2+3="}, 404, "model", "model_not_found",
     "The model 'gpt-4o' does not exist"),
    ("GET", "/chat/completions", None, 405, None, "method_not_allowed",
     "Invalid method for URL (GET /v1/chat/completions): it takes POST."),
    ("POST", "/embeddings", {"model": MODEL, "input": "hi"}, 404, None, "unknown_url",
     "Unknown request URL: POST /v1/embeddings."),
]


def test_raw_http_refusals_are_openai_error_bodies_and_never_reach_the_sgs(gateway):
    server, sessions, seen = gateway
    before = len(seen)
    session = sessions.open("calculator", 10)
    for method, path, body, status, param, code, message in RAW_REFUSALS:
        if method == "GET":
            got = httpx.get(server.url + path, headers={"Authorization": f"Bearer {session.key}"})
        else:
            got = _post(server, path, session.key, body)
        assert got.status_code == status, (path, body, got.text)
        assert got.headers["content-type"] == "application/json", got.headers
        error = got.json()["error"]
        assert got.json() == {"error": error} and set(error) == {"message", "type", "param", "code"}, got.text
        assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code), got.text
        assert error["message"].startswith(message), error["message"]
    # the key is checked before the body, as OpenAI does: no key or an unknown one is a 401 whatever the body
    for key in (None, "braid-nope"):
        got = _post(server, "/chat/completions", key, b"\xff")
        assert got.status_code == 401 and got.json()["error"]["code"] == "invalid_api_key", got.text
    assert len(seen) == before and not session.transcript.segments


def _events(resp: httpx.Response) -> list[dict]:
    """The JSON chunks of a raw stream, once its framing is OpenAI's: ``data: ...`` events, each
    followed by a blank line, the last ``[DONE]``."""
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream"), resp.text
    assert resp.text.endswith("data: [DONE]\n\n"), resp.text[-80:]
    events = resp.text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), resp.text
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


def test_raw_streams_carry_openai_framing_and_usage_on_a_final_chunk_of_its_own(gateway):
    server, sessions, _ = gateway
    session = sessions.open("calculator", 11)
    content = [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+3?"}]  # text parts, as clients send
    chunks = _events(_post(server, "/chat/completions", session.key, {
        "model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4, "stream": True,
        "stream_options": {"include_usage": True}}))
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-2]] == [None] * (len(chunks) - 2)
    assert chunks[-2]["choices"][0]["delta"] == {} and chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == session.transcript.calls[0].gen_len
    assert session.transcript.segments[0].prompt_len == chunks[-1]["usage"]["prompt_tokens"]

    for include_usage in (True, False):
        options = {"stream_options": {"include_usage": True}} if include_usage else {}
        chunks = _events(_post(server, "/completions", session.key, {
            "model": MODEL, "prompt": "2 + 3 =", "max_tokens": 2, "stream": True, **options}))
        assert {c["object"] for c in chunks} == {"text_completion"}
        texts = chunks[:-1] if include_usage else chunks
        assert texts[-1]["choices"][0]["text"] == "" and texts[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        if include_usage:
            assert all(c["usage"] is None for c in texts) and chunks[-1]["choices"] == []
            assert chunks[-1]["usage"]["completion_tokens"] == session.transcript.calls[-1].gen_len
        else:
            assert all("usage" not in c for c in chunks)


def test_a_stop_sequence_ends_the_reply_and_the_recorded_turn_where_it_first_appears(gateway):
    server, sessions, seen = gateway
    session = sessions.open("calculator", 12)
    agent = _agent(server, session.key)
    stops = [" ", "e", ".", "\n"]  # one is all but sure to come within 8 tokens of English
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    reply = agent.chat.completions.create(model=MODEL, messages=messages, stop=stops, max_tokens=8)
    text = reply.choices[0].message.content or ""
    assert not any(s in text for s in stops), text
    seg = session.transcript.segments[0]
    call = seg.calls[0]
    ids = tuple(seg.token_ids[call.gen_start: call.gen_start + call.gen_len])
    assert reply.usage.completion_tokens == len(ids)
    assert any(sample[: len(ids)] == ids for sample in seen.values())  # a prefix of what the SGS generated
    recorded = sessions.tokenizer.decode_text(ids)
    if reply.choices[0].finish_reason == "stop" and any(s in recorded for s in stops):  # cut at a sequence
        assert recorded.startswith(text) and recorded[len(text):][:1] in stops
        assert not any(s in sessions.tokenizer.decode_text(ids[:-1]) for s in stops)  # the fewest ids that hold it
    # the reply echoed as returned extends the segment: the template renders it as the recorded ids' text
    messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "More."}]
    agent.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert len(session.transcript.segments) == 1 and len(session.transcript.calls) == 2
