"""The suites part of bench/real_model.py (``bench/real_model_suites.py``): paired changes, regimes against full
fine-tuning, the forgetting list and the declared choice of the shipped default, on hand-made answers."""

from __future__ import annotations

import json
import math

import pytest

from bench.real_model_suites import (
    REGIMES,
    against_baseline,
    answers_of,
    carried_regime,
    choose_default,
    decode_answers,
    encode_answers,
    forgetting_list,
    markdown,
    paired,
    regime_part,
    suite_sets,
)
from services.common.config import load_config
from tests.conftest import ROOT


def _answers(correct: list[int]) -> dict[str, bool]:
    return {f"q{i}": bool(c) for i, c in enumerate(correct)}


N = 100
BASE = {"heldout": _answers([1] * 20 + [0] * 80), "word-mul": _answers([1] * 70 + [0] * 30)}
AFTER = {  # full FT forgets word-mul; LoRA keeps it; KL keeps it but its held-out gain is far smaller
    "full_ft": {"heldout": _answers([1] * 70 + [0] * 30), "word-mul": _answers([1] * 30 + [0] * 70)},
    "full_ft_kl": {"heldout": _answers([1] * 30 + [0] * 70), "word-mul": _answers([1] * 68 + [0] * 32)},
    "lora": {"heldout": _answers([1] * 65 + [0] * 35), "word-mul": _answers([1] * 66 + [0] * 34)},
}


def _summary(regime: str, flagged: list[str]) -> dict:
    def score(a: dict) -> dict:
        p = sum(a.values()) / N
        return {"accuracy": p, "stderr": math.sqrt(p * (1 - p) / N), "prompts": N, "weight_version": 0}

    return {"suites": {n: {"temperature": 0.0, "before": score(BASE[n]), "after": score(AFTER[regime][n])}
                       for n in BASE}, "forgetting": [{"suite": n} for n in flagged]}


def _measured(flags: dict[str, list[str]]):
    answers = {r: {n: (BASE[n], AFTER[r][n]) for n in BASE} for r in REGIMES}
    parts = {r: regime_part(_summary(r, flags[r]), answers[r]) for r in REGIMES}
    return parts, against_baseline(answers)


def test_paired_change_is_the_mean_difference_per_question_with_its_standard_error():
    d = paired(_answers([1, 1, 0, 0]), _answers([1, 0, 0, 1]))
    assert d["difference"] == 0.0 and d["stderr"] == pytest.approx(math.sqrt(2 / 3) / 2) and d["in_stderr"] == 0.0
    down = paired(BASE["word-mul"], AFTER["full_ft"]["word-mul"])
    assert down["difference"] == pytest.approx(-0.4) and down["in_stderr"] < -3 and down["questions"] == N
    with pytest.raises(ValueError, match="different questions"):
        paired({"a": True}, {"b": True})


def test_a_regime_that_keeps_what_full_fine_tuning_forgot_becomes_the_default():
    parts, versus = _measured({"full_ft": ["word-mul"], "full_ft_kl": [], "lora": []})
    assert parts["full_ft"]["word-mul"]["dropped"] and parts["lora"]["word-mul"]["after"] == 0.66
    assert versus["lora"]["word-mul"]["differs"] and versus["lora"]["word-mul"]["difference"] == pytest.approx(0.36)
    assert versus["full_ft_kl"]["heldout"]["in_stderr"] <= -3  # KL's held-out accuracy is far below full FT's
    assert set(versus) == {"full_ft_kl", "lora"}
    choice = choose_default(parts, versus)
    assert choice["regime"] == "lora" and "word-mul" in choice["reason"]  # KL loses on held-out, LoRA does not
    text = markdown({"regimes": parts, "versus_full_ft": versus, "shipped_default": choice, "suite_prompts": N,
                     "kl_coef": 0.04})
    assert "| word-mul | 0.700 -> 0.300 ± 0.046 **dropped** | " in text and "Shipped default: **lora**" in text
    assert forgetting_list(parts) == [{"regime": "full_ft", "suite": "word-mul", "before": 0.7, "after": 0.3,
                                       "change": pytest.approx(-0.4), "change_stderr": pytest.approx(
                                           parts["full_ft"]["word-mul"]["change"]["stderr"])}]


