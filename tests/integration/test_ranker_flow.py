"""Ranker with real parts: the MiniLM transformer ranker, the ensemble, the causal-LM ranker, the
online retrain through the router, and the MMLU-Pro bench data. The retrain_ranker flow's own tests
are in test_flow.py, under the one temporary Prefect API the fast tier starts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from ranker.base import create, load_ranker
from ranker.data import load_dataset
from ranker.genlog import GenerationLog
from ranker.metrics import spearman
from ranker.store import RankerStore
from tests.conftest import FAST_ENGINE

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests/fixtures/ranker_small.jsonl"
MMLU = ROOT.parent / "shared/data/mmlu-pro-cot/mmlu_pro_cot_lengths.jsonl.gz"
TINY_TRANSFORMER = {"max_tokens": 32, "epochs": 3, "batch_size": 16, "head_lr": 3e-3, "threads": 2}


def _fits_and_round_trips(kind: str, params: dict, out: Path):
    """Fit ``kind`` on 120 fixture rows; it must have learned the fixture's signal and predict the
    same after save and load. Returns the training and test splits."""
    ds = load_dataset(FIXTURE)
    train, test = ds.subset(range(120)), ds.subset(range(120, 160))
    model = create(kind, **params).fit(train.prompts, train.lengths, unit="characters")
    before = model.predict(test.prompts)
    loaded = load_ranker(model.save(out))
    assert loaded.kind == kind and (out / f"{kind}.safetensors").is_file()
    np.testing.assert_allclose(loaded.predict(test.prompts), before, rtol=1e-5)
    assert spearman(before, test.lengths) > 0.3
    return train, test


@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_transformer_and_ensemble_round_trip(tmp_path):
    train, test = _fits_and_round_trips("transformer", TINY_TRANSFORMER, tmp_path / "t")

    ens = create("ensemble", members=["tfidf_linear", "lightgbm"], weights=[1, 2],
                 member_params={"lightgbm": {"max_rounds": 50, "threads": 1}}).fit(train.prompts, train.lengths)
    again = load_ranker(ens.save(tmp_path / "e"))
    assert [m.kind for m in again.models] == ["tfidf_linear", "lightgbm"]
    np.testing.assert_allclose(again.predict(test.prompts), ens.predict(test.prompts), rtol=1e-5)


def _tiny_decoder(path: Path, arch: str = "llama") -> Path:
    """A tiny random decoder with a real word-piece tokenizer (MiniLM's, from its package)."""
    import torch
    from transformers import AutoModel, AutoTokenizer, GPT2Config, LlamaConfig

    from ranker.models.transformer import default_base_path

    tok = AutoTokenizer.from_pretrained(default_base_path())
    config = (LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                          num_attention_heads=4, num_key_value_heads=2, pad_token_id=tok.pad_token_id,
                          max_position_embeddings=256) if arch == "llama" else
              GPT2Config(vocab_size=len(tok), n_embd=64, n_layer=2, n_head=4, n_positions=256))
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_causal_lm_ranker_fine_tunes_the_top_of_a_decoder_and_round_trips(tmp_path):
    params = {"base_path": str(_tiny_decoder(tmp_path / "llama")), "max_tokens": 64, "trainable_layers": 1,
              "epochs": 4, "batch_size": 16, "lr": 1e-3, "head_lr": 3e-3, "threads": 2}
    train, _ = _fits_and_round_trips("causal_lm", params, tmp_path / "r")
    with pytest.raises(ValueError, match="local Hugging Face checkpoint"):
        create("causal_lm").fit(train.prompts, train.lengths)
    with pytest.raises(ValueError, match="chat_template is set"):
        create("causal_lm", **params, chat_template=True).fit(train.prompts, train.lengths)
    # GPT-2 keeps its blocks elsewhere (h, ln_f): refused by name, not mis-split
    with pytest.raises(ValueError, match="not a decoder with `layers` and `norm`"):
        create("causal_lm", **{**params, "base_path": str(_tiny_decoder(tmp_path / "gpt2", "gpt2"))}).fit(
            train.prompts, train.lengths)


