"""The weight plane: relays holding the latest weight versions (``python -m services.weights``).

See ``docs/weights.md``: store (K versions, read/write locking, shared memory), server (Push,
Pull, chained pipelined broadcast, re-link), chain (the pure broadcast plan), controller
(heartbeats, re-planning, master replacement), client, transport (how the trainer's versions
reach the SGS instances), certs (TLS on cross-site links), datachan / dataplane / datapath (the
raw-TCP data channel beside gRPC: tokens and framing, the relay's side, the client's side).
"""
