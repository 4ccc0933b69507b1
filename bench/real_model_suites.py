"""What RL on arith-nl does to the rest of SmolLM2's arithmetic, by regime (issue 57): ``real_model.json`` ``suites``.

Declared before the run of record (DESIGN.md §5); nothing here is chosen after seeing results:

- **Runs**: ``deploy/configs/smollm2-arith.yaml`` as shipped (its 40 one-step GRPO iterations, its
  suites), once per regime of ``REGIMES``: full fine-tuning without a KL term (what the config
  ships: ``trainer.kl_coef`` 0), full fine-tuning with ``KL_COEF`` (DeepSeekMath's GRPO value;
  the reference is the base model), and LoRA as ``bench/lora.py`` declares it (rank 16, alpha 32,
  every projection, learning rate 2e-4). The regimes run one after the other on one machine.
- **Suites**: the config's (word-mul, word-add, gsm8k-easy) plus ``EXTRA_SUITES`` (the issue's other
  probe families, bare equations and three-digit sums, from deploy/data/arith-probe), every one
  greedy, 100 questions drawn by ``eval.seed``, scored by the run itself at the warm start and at the
  end (``services.run.evaluations``); the held-out split (500 questions at the training temperature)
  is the first suite.
- **Before and after**: each suite's accuracy with its binomial s.e. at the warm start and at the
  end, and the paired change (per question, from the runs' answers files ``evals/<suite>-v*.jsonl``)
  with its s.e. A suite **dropped** in a regime when the run's own forgetting check flagged it at the
  end (accuracy below the warm start's by more than ``eval.forgetting_se`` = 3 s.e. of the
  difference): ``forgetting`` lists each (regime, suite).
- **Regimes against full fine-tuning without KL**: per suite, the paired difference of the final
  answers (same questions, same seed); it **differs** when |difference| >= ``GOAL_SE`` s.e.
- **Shipped default** (``choose_default``): full fine-tuning without KL stays, unless another regime
  drops fewer suites while its held-out accuracy is not below full fine-tuning's by ``GOAL_SE`` s.e.
  or more (paired) and at least one of the suites full fine-tuning dropped differs in its favour by
  ``GOAL_SE`` s.e.; among such regimes the one that drops fewest, then the higher held-out accuracy.
  The result names the regime and the reason; the config is changed (or not) in a commit after.
- **Regimes in separate invocations** (``--regimes``): a regime not run in this invocation is carried
  from the results file (its part, its answers per question and its own provenance block) only when
  that block is fresh (``bench/record.py``: a clean commit, and the same code on the measured path
  as now) and declared the same constants; else the script refuses to carry it. Until every regime
  is there the entry lists the missing ones as ``pending`` and makes no comparison and no choice.

    python bench/real_model.py --suites [--regimes full_ft,full_ft_kl,lora] [--quick] [--allow-dirty]

About 45 minutes per regime on the 2-core machine (25 of RL, the rest the suites' evaluations at
both ends and between steps): two and a half hours in all. ``--quick``: 2 iterations, 8 questions per
suite, into /tmp/braid-bench-quick (the pipeline, not a result).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from pathlib import Path

from bench.lora import LORA_SETS

KL_COEF = 0.04  # DeepSeekMath's GRPO KL coefficient (Shao et al. 2024, §4.1): the regime with a reference
REGIMES: dict[str, list[str]] = {
    "full_ft": [],  # the shipped config: full fine-tuning, trainer.kl_coef 0
    "full_ft_kl": [f"trainer.kl_coef={KL_COEF}"],
    "lora": LORA_SETS,
}
BASELINE = "full_ft"
EXTRA_SUITES = ("equations", "add3")  # deploy/data/arith-probe: scored at the warm start and the end only
SUITE_PROMPTS = 100
GOAL_SE = 3.0
QUICK = ["trainer.iterations=2", "eval.prompts=16"]
QUICK_SUITE_PROMPTS = 8


def suite_sets(cfg, prompts: int) -> list[str]:
    """The override that gives a run the config's suites plus ``EXTRA_SUITES``, ``prompts`` questions each."""
    suites = [s.model_dump(mode="json") | {"prompts": prompts} for s in cfg.eval.suites]
    template = suites[0]
    for name in EXTRA_SUITES:
        suites.append(template | {"name": name, "data": f"deploy/data/arith-probe/{name}.jsonl", "every": 0})
    return [f"eval.suites={json.dumps(suites)}"]


# ---------------------------------------------------------------------------- pure: statistics and the choice
def paired(a: dict[str, bool], b: dict[str, bool]) -> dict:
    """Mean and s.e. of ``b - a`` per question (the same questions), and that in s.e."""
    if set(a) != set(b):
        raise ValueError("the two evaluations answered different questions")
    diffs = [float(b[k]) - float(a[k]) for k in sorted(a)]
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    return {"difference": mean, "stderr": se, "in_stderr": mean / se if se > 0 else (0.0 if mean == 0 else math.inf),
            "questions": len(diffs)}


