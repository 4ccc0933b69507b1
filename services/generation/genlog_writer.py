"""Appends every finished sample of one SGS instance to the generation log (``ranker/genlog.py``).

The core calls ``record(sample)`` on its own thread; this only enqueues. A background thread
decodes the prompt text with the checkpoint's tokenizer (the ranker learns from text) and
appends rows in batches, so the engine loop never waits on SQLite. Interrupted partial-rollout
segments are not finished samples and never reach it; samples with no generated token are
skipped (the log requires a positive length). ``check()`` re-raises a failure of the thread in
the process supervisor.
"""

from __future__ import annotations

import queue
import threading

from services.common.types import SampleRecord

_BATCH = 256


class GenLogWriter:
    def __init__(self, path: str, model_dir: str, instance: int) -> None:
        self.path = path
        self.model_dir = model_dir
        self.instance = instance
        self.error: BaseException | None = None
        self.written = 0
        self._queue: queue.Queue[SampleRecord | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="genlog", daemon=True)
        self._thread.start()

    def record(self, sample: SampleRecord) -> None:
        if sample.token_ids:
            self._queue.put(sample)

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"generation log {self.path} failed: {self.error!r}") from self.error

    def close(self, timeout_s: float = 30.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        try:
            from transformers import AutoTokenizer

            from ranker.genlog import GenerationLog, GenRecord

            tokenizer = AutoTokenizer.from_pretrained(self.model_dir, local_files_only=True)
            with GenerationLog(self.path) as log:
                done = False
                while not done:
                    batch = [self._queue.get()]
                    while len(batch) < _BATCH:
                        try:
                            batch.append(self._queue.get_nowait())
                        except queue.Empty:
                            break
                    done = batch[-1] is None or None in batch
                    rows = [
                        GenRecord(
                            prompt_id=s.prompt_id,
                            prompt=tokenizer.decode(list(s.prompt_token_ids), skip_special_tokens=True),
                            response_length=len(s.token_ids),
                            weight_version=s.weight_version,
                            instance=self.instance,
                            finished_at=s.finished_at,
                        )
                        for s in batch
                        if s is not None
                    ]
                    if rows:
                        self.written += log.append(rows)
        except BaseException as exc:  # noqa: BLE001 - surfaced by check() in the process supervisor
            self.error = exc
