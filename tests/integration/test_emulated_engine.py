"""The emulated engine's own checks (``generation.engine: emulated``; the shared behaviour checks are
in ``test_engine_contract.py``): the makespan of a forced-length batch is the instance model's
prediction x ``time_scale``, a changed time scale scales it, the KV cache running out preempts,
waiting uses next to no CPU, ``wake`` ends a long poll, weight reloads take the modelled time, a
missing or broken configuration stops it at start with a clear error, and one SGS process serves
several emulated instances independently (``--instances``)."""

from __future__ import annotations

import threading
import time

import pytest

from services.common.config import GenerationConfig
from services.generation.emulated_engine import EmulatedEngine
from services.generation.emulation import TraceError
from services.generation.engine import Sampling
from services.generation.scheduling.instance_model import Job, run_instance
from services.generation.scheduling.profiles import ProfileError

H20 = "H20-qwen2.5-7b"  # derived: ~7 ms per step at these batch sizes
LENGTHS = {"distribution": "uniform", "low": 1, "high": 80}


def make(checkpoint, *, scale: float = 0.1, profile: str = H20, **gen) -> EmulatedEngine:
    cfg = GenerationConfig(engine="emulated", **{"num_blocks": 256, "page_size": 32, "max_inflight": 64, **gen},
                           emulation={"profile": profile, "lengths": LENGTHS, "time_scale": scale})
    return EmulatedEngine(str(checkpoint), cfg)


def batch(engine: EmulatedEngine, lengths: list[int], prompt_tokens: int = 8,
          poll_s: float = 0.005, spans: list | None = None) -> tuple[float, float, list]:
    """Submit forced-length requests, poll as the SGS core does (every 5 ms) until all are out:
    (wall seconds, CPU seconds of this thread, outputs). The engine has no thread of its own (every
    call runs its model on the caller's thread), so this thread's CPU time is all the engine's; the
    process's would also count whatever else lives in a pytest worker (an earlier file's engines).
    ``spans`` gets (wall from the first submit, wall from the last submit) to the last output: on a
    busy machine the submissions themselves can take a while, and the batch runs from the first."""
    t0, c0 = time.monotonic(), time.thread_time()
    for i, n in enumerate(lengths):
        engine.submit(f"r{i}", [1] + [4] * (prompt_tokens - 1), n, ignore_eos=True)
    t1 = time.monotonic()
    outs: list = []
    while len(outs) < len(lengths):
        outs += engine.poll(poll_s)
    end = time.monotonic()
    if spans is not None:
        spans += [end - t0, end - t1]
    return end - t0, time.thread_time() - c0, outs


def predicted(engine: EmulatedEngine, lengths: list[int], prompt_tokens: int = 8) -> float:
    jobs = [Job(f"r{i}", prompt_tokens, n) for i, n in enumerate(lengths)]
    return run_instance(jobs, engine.spec, "fcfs").makespan_s * engine.time_scale


LONG_TAIL = [200, 30, 60, 20, 120, 10, 40, 25] * 4  # 32 sequences, a long tail


def test_a_forced_length_batch_takes_the_instance_models_makespan_times_the_scale(tiny_checkpoint):
    engine = make(tiny_checkpoint, scale=0.5)
    try:
        spans: list[float] = []
        _, _, outs = batch(engine, LONG_TAIL, spans=spans)
        from_first, from_last = spans
        want = predicted(engine, LONG_TAIL)
        assert 0.5 < want < 5.0, want  # the check means something and stays short
        # never early (the batch starts at the first submit), never late past the last submit's start by more
        # than the model's 3% and a poll's slack
        assert from_first > want - (0.03 * want + 0.02) and from_last < want + 0.03 * want + 0.02, (spans, want)
        assert sorted(len(o.token_ids) for o in outs) == sorted(LONG_TAIL)
        assert all(o.finish_reason == "length" for o in outs)
    finally:
        engine.close()


