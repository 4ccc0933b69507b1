"""Real-engine part of ``bench/dispatch.py``: 2 instance processes of the tiny model behind the real
SGS router, forced-length replay of the estimates file's lengths, one router per policy.

The step cost is profiled **in situ**: uniform forced-length batches sent to both instances
at once through gRPC (so the profile sees the same CPU sharing, polling and RPC overheads as
the runs) and fitted as ``braid profile`` does. One router process per configuration is up
at once (the instances are shared; "+fcfs" configurations tell the router not to forward
estimates, so the instances' LPT queue degenerates to FCFS), each warmed with a request drawn
from the rows outside the batch (it warms the engines and gives the router its recent length
distribution and the ranker's error model). Then ``repeats`` rounds, each one pass over the
profile grid followed by one timed Generate call of the batch per configuration: this host is
shared and its speed drifts 2-3x within minutes, so profile points and timed calls are
interleaved and each keeps its fastest round (the least disturbed by other load). The
simulator replays the *same* assignment (read from the router's timeline) with the in-situ
profile: ``sim_error`` is the mean relative error of the simulated vs the measured makespan,
so it measures the engine model (mixed lengths, continuous batching, admission order), not
the dispatch's randomness. The error with the shipped ``braid profile`` file is reported too
(``sim_error_shipped``), and with the shipped profile **calibrated** on a separate short run
(``sim_error_shipped_calibrated``), and the **calibrated** profile (``sim_error_calibrated``): the
in-situ profile's shape scaled to a separate mixed-length call. Each round also sends as many
samples as the batch, drawn from rows outside the batch, through the round-robin router; the
fastest of those calls' per-instance makespans fit one scale factor
(``allocator.simulator.calibrate_spec``) on the in-situ profile (uniform batches miss what
mixed-length continuous batching on the serving path costs) and, for comparison, on the shipped
profile (measured on the retired ``cb`` engine, whose cost *shape* is wrong for vLLM: no scale
fixes a shape). Both are judged on the timed benchmark calls they never saw.

Lengths: the batch's token lengths scaled so the longest is ``REAL_CAP`` tokens (the tiny model
has 512 positions); prompts are ``clamp(chars / 40, 4, 40)`` tokens of filler.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from pathlib import Path

REAL_CAP = 200
INSTANCES = 2
MAX_INFLIGHT = 32
CALIB_ROUTER = "round_robin+fcfs"  # the router the calibration run goes through
QUICK = ("random+fcfs", "round_robin+fcfs", "lpt+lpt", "streamrl+lpt")
FULL = (*QUICK, "least_loaded+fcfs", "streamrl_naive+lpt", "lpt+lpt/oracle", "streamrl+lpt/oracle")


def _prompt_tokens(text: str) -> int:
    return max(4, min(40, len(text) // 40))


def _specs(rows, idx, scale, cpt, oracle: bool, tag: str):
    from services.common.types import PromptSpec

    out = []
    for k, i in enumerate(idx):
        n = min(REAL_CAP, max(1, round(rows[i].response_length / cpt * scale)))
        est = float(n) if oracle else rows[i].estimated_length
        out.append(PromptSpec(f"{tag}{k}", tuple([1] + [5] * (_prompt_tokens(rows[i].prompt) - 1)), "", est, n))
    return out


def _jobs_from_timeline(timeline: Path, call: int, prompts) -> list[list]:
    """The jobs each instance ran in ``call`` (the router's actual assignment)."""
    from services.generation.scheduling import Job

    events = [json.loads(x) for x in timeline.read_text().splitlines()]
    by_id = {p.prompt_id: p for p in prompts}
    jobs: list[list[Job]] = [[] for _ in range(INSTANCES)]
    for e in events:
        if e["event"] == "sample" and e["call"] == call:
            p = by_id[e["seq"].rsplit("/", 1)[0]]
            jobs[e["instance"]].append(Job(e["seq"], len(p.token_ids), p.forced_length, p.estimated_length))
    return jobs


def _simulate_from_timeline(timeline: Path, call: int, prompts, forward: bool, spec) -> tuple[float, list[float]]:
    """Replay the router's actual assignment of ``call`` on the profile; returns
    (makespan, per-instance makespans)."""
    from services.generation.scheduling import run_instance

    jobs = _jobs_from_timeline(timeline, call, prompts)
    order = "lpt" if forward else "fcfs"
    per = [run_instance(j, spec, order).makespan_s if j else 0.0 for j in jobs]
    return max(per), per


def _measured_per_instance(timeline: Path, call: int) -> list[float]:
    events = [json.loads(x) for x in timeline.read_text().splitlines()]
    d = next(e for e in events if e["event"] == "dispatch" and e["call"] == call)
    ends = [0.0] * INSTANCES
    for e in events:
        if e["event"] == "sample" and e["call"] == d["call"]:
            ends[e["instance"]] = max(ends[e["instance"]], e["finished_at"] - d["t"])
    return ends


IN_SITU_GRID = [(1, 8, 32), (4, 8, 32), (16, 8, 32), (32, 8, 32), (1, 8, 128), (8, 8, 128), (32, 8, 128),
                (4, 40, 32), (32, 40, 32), (32, 8, 2), (32, 40, 2), (64, 8, 2)]


class InSituProfile:
    """Uniform forced-length batches sent to every instance at once through gRPC; each grid
    point keeps its fastest round (the least disturbed by other load on the host)."""

    def __init__(self, instances: list[str]) -> None:
        from services.generation.client import GenerationClient

        self.clients = [GenerationClient(a) for a in instances]
        self.best = [float("inf")] * len(IN_SITU_GRID)
        self.rounds = 0

    def measure_round(self) -> None:
        import threading

        from services.common.types import GenerateParams, PromptSpec

        r = self.rounds
        for k, (bs, p, n) in enumerate(IN_SITU_GRID):
            times = [0.0] * len(self.clients)

            def run(i: int, k: int = k, bs: int = bs, p: int = p, n: int = n, times: list[float] = times) -> None:
                prompts = [PromptSpec(f"prof{r}-{k}-{j}", (1, *[5] * (p - 1)), "", 0.0, n) for j in range(bs)]
                t0 = time.perf_counter()
                list(self.clients[i].generate(prompts, GenerateParams()))
                times[i] = time.perf_counter() - t0

            threads = [threading.Thread(target=run, args=(i,)) for i in range(len(self.clients))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.best[k] = min(self.best[k], statistics.fmean(times))
        self.rounds += 1

    def fit(self, kv_bytes_per_token: float):
        from allocator.profiler import Measurement, fit_step_cost
        from services.generation.scheduling import StepCost

        for c in self.clients:
            c.close()
        ms = [Measurement(bs, p, n, t) for (bs, p, n), t in zip(IN_SITU_GRID, self.best, strict=True)]
        coef, err = fit_step_cost(ms)
        cost = StepCost(k1=coef["k1b"] / kv_bytes_per_token, k2=coef["k2"], k3=coef["k3"], k4=coef["k4"], k5=coef["k5"],
                        prefill_per_token=coef["prefill_per_token"], per_sequence=coef["per_sequence"],
                        kv_bytes_per_token=kv_bytes_per_token)
        return cost, err, [m.__dict__ for m in ms]


def run_real(rows, cpt: float, *, quick: bool, seed: int) -> dict:
    from dataclasses import replace as dc_replace

    from flows.processes import Supervisor, start_instances
    from services.common.config import load_config, write_config
    from services.generation.scheduling.profiles import load_profile, shipped_profile
    from services.policy.model import build_policy, save_policy

    n, repeats = (512, 3) if quick else (1024, 4)
    rng = random.Random(seed + 1)
    order = list(range(len(rows)))
    rng.shuffle(order)
    batch, rest = order[:n], order[n:] or order[:128]
    scale = REAL_CAP / max(rows[i].response_length / cpt for i in batch)
    warm = rest[:128]
    calib = [rest[k % len(rest)] for k in range(n)]  # the calibration run: rows outside the batch (cycled), batch-sized
    base = [
        "generation.instances=2", f"generation.max_inflight={MAX_INFLIGHT}", "generation.forced_lengths=true",
        f"generation.max_new_tokens={REAL_CAP}", "generation.admission=lpt", "generation.dispatch.min_history=32",
    ]
    cfg0 = load_config(None, base)
    profile = load_profile(shipped_profile("cpu-local-braid-tiny"))
    shipped = profile.instance_spec(max_batch=MAX_INFLIGHT,
                                    kv_capacity_tokens=cfg0.generation.num_blocks * cfg0.generation.page_size)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="braid-dispatch-") as tmp:
        work = Path(tmp)
        checkpoint = str(work / "policy")
        save_policy(build_policy(cfg0.model), checkpoint)
        write_config(cfg0, work / "config.json")
        sup = Supervisor(work)
        try:
            instances = start_instances(sup, work, checkpoint, INSTANCES, 1)
            ctx = _Ctx(rows, batch, warm, scale, cpt, base, work, checkpoint, instances, sup, repeats)
            prof = InSituProfile(instances)
            routers = _start_routers(QUICK if quick else FULL, ctx)
            calib_prompts = _specs(rows, calib, scale, cpt, False, "c")
            calib_times: list[float] = []
            for r in range(repeats):  # profile and timed calls interleaved: both see the host's slow phases
                prof.measure_round()
                _calibration_call(routers, calib_prompts, calib_times)
                _timed_round(routers)
                print(f"real round {r + 1}/{repeats} done", flush=True)
            cost, fit_err, points = prof.fit(profile.kv_bytes_per_token)
            in_situ = dc_replace(shipped, cost=cost)
            calibrated, calibration = _calibrate(routers, calib_prompts, calib_times, in_situ)
            shipped_cal, shipped_calibration = _calibrate(routers, calib_prompts, calib_times, shipped)
            results = _summarize(routers, {"in_situ": in_situ, "shipped": shipped, "calibrated": calibrated,
                                           "shipped_calibrated": shipped_cal})
            for name, r in results.items():
                print(f"real {name}: measured {r['measured_s']:.2f}s, simulated {r['simulated_s']:.2f}s "
                      f"(shipped profile {r['simulated_shipped_s']:.2f}s, calibrated "
                      f"{r['simulated_calibrated_s']:.2f}s)",
                      flush=True)
        finally:
            sup.stop_all()

    def err(key: str) -> list[float]:
        return [abs(r[key] - r["measured_s"]) / r["measured_s"] for r in results.values()]

    rnd = results["random+fcfs"]
    return {
        "instances": INSTANCES, "samples": n, "max_inflight": MAX_INFLIGHT, "length_cap_tokens": REAL_CAP,
        "repeats": repeats, "in_situ_profile": {"fit_rel_rmse": fit_err, "step_cost": cost.__dict__, "points": points},
        "runs": results,
        "speedup_vs_random_measured": {k: rnd["measured_s"] / r["measured_s"] for k, r in results.items()},
        "speedup_vs_random_simulated": {k: rnd["simulated_s"] / r["simulated_s"] for k, r in results.items()},
        "measurement_spread": statistics.fmean((max(r["measured_all_s"]) - min(r["measured_all_s"]))
                                               / min(r["measured_all_s"]) for r in results.values()),
        "sim_error": statistics.fmean(err("simulated_s")),
        "sim_error_max": max(err("simulated_s")),
        "sim_error_shipped_profile": statistics.fmean(err("simulated_shipped_s")),
        "sim_error_shipped": statistics.fmean(err("simulated_shipped_s")),
        "sim_error_calibrated": statistics.fmean(err("simulated_calibrated_s")),
        "sim_error_calibrated_max": max(err("simulated_calibrated_s")),
        "sim_error_shipped_calibrated": statistics.fmean(err("simulated_shipped_calibrated_s")),
        "calibration": calibration | {"profile": "in situ (uniform batches through gRPC, this run)"},
        "shipped_calibration": shipped_calibration | {"profile": "shipped (cpu-local-braid-tiny)"},
    }


class _Ctx:
    def __init__(self, rows, batch, warm, scale, cpt, base, work, checkpoint, instances, sup, repeats) -> None:
        self.rows, self.batch, self.warm, self.scale, self.cpt = rows, batch, warm, scale, cpt
        self.base, self.work, self.checkpoint, self.instances, self.sup, self.repeats = (
            base, work, checkpoint, instances, sup, repeats)


def _start_routers(names, c: _Ctx) -> dict:
    """One router process per configuration, all up at once (the instances are shared), each
    warmed with a request drawn from the rows outside the batch."""
    from flows.processes import start_router
    from services.common.config import load_config, write_config
    from services.common.types import GenerateParams
    from services.generation.client import GenerationClient

    routers = {}
    for name in names:
        policy, rest = name.split("+")
        inside, _, oracle = rest.partition("/")
        forward = inside == "lpt"
        run_dir = c.work / name.replace("+", "_").replace("/", "_")
        run_dir.mkdir()
        overrides = [f"generation.dispatch.policy={policy}", f"generation.dispatch.forward_estimates={forward}"]
        write_config(load_config(None, c.base + overrides), run_dir / "config.json")
        c.sup.run_dir = run_dir
        client = GenerationClient(start_router(c.sup, run_dir, c.checkpoint, c.instances))
        client.wait_ready()
        list(client.generate(_specs(c.rows, c.warm, c.scale, c.cpt, bool(oracle), "w"), GenerateParams()))
        routers[name] = (client, run_dir, forward, _specs(c.rows, c.batch, c.scale, c.cpt, bool(oracle), "b"), [])
    return routers


def _calibration_call(routers: dict, prompts, times: list[float]) -> None:
    """One Generate call of the calibration rows through ``CALIB_ROUTER`` (timed)."""
    from services.common.types import GenerateParams

    client = routers[CALIB_ROUTER][0]
    t0 = time.time()
    samples = list(client.generate(prompts, GenerateParams()))
    times.append(time.time() - t0)
    assert len(samples) == len(prompts)


def _router_calls(timeline: Path) -> list[int]:
    """The router's Generate calls after its warm-up, in order."""
    return [json.loads(x)["call"] for x in timeline.read_text().splitlines() if '"event": "dispatch"' in x][1:]


def _calibrate(routers: dict, prompts, times: list[float], shipped) -> tuple:
    """Fit the shipped profile's scale (``allocator.simulator.calibrate_spec``) to the fastest
    calibration call's per-instance makespans: a separate, short run (rows outside the batch),
    never the benchmark calls the calibrated profile is then judged on."""
    from allocator.simulator import MeasuredInstance, calibrate_spec

    _, run_dir, _, _, _ = routers[CALIB_ROUTER]
    timeline = run_dir / "router-timeline.jsonl"
    calib_calls = _router_calls(timeline)[0::2]  # the calibration router alternates calibration and timed calls
    best = min(range(len(times)), key=times.__getitem__)
    jobs = _jobs_from_timeline(timeline, calib_calls[best], prompts)
    measured = _measured_per_instance(timeline, calib_calls[best])
    spec, info = calibrate_spec(shipped, [MeasuredInstance(tuple(j), "fcfs", m)
                                          for j, m in zip(jobs, measured, strict=True)])
    return spec, {**info, "samples": len(prompts), "router": CALIB_ROUTER, "measured_s": times[best],
                  "measured_all_s": times, "measured_per_instance_s": measured}


def _timed_round(routers: dict) -> None:
    """One timed Generate call of the batch per configuration."""
    from services.common.types import GenerateParams

    for client, _, _, prompts, times in routers.values():
        t0 = time.time()
        samples = list(client.generate(prompts, GenerateParams()))
        times.append(time.time() - t0)
        want = {p.prompt_id: p.forced_length for p in prompts}
        assert sorted(s.prompt_id for s in samples) == sorted(want)
        assert all(len(s.token_ids) == want[s.prompt_id] for s in samples)


def _summarize(routers: dict, specs: dict) -> dict[str, dict]:
    """Per configuration: its fastest call, and the simulator's replay of that call's assignment."""
    out = {}
    for name, (client, run_dir, forward, prompts, times) in routers.items():
        client.close()
        timeline = run_dir / "router-timeline.jsonl"
        calls = _router_calls(timeline)
        if name == CALIB_ROUTER:
            calls = calls[1::2]  # its calibration calls come first in each round
        best = min(range(len(times)), key=times.__getitem__)
        simulated, per_sim = _simulate_from_timeline(timeline, calls[best], prompts, forward, specs["in_situ"])
        shipped, _ = _simulate_from_timeline(timeline, calls[best], prompts, forward, specs["shipped"])
        calibrated, _ = _simulate_from_timeline(timeline, calls[best], prompts, forward, specs["calibrated"])
        shipped_cal, _ = _simulate_from_timeline(timeline, calls[best], prompts, forward, specs["shipped_calibrated"])
        out[name] = {
            "measured_s": times[best], "measured_all_s": times, "simulated_s": simulated,
            "simulated_shipped_s": shipped, "simulated_calibrated_s": calibrated,
            "simulated_shipped_calibrated_s": shipped_cal,
            "measured_per_instance_s": _measured_per_instance(timeline, calls[best]),
            "simulated_per_instance_s": per_sim,
        }
    return out
