"""``agentic.enabled``: GRPO on multi-turn trajectories (RollArt §5.3) under the staleness bound.

The rollout thread (``services.rollout.lifecycle``) owns the staleness manager and the groups,
hands the learner its work, and acts on events from the rollout loop (``services.agentic.rollout``):

1. **launch** — a GRPO group is ``group_size`` trajectories of one episode (plus
   ``agentic.redundant_trajectories`` extra ones). It starts when ``StalenessManager.can_reserve``
   allows one at the newest published version V (StaleFlow Algorithm 2) and ``agentic.concurrency``
   leaves room; it is *reserved* with ``V_traj = V``. Every turn of its trajectories is generated
   with ``min_weight_version = V_traj``, so however many versions a trajectory spans, its oldest
   token is no older than V_traj: a trajectory spanning versions is bounded exactly as a partial
   rollout is (``V_traj + eta >= V_buf``). The mode sets eta: ``sync`` (and ``sequential``) 0,
   ``one_step`` 1, ``bounded`` ``trainer.eta``.
2. **interaction** — ``trajectory`` (RollArt): each trajectory is one task that generates and
   steps its environment on its own, then asks for its reward; ``batch`` (the baseline): the
   trajectories launched together form a wave that generates turn k, then steps every
   environment, then turn k + 1, and is scored when the wave ends. The next wave starts once the
   Ready buffers are consumed, as large as the bound then allows (with eta = 1, two steps'
   groups): the baseline's strongest schedule, waves as large as trajectory level's in-flight work.
3. **collect** — a finished trajectory with its reward joins its group. When ``group_size`` have
   finished (the first to finish), the group's other trajectories are cancelled (redundant
   rollouts: the aborted work is counted), DAPO's filter may abort it, otherwise it is
   *occupied*. A trajectory lost to an environment or reward failure is counted and replaced
   by a new trajectory of the same episode (``agentic.max_replacements`` per group; then the
   group is aborted, counted), and the environment pool pauses a worker that looks dead.
4. **train** — the head buffer's occupied groups are final: their gradients are computed as
   they appear; a Ready head buffer is *consumed*: one optimizer step, version + 1, the weights
   offered to every SGS instance.

Every consumed trajectory is checked against the bound (``bound_violations`` must stay 0) and,
with ``agentic.log_trajectories``, written to ``trajectories.jsonl``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
from dataclasses import dataclass, field
from typing import Literal

from services.agentic.episodes import Episode, EpisodeStream
from services.agentic.manager import EnvManager
from services.agentic.rollout import Rollout, Score, ScoreFailed
from services.agentic.runner import run_batch_level
from services.agentic.training import to_sample
from services.agentic.trajectory import Dropped, Trajectory
from services.common.types import SampleRecord
from services.rollout.agentic_report import TrajectoryLog, consumed_metrics
from services.rollout.keeper import FleetKeeper
from services.rollout.lifecycle import GroupLifecycle, drain
from services.rollout.rewards import Outcome
from services.rollout.staleness import ConsumeResult
from services.run.runtime import Published, TrainerRuntime
from services.trainer.learner import Group

log = logging.getLogger("braid.agentic")

# always in the metrics: launched = finished + dropped + aborted + still running
COUNTED = ("groups_launched", "trajectories_launched", "trajectories_finished", "trajectories_dropped",
           "trajectories_aborted", "replacements", "aborted_tokens", "dropped_tokens")
COLLECT_S = 0.05


@dataclass
class _Member:
    tid: str
    group: str
    index: int
    env: int  # the environment worker's index in the pool
    manager: EnvManager
    state: Literal["pending", "running"] = "pending"
    future: object = None  # concurrent.futures.Future of its task (trajectory level)


@dataclass
class _Group:
    key: str
    episode: Episode
    v_traj: int
    finished: dict[int, tuple[Trajectory, Score]] = field(default_factory=dict)
    next_index: int = 0
    replacements: int = 0


class AgenticRunner(GroupLifecycle):
    def __init__(self, rt: TrainerRuntime, rollout: Rollout, held_out: list[Episode]) -> None:
        super().__init__(rt)
        self.a, self.rollout = rt.cfg.agentic, rollout
        self.episodes = EpisodeStream(self.a, rt.cfg.task.seed, held_out)
        self.per_group = self.tc.group_size + self.a.redundant_trajectories
        self.events: queue.Queue = queue.Queue()
        self.groups: dict[str, _Group] = {}
        self.members: dict[str, _Member] = {}  # pending or running
        self.pending: list[_Member] = []
        self.running = 0
        self.wave = None  # the running wave's future (batch level)
        self.kept: dict[str, list[tuple[int, Trajectory, Score]]] = {}  # occupied groups' trajectories (metrics, log)
        self.counts.update(dict.fromkeys(COUNTED, 0))
        self.created = 0  # groups created by this attempt (their keys)
        self.log = TrajectoryLog(rt.run_dir / "trajectories.jsonl") if self.a.log_trajectories else None
        if rt.runner_state is not None and "episodes" in rt.runner_state:  # resumed from a recovery checkpoint
            self.episodes.restore(rt.runner_state["episodes"])
        # the generator's fleet table (``SgsGenerator``; None for a generator of another kind): lost
        # instances' turns re-run elsewhere; they come back when restarted
        self.fleet = getattr(rollout.generator, "fleet", None)
        rt.publisher.push_errors_fatal = False  # a failed push loses that instance (on the table, at once)
        # readmission and scale-out membership (the table's rows); the publisher offers by the same table
        # (the run's: ``build_agentic(..., trainer.fleet)``) and records the version each instance was offered
        self.keeper = FleetKeeper(rt, self.fleet, self.counts) if self.fleet is not None else None
        self.latest: tuple[int, object] = (rt.version, rt.start_snapshot)
        self.start_head()

    def checkpoint_state(self) -> dict:
        """The recovery checkpoint's part: the data cursors (groups in flight are not kept: a
        restarted trainer draws new episodes)."""
        return {"sampler": self.rt.sampler.state(), "episodes": self.episodes.state()}

    def tick(self) -> None:
        self._readmit()
        self._launch()
        self._collect(COLLECT_S)
        self.head.train_head()

    def published(self, out: Published) -> None:
        self.latest = (out.version, out.snapshot)

    def _readmit(self) -> None:
        """A lost instance (its turn failed UNAVAILABLE, or its weight push failed: either marks its row
        at once) is noticed; one that answers again (restarted by the launcher) takes the newest weights
        and serves again; instances join and leave with scale-out (``keeper.FleetKeeper``)."""
        if self.keeper is not None:
            self.keeper.poll(self.latest)

    def before_step(self) -> None:
        if self.a.interaction == "trajectory":
            self._launch()  # what the bound allows now starts before the optimizer step and runs during it

    # ------------------------------------------------------------------ launching
    def _room(self) -> int:
        return self.a.concurrency - self.running - len(self.pending)

    def _launch(self) -> None:
        batch = self.a.interaction == "batch"
        if not batch or (self.running == 0 and not self.pending):  # batch level: a wave at a time
            while self._room() >= self.per_group and self.mgr.can_reserve(self.version):
                self._new_group()
        self._start_pending()
        if self.running == 0 and not self.pending and not self.mgr.ready() and not self.waiting_for_a_step():
            raise RuntimeError(f"nothing in flight and no group can start at version {self.version} "
                               f"(head buffer {self.mgr.head} is {self.mgr.state(self.mgr.head)})")

    def _new_group(self) -> None:
        ep = self.episodes.next()
        key = f"{ep.kind}-{ep.seed}-a{self.rt.attempt}g{self.created}"
        self.created += 1
        self.mgr.reserve(key, self.version)
        g = self.groups[key] = _Group(key, ep, self.version)
        for _ in range(self.per_group):
            self._add_member(g)
        self.counts["groups_launched"] += 1

    def _add_member(self, g: _Group) -> None:
        tid = f"{g.key}/{g.next_index}"
        manager, env = self.rollout.manager(tid, g.episode, g.v_traj)
        m = _Member(tid, g.key, g.next_index, env, manager)
        g.next_index += 1
        self.members[tid] = m
        self.pending.append(m)
        self.counts["trajectories_launched"] += 1

    def _start_pending(self) -> None:
        if not self.pending:
            return
        if self.a.interaction == "trajectory":
            for m in self.pending:
                m.state, m.future = "running", self.rollout.loop.submit(self._run_one(m))
        elif self.running == 0:
            for m in self.pending:
                m.state = "running"
            self.wave = self.rollout.loop.submit(self._run_wave(list(self.pending)))
            self.counts["waves"] += 1
        else:
            return
        self.running += len(self.pending)
        self.pending = []

    # ------------------------------------------------------------------ on the rollout loop
    async def _run_one(self, m: _Member) -> None:
        try:
            result = await m.manager.run()
            await self._report(m, result)
        except asyncio.CancelledError:
            m.manager.abandon()
            self.events.put(("cancelled", m.tid, m.manager.generated_tokens))
            raise
        except BaseException as exc:  # noqa: BLE001 - surfaced on the rollout thread
            self.events.put(("error", m.tid, exc))
        await m.manager.wait_closed()

    async def _run_wave(self, wave: list[_Member]) -> None:
        try:
            await run_batch_level([m.manager for m in wave])
        except asyncio.CancelledError:  # the run ended (shutdown): close the wave's sessions
            for m in wave:
                m.manager.abandon()
            raise
        except BaseException as exc:  # noqa: BLE001
            self.events.put(("error", wave[0].tid, exc))
            return
        try:
            async with asyncio.TaskGroup() as tg:  # rewards of the whole wave, after it (batch style)
                for m in wave:
                    tg.create_task(self._report(m, m.manager.result()))
        except BaseException as exc:  # noqa: BLE001
            self.events.put(("error", wave[0].tid, exc))

    async def _report(self, m: _Member, result: Trajectory | Dropped) -> None:
        if isinstance(result, Dropped):
            self.events.put(("dropped", m.tid, result))
            return
        try:
            score = await self.rollout.scorer.score(result)
        except ScoreFailed as err:
            self.events.put(("dropped", m.tid, Dropped(result.trajectory_id, result.env_kind, result.seed,
                                                       result.num_turns, f"reward: {err}", err.code,
                                                       result.generated_tokens)))
            return
        self.events.put(("done", m.tid, result, score))

    # ------------------------------------------------------------------ collecting
    def _collect(self, timeout: float) -> None:
        drain(self.events, timeout, self._on_event)

    def _on_event(self, event: tuple) -> None:
        kind, tid = event[0], event[1]
        if kind == "error":
            raise RuntimeError(f"trajectory {tid} failed: {event[2]!r}") from event[2]
        m = self.members.pop(tid, None)
        if m is None:  # cancelled by the runner already: its work is thrown away
            self.counts["aborted_tokens"] += event[2] if kind == "cancelled" else event[2].generated_tokens
            if kind == "done":
                self.counts["finished_after_abort"] += 1
            return
        self.running -= 1
        g = self.groups[m.group]
        if kind == "dropped":
            self._on_dropped(g, m, event[2])
        elif kind == "done":
            self._on_done(g, m, event[2], event[3])
        else:
            raise AssertionError(f"{tid}: {kind} of a member the runner did not cancel")

    def _on_done(self, g: _Group, m: _Member, traj: Trajectory, score: Score) -> None:
        self.counts["trajectories_finished"] += 1
        g.finished[m.index] = (traj, score)
        if len(g.finished) >= self.tc.group_size:
            self._complete(g)

    def _on_dropped(self, g: _Group, m: _Member, d: Dropped) -> None:
        self.counts["trajectories_dropped"] += 1
        self.counts[f"dropped_{d.code}"] += 1
        self.counts["dropped_tokens"] += d.generated_tokens
        self.counts[f"dropped_on_env_{m.env}"] += 1
        self.rollout.envs.failed(m.env, d.code)
        log.warning("trajectory %s dropped after %d turns: %s", d.trajectory_id, d.turns_done, d.reason)
        live = sum(1 for x in self.members.values() if x.group == g.key)
        if len(g.finished) + live >= self.tc.group_size:
            return  # the group's other (redundant) trajectories can still fill it
        if g.replacements < self.a.max_replacements:
            g.replacements += 1
            self.counts["replacements"] += 1
            self._add_member(g)
        else:
            self.abort(g.key, "failures")

    def _complete(self, g: _Group) -> None:
        self._cancel_members(g.key)  # the group is full: its other trajectories are surplus
        done = sorted(g.finished.items(), key=lambda kv: kv[1][0].finished_at)[: self.tc.group_size]
        samples, outcomes = [], []
        for _, (traj, score) in done:  # an agent's earlier segments (history edits) train with the same reward
            for part in (*traj.segments, traj):
                samples.append(to_sample(part, g.key, len(samples)))
                outcomes.append(Outcome(score.reward, score.reward == 1.0))
        if self.complete(g.key, samples, outcomes):
            self.kept[g.key] = [(idx, traj, score) for idx, (traj, score) in done]

    def _cancel_members(self, key: str) -> None:
        """Abandon a group's trajectories still pending or running (their work is counted as aborted)."""
        for m in [x for x in self.members.values() if x.group == key]:
            del self.members[m.tid]
            self.counts["trajectories_aborted"] += 1
            if m.state == "pending":
                self.pending.remove(m)
                continue
            self.running -= 1
            if m.future is not None:  # trajectory level; a wave's member runs to the wave's end, ignored
                m.future.cancel()

    def forget(self, key: str, reason: str) -> None:
        """A group left the staleness manager (aborted): cancel its trajectories, drop what it kept."""
        if key not in self.groups:
            return
        self.counts[f"groups_aborted_{reason}"] += 1
        self._cancel_members(key)
        self.groups.pop(key, None)
        self.kept.pop(key, None)

    # ------------------------------------------------------------------ training
    def staleness_of(self, result: ConsumeResult, sample: SampleRecord) -> int:
        return result.buffer_version - self.groups[sample.group_id].v_traj  # however many versions it spanned

    def step_metrics(self, result: ConsumeResult, keys: list[str], groups: list[Group]) -> dict:
        kept = {key: self.kept.pop(key) for key in keys}
        if self.log is not None:
            self.log.write(result.buffer_version + 1, result.buffer_version, kept)
        for key in keys:
            self.groups.pop(key)
        lost = {} if self.fleet is None else {"instances_lost": self.fleet.losses,
                                              "instance_turns": [r.placed for r in self.fleet.snapshot().rows],
                                              "turns_rerun": getattr(self.rollout.generator, "lost_turns", 0)}
        return consumed_metrics(kept) | {"interaction": self.a.interaction, **lost}

    def shutdown(self) -> None:
        for key in list(self.groups):
            self._cancel_members(key)
        if self.wave is not None:
            self.wave.cancel()
        self.pending = []
        if self.log is not None:
            self.log.close()
