"""The OpenAI-compatible gateway driven by the official ``openai`` client, in front of a real SGS
process serving SmolLM2-135M-Instruct (the hf engine: the gateway, not the engine, is the subject;
the SGS and its engine contract are tested elsewhere): chat (plain, streamed, with tools), plain
completions, a history edit, OpenAI-style errors; every generated token the transcript keeps is
the SGS's own (its streamed samples, compared id for id)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from tests.conftest import FAST_ENGINE, start_sgs, stop_sgs

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
    second = agent.chat.completions.create(model=MODEL, messages=messages, stream=True)
    chunks = list(second)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length") and chunks[-1].usage.completion_tokens >= 1
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
    assert len(seen) == before and not session.transcript.segments
