"""The generation log: every finished sample's (prompt, response length, weight version).

The SGS appends one row per finished sample (interrupted partial-rollout segments are not
finished samples and are not logged); the ranker retrains on the most recent rows (online
adaptation: output lengths drift as the policy trains). One SQLite file in WAL mode, so several
SGS processes can append to the same log while a reader retrains from it.

``response_length`` is in **tokens** of the policy's tokenizer (what the SGS generated).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import astuple, dataclass
from pathlib import Path

SCHEMA_VERSION = 1
_COLUMNS = ("prompt_id", "prompt", "response_length", "weight_version", "instance", "finished_at")
_CREATE = f"""
CREATE TABLE IF NOT EXISTS generations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    prompt_id TEXT NOT NULL,
    prompt TEXT NOT NULL,
    response_length INTEGER NOT NULL CHECK (response_length > 0),
    weight_version INTEGER NOT NULL,
    instance INTEGER NOT NULL,
    finished_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}');
"""


@dataclass(frozen=True)
class GenRecord:
    """One finished sample. ``response_length`` in generated tokens (> 0)."""

    prompt_id: str
    prompt: str
    response_length: int
    weight_version: int
    instance: int
    finished_at: float


class GenerationLogError(ValueError):
    """The log file is not a generation log of this schema, or a record is invalid."""


class GenerationLog:
    """Append-only log of finished samples in one SQLite file (safe across threads and processes)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        row = self._open()
        if row is None or int(row[0]) != SCHEMA_VERSION:
            raise GenerationLogError(
                f"{self.path}: generation log schema {row[0] if row else '?'}, this Braid reads {SCHEMA_VERSION}"
            )

    def _open(self, patience_s: float = 30.0) -> tuple | None:
        """Connect, switch to WAL, create the tables if new; the schema row. Processes that open one
        new file at once (every SGS of a run) can be refused "database is locked" without SQLite's
        busy handler being asked (switching the journal mode, a reader upgrading to writer): such an
        open is tried again until ``patience_s`` has passed."""
        deadline = time.monotonic() + patience_s
        while True:
            db = None
            try:
                db = sqlite3.connect(self.path, timeout=patience_s, check_same_thread=False, isolation_level=None)
                db.execute("PRAGMA journal_mode=WAL")
                db.executescript(_CREATE)
                row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            except sqlite3.DatabaseError as err:
                if db is not None:
                    db.close()
                if isinstance(err, sqlite3.OperationalError) and "locked" in str(err) and time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                raise GenerationLogError(f"{self.path}: not a generation log ({err})") from None
            self._db = db
            return row

    def append(self, records: Iterable[GenRecord]) -> int:
        """Append records in one transaction; returns how many. Rejects a non-positive length."""
        rows = [astuple(r) for r in records]
        for r in rows:
            if r[2] <= 0:
                raise GenerationLogError(f"{self.path}: response_length must be > 0 (prompt_id {r[0]!r} has {r[2]})")
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    f"INSERT INTO generations ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})", rows
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return len(rows)

    def recent(self, n: int) -> list[GenRecord]:
        """The ``n`` most recently appended records, oldest first."""
        if n <= 0:
            raise ValueError(f"n must be positive, got {n}")
        with self._lock, self._readable():
            rows = self._db.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM generations ORDER BY id DESC LIMIT ?", (n,)
            ).fetchall()
        for r in rows:  # SQLite keeps any value in any column: a row written by something else may not fit
            if not (isinstance(r[0], str) and isinstance(r[1], str) and isinstance(r[2], int) and r[2] > 0
                    and isinstance(r[3], int) and isinstance(r[4], int) and isinstance(r[5], (int, float))):
                raise GenerationLogError(f"{self.path}: a row of the wrong types ({', '.join(_COLUMNS)}): {r!r:.200}")
        return [GenRecord(*r) for r in reversed(rows)]

    def count(self) -> int:
        with self._lock, self._readable():
            return int(self._db.execute("SELECT COUNT(*) FROM generations").fetchone()[0])

    @contextmanager
    def _readable(self):
        """A damaged file or a table of another shape: ``GenerationLogError`` naming the file."""
        try:
            yield
        except sqlite3.DatabaseError as err:
            raise GenerationLogError(f"{self.path}: not a readable generation log ({err})") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> GenerationLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
