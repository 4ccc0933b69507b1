"""LoRA adapters (``services.common.lora``): peft's on-disk format, merging into the base, and
``braid model merge``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from flows.cli import main as cli_main
from services.common.lora import (
    AdapterError,
    LoraConfig,
    adapter_state,
    check_fits,
    merge,
    read_adapter,
    save_adapter,
    wrap,
)
from services.policy.model import load_policy

ROOT = Path(__file__).resolve().parents[2]
CFG = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])


@pytest.fixture(scope="module")
def trained(tiny_checkpoint, tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """An adapter over the tiny checkpoint with nonzero lora_B (as after training), saved; and the
    peft model it came from."""
    policy = load_policy(tiny_checkpoint)
    model = wrap(policy.model, CFG).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_" in name:
                p.normal_(0.0, 0.2)
    out = save_adapter(tmp_path_factory.mktemp("adapter") / "v00001", adapter_state(model), CFG, tiny_checkpoint)
    return out, model


def test_an_adapter_round_trips_through_peft_format(trained, tiny_checkpoint):
    path, model = trained
    cfg, state = read_adapter(path)
    assert cfg == LoraConfig(rank=4, alpha=8.0, target_modules=sorted(CFG.target_modules))
    want = adapter_state(model)
    assert state.keys() == want.keys() and all(torch.equal(state[k], want[k]) for k in want)  # (stored sorted)
    assert check_fits(tiny_checkpoint, path)[1].keys() == want.keys()


def test_the_merged_checkpoint_computes_what_the_peft_model_does(trained, tiny_checkpoint, tmp_path):
    path, model = trained
    report = merge(tiny_checkpoint, path, tmp_path / "merged")
    layers = model.config.num_hidden_layers
    assert report.adapter_tensors == 2 * report.merged_modules == 2 * 3 * layers  # 3 targets a layer, A and B
    assert report.adapter_bytes == (path / "adapter_model.safetensors").stat().st_size
    assert "tokenizer.json" in report.tokenizer_files
    merged = load_policy(tmp_path / "merged")  # what `braid run --model` loads: a plain HF checkpoint
    assert not any("lora" in k for k in merged.model.state_dict())
    ids = torch.tensor([[1, 5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        got = merged.model(input_ids=ids).logits
        base = load_policy(tiny_checkpoint).model(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(base, want, atol=1e-3)  # not vacuous: the adapter changes the outputs


def test_braid_model_merge_prints_its_report(trained, tiny_checkpoint, tmp_path, capsys):
    path, model = trained
    assert cli_main(["model", "merge", "--base", str(tiny_checkpoint), "--adapter", str(path),
                     "--out", str(tmp_path / "m")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["out"] == str(tmp_path / "m") and report["merged_modules"] == 3 * model.config.num_hidden_layers
    assert (tmp_path / "m" / "config.json").is_file()


def test_braid_model_merge_refuses_bad_input(trained, tiny_checkpoint, tmp_path, capsys):
    path, model = trained

    def refused(base, adapter) -> str:
        assert cli_main(["model", "merge", "--base", str(base), "--adapter", str(adapter),
                         "--out", str(tmp_path / "never")]) == 2
        assert not (tmp_path / "never").exists()
        return capsys.readouterr().err

    assert "no config.json" in refused(tmp_path, path)  # the base is not a checkpoint
    assert "no adapter_config.json or adapter_model.safetensors" in refused(tiny_checkpoint, tmp_path)
    wrong = tmp_path / "wrong"
    shutil.copytree(path, wrong)
    save_adapter(wrong, {k: torch.zeros(v.shape[0] * 2, v.shape[1]) if ".lora_A." in k else v
                         for k, v in adapter_state(model).items()}, CFG, tiny_checkpoint)
    assert "tensors of the wrong shape" in refused(tiny_checkpoint, wrong)
    other = tmp_path / "other"  # targets the base does not have
    save_adapter(other, {}, LoraConfig(target_modules=["nope_proj"]), tiny_checkpoint)
    assert "nope_proj" in refused(tiny_checkpoint, other)


def test_a_lora_run_checkpoints_the_adapter_and_it_loads_folded_into_its_base(tiny_checkpoint, tmp_path):
    """``trainer.checkpoint_every`` under LoRA saves the adapter (listed with its base in the
    index); ``load_checkpoint`` (what ``bench/eval_checkpoints.py`` scores) folds it into the base."""
    from services.common.config import load_config
    from services.policy.model import load_checkpoint
    from services.run.runtime import TrainerRuntime
    from tests.unit.test_learner import _groups

    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", ["trainer.lr=0.05", "trainer.lora.rank=4",
                                                           "trainer.checkpoint_every=1"])
    rt = TrainerRuntime(cfg, load_policy(tiny_checkpoint), [], tmp_path)
    rt.model_dir = str(tiny_checkpoint)
    rt.learner.begin()
    rt.learner.backward(_groups())
    rt.learner.step()
    rt.version = 1
    rt.maybe_checkpoint()
    row = json.loads((tmp_path / "checkpoints" / "index.jsonl").read_text())
    assert row["adapter"] is True and row["base"] == str(tiny_checkpoint) and row["version"] == 1
    _, saved = read_adapter(row["path"])
    live = rt.learner.weights().host_copies()
    assert saved.keys() == live.keys() and all(torch.equal(saved[k], live[k]) for k in live)
    assert not (Path(row["path"]) / "config.json").exists()  # the adapter only, not the base
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        want = rt.learner.model.eval()(input_ids=ids).logits
        got = load_checkpoint(row["path"]).model(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    with pytest.raises(AdapterError, match=r"base checkpoint .* is not here"):
        load_checkpoint(row["path"], base=tmp_path / "gone")
