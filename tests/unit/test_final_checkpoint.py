"""The trained model handed back (``services.run.final``) and the pure parts of ``braid eval``
(``flows.eval_cli``), ``braid run``'s last lines and the report's section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flows.cli import run_output
from flows.eval_cli import EvalError, check_checkpoint, eval_overrides, eval_report, one_line
from flows.report import final_lines
from services.common.config import load_config
from services.run.evaluate import EvalResult
from services.run.final import config_digest, drop_tied, final_meta, read_meta, replace_dir, write_final

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "deploy/configs/smoke.yaml"
RESULT = EvalResult(weight_version=2, prompts=32, accuracy=0.25, stderr=0.0765, response_len_mean=9.0,
                    by_difficulty={"1": {"n": 32, "accuracy": 0.25}})


def test_final_meta_names_the_policy_its_score_and_the_config(tmp_path):
    cfg = load_config(SMOKE)
    meta = final_meta(cfg, RESULT, version=2, fingerprint="abc", config_path=str(tmp_path / "config.json"),
                      final=tmp_path / "final", base="/base")
    assert (meta["iteration"], meta["weight_version"], meta["accuracy"], meta["stderr"]) == (2, 2, 0.25, 0.0765)
    assert meta["config"] == str(tmp_path / "config.json") and meta["config_digest"] == config_digest(cfg)
    assert meta["adapter"] is None and "merge_command" not in meta
    assert meta["eval_command"] == f"braid eval --model {tmp_path / 'final'} --config {tmp_path / 'config.json'}"
    lora = final_meta(load_config(SMOKE, ["trainer.lora.rank=4"]), RESULT, version=2, fingerprint="abc",
                      config_path="c.json", final=tmp_path / "final", base="/base")
    assert lora["adapter"] == str(tmp_path / "final" / "adapter")
    adapter = tmp_path / "final" / "adapter"
    assert lora["merge_command"].startswith(f"braid model merge --base /base --adapter {adapter}")


def test_config_digest_follows_the_values_not_the_file():
    cfg = load_config(SMOKE)
    assert config_digest(cfg) == config_digest(load_config(SMOKE, ["trainer.iterations=2"]))  # smoke's own value
    assert config_digest(cfg) != config_digest(load_config(SMOKE, ["trainer.iterations=3"]))


def test_replace_dir_puts_the_new_directory_in_place_of_the_old(tmp_path):
    dest, tmp = tmp_path / "final", tmp_path / ".final.x.tmp"
    dest.mkdir()
    (dest / "old").write_text("old")
    tmp.mkdir()
    (tmp / "new").write_text("new")
    replace_dir(tmp, dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"] and [p.name for p in dest.iterdir()] == ["new"]
    fresh = tmp_path / ".other.tmp"
    fresh.mkdir()
    replace_dir(fresh, tmp_path / "absent")  # no old one: a plain rename
    assert (tmp_path / "absent").is_dir()


def test_drop_tied_leaves_out_only_a_copy_of_tied_embeddings():
    from types import SimpleNamespace

    embed = torch.ones(3, 2)
    state = {"model.embed_tokens.weight": embed, "lm_head.weight": embed.clone(), "x": torch.zeros(1)}
    assert drop_tied(state, SimpleNamespace(tie_word_embeddings=True)).keys() == {"model.embed_tokens.weight", "x"}
    assert drop_tied(state, SimpleNamespace(tie_word_embeddings=False)) is state
    other = {**state, "lm_head.weight": torch.zeros(3, 2)}  # not a copy: kept
    assert drop_tied(other, SimpleNamespace(tie_word_embeddings=True)) is other


def _trained_runtime(checkpoint: Path, run_dir: Path, overrides: list[str]):
    from services.policy.model import load_policy
    from services.run.runtime import TrainerRuntime
    from tests.unit.test_learner import _groups

    cfg = load_config(SMOKE, ["trainer.lr=0.05", *overrides])
    rt = TrainerRuntime(cfg, load_policy(checkpoint), [], run_dir)
    rt.model_dir = str(checkpoint)
    rt.learner.begin()
    rt.learner.backward(_groups())
    rt.learner.step()
    rt.version = 1
    return rt


def test_write_final_saves_the_learners_weights_as_a_checkpoint(tiny_checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    rt = _trained_runtime(tiny_checkpoint, tmp_path, [])
    final = write_final(rt, RESULT, str(tmp_path / "config.json"))
    assert final == (tmp_path / "final").resolve() and not list(tmp_path.glob(".final*"))
    saved = AutoModelForCausalLM.from_pretrained(final, local_files_only=True).state_dict()
    live = rt.learner.weights().host_copies()
    assert all(torch.equal(saved[k], v) for k, v in live.items()) and "model.norm.weight" in saved
    assert (final / "tokenizer.json").is_file() and read_meta(final)["weight_version"] == 1
    assert read_meta(final)["base"] == str(tiny_checkpoint.resolve())
    rt.version = 2
    assert write_final(rt, RESULT, "c.json") == final and read_meta(final)["weight_version"] == 2  # replaced
    assert read_meta(tmp_path) is None


def test_write_final_of_a_lora_run_holds_the_adapter_and_the_merged_model(tiny_checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    from services.common.lora import read_adapter

    rt = _trained_runtime(tiny_checkpoint, tmp_path, ["trainer.lora.rank=4"])
    final = write_final(rt, RESULT, str(tmp_path / "config.json"))
    _, adapter = read_adapter(final / "adapter")
    live = rt.learner.weights().host_copies()
    assert adapter.keys() == live.keys() and all(torch.equal(adapter[k], live[k]) for k in live)
    assert read_meta(final)["adapter"] == str(final / "adapter")
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        want = rt.learner.model.eval()(input_ids=ids).logits
        got = AutoModelForCausalLM.from_pretrained(final, local_files_only=True)(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)  # the adapter folded into its base: the trained policy


def test_braid_run_prints_the_json_then_last_where_the_final_model_is():
    result = {"run_dir": "runs/x", "mode": "sync", "warmstart_accuracy": 0.1, "final_accuracy": 0.3,
              "accuracy_stderr": 0.02, "eval_prompts": 500, "samples_per_second": 9.0,
              "final_checkpoint": "/abs/runs/x/final", "final_adapter": None, "rl_seconds": 1.0}
    lines = run_output(result).splitlines()
    assert lines[-1] == "final model: /abs/runs/x/final"
    config = Path("runs/x/config.json").resolve()
    assert lines[-2] == f"score it: braid eval --model /abs/runs/x/final --config {config}"
    shown = json.loads("\n".join(lines[:-2]))
    assert shown["final_checkpoint"] == "/abs/runs/x/final" and "rl_seconds" not in shown
    assert "cpu" not in shown  # a summary from before the trainer recorded its CPU
    line = "CPU: AMD EPYC, 2 cores, AVX2, no AVX-512; torch kernels AVX2"
    assert json.loads("\n".join(run_output({**result, "cpu": line}).splitlines()[:-2]))["cpu"] == line
    lora = run_output({**result, "final_adapter": "/abs/runs/x/final/adapter"}).splitlines()
    assert lora[-1].startswith("final model: /abs/runs/x/final (LoRA")
    assert lora[-1].endswith("/abs/runs/x/final/adapter)")


def test_the_report_names_the_final_model_and_how_to_load_it():
    lines = final_lines({"final_checkpoint": "/r/x/final", "final_adapter": None})
    assert "braid eval --model /r/x/final --config /r/x/config.json" in lines
    assert any('from_pretrained("/r/x/final")' in x for x in lines)
    assert final_lines({}) == []  # a summary from before final/ existed


def test_eval_overrides_put_the_users_first_then_the_model_and_the_prompts():
    assert eval_overrides("m/", 8, ["a.b=1"]) == ["a.b=1", "model.path=m/", "eval.prompts=8"]
    assert eval_overrides(None, None, None) == []


def test_one_line_joins_a_config_errors_lines():
    got = one_line("invalid config (c.yaml):\n  a.b: bad\n  c: worse\n")
    assert got == "invalid config (c.yaml): a.b: bad; c: worse"


def test_eval_report_compares_with_the_runs_own_final_accuracy(tmp_path):
    cfg = load_config(SMOKE)
    meta = {"accuracy": 0.2, "stderr": 0.05, "eval_prompts": 32, "weight_version": 2, "eval_fingerprint": "f"}
    got = eval_report(RESULT, model=tmp_path, config="c.yaml", overrides=[], cfg=cfg, fingerprint="f", meta=meta,
                      seconds=1.23, out=tmp_path)
    assert (got["accuracy"], got["stderr"], got["prompts"], got["breakdown_by"]) == (0.25, 0.0765, 32, "steps")
    assert got["run"]["same_heldout_set"] and got["run"]["difference_in_stderr"] == pytest.approx(0.05 / 0.0765)
    other = eval_report(RESULT, model=tmp_path, config="c.yaml", overrides=[], cfg=cfg, fingerprint="g", meta=meta,
                        seconds=1.0, out=tmp_path)
    assert other["run"]["difference_in_stderr"] is None and "run" not in eval_report(
        RESULT, model=tmp_path, config="c.yaml", overrides=[], cfg=cfg, fingerprint="g", meta=None, seconds=1.0,
        out=tmp_path)


def test_check_checkpoint_says_what_a_directory_is_not(tiny_checkpoint, tmp_path):
    assert check_checkpoint(tiny_checkpoint).vocab_size > 0
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    (tmp_path / "file").write_text("")
    (tmp_path / "no-tokenizer").mkdir()
    for name in ("config.json", "model.safetensors"):
        (tmp_path / "no-tokenizer" / name).write_bytes((tiny_checkpoint / name).read_bytes())
    for name, why in (("missing", "no such directory"), ("file", "not a directory"), ("adapter", "LoRA adapter"),
                      ("no-tokenizer", "no tokenizer")):
        with pytest.raises(EvalError, match=why):
            check_checkpoint(tmp_path / name)
