"""OpenAI's response side of the wire: reply bodies, the chunks of a stream, stop sequences (pure).

A stream is framed as OpenAI frames it: server-sent events, each ``data: <json>\\n\\n``, ending with
``data: [DONE]\\n\\n``. A chat stream's chunks (object ``chat.completion.chunk``) open with
``delta: {"role": "assistant", "content": ""}``, carry the content, then each tool call, then a chunk
whose delta is empty and whose ``finish_reason`` is set; a completion stream's (object
``text_completion``) carry the text, then ``text: ""`` with the finish reason. With
``stream_options: {"include_usage": true}`` every chunk has ``"usage": null`` and one more chunk
follows the finish, ``choices: []`` with the call's usage; without it no chunk has a ``usage`` field.
The SGS returns a turn when it is finished, so the content comes in one delta.

A stop sequence ends the reply where its text first holds one: the reply's text stops before it
(OpenAI leaves the sequence out) and the turn keeps the fewest generated ids whose text holds it,
so what Braid records and trains on is what the agent was shown, up to the sequence."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _head(rid: str, obj: str, model: str) -> dict[str, Any]:
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "system_fingerprint": None}


def chat_completion(rid: str, model: str, message: dict[str, Any], finish: str, used: dict[str, int]) -> dict:
    """A chat reply (object ``chat.completion``)."""
    return {**_head(rid, "chat.completion", model),
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}], "usage": used}


def text_completion(rid: str, model: str, text: str, finish: str, used: dict[str, int]) -> dict:
    """A plain completion (object ``text_completion``)."""
    return {**_head(rid, "text_completion", model),
            "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}], "usage": used}


def chat_chunks(rid: str, model: str, message: dict[str, Any], finish: str, used: dict[str, int],
                include_usage: bool) -> Iterator[dict]:
    """The chunks of a streamed chat reply, in OpenAI's order."""
    head = _head(rid, "chat.completion.chunk", model)

    def choice(delta: dict[str, Any], finish_reason: str | None = None) -> list[dict[str, Any]]:
        return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]

    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("content"):
        deltas.append({"content": message["content"]})
    deltas += [{"tool_calls": [{"index": i, **call}]} for i, call in enumerate(message.get("tool_calls", []))]
    chunks = [{**head, "choices": choice(d)} for d in deltas] + [{**head, "choices": choice({}, finish)}]
    yield from _with_usage(chunks, head, used, include_usage)


def completion_chunks(rid: str, model: str, text: str, finish: str, used: dict[str, int],
                      include_usage: bool) -> Iterator[dict]:
    """The chunks of a streamed plain completion, in OpenAI's order."""
    head = _head(rid, "text_completion", model)
    chunks = [{**head, "choices": [{"index": 0, "text": t, "logprobs": None, "finish_reason": f}]}
              for t, f in ([(text, None)] if text else []) + [("", finish)]]
    yield from _with_usage(chunks, head, used, include_usage)


def _with_usage(chunks: list[dict], head: dict, used: dict[str, int], include_usage: bool) -> Iterator[dict]:
    if not include_usage:
        yield from chunks
        return
    for chunk in chunks:
        yield {**chunk, "usage": None}
    yield {**head, "choices": [], "usage": used}


def sse(chunks: Iterable[dict]) -> Iterator[str]:
    """Server-sent events: one ``data:`` line per chunk, a blank line after each, then ``[DONE]``."""
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """Where the first stop sequence in ``text`` begins (None: none there)."""
    hits = [i for s in stops if (i := text.find(s)) >= 0]
    return min(hits) if hits else None


def cut_at_stop(ids: Sequence[int], decode: Callable[[Sequence[int]], str],
                stops: Sequence[str]) -> tuple[int, str] | None:
    """``(kept, text)`` when the text of ``ids`` holds a stop sequence: the fewest leading ids whose
    text holds one, and that text cut before the sequence. A binary search over prefixes (a longer
    prefix's text extends a shorter one's), so a long turn is decoded ~log2(n) times."""
    if not stops or first_stop(decode(ids), stops) is None:
        return None
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if first_stop(decode(ids[:mid]), stops) is None:
            lo = mid + 1
        else:
            hi = mid
    text = decode(ids[:lo])
    cut = first_stop(text, stops)
    assert cut is not None  # the prefix was chosen to hold a stop sequence
    return lo, text[:cut]
