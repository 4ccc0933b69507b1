"""The repack simulator (allocator.repack_sim): the live policies driven by a simulated fleet."""

from __future__ import annotations

from dataclasses import replace

import pytest

from allocator.repack_sim import GroupSpec, SimConfig, arith_workload, simulate
from services.generation.scheduling.cost import StepCost
from services.rollout.repack_policy import RepackSettings, ramping_down

COST = StepCost(k1=0.0, k2=0.0, k3=2e-5, k4=2e-3, kv_bytes_per_token=2048.0,
                prefill_per_token=1.5e-5, per_sequence=2.6e-4)
CFG = SimConfig(instances=4, repack=True, iterations=10, settings=RepackSettings(interval_s=0.5))


def train(lengths) -> float:
    return 0.005 + 2e-5 * sum(lengths)


def workload(seed: int = 0) -> list[GroupSpec]:
    return arith_workload(0, 800, 8, 192, runaway=0.04, sample_seed=seed)


def test_deterministic_for_a_seed() -> None:
    a = simulate(CFG, workload(1), COST, train)
    b = simulate(CFG, workload(1), COST, train)
    assert a == b
    c = simulate(CFG, workload(2), COST, train)
    assert c.iteration_end != a.iteration_end


def test_tokens_are_conserved_across_migrations() -> None:
    r = simulate(CFG, workload(), COST, train)
    assert r.migrations > 0
    # a resumed trajectory re-prefills its tokens so far; it never decodes them again nor loses them
    assert r.decoded_tokens == r.finished_tokens + r.left_tokens
    groups = {g.key: g for g in workload()}
    for keys, tokens, samples in zip(r.consumed, r.iteration_tokens, r.iteration_samples, strict=True):
        assert tokens == sum(sum(groups[k].lengths) for k in keys)
        assert samples == CFG.prompts_per_iteration * CFG.group_size


def test_migrations_move_only_what_best_fit_allows() -> None:
    r = simulate(CFG, workload(), COST, train)
    s = CFG.settings
    assert r.moves
    for m, src, dst, keys in r.moves:
        assert (src.index, dst.index) == (m.source, m.destination)
        assert src.version == dst.version == m.version
        # both candidates (the fall in KV needs the previous snapshot)
        assert ramping_down(src, 1.0, s) and ramping_down(dst, 1.0, s)
        assert not dst.draining
        assert dst.kv_used + src.kv_used <= s.c_max and dst.running + src.running <= s.batch_bound
        assert len(keys) == src.running + src.waiting  # every sample of the source's open calls
    sources = {k: m.source for m, _, _, keys in r.moves for k in keys}
    dests = {k: m.destination for m, _, _, keys in r.moves for k in keys}
    for key, inst in r.resumed_on.items():
        assert inst == dests[key] != sources[key]


def test_no_ramp_down_means_no_migration() -> None:
    never = replace(CFG, settings=RepackSettings(c_max=1e-9, interval_s=0.5))  # KV is never below c_max
    r = simulate(never, workload(), COST, train)
    assert r.migrations == 0 and not r.moves and r.repacks == 0
    assert simulate(CFG, workload(), COST, train).migrations > 0  # the same run with room does migrate


def test_repack_off_never_migrates_and_bound_holds() -> None:
    for repack in (False, True):
        r = simulate(replace(CFG, repack=repack), workload(), COST, train)
        assert r.violations == 0
        assert len(r.iteration_end) == CFG.iterations
        if not repack:
            assert r.migrations == 0 and not r.moves and r.kv_means  # snapshots are still taken (the KV metric)


def test_repack_does_not_slow_a_fleet_without_a_tail() -> None:
    """Equal lengths in every group: nothing is left behind to consolidate; the two variants
    differ at most by the idle-only sync, which must not cost throughput here."""
    flat = [GroupSpec(f"g{i}", 12, (24,) * 8) for i in range(800)]
    none = simulate(replace(CFG, repack=False), flat, COST, train).steady()[0]
    rep = simulate(CFG, flat, COST, train).steady()[0]
    assert rep >= 0.97 * none


def test_a_slower_core_lowers_throughput_and_instances_share_it() -> None:
    base = simulate(replace(CFG, repack=False), workload(), COST, train).steady()[0]
    slow = simulate(replace(CFG, repack=False, cpu_scale=2.0), workload(), COST, train).steady()[0]
    assert slow < 0.75 * base


def test_too_few_groups_is_refused() -> None:
    with pytest.raises(ValueError, match="groups"):
        simulate(CFG, workload()[:50], COST, train)
