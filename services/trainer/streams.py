"""Mechanism around the SGS client: sample streams read on threads, weights pushed on a thread.

``SampleStream`` runs one Generate call on a background thread and hands samples to the
trainer through a queue, so two iterations' streams can be open at once (one-step
asynchrony). ``WeightPublisher`` pushes weight versions from a background thread: the
trainer pays only for a snapshot copy and returns to training; a newer version supersedes one
not yet sent. A failure on either thread is re-raised in the trainer at its next call.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import torch

from services.common.types import GenerateParams, PromptSpec, SampleRecord
from services.generation.client import GenerationClient

_END = object()


class SampleStream:
    def __init__(self, client: GenerationClient, prompts: list[PromptSpec], params: GenerateParams) -> None:
        self.expected = len(prompts) * params.samples_per_prompt
        self.submitted_at = time.time()
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(
            target=self._read, args=(client, prompts, params), name=f"stream-{params.tag}", daemon=True
        )
        self._thread.start()

    def _read(self, client: GenerationClient, prompts: list[PromptSpec], params: GenerateParams) -> None:
        try:
            for sample in client.generate(prompts, params):
                self._queue.put(sample)
            self._queue.put(_END)
        except BaseException as exc:  # surfaced to the consumer
            self._queue.put(exc)

    def __iter__(self) -> Iterator[SampleRecord]:
        received = 0
        while True:
            item = self._queue.get()
            if item is _END:
                if received != self.expected:
                    raise RuntimeError(f"stream ended after {received} of {self.expected} samples")
                return
            if isinstance(item, BaseException):
                raise RuntimeError(f"generation stream failed: {item}") from item
            received += 1
            yield item


class WeightPublisher:
    def __init__(self, client: GenerationClient, chunk_bytes: int) -> None:
        self._client = client
        self._chunk_bytes = chunk_bytes
        self._cond = threading.Condition()
        self._next: tuple[int, dict[str, torch.Tensor]] | None = None
        self._error: BaseException | None = None
        self._closed = False
        self.published = 0
        self.push_seconds: dict[int, float] = {}
        self._thread = threading.Thread(target=self._run, name="weight-publisher", daemon=True)
        self._thread.start()

    def publish(self, model: torch.nn.Module, version: int) -> float:
        """Snapshot ``model``'s weights for ``version`` and return the trainer-side stall (s)."""
        t0 = time.perf_counter()
        self.raise_if_failed()
        snapshot = {k: v.detach().clone() for k, v in model.state_dict().items()}
        with self._cond:
            self._next = (version, snapshot)
            self._cond.notify_all()
        return time.perf_counter() - t0

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"weight push failed: {self._error}") from self._error

    def wait(self, version: int, timeout_s: float = 600) -> None:
        """Block until ``version`` (or newer) has been handed to the SGS."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self.published < version:
                self.raise_if_failed()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"weight version {version} not published within {timeout_s}s")
                self._cond.wait(min(remaining, 0.5))

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._next is None and not self._closed:
                    self._cond.wait()
                if self._next is None:
                    return
                version, state = self._next
                self._next = None
            try:
                t0 = time.perf_counter()
                self._client.update_weights(state, version, chunk_bytes=self._chunk_bytes)
                self.push_seconds[version] = time.perf_counter() - t0
            except BaseException as exc:
                self._error = exc
                with self._cond:
                    self._cond.notify_all()
                return
            with self._cond:
                self.published = version
                self._cond.notify_all()
