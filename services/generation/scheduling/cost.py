"""Per-step cost model of one generation instance (StaleFlow Appendix B, plus a CPU term).

One decode step of an instance with ``n`` running sequences that together hold ``kv`` KV-cache
tokens takes

    T(n, kv) = k1 * kv * b  +  max(k2, k3 * n)  +  k4  +  k5 * n * kv

- ``k1 * kv * b`` — attention reads every cached key/value once (``b`` bytes per token): the
  memory-bound attention term of StaleFlow's T_i(S);
- ``max(k2, k3 * n)`` — the matmuls: reading the weights (k2, memory-bound) or computing
  2 x params FLOPs per sequence (k3 * n, compute-bound), whichever is slower;
- ``k4`` — a constant per step (kernel launches, sampling, the scheduler loop);
- ``k5 * n * kv`` — **not in StaleFlow**: transformers' continuous batching on CPU runs
  attention through SDPA with a dense mask of (all query tokens) x (all cached tokens), so its
  cost grows with n x kv. It is 0 for GPU profiles (paged attention reads each sequence's own
  KV only) and fitted for the measured CPU profile (transformers' dense continuous-batching
  attention, the retired ``cb`` engine's; paged attention, as vLLM's, reads each sequence's own KV).

Admitting a sequence adds ``per_sequence`` (request set-up, the scheduler's bookkeeping,
returning the result: ~3 ms per sequence for the CPU engine behind the SGS core, which
dominates for outputs of a few tokens) and ``prefill_per_token`` per prompt token.

StreamRL's per-token latency PTL(BS) (Eq. 1) is this step time at batch size BS with a
typical context per sequence: ``ptl(bs, context) = T(bs, bs * context)``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepCost:
    k1: float  # s per byte of KV cache read in one step
    k2: float  # s: weight-read floor of one step's matmuls
    k3: float  # s per running sequence (compute-bound matmuls)
    k4: float  # s: constant per step
    kv_bytes_per_token: float
    k5: float = 0.0  # s per (running sequence x cached token): dense-mask attention (CPU engine)
    prefill_per_token: float = 0.0  # s per prompt token prefilled
    per_sequence: float = 0.0  # s per admitted sequence (set-up and completion overhead)

    def __post_init__(self) -> None:
        for name in ("k1", "k2", "k3", "k4", "k5", "prefill_per_token", "per_sequence"):
            if getattr(self, name) < 0:
                raise ValueError(f"step cost {name} must be >= 0, got {getattr(self, name)}")
        if self.kv_bytes_per_token <= 0:
            raise ValueError(f"kv_bytes_per_token must be > 0, got {self.kv_bytes_per_token}")

    def step(self, n: int, kv_tokens: float) -> float:
        """Seconds for one decode step of ``n`` sequences holding ``kv_tokens`` in total."""
        if n <= 0:
            return 0.0
        return (
            self.k1 * self.kv_bytes_per_token * kv_tokens
            + max(self.k2, self.k3 * n)
            + self.k4
            + self.k5 * n * kv_tokens
        )

    def steps(self, n: int, kv_tokens: float, k: int) -> float:
        """Seconds for ``k`` consecutive steps of ``n`` sequences whose KV starts at ``kv_tokens``
        and grows by ``n`` tokens per step (closed form of the sum of ``step``)."""
        if n <= 0 or k <= 0:
            return 0.0
        kv_sum = k * kv_tokens + n * k * (k - 1) / 2.0  # sum over steps of the KV held
        return (
            self.k1 * self.kv_bytes_per_token * kv_sum
            + k * (max(self.k2, self.k3 * n) + self.k4)
            + self.k5 * n * kv_sum
        )

    def prefill(self, tokens: float, sequences: int = 0) -> float:
        """Seconds to admit ``sequences`` sequences holding ``tokens`` prompt tokens in total."""
        return self.prefill_per_token * tokens + self.per_sequence * sequences

    def ptl(self, batch_size: int, context: float) -> float:
        """StreamRL's PTL(BS): seconds per generated token of each sequence in a batch of
        ``batch_size`` sequences with ``context`` cached tokens each."""
        return self.step(batch_size, batch_size * context)


@dataclass(frozen=True)
class InstanceSpec:
    """One generation instance (a data-parallel unit) as the policies and the simulator see it.

    ``kv_capacity_tokens``: KV-cache capacity; ``max_batch``: most sequences in flight (the
    engine's max_num_seqs / the SGS's max_inflight); ``watermark``: fraction of the KV cache kept
    free when admitting new sequences (vLLM's watermark, transformers' safety margin).
    """

    cost: StepCost
    kv_capacity_tokens: int
    max_batch: int
    watermark: float = 0.0

    def __post_init__(self) -> None:
        if self.kv_capacity_tokens < 1:
            raise ValueError(f"kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")

    def kv_bounded_batch(self, prompt_tokens: float, output_tokens: float) -> int:
        """Largest batch whose sequences all fit in the KV cache at full length (StreamRL's
        memory-bounded BS), capped by ``max_batch``; at least 1."""
        per_seq = max(1.0, prompt_tokens + output_tokens)
        fit = int(self.kv_capacity_tokens * (1.0 - self.watermark) // per_seq)
        return max(1, min(self.max_batch, fit))
