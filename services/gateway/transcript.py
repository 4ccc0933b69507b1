"""Token-exact transcripts of an agent that speaks the OpenAI chat API (pure; no I/O).

An agent sends the whole conversation with every call. Braid keeps, per session, the exact token
ids the policy saw and generated, so nothing the SGS generated is ever re-tokenized (verl #6719's
drift cannot happen):

- The first call's messages are rendered with the model's chat template once and tokenized: the
  prompt of segment 0.
- A call whose messages *extend* the segment's conversation (its messages begin with the
  segment's, the assistant replies exactly as Braid returned them) continues from the stored ids:
  only the text the template adds after them (the new tool results or user turns, then the next
  assistant header) is tokenized, alone, and appended as context (loss mask 0).
- A call that edits history (a changed or dropped message, a rewritten reply, or a template that
  renders earlier turns differently once more follow, so the stored ids are no longer a prefix of
  the rendering) starts a new segment from its own rendering. Each segment is one token sequence
  the trainer consumes; the session's reward applies to all of them.

Generated ids are appended exactly as returned (EOS included when the turn ended there), with the
SGS's log-probs, loss mask 1, and the weight version that generated them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

Message = Mapping[str, Any]

# A chat template that lays a conversation out as Braid's own multi-turn trajectories (what the
# EnvManager builds): BOS, the messages' text in order, EOS after each assistant reply, no role
# markers. For a model trained on that layout without a chat template of its own (the tiny policy).
TRAJECTORY_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['content'] }}"
                       "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{% endfor %}")


class ChatTokenizer(Protocol):
    """What a transcript needs of the policy's tokenizer."""

    def render(self, messages: Sequence[Message], tools: Sequence[Message] | None,
               add_generation_prompt: bool) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...  # special tokens kept (the ids' exact text)

    def decode_text(self, ids: Sequence[int]) -> str: ...  # what an agent reads: special tokens dropped