def test_full_fine_tuning_stays_when_it_forgets_nothing_or_nothing_does_better():
    parts, versus = _measured({"full_ft": [], "full_ft_kl": [], "lora": []})
    assert choose_default(parts, versus)["regime"] == "full_ft"
    parts, versus = _measured({"full_ft": ["word-mul"], "full_ft_kl": ["word-mul"], "lora": ["word-mul"]})
    choice = choose_default(parts, versus)
    assert choice["regime"] == "full_ft" and "no other regime dropped fewer" in choice["reason"]


def test_the_suites_of_the_runs_are_the_configs_and_the_extra_probe_families():
    cfg = load_config(ROOT / "deploy/configs/smollm2-arith.yaml")
    (override,) = suite_sets(cfg, 8)
    run = load_config(ROOT / "deploy/configs/smollm2-arith.yaml", [override])
    assert [s.name for s in run.eval.suites] == ["word-mul", "word-add", "gsm8k-easy", "equations", "add3"]
    assert all(s.prompts == 8 and s.temperature == 0 for s in run.eval.suites)
    assert run.eval.suites[3].every == 0 and run.eval.suites[3].data.endswith("arith-probe/equations.jsonl")


def test_answers_survive_the_results_file_and_refuse_unequal_question_sets():
    answers = {"heldout": (BASE["heldout"], AFTER["lora"]["heldout"])}
    doc = json.loads(json.dumps(encode_answers(answers)))
    assert doc["heldout"]["before"].count("1") == 20 and decode_answers(doc) == answers
    with pytest.raises(ValueError, match="different questions"):
        encode_answers({"x": ({"a": True}, {"b": True})})


def _previous(regime: str, config: dict) -> dict:
    answers = encode_answers({n: (BASE[n], AFTER[regime][n]) for n in BASE})
    prov = {"commit": "0" * 40, "dirty": False, "date": "2026-11-30T00:00:00+00:00", "config": config}
    return {"regimes": {regime: {"heldout": {}}}, "runs": {regime: {"answers": answers, "provenance": prov,
                                                                    "rl_seconds": 1.0, "suite_eval_seconds": 2.0}}}


def test_a_regime_is_carried_only_when_its_own_block_is_fresh_and_declared_the_same(monkeypatch):
    import bench.record

    declared = {"kl_coef": 0.04, "quick": False}
    previous = _previous("lora", declared)
    assert carried_regime(previous, "full_ft", declared) is None  # not there: pending, nothing to refuse
    with pytest.raises(SystemExit, match=r"regime lora .* cannot be carried: .*--regimes lora"):
        carried_regime(previous, "lora", declared)  # commit 000...: not a commit of this repository
    monkeypatch.setattr(bench.record, "judge_block", lambda block: [])
    part, run = carried_regime(previous, "lora", declared)
    assert part == {"heldout": {}} and decode_answers(run["answers"])["word-mul"][1] == AFTER["lora"]["word-mul"]
    with pytest.raises(SystemExit, match=r"declared .*quick.*True"):
        carried_regime(previous, "lora", {**declared, "quick": True})


