"""The gateway's token-exact transcripts: extension continues from the stored ids, history edits
start segments, generated ids are kept as returned (a character tokenizer with a ChatML-like
template stands in for the policy's: pure logic)."""

from __future__ import annotations

import pytest

from services.gateway.transcript import Transcript, normalize

EOS = "<|end|>"


class CharChat:
    """ChatML-like rendering; one id per character (lossless), so ids and text map both ways."""

    def render(self, messages, tools, add_generation_prompt):
        parts = [f"<|{m['role']}|>{normalize(m)['content']}{EOS}\n" for m in messages]
        return "".join(parts) + ("<|assistant|>" if add_generation_prompt else "")

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)

    def decode_text(self, ids):
        return self.decode(ids).replace(EOS, "")


def _reply(transcript, prepared, text, version=0, stop=True):
    generated = [ord(c) for c in text + (EOS if stop else "")]  # the SGS's ids, EOS included
    logprobs = [-0.5] * len(generated)
    transcript.record(prepared, generated, logprobs, version, "stop" if stop else "length",
                      {"role": "assistant", "content": text}, text)
    return {"role": "assistant", "content": text, "refusal": None, "annotations": []}  # as the client echoes it


def test_a_follow_up_call_continues_from_the_stored_ids_and_only_new_text_is_tokenized():
    t = Transcript(CharChat())
    user = {"role": "user", "content": "2+3?"}
    first = t.prepare([user])
    assert first.new and first.segment == 0
    echoed = _reply(t, first, "calc 2+3", version=4)
    tool = {"role": "tool", "content": "5", "tool_call_id": "c1"}
    second = t.prepare([user, echoed, tool])
    assert not second.new and second.segment == 0
    seg = t.segments[0]
    assert second.token_ids[: len(seg.token_ids)] == tuple(seg.token_ids)  # the stored ids, untouched
    assert CharChat().decode(second.context) == "\n<|tool|>5" + EOS + "\n<|assistant|>"
    _reply(t, second, "#5", version=5)
    seg = t.segments[0]
    assert len(t.segments) == 1 and [c.weight_version for c in seg.calls] == [4, 5]
    text = CharChat().decode(seg.token_ids)
    assert text == "<|user|>2+3?<|end|>\n<|assistant|>calc 2+3<|end|>\n<|tool|>5<|end|>\n<|assistant|>#5<|end|>"
    trained = "".join(chr(i) for i, m in zip(seg.token_ids, seg.loss_mask, strict=True) if m)
    assert trained == "calc 2+3" + EOS + "#5" + EOS  # only what the SGS generated
    assert len(seg.logprobs) == len(seg.token_ids) and seg.prompt_len == len(first.token_ids)
    for call in seg.calls:
        assert set(seg.loss_mask[call.gen_start: call.gen_start + call.gen_len]) == {1}
        assert seg.logprobs[call.gen_start: call.gen_start + call.gen_len] == [-0.5] * call.gen_len


def test_an_edited_history_starts_a_new_segment_and_the_old_one_is_kept():
    t = Transcript(CharChat())
    user = {"role": "user", "content": "2+3?"}
    echoed = _reply(t, t.prepare([user]), "calc 2+3")
    rewritten = {"role": "assistant", "content": "calc 3+2"}  # the agent changed the reply
    edited = t.prepare([user, rewritten, {"role": "user", "content": "again"}])
    assert edited.new and edited.segment == 1
    _reply(t, edited, "#5")
    assert len(t.segments) == 2 and t.segments[0].calls and t.segments[1].prompt_len == len(edited.token_ids)
    dropped = t.prepare([{"role": "user", "content": "other"}])  # an unrelated conversation: also new
    assert dropped.new and dropped.segment == 2
    assert t.prepare([user, echoed, {"role": "user", "content": "x"}]).new  # only the last segment is extended


def test_a_truncated_reply_extends_its_segment_and_the_template_closes_it_as_context():
    t = Transcript(CharChat())
    user = {"role": "user", "content": "q"}
    echoed = _reply(t, t.prepare([user]), "long", stop=False)  # finish_reason length: no EOS generated
    nxt = t.prepare([user, echoed, {"role": "user", "content": "go on"}])
    assert not nxt.new and CharChat().decode(nxt.context).startswith(EOS)  # the template's EOS, not trained


def test_a_tool_call_reply_renders_as_the_text_the_model_generated():
    """The agent echoes a reply whose ``tool_calls`` were parsed from the generated text: the segment
    goes on from the generated ids (the template never re-renders the call its own way)."""
    t = Transcript(CharChat())
    user = {"role": "user", "content": "2+3?"}
    raw = '<tool_call>{"name": "calc", "arguments": {"x": "2+3"}}</tool_call>'
    first = t.prepare([user])
    generated = [ord(c) for c in raw + EOS]
    call = {"id": "call_0", "type": "function", "function": {"name": "calc", "arguments": '{"x": "2+3"}'}}
    reply = {"role": "assistant", "content": None, "tool_calls": [call]}
    t.record(first, generated, [0.0] * len(generated), 0, "tool_calls", reply, raw)
    nxt = t.prepare([user, reply, {"role": "tool", "tool_call_id": "call_0", "content": "5"}])
    assert not nxt.new and CharChat().decode(nxt.context) == "\n<|tool|>5" + EOS + "\n<|assistant|>"


