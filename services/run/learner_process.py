"""The learner in a process of its own, apart from the rollout orchestrator (``trainer.learner``).

``LearnerProcess`` is the learner's interface (``begin``, ``backward``, ``step``, ``stats``,
``state``, ``load_state``, ``weights``) served by a child of the trainer process. The trainer
process keeps the rollout orchestrator (routing, collecting, scoring, the prompt, partial-response
and experience pools, the weight publisher); the child holds the policy's master weights and the
optimizer. Besides them the trainer process keeps

- the *base*: the learner state of the newest recovery checkpoint (``torch.save`` bytes; before
  the first one, none: the checkpoint the run started from), and
- the *log*: every command the learner finished since the base (each ``begin``, the groups of
  each ``backward``, each ``step``).

When the child dies (killed, crashed: its pipe breaks) a new child starts from the base and
replays the log, and the command that was under way runs again. Training is deterministic on
the CPU, so the replayed steps rebuild the weights the dead child had published: no buffered or
in-flight trajectory is lost (the orchestrator went on routing and collecting), and the groups
handed over since the checkpoint are trained again without a second entry in the ledger (the
trainer process wrote it, once). ``revivals`` records each restart.

Weights cross in shared memory: after every step (and load) the child copies its weights into
one shared flat buffer; ``weights`` streams views of it to the publisher, which copies them out
before the next step can change them (both on the learner thread, in order).

The first child is forked when the trainer process starts, before it has a thread or has run a
torch operation (the learner's modules are imported already, so the child imports nothing
again); a replacement is spawned (by then the trainer process runs gRPC and orchestrator threads
and torch's OpenMP pool, and a forked child could inherit a held lock or a dead thread team).
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.multiprocessing as tmp

from services.common.atomic import write_text_atomic
from services.common.config import RunConfig
from services.common.weights import WeightStream, specs_of
from services.policy.model import load_policy
from services.trainer.learner import Group, Learner, StepStats

log = logging.getLogger("braid.learner")
ALIGN = 64  # byte alignment of each tensor in the shared buffer
PID_FILE = "learner.pid"


class LearnerDied(RuntimeError):
    """The learner process ended (its pipe broke) and could not be replaced."""


@dataclass(frozen=True)
class Revival:
    """One restart of the learner process: when it died, when its replacement had replayed the
    log, what the log held."""

    died_at: float
    revived_at: float
    exitcode: int | None
    replayed_steps: int
    replayed_groups: int
    replayed_samples: int
    rollout: dict  # the orchestrator's groups when the learner died (``probe``): none of them is lost


@dataclass(frozen=True)
class Slot:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def layout(stream: WeightStream) -> tuple[list[Slot], int]:
    """Each tensor's place in the flat buffer (aligned), and the buffer's size."""
    slots, offset = [], 0
    for name, spec in stream.specs.items():
        dtype = getattr(torch, spec.dtype)
        nbytes = torch.Size(spec.shape).numel() * torch.empty((), dtype=dtype).element_size()
        slots.append(Slot(name, dtype, tuple(spec.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return slots, offset


def views(flat: torch.Tensor, slots: list[Slot]) -> dict[str, torch.Tensor]:
    return {s.name: flat[s.offset:s.offset + s.nbytes].view(s.dtype).view(s.shape) for s in slots}


# ---------------------------------------------------------------------------------------- the child
def serve(conn, cfg: RunConfig, model_dir: str, inherited=None) -> None:
    """The learner process: build the learner, share the weight buffer, answer commands until the
    pipe closes (the trainer process is gone) or ``close``. ``inherited``: the trainer's end of the
    pipe, which a forked child holds too: closed, or the trainer's death would not close the pipe."""
    if inherited is not None:
        inherited.close()
    torch.set_num_threads(cfg.trainer.threads)
    torch.manual_seed(cfg.trainer.seed)
    try:
        learner = Learner(cfg, load_policy(model_dir, cfg.model.chat_template))
        slots, size = layout(learner.weights())
        flat = torch.zeros(max(size, 1), dtype=torch.uint8).share_memory_()
    except Exception:  # noqa: BLE001 - the trainer process raises it (a start that fails is not retried)
        conn.send(("error", traceback.format_exc(), None))
        return
    shared = views(flat, slots)

    def publish() -> None:
        for name, tensor in learner.weights().checked():
            shared[name].copy_(tensor)

    publish()
    conn.send(("ready", flat, slots))
    while True:
        try:
            cmd, arg = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer = ("ok", _command(learner, cmd, arg, publish))
        except Exception:  # noqa: BLE001 - the trainer process raises it
            answer = ("error", traceback.format_exc())
        try:
            conn.send(answer)
        except OSError:  # the trainer process is gone (BrokenPipeError)
            return
        if cmd == "close":
            return


def _command(learner, cmd: str, arg, publish: Callable[[], None]):
    if cmd == "begin":
        learner.begin()
    elif cmd == "backward":
        learner.backward(arg)
    elif cmd == "step":
        grad_norm = learner.step()
        publish()
        return grad_norm, learner.stats
    elif cmd == "state":
        buf = io.BytesIO()
        torch.save(learner.state(), buf)
        return buf.getvalue()
    elif cmd == "load_state":
        learner.load_state(torch.load(io.BytesIO(arg), map_location="cpu", weights_only=False))
        publish()
    elif cmd != "close":
        raise ValueError(f"unknown learner command {cmd!r}")
    return None