def test_until_every_regime_is_there_no_default_is_chosen_and_the_missing_are_named():
    parts, _ = _measured({"full_ft": ["word-mul"], "full_ft_kl": [], "lora": []})
    prov = {"commit": "a" * 40, "dirty": False, "date": "2026-11-30T15:00:00+00:00"}
    text = markdown({"regimes": {"full_ft": parts["full_ft"]}, "versus_full_ft": {}, "shipped_default": None,
                     "pending": ["full_ft_kl", "lora"], "suite_prompts": N, "kl_coef": 0.04,
                     "runs": {"full_ft": {"provenance": prov, "rl_seconds": 1500.0, "suite_eval_seconds": 700.0}}})
    assert "**not chosen yet**: full_ft_kl, lora not measured (`bench/real_model.py --suites --regimes " \
           "full_ft_kl,lora`)" in text
    assert "- full_ft: run in the invocation at `aaaaaaaaaaaa`, 2026-11-30T15:00:00+00:00; RL 1500 s" in text


def test_a_runs_answers_files_are_read_paired_and_encoded(tmp_path):
    from services.run.suites import answers_path

    for version, correct in ((0, [1, 0, 0]), (40, [1, 1, 0])):
        rows = [{"prompt_id": f"word-mul:{i}", "correct": bool(c), "reward": float(c)} for i, c in enumerate(correct)]
        answers_path(tmp_path / "evals", "word-mul", version).parent.mkdir(exist_ok=True)
        answers_path(tmp_path / "evals", "word-mul", version).write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"suites": {"word-mul": {"before": {"weight_version": 0}, "after": {"weight_version": 40}}}}
    doc = encode_answers(answers_of(tmp_path, summary))
    assert doc == {"word-mul": {"ids": ["word-mul:0", "word-mul:1", "word-mul:2"], "before": "100", "after": "110"}}


def _fake_braid_run(run_dir, extra):
    """What ``real_model.braid_run`` leaves behind (answers files, a summary), without a run: the regime is
    the run directory's name after the stamp."""
    from services.run.suites import answers_path

    regime = run_dir.name.split("-", 2)[-1]
    for version, answers in ((0, BASE), (40, AFTER[regime])):
        for name, a in answers.items():
            path = answers_path(run_dir / "evals", name, version)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps({"prompt_id": k, "correct": v}) + "\n" for k, v in a.items()))
    flagged = [{"suite": "word-mul"}] if regime == "full_ft" else []
    part = _summary(regime, [])["suites"]
    for s in part.values():
        s["after"]["weight_version"] = 40
    return {"suites": part, "forgetting": flagged, "iterations": 40, "rl_seconds": 1.0, "suite_eval_seconds": 2.0,
            "samples_per_second": 3.0}


def test_invocations_run_some_regimes_carry_the_others_and_choose_once_all_are_there(tmp_path, monkeypatch):
    import bench.record
    from bench import real_model

    monkeypatch.setattr(real_model, "braid_run", _fake_braid_run)
    monkeypatch.setattr(bench.record, "judge_block", lambda block: [])  # as if each earlier block were fresh
    args = ["--suites", "--quick", "--out", str(tmp_path), "--runs-dir", str(tmp_path / "runs")]
    assert real_model.main([*args, "--regimes", "full_ft"]) == 0
    first = json.loads((tmp_path / "real_model.json").read_text())["suites"]
    assert first["pending"] == ["full_ft_kl", "lora"] and first["shipped_default"] is None
    assert first["regimes"]["full_ft"]["word-mul"]["dropped"] and "not chosen yet" in (
        tmp_path / "real_model_suites.md").read_text()
    assert real_model.main([*args, "--regimes", "full_ft_kl,lora"]) == 0
    second = json.loads((tmp_path / "real_model.json").read_text())["suites"]
    assert second["pending"] == [] and second["runs"]["full_ft"]["carried"]
    assert second["runs"]["full_ft"]["provenance"] == first["runs"]["full_ft"]["provenance"]
    assert not second["provenance"]["measured_in_this_run"] and second["shipped_default"]["regime"] == "lora"
    assert "- full_ft: carried from the invocation at" in (tmp_path / "real_model_suites.md").read_text()
    with pytest.raises(SystemExit, match="--regimes 'lora,sft': sft"):
        real_model.main([*args, "--regimes", "lora,sft"])