def test_a_time_scale_change_scales_the_makespan(tiny_checkpoint):
    walls = []
    for scale in (0.25, 0.5):
        engine = make(tiny_checkpoint, scale=scale)
        try:
            walls.append(batch(engine, LONG_TAIL)[0])
        finally:
            engine.close()
    assert 1.85 < walls[1] / walls[0] < 2.15, walls


def test_a_straggler_delay_slows_every_step(tiny_checkpoint):
    """``step_delay_s`` (``generation.step_delay_ms``) is added to every modelled step, scaled too."""
    cfg = GenerationConfig(engine="emulated", num_blocks=256, page_size=32, max_inflight=64,
                           emulation={"profile": H20, "lengths": LENGTHS, "time_scale": 0.5})
    plain, slow = EmulatedEngine(str(tiny_checkpoint), cfg), EmulatedEngine(str(tiny_checkpoint), cfg, 0.01)
    try:
        lengths = [60, 30, 45, 60]
        wall_plain, wall_slow = batch(plain, lengths)[0], batch(slow, lengths)[0]
        assert abs(wall_slow - predicted(slow, lengths)) < 0.03 * wall_slow + 0.02
        assert wall_slow - wall_plain == pytest.approx(60 * 0.01 * 0.5, rel=0.15)
    finally:
        plain.close()
        slow.close()


def test_the_kv_cache_running_out_preempts_and_every_sample_still_finishes(tiny_checkpoint):
    """4 blocks of 32 tokens: four sequences of 10-token prompts fit at admission and outgrow the
    cache as they decode; the newest is preempted, recomputed later, and all finish on time."""
    engine = make(tiny_checkpoint, scale=0.1, num_blocks=4)
    lengths = [60, 60, 60, 60]
    try:
        wall, _, outs = batch(engine, lengths, prompt_tokens=10)
        assert engine.preemptions > 0
        assert sorted(len(o.token_ids) for o in outs) == lengths
        want = predicted(engine, lengths, prompt_tokens=10)
        assert abs(wall - want) < 0.05 * want + 0.02, (wall, want)
    finally:
        engine.close()


def test_waiting_uses_next_to_no_cpu(tiny_checkpoint):
    """Polled every 5 ms (the SGS core's loop) the engine costs a few % of a core (~0.2 ms of Python
    a poll); polled with a long timeout it sleeps until the next completion. It starts no thread,
    so the polling thread's CPU time is the engine's whole cost."""
    before = set(threading.enumerate())
    engine = make(tiny_checkpoint, scale=0.5)
    try:
        assert set(threading.enumerate()) == before
        wall, cpu, _ = batch(engine, LONG_TAIL)
        assert wall > 0.5 and cpu < 0.1 * wall, (wall, cpu)
        wall, cpu, _ = batch(engine, LONG_TAIL, poll_s=1.0)
        assert wall > 0.5 and cpu < 0.03 * wall, (wall, cpu)
    finally:
        engine.close()


def test_wake_ends_a_long_poll_and_close_any_poll(tiny_checkpoint):
    """The SGS core polls this engine with a long timeout (``poll_wait_s``): ``wake`` (new work in
    the core's inbox) ends the wait at once, handing out only what is due; ``close`` ends it too."""
    engine = make(tiny_checkpoint, scale=1.0)
    try:
        engine.submit("long", [1, 4, 5], 200, ignore_eos=True)  # ~1.4 s of modelled steps
        threading.Timer(0.1, engine.wake).start()
        t0 = time.monotonic()
        assert engine.poll(engine.poll_wait_s) == []
        assert 0.05 < time.monotonic() - t0 < 0.5
        threading.Timer(0.1, engine.close).start()
        t0 = time.monotonic()
        assert engine.poll(5.0) == [] and time.monotonic() - t0 < 0.5
    finally:
        engine.close()


