"""The trained model handed back, and ``braid eval``: a real run of the smoke config writes ``final/``,
which transformers loads as the run's final policy, and ``braid eval`` (the CLI's main; its SGS and
reward worker are processes) scores it and the warm start on the run's held-out set as the run did.

Every evaluation request carries ``eval.seed`` and the SGS samples each held-out prompt from a
generator of its own seeded from it and the prompt's id (``services.run.heldout``), so ``braid eval``
reproduces the run's evaluations sample for sample: the warm start's and the final one alike (the
final one followed training, whose unseeded rollouts advanced the engine's own generator: that no
longer matters).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import FAST_ENGINE, ROOT
from tests.integration.runs import run_smoke

# iterations 2 (smoke.yaml): checkpoints/v00002 is the final policy too, written by the periodic checkpoint
OVERRIDES = ["trainer.checkpoint_every=2", "weights.transport=direct"]  # direct: no relay process to start


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, smoke_cache) -> tuple[Path, Path, dict]:
    """(run dir, warm-start checkpoint, summary) of a 2-iteration smoke run on the fast engine."""
    from services.common.config import load_config
    from services.policy.warmstart import ensure_warmstart

    tmp = tmp_path_factory.mktemp("eval-run")
    overrides = [f"cache_dir={smoke_cache}", *OVERRIDES]
    # the session's warm start of smoke.yaml (the flow's warm-start task finds the same one)
    warm = ensure_warmstart(load_config(ROOT / "deploy/configs/smoke.yaml", [FAST_ENGINE, *overrides]), progress=False)
    run_dir = tmp / "run"
    run_dir.mkdir()
    summary, _ = run_smoke(run_dir, warm, overrides)
    return run_dir, warm, summary


def braid_eval(model: Path, run_dir: Path, out: Path, capsys) -> dict:
    """``braid eval``'s JSON: the CLI's ``main`` in this process (its services are processes of their own;
    a ``braid eval`` subprocess would import torch and transformers again, ~11 s of CPU here)."""
    from flows.cli import main

    capsys.readouterr()
    code = main(["eval", "--model", str(model), "--config", str(run_dir / "config.json"), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    return json.loads(captured.out)


def test_final_is_the_runs_final_policy_and_transformers_loads_it(finished_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_dir, warm, summary = finished_run
    final = run_dir / "final"
    assert summary["final_checkpoint"] == str(final.resolve()) and summary["final_adapter"] is None
    meta = json.loads((final / "final.json").read_text())
    assert meta["weight_version"] == summary["final_weight_version"] == 2 and meta["iteration"] == 2
    assert (meta["accuracy"], meta["stderr"]) == (summary["final_accuracy"], summary["accuracy_stderr"])
    assert meta["base"] == str(warm.resolve()) and meta["eval_fingerprint"] == summary["eval_fingerprint"]
    assert not list(run_dir.glob(".final*"))  # the temporary directory was renamed into place
    model = AutoModelForCausalLM.from_pretrained(final, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(final, local_files_only=True)
    assert tok.eos_token_id == model.config.eos_token_id
    saved = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / "v00002", local_files_only=True)
    base = AutoModelForCausalLM.from_pretrained(warm, local_files_only=True)
    got, want, before = model.state_dict(), saved.state_dict(), base.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert any(not torch.equal(got[k], before[k]) for k in got)  # trained: not the warm start


def test_braid_eval_scores_final_as_the_run_did(finished_run, tmp_path, capsys):
    run_dir, _, summary = finished_run
    got = braid_eval(run_dir / "final", run_dir, tmp_path / "final", capsys)
    n, run, fin = summary["eval_prompts"], got["run"], summary["eval_final"]
    assert run["same_heldout_set"] and run["accuracy"] == summary["final_accuracy"] and got["prompts"] == n
    # Exactly the run's final evaluation, not a second draw: the same checkpoint, the same prompts and
    # the same per-request seeds (eval.seed and each prompt's id), each sample from its own generator,
    # so what the engine generated before (the run's training rollouts) does not enter. Only float
    # rounding could differ: a batch of another shape may round a log-prob's last bit differently (hf's
    # left padding), flipping a token only where a draw lands within that bit. Measured on this config:
    # every prompt's response length equal, 32 of 32, on hf (1 run) and on vLLM (3 runs).
    assert (got["accuracy"], got["response_len_mean"], got["breakdown"]) == (
        fin["accuracy"], fin["response_len_mean"], fin["by_difficulty"]), (got, fin)
    assert run["difference_in_stderr"] == 0.0
    assert got["eval_fingerprint"] == summary["eval_fingerprint"] and got["breakdown_by"] == "steps"
    assert json.loads((tmp_path / "final" / "eval.json").read_text()) == got


@pytest.mark.slow
def test_braid_eval_reproduces_the_warm_start_evaluation_sample_for_sample(finished_run, tmp_path, capsys):
    run_dir, warm, summary = finished_run
    got, ws = braid_eval(warm, run_dir, tmp_path / "warm", capsys), summary["eval_warmstart"]
    assert (got["accuracy"], got["response_len_mean"], got["breakdown"]) == (
        ws["accuracy"], ws["response_len_mean"], ws["by_difficulty"])
    assert got["prompts"] == summary["eval_prompts"] and "run" not in got  # a warm start has no final.json


@pytest.mark.parametrize("case", ["missing", "file", "not a checkpoint", "adapter", "no config", "bad override"])
def test_braid_eval_refuses_bad_input_with_exit_2_and_one_line(finished_run, tmp_path, capsys, case):
    from flows.cli import main

    run_dir, _, _ = finished_run
    model, config, extra = run_dir / "final", str(run_dir / "config.json"), []
    if case == "missing":
        model = tmp_path / "nowhere"
    elif case == "file":
        model = run_dir / "final" / "final.json"
    elif case == "not a checkpoint":
        model = run_dir  # a run directory: a config.json, but no weights
    elif case == "adapter":
        model = tmp_path / "adapter"
        model.mkdir()
        (model / "adapter_config.json").write_text("{}")
    elif case == "no config":
        config = str(tmp_path / "missing.yaml")
    else:
        extra = ["--prompts", "0"]
    assert main(["eval", "--model", str(model), "--config", config, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("braid eval: ") and "\n" not in err and "Traceback" not in err, err


@pytest.mark.long  # `make test-long`; the fast tier keeps the single-turn evaluation picks (tests/unit/test_collect.py)
def test_braid_eval_of_an_agentic_config_plays_its_turns_on_the_held_out_table(tiny_checkpoint, tmp_path, capsys,
                                                                               monkeypatch):
    """An agentic config's ``braid eval``: the generator picks on the HeldOut's table (real capacity,
    the table single-turn evaluation picks on), not on a table of its own."""
    from services.common.config import load_config, write_config
    from services.run import heldout

    agentic = ["agentic.enabled=true", "agentic.workers=2", "agentic.concurrency=16", "eval.prompts=8",
               "agentic.max_turns=6"]
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [FAST_ENGINE, *agentic])
    write_config(cfg, tmp_path / "config.json")
    built = []
    real = heldout.build_agentic

    def build_agentic(*args):
        built.append(real(*args))
        return built[-1]

    monkeypatch.setattr(heldout, "build_agentic", build_agentic)
    got = braid_eval(tiny_checkpoint, tmp_path, tmp_path / "eval", capsys)
    assert got["prompts"] == 8 and got["breakdown_by"] == "difficulty" and got["reward_failures"] == 0
    (rollout,) = built
    fleet = rollout.generator.fleet
    assert fleet.capacity == 2 * cfg.agentic.concurrency  # the HeldOut's (modes.fleet_capacity), not 1 << 30
    assert sum(r.placed for r in fleet.snapshot().rows) > 0 and all(r.inflight == 0 for r in fleet.snapshot().rows)
