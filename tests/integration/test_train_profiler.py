"""``braid profile-train --quick`` on the smoke config's model: the real learner, timed; and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from allocator.train_profile import FORMAT, load_train_profile
from flows.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
SMOKE = str(ROOT / "deploy/configs/smoke.yaml")


def test_profile_train_quick_writes_a_profile_whose_times_grow_with_tokens(tmp_path, capsys):
    out = tmp_path / "smoke-train.json"
    # the smoke model widened (hidden 256, 4 layers): its steps take 50-600 ms, so compute, not a
    # step's fixed ~10 ms, sets the times; at the smoke model's own size a busy machine (make test runs
    # two workers) made the smallest point 3x slower than the largest and the fit found no throughput
    wider = ["--set", "model.hidden_size=256", "--set", "model.num_layers=4", "--set", "model.intermediate_size=512"]
    args = ["profile-train", "--config", SMOKE, "--quick", "--threads", "1", *wider, "--out", str(out)]
    # each point's time is the fastest of its 3 steps: a busy machine (make test runs two workers) once
    # starved two of one point's three steps (4771, 5805, 241 ms against 56 ms for a quarter of the tokens),
    # and their median made the fit refuse; the fastest step is the point's own time
    rc = cli_main(args)
    assert rc == 0, capsys.readouterr().err
    printed = capsys.readouterr().out  # a progress line per grid point, then the summary
    assert printed.count("ms/step") == 4
    summary = json.loads(printed[printed.index("\n{") + 1:])
    raw = json.loads(out.read_text())
    assert raw["format"] == FORMAT and raw["hardware"] == "cpu-local" and raw["algorithm"] == "grpo"
    assert raw["device"] == "cpu" and raw["threads"] == 1 and raw["reference_model"] is False
    assert (raw["backend"], raw["dtype"], raw["ranks"], raw["group_size"], raw["micro_batch_groups"]) == (
        "torch", "float32", 1, 4, 2)
    assert raw["model"]["fingerprint"]["hidden"] == 256 and raw["model"]["fingerprint"]["layers"] == 4
    prof = load_train_profile(out)
    assert len(prof.points) == 4 and prof.effective_flops > 0 and prof.fixed_s >= 0
    # equal lengths: the learner padded nothing; every step made at least one micro-batch
    assert all(p.padded_tokens == p.tokens and p.micro_batches >= 1 for p in prof.points)
    # times grow with tokens: the fit has a positive throughput (it refuses points whose time does not
    # grow with FLOPs). Not two single points against each other: on a busy machine (make test runs two
    # workers) one 10 ms step of this tiny model can take 120 ms, more than the largest point's.
    by_tokens = sorted(prof.points, key=lambda p: p.tokens)
    assert by_tokens[-1].tokens >= 10 * by_tokens[0].tokens and prof.effective_flops > 0
    assert summary["out"] == str(out) and summary["points"] == 4 and summary["backend"] == "torch"


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "trainer.backend=megatron"], "trainer.backend megatron on cpu cannot run here: "),  # MegatronDeviceError
    (["--set", "trainer.ranks=2"], "measures one trainer rank; trainer.ranks is 2"),
    (["--device", "cuda:0"], "trainer.backend torch on cuda:0 cannot run here: DeviceError"),
])
def test_profile_train_refuses_what_it_cannot_measure_here(tmp_path, capsys, args, message):
    pytest.importorskip("torch")
    import torch

    if "cuda" in " ".join(args) and torch.cuda.is_available():
        pytest.skip("this host has CUDA")
    out = tmp_path / "p.json"
    assert cli_main(["profile-train", "--config", SMOKE, "--quick", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("braid profile-train: ") and message in err and not out.exists()