def regime_part(summary: dict, answers: dict[str, tuple[dict, dict]]) -> dict:
    """One regime's suites: before and after with s.e., the paired change, and whether the run flagged it."""
    flagged = {f["suite"]: f for f in summary.get("forgetting", [])}
    out = {}
    for name, s in summary["suites"].items():
        before, after = answers[name]
        out[name] = {"before": s["before"]["accuracy"], "before_stderr": s["before"]["stderr"],
                     "after": s["after"]["accuracy"], "after_stderr": s["after"]["stderr"],
                     "prompts": s["after"]["prompts"], "temperature": s.get("temperature"),
                     "change": paired(before, after), "dropped": name in flagged}
    return out


def against_baseline(answers: dict[str, dict[str, tuple[dict, dict]]]) -> dict:
    """Per regime other than ``BASELINE`` and suite: the paired difference of the final answers, and whether
    it differs by ``GOAL_SE`` s.e. or more."""
    out: dict[str, dict] = {}
    for regime, suites in answers.items():
        if regime == BASELINE:
            continue
        out[regime] = {}
        for name, (_, after) in suites.items():
            d = paired(answers[BASELINE][name][1], after)
            out[regime][name] = {**d, "differs": abs(d["in_stderr"]) >= GOAL_SE}
    return out


def choose_default(parts: dict[str, dict], versus: dict[str, dict]) -> dict:
    """The shipped default by the declared rule (module docstring): the regime and the reason."""
    dropped = {r: sorted(n for n, s in p.items() if s["dropped"]) for r, p in parts.items()}
    base_dropped = set(dropped[BASELINE])
    better = []
    for regime, vs in versus.items():
        held_worse = vs["heldout"]["in_stderr"] <= -GOAL_SE
        rescued = [n for n in base_dropped if vs[n]["differs"] and vs[n]["difference"] > 0]
        if len(dropped[regime]) < len(base_dropped) and not held_worse and rescued:
            better.append((len(dropped[regime]), -parts[regime]["heldout"]["after"], regime, rescued))
    if not better:
        why = ("full fine-tuning without KL dropped no suite" if not base_dropped else
               f"no other regime dropped fewer suites than full fine-tuning's {sorted(base_dropped)} with a "
               f">= {GOAL_SE:g} s.e. difference in its favour and a held-out accuracy not {GOAL_SE:g} s.e. lower")
        return {"regime": BASELINE, "reason": why, "dropped": dropped}
    _, _, regime, rescued = min(better)
    return {"regime": regime, "dropped": dropped,
            "reason": f"{regime} dropped {dropped[regime] or 'no suite'} against full fine-tuning's "
                      f"{sorted(base_dropped)}, kept {sorted(rescued)} by >= {GOAL_SE:g} s.e., and its held-out "
                      f"accuracy is not {GOAL_SE:g} s.e. lower"}


def forgetting_list(parts: dict[str, dict]) -> list[dict]:
    """Each (regime, suite) that dropped, with before, after and the paired change."""
    return [{"regime": r, "suite": n, "before": s["before"], "after": s["after"], "change": s["change"]["difference"],
             "change_stderr": s["change"]["stderr"]} for r, p in parts.items() for n, s in p.items() if s["dropped"]]


# ---------------------------------------------------------------------------- the runs
def answers_of(run_dir: Path, summary: dict) -> dict[str, tuple[dict, dict]]:
    """Per suite, (warm-start answers, final answers) as prompt id -> correct."""
    from services.run.suites import answers_path, read_answers

    evals = run_dir / "evals"
    return {name: (read_answers(answers_path(evals, name, s["before"]["weight_version"])),
                   read_answers(answers_path(evals, name, s["after"]["weight_version"])))
            for name, s in summary["suites"].items()}


def encode_answers(answers: dict[str, tuple[dict, dict]]) -> dict[str, dict]:
    """Per suite, the questions and whether each was answered right before and after, as ``0``/``1`` strings
    (what a later invocation needs to pair a carried regime with the others)."""
    out = {}
    for name, (before, after) in answers.items():
        if set(before) != set(after):
            raise ValueError(f"suite {name}: the warm start and the end answered different questions")
        ids = sorted(before)
        out[name] = {"ids": ids, "before": "".join("01"[before[i]] for i in ids),
                     "after": "".join("01"[after[i]] for i in ids)}
    return out


def decode_answers(doc: dict[str, dict]) -> dict[str, tuple[dict, dict]]:
    """``encode_answers`` undone."""
    return {name: tuple({i: c == "1" for i, c in zip(s["ids"], s[side], strict=True)} for side in ("before", "after"))
            for name, s in doc.items()}