def test_a_cancel_or_interrupt_after_an_unpolled_finish(tiny_checkpoint):
    """A request whose last step passed before anyone polled has finished: a cancel drops its
    output, an interrupt returns all of it (the engine brings its model up to now first)."""
    engine = make(tiny_checkpoint, scale=0.1)
    try:
        engine.submit("a", [1, 4, 5], 5, ignore_eos=True)
        engine.submit("b", [1, 4, 6], 5, ignore_eos=True)
        time.sleep(0.2)  # both finished ~4 ms in; nobody polled
        engine.cancel("a")
        assert [(rid, len(o.token_ids)) for rid, o in engine.interrupt(["b"]).items()] == [("b", 5)]
        assert engine.poll(0.01) == []
    finally:
        engine.close()


def test_an_interrupted_request_resumes_with_what_it_had_left(tiny_checkpoint):
    """Partial rollout or migration never reshapes the trace: a resume (prompt + the tokens the
    interrupt returned) generates exactly the rest of the interrupted request's drawn length, on any
    instance of the process, and ends the way the draw did; an unrelated prompt still draws afresh."""
    lengths = {"distribution": "uniform", "low": 200, "high": 300}
    cfg = GenerationConfig(engine="emulated", num_blocks=256, page_size=32, max_inflight=64,
                           emulation={"profile": H20, "lengths": lengths, "time_scale": 0.05})
    first, second = EmulatedEngine(str(tiny_checkpoint), cfg), EmulatedEngine(str(tiny_checkpoint), cfg)
    try:
        prompt = [1, 4, 7, 9]
        first.submit("a", prompt, 400, sampling=Sampling(seed=11))
        drawn = first._reqs["a"].length
        time.sleep(0.05)  # ~2 ms of modelled work per step at this scale: a few dozen steps
        out = first.interrupt(["a"])["a"]
        k = len(out.token_ids)
        assert out.finish_reason == "interrupted" and 0 < k < drawn
        second.submit("a#1", prompt + list(out.token_ids), 400 - k)
        assert second._reqs["a#1"].length == drawn - k and second._reqs["a#1"].stop
        second.submit("b", [1, 4, 7, 8], 400)
        assert 200 <= second._reqs["b"].length <= 300
    finally:
        first.close()
        second.close()


def test_kv_usage_is_honest_and_a_weight_reload_takes_the_modelled_time(tiny_checkpoint, tmp_path):
    cfg = GenerationConfig(engine="emulated", num_blocks=64, page_size=32, max_inflight=64,
                           emulation={"profile": H20, "lengths": LENGTHS, "time_scale": 1.0, "reload_s": 0.3})
    engine = EmulatedEngine(str(tiny_checkpoint), cfg)
    try:
        assert engine.kv_usage() == 0.0 and engine.kv_capacity_tokens() == 64 * 32
        engine.submit("a", [1, 4, 5, 6], 40, ignore_eos=True)
        engine.poll(0.05)
        assert 4 / 2048 < engine.kv_usage() <= 44 / 2048
        assert [o.request_id for o in engine.poll(5.0)] == ["a"]
        assert engine.kv_usage() == 0.0
        specs = engine.param_specs()
        import torch

        t0 = time.monotonic()
        engine.load_weights({k: torch.zeros(s.shape) for k, s in specs.items()})
        assert 0.28 < time.monotonic() - t0 < 0.5
    finally:
        engine.close()


def test_seeded_samples_are_the_same_on_another_instance(tiny_checkpoint):
    from services.generation.engine import Sampling

    seeded = Sampling(temperature=1.0, seed=42)
    got = []
    for neighbours in (0, 5):
        engine = make(tiny_checkpoint, scale=0.01, seed=neighbours)
        try:
            for i in range(neighbours):
                engine.submit(f"n{i}", [1, 4], 30)
            engine.submit("s", [1, 5, 6], 60, sampling=seeded)
            outs = []
            while len(outs) < neighbours + 1:
                outs += engine.poll(0.01)
            got.append(next(o for o in outs if o.request_id == "s"))
        finally:
            engine.close()
    assert got[0] == got[1] and engine.synthetic