def test_tool_calls_compare_by_name_and_parsed_arguments():
    a = {"role": "assistant", "content": None,
         "tool_calls": [{"id": "x", "type": "function", "function": {"name": "calc", "arguments": '{"a": 1, "b": 2}'}}]}
    b = {"role": "assistant", "content": "",
         "tool_calls": [{"id": "y", "type": "function", "function": {"name": "calc", "arguments": '{"b":2,"a":1}'}}]}
    assert normalize(a) == normalize(b)
    assert normalize({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}) == \
        {"role": "user", "content": "ab"}


def test_bad_input_and_misuse_are_refused():
    t = Transcript(CharChat(), max_segments=2)
    with pytest.raises(ValueError, match="empty"):
        t.prepare([])
    p = t.prepare([{"role": "user", "content": "a"}])
    with pytest.raises(ValueError, match="log-probs"):
        t.record(p, [1, 2], [0.0], 0, "stop", {"role": "assistant", "content": ""}, "")
    _reply(t, p, "x")
    with pytest.raises(ValueError, match="another state"):
        t.record(p, [1], [0.0], 0, "stop", {"role": "assistant", "content": ""}, "")  # prepared before the first record
    _reply(t, t.prepare([{"role": "user", "content": "b"}]), "y")
    with pytest.raises(ValueError, match="started 2 segments"):
        t.prepare([{"role": "user", "content": "c"}])


def test_tool_calls_are_parsed_from_the_generated_text_and_bad_blocks_stay_text():
    from services.gateway.tools import parse_tool_calls

    text = 'Let me compute.\n<tool_call>{"name": "calc", "arguments": {"x": "2+3"}}</tool_call>'
    content, calls = parse_tool_calls(text, "call_s0_")
    assert content == "Let me compute." and calls == [
        {"id": "call_s0_0", "type": "function", "function": {"name": "calc", "arguments": '{"x": "2+3"}'}}]
    only, two = parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}</tool_call>'
                                 '<tool_call>{"name": "b", "arguments": "{}"}</tool_call>', "c")
    assert only is None and [c["function"]["name"] for c in two] == ["a", "b"] and two[1]["id"] == "c1"
    broken = '<tool_call>{"name": calc}</tool_call>'
    assert parse_tool_calls(broken, "c") == (broken, [])
    assert parse_tool_calls("no calls", "c") == ("no calls", [])


def test_a_plain_completion_extends_by_ids_or_by_text_and_otherwise_starts_a_segment():
    t = Transcript(CharChat())
    first = t.prepare_prompt("2+3=")
    assert first.new
    t.record(first, [ord("5")], [-0.1], 2, "length")
    by_text = t.prepare_prompt("2+3=5, 4+4=")
    assert not by_text.new and CharChat().decode(by_text.context) == ", 4+4="
    seg = t.segments[0]
    assert not t.prepare_prompt([*seg.token_ids, ord("!")]).new
    assert t.prepare_prompt("2+3=6").new and t.prepare_prompt([ord("x")]).new
    with pytest.raises(ValueError, match="empty"):
        t.prepare_prompt("")


def test_a_segment_becomes_a_trajectory_whose_turns_are_its_calls():
    from services.gateway.episodes import segment_trajectory

    chat = CharChat()
    t = Transcript(chat)
    user = {"role": "user", "content": "9-2>4="}
    echoed = _reply(t, t.prepare([user]), "9-2", version=3)
    _reply(t, t.prepare([user, echoed, {"role": "user", "content": "=7,"}]), "#5", version=4)
    traj = segment_trajectory(t.segments[0], chat, trajectory_id="g/0", kind="calculator", seed=1, reward=1.0,
                              started_at=0.0, finished_at=1.0)
    assert traj.trajectory_id == "g/0/s0" and traj.prompt_text == "<|user|>9-2>4=<|end|>\n<|assistant|>"
    assert [x.action_text for x in traj.turns] == ["9-2", "#5"]
    assert [x.weight_version for x in traj.turns] == [3, 4] and [x.reward for x in traj.turns] == [0.0, 1.0]
    first = traj.turns[0]
    assert traj.token_ids[first.gen_start + first.gen_len:][: first.obs_len] == tuple(
        chat.encode("\n<|user|>=7,<|end|>\n<|assistant|>"))
    assert traj.turns[1].obs_len == 0 and sum(traj.loss_mask) == traj.generated_tokens == len("9-2#5") + 2 * len(EOS)


def test_an_agent_is_named_module_function_and_checked_at_load():
    from services.gateway.episodes import load_agent

    assert load_agent("examples.calculator_agent:play").__name__ == "play"
    for spec, match in [("nocolon", "module:function"), ("examples.calculator_agent:nope", "nope"),
                        ("no_such_module_x:play", "No module"), ("examples.calculator_agent:PROBLEM", "not callable")]:
        with pytest.raises(ValueError, match=match):
            load_agent(spec)


def test_an_agent_needs_trajectory_level_interaction():
    from services.common.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="needs interaction 'trajectory'"):
        load_config(None, ["agentic.agent=examples.calculator_agent:play", "agentic.interaction=batch"])


def test_the_example_agent_solves_and_runs_the_tool_like_the_task():
    from examples.calculator_agent import solve, tool

    assert solve("247-9>200=") == 193 and tool("12-3") == "=9," and tool("12>3") == "=1," and tool("hi") == "=,"