# ---------------------------------------------------------------------------------------- the parent
class LearnerProcess:
    """``max_restarts``: how many dead children are replaced before ``LearnerDied`` ends the run;
    ``on_revive``: told of each restart; ``run_dir``: where ``learner.pid`` names the child;
    ``start``: how the first child starts, ``fork`` only from a process that has not run a torch
    operation yet (a forked child of a process whose OpenMP threads ran can crash in its first
    parallel operation), else ``spawn``."""

    def __init__(self, cfg: RunConfig, model_dir: str, run_dir: Path, max_restarts: int,
                 on_revive: Callable[[Revival], None] | None = None, start: str = "fork") -> None:
        self.cfg, self.model_dir, self.run_dir = cfg, model_dir, Path(run_dir)
        self.max_restarts = max_restarts
        self.on_revive = on_revive
        self.stats = StepStats()
        self.probe: Callable[[], dict] | None = None  # the orchestrator's groups in flight and buffered, at a death
        self.revivals: list[Revival] = []
        self._restarts = 0
        self._base: bytes | None = None
        self._log: list[tuple[str, object]] = []
        self._proc = None
        self._conn = None
        self._shared: dict[str, torch.Tensor] = {}
        self._start(start)

    # ------------------------------------------------------------------ the learner's interface
    def begin(self) -> StepStats:
        self._call("begin")
        self.stats = StepStats()
        return self.stats

    def backward(self, groups: list[Group]) -> None:
        self._call("backward", groups)

    def step(self) -> float:
        grad_norm, stats = self._call("step")
        for f in fields(StepStats):  # into the object ``begin`` returned: the caller holds it
            setattr(self.stats, f.name, getattr(stats, f.name))
        return grad_norm

    def state(self) -> dict:
        """The learner's state (a recovery checkpoint's); it becomes the base replays start from."""
        data = self._call("state")
        self._base, self._log = data, []
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)

    def load_state(self, state: dict) -> None:
        buf = io.BytesIO()
        torch.save(state, buf)
        self._call("load_state", buf.getvalue())
        self._base, self._log = buf.getvalue(), []

    def weights(self) -> WeightStream:
        """The newest step's weights (views of the shared buffer, valid until the next step)."""
        self._ensure_ready()
        return WeightStream(specs_of(self._shared), iter(self._shared.items()))

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def close(self) -> None:
        if self._proc is None:
            return
        with contextlib.suppress(LearnerDied):  # already gone: nothing to close
            self._request("close", None)
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
        self._proc = None

    # ------------------------------------------------------------------ mechanism
    def _start(self, method: str) -> None:
        ctx = tmp.get_context(method)
        parent, child = ctx.Pipe()
        inherited = parent if method == "fork" else None
        proc = ctx.Process(target=serve, args=(child, self.cfg, self.model_dir, inherited), name="braid-learner",
                           daemon=True)
        proc.start()
        child.close()
        self._proc, self._conn, self._shared = proc, parent, {}
        write_text_atomic(self.run_dir / PID_FILE, f"{proc.pid}\n")

    def _ensure_ready(self) -> None:
        if self._shared:
            return
        kind, flat, slots = self._receive()
        if kind == "error":
            raise RuntimeError(f"the learner process failed to start:\n{flat}")
        if kind != "ready":
            raise RuntimeError(f"the learner process said {kind!r} before it was ready")
        self._shared = views(flat, slots)

    def _receive(self):
        try:
            return self._conn.recv()
        except (EOFError, OSError) as err:
            raise LearnerDied(f"the learner process (pid {self.pid}) ended: {err or 'pipe closed'}") from err

    def _request(self, cmd: str, arg):
        self._ensure_ready()
        try:
            self._conn.send((cmd, arg))
        except (BrokenPipeError, OSError) as err:
            raise LearnerDied(f"the learner process (pid {self.pid}) ended: {err}") from err
        kind, reply = self._receive()
        if kind == "error":
            raise RuntimeError(f"the learner process failed on {cmd}:\n{reply}")
        return reply

    def _call(self, cmd: str, arg=None):
        """Run ``cmd`` on the learner, replacing a dead learner (and replaying the log) first."""
        while True:
            try:
                reply = self._request(cmd, arg)
            except LearnerDied as died:
                self._revive(died, time.time(), self.probe() if self.probe is not None else {})
                continue
            if cmd in ("begin", "backward", "step"):
                self._log.append((cmd, arg))
            return reply

    def _revive(self, died: LearnerDied, died_at: float, rollout: dict) -> None:
        """Start another learner from the base and replay the log (again, if it dies meanwhile)."""
        exitcode = self._reap()
        self._restarts += 1
        if self._restarts > self.max_restarts:
            raise LearnerDied(f"{died} (restarted {self._restarts - 1} times already: trainer.recovery.max_restarts)")
        log.warning("%s (exit code %s): starting another from the last checkpoint, replaying %d commands",
                    died, exitcode, len(self._log))
        self._start("spawn")
        try:
            if self._base is not None:
                self._request("load_state", self._base)
            for cmd, arg in self._log:
                self._request(cmd, arg)
        except LearnerDied as again:
            self._revive(again, died_at, rollout)
            return
        backwards = [arg for cmd, arg in self._log if cmd == "backward"]
        revival = Revival(died_at, time.time(), exitcode, sum(1 for cmd, _ in self._log if cmd == "step"),
                          sum(len(g) for g in backwards), sum(len(x.samples) for g in backwards for x in g), rollout)
        self.revivals.append(revival)
        log.warning("learner process %d replaced the dead one: %s", self.pid, asdict(revival))
        if self.on_revive is not None:
            self.on_revive(revival)

    def _reap(self) -> int | None:
        proc, self._proc = self._proc, None
        if self._conn is not None:
            self._conn.close()
        if proc is None:
            return None
        proc.join(timeout=10)
        if proc.is_alive():  # its pipe broke but it runs on: it is no longer ours
            proc.kill()
            proc.join(timeout=10)
        return proc.exitcode