def test_a_missing_or_broken_configuration_stops_the_engine_at_start(tiny_checkpoint, tmp_path):
    with pytest.raises(ValueError, match=r"needs generation\.emulation"):
        EmulatedEngine(str(tiny_checkpoint), GenerationConfig(engine="hf"))
    with pytest.raises(ProfileError, match="no shipped profile 'A100-none'"):
        make(tiny_checkpoint, profile="A100-none")
    bad = tmp_path / "lengths.txt"
    bad.write_text("12 x 7")
    with pytest.raises(TraceError, match=r"lengths\.txt"):
        EmulatedEngine(str(tiny_checkpoint), GenerationConfig(
            engine="emulated", emulation={"profile": H20, "lengths": str(bad)}))


def test_one_sgs_process_serves_three_emulated_instances_independently(tmp_path, tiny_checkpoint):
    """The real SGS (gRPC service, core, weight assembler) over the emulated engine, three instances
    in one process (``--instances 3``: one interpreter start for all, as the launcher groups them):
    the port file lists three ports; each answers Health and streams samples with their lengths by
    itself; a weight version pushed to one installs there only; SIGTERM ends the process cleanly."""
    import grpc
    import torch

    from services.common.config import load_config, write_config
    from services.common.types import GenerateParams, PromptSpec
    from services.generation.checkpoint import tensor_specs
    from services.generation.client import GenerationClient
    from tests.conftest import ROOT, spawn_service, stop_service

    emulation = "{profile: H20-qwen2.5-7b, lengths: {distribution: uniform, low: 1, high: 30}, time_scale: 0.5}"
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", ["generation.engine=emulated",
                                                          f"generation.emulation={emulation}",
                                                          "generation.forced_lengths=true"])
    write_config(cfg, tmp_path / "config.json")
    proc, ports = spawn_service(
        ["services.generation", "--config", str(tmp_path / "config.json"), "--model", str(tiny_checkpoint),
         "--instance", "4", "--instances", "3", "--port-file", str(tmp_path / "sgs.port")],
        tmp_path / "sgs.port", tmp_path / "sgs.log", what="SGS of 3 instances")
    clients = [GenerationClient(f"127.0.0.1:{p}") for p in ports]
    try:
        assert len(set(ports)) == 3
        assert [c.wait_ready().engine for c in clients] == ["emulated"] * 3
        specs = [PromptSpec(f"p{i}", (1, 4, 5), forced_length=n) for i, n in enumerate((40, 5, 20))]
        streams = [c.generate(specs, GenerateParams()) for c in clients]  # all three at once
        for stream in streams:
            got = [(s.prompt_id, len(s.token_ids), s.finish_reason) for s in stream]
            assert got == [("p1", 5, "length"), ("p2", 20, "length"), ("p0", 40, "length")]
        assert [c.health().finished for c in clients] == [3, 3, 3]
        # one forced length per sample of a group (a recorded group's own lengths), or the call is refused
        group = [PromptSpec("g", (1, 4, 5), forced_lengths=(7, 3, 11))]
        samples = clients[0].generate(group, GenerateParams(samples_per_prompt=3))
        assert {s.sample_index: len(s.token_ids) for s in samples} == {0: 7, 1: 3, 2: 11}
        with pytest.raises(grpc.RpcError) as err:
            list(clients[0].generate(group, GenerateParams(samples_per_prompt=2)))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "one per sample" in err.value.details()
        state = {k: torch.zeros(s.shape) for k, s in tensor_specs(tiny_checkpoint, torch.float32).items()}
        assert clients[1].update_weights(state, version=1).staged
        after = list(clients[1].generate([PromptSpec("q", (1, 4))],
                                         GenerateParams(max_new_tokens=8, min_weight_version=1)))
        assert [s.weight_version for s in after] == [1] and 1 <= len(after[0].token_ids) <= 8
        assert [c.health().weight_version for c in clients] == [0, 1, 0]
        assert [s.weight_version for s in clients[2].generate([PromptSpec("r", (1, 4))], GenerateParams())] == [0]
    finally:
        for c in clients:
            c.close()
        assert stop_service(proc, 30) == 0, (tmp_path / "sgs.log").read_text()[-3000:]
    log = (tmp_path / "sgs.log").read_text()
    assert "serving instances 4..6" in log and "instance 5: installed weight version 1" in log, log[-3000:]