def carried_regime(previous: dict, regime: str, declared: dict) -> tuple[dict, dict] | None:
    """``regime``'s part and run from an earlier invocation's entry, when it is there and may be carried
    (module docstring); None when it is not there. Refuses a stale one, saying why."""
    from bench.record import judge_block

    run, part = (previous.get("runs") or {}).get(regime), (previous.get("regimes") or {}).get(regime)
    if not run or not part or "answers" not in run:
        return None
    prov = run.get("provenance") or {}
    problems = judge_block(prov)
    if prov.get("config") != declared:
        problems = [*problems, f"declared {prov.get('config')}, not {declared}"]
    if problems:
        raise SystemExit(f"regime {regime} in the results file cannot be carried: {'; '.join(problems)}; "
                         f"run it again (--regimes {regime})")
    return part, run


def measure(runs_dir: Path, quick: bool, regimes: list[str], previous: dict, prov: dict) -> dict:
    """The regimes in ``regimes`` run now, the others carried from ``previous`` when they may be, then the
    comparison once all are there (module docstring). ``prov``: this invocation's provenance block."""
    from bench import real_model
    from services.common.config import load_config

    cfg = load_config(real_model.CONFIG)
    common = [*(QUICK if quick else []), *suite_sets(cfg, QUICK_SUITE_PROMPTS if quick else SUITE_PROMPTS)]
    parts, runs = {}, {}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for regime, sets in REGIMES.items():
        if regime not in regimes:
            if (carried := carried_regime(previous, regime, prov["config"])) is not None:
                parts[regime], runs[regime] = carried[0], {**carried[1], "carried": True}
            continue
        run_dir = runs_dir / f"{stamp}-{regime}"
        summary = real_model.braid_run(run_dir, [*sets, *common])
        answers = answers_of(run_dir, summary)
        parts[regime] = regime_part(summary, answers)
        runs[regime] = {"run_dir": str(run_dir), "sets": sets, "iterations": summary["iterations"],
                        "rl_seconds": summary["rl_seconds"], "suite_eval_seconds": summary["suite_eval_seconds"],
                        "samples_per_second": summary["samples_per_second"], "answers": encode_answers(answers),
                        "provenance": prov}
    pending = [r for r in REGIMES if r not in parts]
    versus = {} if pending else against_baseline({r: decode_answers(runs[r]["answers"]) for r in REGIMES})
    return {"regimes": parts, "versus_full_ft": versus, "forgetting": forgetting_list(parts), "pending": pending,
            "shipped_default": None if pending else choose_default(parts, versus), "runs": runs,
            "kl_coef": KL_COEF, "goal_se": GOAL_SE, "suite_prompts": QUICK_SUITE_PROMPTS if quick else SUITE_PROMPTS,
            "extra_suites": list(EXTRA_SUITES)}


def markdown(r: dict) -> str:
    regimes = list(r["regimes"])
    suites = list(r["regimes"][regimes[0]])
    lines = ["# SmolLM2 on arith-nl: what each regime does to the suites (bench/real_model.py --suites)", "",
             f"Before -> after (± s.e.), greedy suites of {r['suite_prompts']} questions, the held-out split at the "
             f"training temperature; **dropped**: flagged by the run's forgetting check (> 3 s.e. below the warm "
             f"start). KL coefficient {r['kl_coef']:g}.", "",
             "| suite | " + " | ".join(regimes) + " |", "|---|" + "---|" * len(regimes)]
    for name in suites:
        cells = []
        for regime in regimes:
            s = r["regimes"][regime][name]
            vs = r["versus_full_ft"].get(regime, {}).get(name)
            diff = f"; vs full FT {vs['difference']:+.3f} ({vs['in_stderr']:+.1f} s.e.)" if vs else ""
            cells.append(f"{s['before']:.3f} -> {s['after']:.3f} ± {s['after_stderr']:.3f}"
                         f"{' **dropped**' if s['dropped'] else ''}{diff}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    d = r["shipped_default"]
    lines += ["", f"Shipped default: **{d['regime']}** ({d['reason']})." if d else
              f"Shipped default: **not chosen yet**: {', '.join(r['pending'])} not measured "
              f"(`bench/real_model.py --suites --regimes {','.join(r['pending'])}`).", ""]
    for regime, run in r.get("runs", {}).items():
        p = run["provenance"]
        lines.append(f"- {regime}: {'carried from' if run.get('carried') else 'run in'} the invocation at "
                     f"`{p['commit'][:12]}`{' (dirty tree)' if p.get('dirty') else ''}, {p['date']}; "
                     f"RL {run['rl_seconds']:.0f} s, suites {run['suite_eval_seconds']:.0f} s.")
    return "\n".join([*lines, ""])
