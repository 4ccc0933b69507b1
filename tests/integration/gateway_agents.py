"""Agents for the gateway's training test (``agentic.agent=tests.integration.gateway_agents:NAME``):
they speak only the OpenAI API, like ``examples/calculator_agent.py``."""

from __future__ import annotations

import openai

from examples.calculator_agent import play, tool


def restarting(episode) -> float:
    """Plays one turn, then starts the conversation over (a history edit: the gateway records a new
    segment) and plays the episode from the problem."""
    client = openai.OpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0, timeout=300)
    first = client.chat.completions.create(model=episode.model, max_tokens=episode.max_tokens,
                                           messages=[{"role": "user", "content": episode.prompt}])
    tool((first.choices[0].message.content or "").strip())  # looked at, then thrown away
    return play(episode)
