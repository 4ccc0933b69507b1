"""Pure parts of the training-model bench (bench/train_profile.py, its batches in bench/train_profile_cases.py):
its batches and predictions; no step runs."""

from __future__ import annotations

import gzip
import json

import pytest

from bench import train_profile as bt
from bench import train_profile_cases as cases_of
from services.generation.scheduling.models import get_model
from services.policy.model import Policy, char_tokenizer


def test_the_shipped_countdown_lengths_are_the_default_configs_batches():
    cases = cases_of.countdown_cases(bt.LENGTHS, 8)
    recorded = [c for c in cases if c.micro_batch_groups == 8]
    assert len(recorded) == 6 and len(cases) == 8 and all(c.micro_batch_groups == 1 for c in cases[6:])
    for c in recorded:
        assert len(c.groups) == 32 and all(len(g) == 8 and all(p == 11 for p, _ in g) for g in c.groups)
        assert len(c.calls()) == 4 and sum(map(len, c.calls())) == 256 and max(c.seqs) <= 11 + 192
    assert len(cases_of.countdown_cases(bt.LENGTHS, 8, limit=2, regroup=1)) == 3


def test_a_file_of_another_format_is_refused(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"format": "other", "iterations": []}))
    with pytest.raises(ValueError, match="not a braid-train-lengths/1 file"):
        cases_of.countdown_cases(path, 8)


def test_mmlu_groups_are_one_questions_responses_in_completion_order(tmp_path):
    path = tmp_path / "m.jsonl.gz"
    with gzip.open(path, "wt") as f:
        for q in range(6):
            chars = {m: 40 * (q + 1) + 4 * i for i, m in enumerate(cases_of.MMLU_MODELS)}
            if q == 5:
                del chars[cases_of.MMLU_MODELS[0]]  # a question some model lacks is left out
            f.write(json.dumps({"question": "q" * 20, "options": ["ab", "cd"], "resp_chars": chars}) + "\n")
    batches = cases_of.mmlu_groups(path, questions=2, steps=2)
    assert len(batches) == 2 and all(len(b) == 2 for b in batches)
    for b in batches:
        assert all(len(g) == 8 and all(p == 6 for p, _ in g) for g in b)  # (20 + 2 + 2) / 4 prompt tokens
        assert [max(p + r for p, r in g) for g in b] == sorted(max(p + r for p, r in g) for g in b)
    assert {r for b in batches for g in b for _, r in g} <= {10 * (q + 1) + i for q in range(5) for i in range(8)}
    with pytest.raises(ValueError, match="5 questions"):
        cases_of.mmlu_groups(path, questions=3, steps=2)


def test_predictions_price_padding_as_the_allocator_does():
    model = get_model("braid-tiny")
    site, prof, path = bt.allocator_site(None, model)
    assert path.name == "cpu-local-braid-tiny-train.json" and site.profile is not None
    case = cases_of.countdown_cases(bt.LENGTHS, 8, limit=1, regroup=0)[0]
    p = bt.predictions(case, prof, model, site)
    assert p["pad_factor"] > 1.3 and p["expected_pad_factor"] > 1.3 and p["micro_batches"] >= 4
    assert p["unpadded_s"] < p["exact_s"] and p["unpadded_s"] < p["planned_s"]
    wl = cases_of.workload_case(cases_of.WORKLOAD, 8, 8)
    assert len(wl.seqs) == 64 and len(wl.calls()) == 1


def test_model_error_is_the_median_over_cases_and_its_spread_over_rounds():
    rows = [{"planned_s": 1.1, "measured_s": {"median": 1.0}, "measured_runs": [1.0, 1.1, 0.9]},
            {"planned_s": 0.8, "measured_s": {"median": 1.0}, "measured_runs": [1.0, 0.8, 1.2]},
            {"planned_s": 2.0, "measured_s": {"median": 2.0}, "measured_runs": [2.0, 2.0, 2.0]}]
    s = bt.summarise(rows, 3, "planned_s")
    assert s["median_abs_rel_error"] == pytest.approx(0.1) and s["mean_rel_error"] == pytest.approx(-1 / 30)
    assert s["per_round"]["n"] == 3 and s["per_round"]["min"] == pytest.approx(0.0)


def _recorded_run(tmp_path, texts=None):
    """A run directory as a default run with ``generation.genlog`` leaves it: config, ledger, log."""
    import yaml

    from ranker.genlog import GenerationLog, GenRecord
    from services.common.config import load_config
    from services.tasks.arith import ProblemSampler, eval_problems

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(yaml.safe_load(bt.CONFIG.read_text())))
    cfg = load_config(run / "config.json")
    dist = cfg.task.distribution()
    held = frozenset(p.prompt for p in eval_problems(cfg.eval.seed, cfg.eval.prompts, **dist))
    problems = ProblemSampler(cfg.task.seed, exclude=held, **dist).batch(4)
    texts = texts or {p.prompt_id: f"<|user|>{p.prompt}" for p in problems}
    with GenerationLog(run / "genlog.sqlite") as log:  # p3's second sample generated no token: not logged
        log.append([GenRecord(p.prompt_id, texts[p.prompt_id], 10 * k + i + 1, 0, 0, float(100 * k - i))
                    for k, p in enumerate(problems) for i in range(2) if (k, i) != (3, 1)])
    consume = [{"event": "consume", "attempt": a, "step": s, "prompt_id": pid, "samples": [0, 1]}
               for a, s, pid in ((0, 1, "p1"), (0, 1, "p0"), (0, 2, "p2"), (1, 2, "p3"), (1, 2, "p2"))]
    ledger = [{"event": "start", "attempt": 0, "version": 0, "time": 5.0}, *consume[:3],
              {"event": "start", "attempt": 1, "version": 1, "time": 9.0}, *consume[3:]]  # step 2 redone
    (run / "ledger.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ledger))
    return run, problems


def test_extract_reads_each_steps_groups_from_the_ledger_and_their_lengths_from_the_log(tmp_path):
    run, problems = _recorded_run(tmp_path)
    its = cases_of.extract_run(run)
    assert [(it["iteration"], it["mode"]) for it in its] == [(0, "one_step"), (1, "one_step")]
    (p1, l1), (p0, l0) = its[0]["groups"]  # the step's order, not the prompts' ids
    assert (l1, l0) == ([12, 11], [2, 1])  # within a group, by finish time
    assert [g[1] for g in its[1]["groups"]] == [[31, 0], [22, 21]]  # the rolled-back attempt's step 2 is gone
    enc = Policy(model=None, tokenizer=char_tokenizer())
    assert (p0, p1) == tuple(len(enc.encode_prompt(p.prompt)) for p in problems[:2])
    assert cases_of.run_ref(run)["first_event_unix_s"] == 5.0


def test_extract_refuses_a_run_whose_prompts_are_not_the_seeded_samplers(tmp_path):
    run, _ = _recorded_run(tmp_path, texts={f"p{k}": "another prompt" for k in range(4)})
    with pytest.raises(SystemExit, match="not the seeded sampler's"):
        cases_of.extract_run(run)
