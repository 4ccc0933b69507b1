"""Ranker with real parts: the MiniLM transformer ranker, the ensemble, the retrain_ranker Prefect
flow (real Prefect test API) hot-swapping the ranker a watcher serves, and the MMLU-Pro bench data."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from ranker.base import create, load_ranker
from ranker.data import load_dataset
from ranker.genlog import GenerationLog, GenRecord
from ranker.metrics import spearman
from ranker.store import RankerStore, RankerWatcher
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


def _fill_log(path: Path, rows: list[dict], version: int, scale: float = 1.0) -> None:
    with GenerationLog(path) as log:
        log.append(GenRecord(r["id"], r["prompt"], max(1, int(r["response_length"] * scale)), version, 0, float(i))
                   for i, r in enumerate(rows))


def test_retrain_flow_swaps_the_ranker_the_watcher_serves(prefect_api, tmp_path):
    from prefect.client.orchestration import get_client

    from flows.retrain_ranker import RetrainParams, retrain_ranker

    rows = [json.loads(x) for x in FIXTURE.read_text().splitlines()]
    log_path, store_root = tmp_path / "gen.sqlite", tmp_path / "store"
    _fill_log(log_path, rows, version=1)
    store = RankerStore(store_root)
    store.publish(create("prompt_length").fit(["a", "bbbbbbbb"], [5, 9]).save(tmp_path / "initial"))
    watcher = RankerWatcher(store_root)
    old = watcher.get()
    assert old.kind == "prompt_length"

    params = RetrainParams(log_path=str(log_path), store_root=str(store_root), n_recent=160, kind="tfidf_linear",
                           holdout_fraction=0.25, min_samples=40, work_dir=str(tmp_path / "work"))
    result = retrain_ranker(params)
    assert result["previous"] is not None and result["published"] != result["previous"]
    assert result["n_train"] + result["n_holdout"] == 160
    assert result["before"]["kind"] == "prompt_length" and result["after"]["kind"] == "tfidf_linear"
    assert result["after"]["spearman"] > result["before"]["spearman"]  # learned from the log, on held-out samples
    assert store.current().name == result["published"]
    new = watcher.get()  # the SGS side: the next get() serves the new ranker, no restart
    assert (new is not old and new.kind == "tfidf_linear" and new.unit == "tokens"
            and watcher.name == result["published"])

    async def artifact():
        async with get_client() as client:
            from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["ranker-retrain"])))

    import asyncio

    arts = asyncio.run(artifact())
    assert arts and arts[0].type == "table"
    table = arts[0].data if isinstance(arts[0].data, list) else json.loads(arts[0].data)
    assert [r["ranker"] for r in table] == ["current (before)", "new (after)"]


def test_retrain_flow_fails_clearly_on_a_small_log(prefect_api, tmp_path):
    from flows.retrain_ranker import RetrainParams, retrain_ranker

    rows = [json.loads(x) for x in FIXTURE.read_text().splitlines()][:12]
    _fill_log(tmp_path / "gen.sqlite", rows, version=1)
    params = RetrainParams(log_path=str(tmp_path / "gen.sqlite"), store_root=str(tmp_path / "store"), min_samples=50)
    with pytest.raises(ValueError, match=r"gen.sqlite: generation log has 12 finished samples, .*min_samples=50"):
        retrain_ranker(params)
    assert RankerStore(tmp_path / "store").current() is None
    with pytest.raises(ValueError, match="holdout_fraction"):
        RetrainParams(log_path="x", store_root="y", holdout_fraction=0.9)


@pytest.mark.skipif(not MMLU.is_file(), reason=f"MMLU-Pro data not present at {MMLU} (../shared is absent)")
def test_convert_mmlu_on_the_shared_data(tmp_path):
    from ranker.data import convert_mmlu

    counts = convert_mmlu(MMLU, tmp_path, model="Meta-Llama-3_1-8B-Instruct", seed=0)
    assert counts == {"train": 8422, "val": 2406, "test": 1204}
    test = load_dataset(tmp_path / "test.jsonl")
    assert test.examples[0].prompt.startswith("The following are multiple choice questions (with answers) about ")
    assert test.examples[0].prompt.endswith("Answer: Let's think step by step.")


def test_retrain_flow_replaces_an_unreadable_current_ranker(prefect_api, tmp_path):
    from flows.retrain_ranker import RetrainParams, retrain_ranker

    rows = [json.loads(x) for x in FIXTURE.read_text().splitlines()]
    _fill_log(tmp_path / "gen.sqlite", rows, version=1)
    store = RankerStore(tmp_path / "store")
    broken = store.publish(create("prompt_length").fit(["a", "bb"], [5, 9]).save(tmp_path / "initial"))
    (tmp_path / "store" / broken / "ranker.json").write_text("{}")
    result = retrain_ranker(RetrainParams(log_path=str(tmp_path / "gen.sqlite"), store_root=str(tmp_path / "store"),
                                          kind="prompt_length", min_samples=40))
    assert result["before"] is None and result["previous"] == broken
    assert store.current().name == result["published"] != broken


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
