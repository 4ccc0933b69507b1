"""PTL profiles (shipped, derived, bad files) and the discrete-event simulator's sanity."""

from __future__ import annotations

import json

import pytest

from allocator.simulator import SimSample, generation_time, simulate
from services.generation.scheduling import InstanceSpec, StepCost
from services.generation.scheduling.models import MODELS, get_model
from services.generation.scheduling.profiles import (
    PROFILE_DIR,
    ProfileError,
    derive_profile,
    load_profile,
    save_profile,
)


@pytest.mark.parametrize("path", sorted(p for p in PROFILE_DIR.glob("*.json") if not p.stem.endswith("-train")),
                         ids=lambda p: p.stem)
def test_every_shipped_profile_loads_and_says_how_it_was_made(path):
    profile = load_profile(path)
    model = MODELS[profile.model.name]
    load_profile(path, model=model)  # consistent with its model config
    if profile.source == "derived":
        assert "DERIVED" in profile.notes and "not measured on a GPU" in profile.notes
    else:
        assert profile.hardware == "cpu-local" and profile.engine == "cb" and profile.fit_rel_rmse is not None
    spec = profile.instance_spec()
    assert spec.cost.step(1, 100) > 0 and spec.kv_capacity_tokens > 0


def test_derived_h20_profile_matches_the_published_compute_memory_crossover():
    cost = derive_profile("H20", "qwen2.5-7b").step_cost
    # StaleFlow App. B: on H20 (bf16) matmuls turn compute-bound above ~37 sequences
    assert 20 <= cost.k2 / cost.k3 <= 45
    h800 = derive_profile("H800", "qwen2.5-7b").step_cost
    assert h800.k2 / h800.k3 > 150  # 6.7x the FLOPs, less bandwidth: memory-bound much longer


def test_profile_for_another_model_is_refused_naming_file_and_field(tmp_path):
    path = save_profile(derive_profile("H20", "qwen2.5-7b"), tmp_path / "h20.json")
    with pytest.raises(ProfileError, match=r"h20.json: profile is for model 'qwen2.5-7b', not 'qwen2.5-32b': "
                                           r"field model.fingerprint.hidden"):
        load_profile(path, model=get_model("qwen2.5-32b"))


def test_bad_profile_files_name_line_or_field(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "format": "braid-ptl-profile/1",\n  "hardware": \n}')
    with pytest.raises(ProfileError, match=r"broken.json: line 4 column 1: not JSON"):
        load_profile(broken)
    data = derive_profile("H800", "qwen2.5-7b").model_dump(mode="json")
    data["step_cost"]["k3"] = -1.0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"bad.json: field step_cost.k3: Input should be greater than or equal to 0"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile(tmp_path / "missing.json")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ProfileError, match=r"binary.json: profile is not UTF-8"):
        load_profile(binary)


SPEC = InstanceSpec(StepCost(k1=0.0, k2=0.01, k3=0.001, k4=0.001, kv_bytes_per_token=1.0),
                    kv_capacity_tokens=10**6, max_batch=16)


def test_simulator_sanity():
    lengths = [5 + (i * 37) % 200 for i in range(120)] + [2000]
    prompts = [8] * len(lengths)
    one = generation_time(prompts, lengths, SPEC, 1)
    four = generation_time(prompts, lengths, SPEC, 4)
    assert four < one  # more instances, less time
    assert four >= 2000 * 0.011  # never faster than the longest sample alone
    samples = [SimSample(f"s{i}", 8, n, float(n)) for i, n in enumerate(lengths)]
    res = simulate(samples, SPEC, 4, policy="lpt", admission="lpt", oracle=True)
    assert sum(r.tokens for r in res.instances) == sum(lengths)
    assert sorted(k for r in res.instances for k in r.finish_s) == sorted(s.seq_id for s in samples)
    assert res.makespan_s == max(res.instance_makespans)
    rnd = simulate(samples, SPEC, 4, policy="random", admission="fcfs")
    assert res.makespan_s <= rnd.makespan_s  # the oracle LPT beats blind random dispatch here