class HFChatTokenizer:
    """A Hugging Face tokenizer with a chat template: rendering as text (the template applied once),
    ids without added special tokens (the template writes them), decoding that keeps them."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the policy's tokenizer has no chat template: an OpenAI chat endpoint needs one")
        self.tokenizer = tokenizer

    def render(self, messages: Sequence[Message], tools: Sequence[Message] | None, add_generation_prompt: bool) -> str:
        # content as text (None and a list of text parts made a string: templates concatenate it)
        return self.tokenizer.apply_chat_template(
            [{**m, "content": normalize(m)["content"]} for m in messages], tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt, tokenize=False)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def decode_text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def normalize(message: Message) -> dict[str, Any]:
    """The parts of a chat message that the template renders, in one form: ``content`` None and ""
    alike, a list of text parts joined, tool calls as (name, arguments as parsed JSON). The fields
    the OpenAI client adds when a reply is sent back as-is (``refusal``, ``annotations``, ...) and
    tool-call ids drop out, so an agent that echoes a reply extends its segment."""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    out: dict[str, Any] = {"role": message.get("role"), "content": content or ""}
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [_call_key(c) for c in calls]
    if message.get("name"):
        out["name"] = message["name"]
    return out


def _call_key(call: Message) -> tuple[str, str]:
    fn = call.get("function") or {}
    args = fn.get("arguments", "")
    with contextlib.suppress(ValueError):  # text that is not JSON is compared as the text it is
        args = json.dumps(json.loads(args) if isinstance(args, str) else args, sort_keys=True)
    return str(fn.get("name", "")), str(args)


@dataclass(frozen=True)
class Call:
    """One generation inside a segment: where its generated ids sit, and how they came to be."""

    segment: int
    gen_start: int
    gen_len: int
    weight_version: int
    finish_reason: str


@dataclass
class Segment:
    """One token sequence: the rendered prompt, then generated and context ids as the calls came."""

    index: int
    prompt_len: int
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    messages: list[dict[str, Any]] = field(default_factory=list)  # normalized: what the ids hold
    calls: list[Call] = field(default_factory=list)
    raw: dict[int, str] = field(default_factory=dict)  # message index -> the text generated for that reply

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass(frozen=True)
class Prepared:
    """The prompt of one call: ids to generate from, and where they go (``new``: a new segment)."""

    token_ids: tuple[int, ...]
    segment: int
    new: bool
    messages: tuple[dict[str, Any], ...]
    context: tuple[int, ...]  # ids appended before generating (a new segment: all of them)
    raw: tuple[tuple[int, str], ...] = ()  # the segment's generated replies kept (message index, text)


class Transcript:
    """The segments of one session. ``prepare`` a call's prompt, then ``record`` what was generated
    for it; one call at a time (the gateway serializes a session's calls)."""

    def __init__(self, tokenizer: ChatTokenizer, max_segments: int = 16) -> None:
        self.tokenizer = tokenizer
        self.max_segments = max_segments
        self.segments: list[Segment] = []

    def prepare(self, messages: Sequence[Message], tools: Sequence[Message] | None = None) -> Prepared:
        if not messages:
            raise ValueError("messages must not be empty")
        norm = tuple(normalize(m) for m in messages)
        seg = self.segments[-1] if self.segments else None
        if seg is not None and seg.calls and self._extends(seg, norm):
            # Braid's own replies render as the text generated for them (a tool call as the model
            # wrote it, whatever the template would make of ``tool_calls``)
            shown = [{"role": "assistant", "content": seg.raw[i]} if i in seg.raw else m
                     for i, m in enumerate(messages)]
            rendered = self.tokenizer.render(shown, tools, True)
            held = self.tokenizer.decode(seg.token_ids)
            if rendered.startswith(held) and len(rendered) > len(held):
                context = tuple(self.tokenizer.encode(rendered[len(held):]))
                return Prepared(tuple(seg.token_ids) + context, seg.index, False, norm, context, tuple(seg.raw.items()))
        return self._new(tuple(self.tokenizer.encode(self.tokenizer.render(messages, tools, True))), norm)

    def prepare_prompt(self, prompt: str | Sequence[int]) -> Prepared:
        """A plain completion's prompt (``/v1/completions``): one that extends the last segment (its
        ids, or text that starts with what they decode to) continues it, only the new text
        tokenized; any other starts a segment."""
        seg = self.segments[-1] if self.segments and self.segments[-1].calls else None
        if isinstance(prompt, str):
            held = self.tokenizer.decode(seg.token_ids) if seg is not None else None
            if held is not None and prompt.startswith(held):
                context = tuple(self.tokenizer.encode(prompt[len(held):]))
                return Prepared(tuple(seg.token_ids) + context, seg.index, False, (), context)
            return self._new(tuple(self.tokenizer.encode(prompt)), ())
        ids = tuple(int(i) for i in prompt)
        if seg is not None and ids[: len(seg.token_ids)] == tuple(seg.token_ids):
            context = ids[len(seg.token_ids):]
            return Prepared(ids, seg.index, False, (), context)
        return self._new(ids, ())

    def _new(self, ids: tuple[int, ...], norm: tuple[dict[str, Any], ...]) -> Prepared:
        if not ids:
            raise ValueError("the prompt is empty")
        if len(self.segments) >= self.max_segments:
            raise ValueError(f"the session started {self.max_segments} segments (history edits): open a new session")
        return Prepared(ids, len(self.segments), True, norm, ids)

    @staticmethod
    def _extends(seg: Segment, norm: tuple[dict[str, Any], ...]) -> bool:
        n = len(seg.messages)
        return len(norm) > n and list(norm[:n]) == seg.messages

    def record(self, prepared: Prepared, generated: Sequence[int], logprobs: Sequence[float], weight_version: int,
               finish_reason: str, reply: Message | None = None, text: str = "") -> Call:
        """Append what the SGS generated for ``prepared`` (its ids exactly, with their log-probs), the
        reply as returned to the agent (what its next call must echo to extend the segment) and
        ``text``, the generated text exactly (special tokens kept, the final EOS left out: a reply renders
        as it when the conversation goes on); neither for a plain completion."""
        if len(generated) != len(logprobs):
            raise ValueError(f"{len(generated)} generated ids but {len(logprobs)} log-probs")
        if prepared.new:
            if prepared.segment != len(self.segments):
                raise ValueError("a call was prepared against another state of the transcript")
            seg = Segment(prepared.segment, len(prepared.token_ids), list(prepared.token_ids),
                          [0] * len(prepared.token_ids), [0.0] * len(prepared.token_ids))
            self.segments.append(seg)
        else:
            seg = self.segments[prepared.segment]
            if len(seg.token_ids) + len(prepared.context) != len(prepared.token_ids):
                raise ValueError("a call was prepared against another state of the transcript")
            seg.token_ids += prepared.context
            seg.loss_mask += [0] * len(prepared.context)
            seg.logprobs += [0.0] * len(prepared.context)
        call = Call(seg.index, len(seg.token_ids), len(generated), weight_version, finish_reason)
        seg.token_ids += list(generated)
        seg.loss_mask += [1] * len(generated)
        seg.logprobs += [float(x) for x in logprobs]
        if prepared.messages:  # a chat call (a plain completion's segment holds no messages)
            seg.messages = [*prepared.messages, normalize(reply)]
            seg.raw = {**dict(prepared.raw), len(prepared.messages): text}
        seg.calls.append(call)
        return call

    @property
    def calls(self) -> list[Call]:
        return [c for s in self.segments for c in s.calls]
