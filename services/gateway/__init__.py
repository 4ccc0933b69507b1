"""OpenAI-compatible gateway: agents that speak the OpenAI API play Braid's rollouts (issue 33)."""