@pytest.mark.skipif(not MMLU.is_file(), reason=f"MMLU-Pro data not present at {MMLU} (../shared is absent)")
def test_convert_mmlu_on_the_shared_data(tmp_path):
    from ranker.data import convert_mmlu

    counts = convert_mmlu(MMLU, tmp_path, model="Meta-Llama-3_1-8B-Instruct", seed=0)
    assert counts == {"train": 8422, "val": 2406, "test": 1204}
    test = load_dataset(tmp_path / "test.jsonl")
    assert test.examples[0].prompt.startswith("The following are multiple choice questions (with answers) about ")
    assert test.examples[0].prompt.endswith("Answer: Let's think step by step.")


@pytest.mark.long  # `make test-long` (CI runs it; docs/testing.md)
def test_sgs_logs_generations_retrain_swaps_the_ranker_the_router_uses(prefect_api, tmp_path, tiny_checkpoint):
    """Online adaptation, closed loop on real processes: two SGS instances log every finished
    sample; the router estimates lengths with the store's ranker; retrain_ranker learns from the
    log and publishes a new ranker; the router's next request uses it, with no restart."""
    from transformers import AutoTokenizer

    from flows.processes import Supervisor, start_instances, start_router
    from flows.retrain_ranker import RetrainParams, retrain_ranker
    from services.common.config import load_config, write_config
    from services.common.types import GenerateParams, PromptSpec
    from services.generation.client import GenerationClient
    from services.tasks.arith import eval_problems

    log_path, store_root = tmp_path / "gen.sqlite", tmp_path / "store"
    first = RankerStore(store_root).publish(
        create("prompt_length").fit(["a", "bbbbbbbb"], [5, 9]).save(tmp_path / "r0"))
    cfg = load_config(ROOT / "deploy/configs/smoke.yaml", [FAST_ENGINE,
        "generation.instances=2", f"generation.genlog={log_path}", f"generation.ranker_dir={store_root}",
        "generation.dispatch.policy=lpt", "weights.transport=direct",
    ])
    write_config(cfg, tmp_path / "config.json")
    tok = AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)
    problems = eval_problems(7, 24, **cfg.task.distribution())
    prompts = [PromptSpec(f"q{i}", tuple(tok.encode(p.prompt))) for i, p in enumerate(problems)]

    def dispatches() -> list[dict]:
        rows = [json.loads(x) for x in (tmp_path / "router-timeline.jsonl").read_text().splitlines()]
        return [r for r in rows if r["event"] == "dispatch"]

    sup = Supervisor(tmp_path)
    try:
        instances = start_instances(sup, tmp_path, str(tiny_checkpoint), 2, 1)
        with GenerationClient(start_router(sup, tmp_path, str(tiny_checkpoint), instances)) as router:
            router.wait_ready()
            for k in range(3):
                assert len(list(router.generate(prompts[8 * k: 8 * k + 8], GenerateParams(samples_per_prompt=4)))) == 32
            assert [d["ranker"] for d in dispatches()] == [first] * 3 and dispatches()[0]["estimates"] == "estimator"
            deadline = time.monotonic() + 60  # every finished sample, from both instances (written in the background)
            while GenerationLog(log_path).count() < 96 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert GenerationLog(log_path).count() == 96

            result = retrain_ranker(RetrainParams(
                log_path=str(log_path), store_root=str(store_root), kind="tfidf_linear", min_samples=40,
                holdout_fraction=0.25, work_dir=str(tmp_path / "work"),
            ))
            assert result["published"] not in (None, first)
            assert len(list(router.generate(prompts[:8], GenerateParams(samples_per_prompt=4)))) == 32
            assert dispatches()[-1]["ranker"] == result["published"]
    finally:
        sup.stop_all()
