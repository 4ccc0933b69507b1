"""An agent that speaks only the OpenAI API and plays Braid's calculator task (docs/gateway.md).

Braid runs it once per episode with ``agentic.agent=examples.calculator_agent:play``: it gets the
gateway's base URL, the episode's session key, the model name and the problem (the task's first
observation, e.g. ``247-9>200=``: start at 247, subtract 9 while the value is above 200), talks to
the policy through the official ``openai`` client, runs the calculator tool itself, and returns its
reward (1.0 for the right final answer). It knows nothing of Braid's environments or tokens: the
gateway records what the policy saw and generated.

Turn protocol (the task's): the model answers with a tool call ``A-B`` or ``A>B`` (the agent replies
``=RESULT,``), or with its final answer ``#N``; anything else gets ``=,`` and costs the turn.
"""

from __future__ import annotations

import re

import openai

PROBLEM = re.compile(r"(\d+)-(\d+)>(\d+)=")
CALL = re.compile(r"(\d{1,9})([->])(\d{1,9})")
ANSWER = re.compile(r"#(\d{1,9})")


def solve(prompt: str) -> int:
    """The problem's answer: subtract while above the threshold."""
    m = PROBLEM.fullmatch(prompt)
    if m is None:
        raise ValueError(f"not a calculator problem: {prompt!r}")
    n, d, limit = (int(x) for x in m.groups())
    while n > limit:
        n -= d
    return n


def tool(text: str) -> str:
    """The calculator tool's reply to a turn's text (``=,`` when it is not a call)."""
    m = CALL.fullmatch(text)
    if m is None:
        return "=,"
    a, op, b = int(m[1]), m[2], int(m[3])
    return f"={a - b if op == '-' else int(a > b)},"


def play(episode) -> float:
    """One episode (``services.gateway.episodes.AgentEpisode``); returns its reward."""
    client = openai.OpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0, timeout=300)
    messages: list[dict] = [{"role": "user", "content": episode.prompt}]
    for _ in range(episode.max_turns):
        reply = client.chat.completions.create(model=episode.model, messages=messages, max_tokens=episode.max_tokens)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))  # sent back as returned: the gateway extends its ids
        text = (message.content or "").strip()
        if m := ANSWER.fullmatch(text):
            return float(int(m[1]) == solve(episode.prompt))
        messages.append({"role": "user", "content": tool(text)})
    return 0.0
