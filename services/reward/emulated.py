"""The emulated reward (``reward.kind: emulated``): a declared success rate, never a judgement.

An emulated run (``generation.engine: emulated``, ``trainer.backend: emulated``) generates
SYNTHETIC tokens, so no rule or model can judge them. This kind answers reward 1 ("correct") with
probability ``reward.rate`` and 0 otherwise, drawn from a BLAKE2b hash of the request (its task,
prompt and actions): the same sample gets the same reward on every worker and every retry, and
the share of correct samples follows the rate. Emulation measures time, never learning: the
accuracy an emulated run reports is this rate, give or take its sampling error. Every check of a
request (``check_request``) still runs, so the reward pool's control path is the real one.
"""

from __future__ import annotations

import hashlib
from typing import ClassVar

from services.reward.protocol import RewardRequest, Scored, check_request


class EmulatedReward:
    kind: ClassVar[str] = "emulated"
    judges: ClassVar[bool] = False  # a declared rate: it never reads the answer

    def __init__(self, rate: float, extra_tasks: tuple[str, ...] = ()) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"an emulated reward rate is a probability in [0, 1], got {rate}")
        self.rate = rate
        self.extra_tasks = extra_tasks

    def score(self, request: RewardRequest) -> Scored:
        check_request(request, self.extra_tasks)
        correct = uniform(request) < self.rate
        return Scored(1.0 if correct else 0.0, {"correct": "true" if correct else "false", "emulated": "true"})


def uniform(request: RewardRequest) -> float:
    """A number in [0, 1) that is a function of the request's task, prompt and actions only."""
    h = hashlib.blake2b(digest_size=8)
    for part in (request.task, request.prompt, *request.actions):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return int.from_bytes(h.digest(), "big") / 2**64
