"""Record a real multi-visit length trace (issue 55): the same prompts answered again and again by a
policy that trains between visits.

Recipe (``DECLARED`` below, fixed before the recording): a Braid run through the CLI of the shipped
real-model config (``deploy/configs/smollm2-arith.yaml``: SmolLM2-135M-Instruct on vLLM, one-step
asynchronous GRPO, the numeric verifier) on ``prompts`` GSM8K training questions (``--data``, drawn
with ``seed``) for ``visits`` epochs' worth of optimizer steps: every question is drawn once per epoch
(reshuffled each epoch; a one-step run draws ahead, so a last visit may be partly recorded), sampled
``group_size`` times, and the policy takes an optimizer step every ``prompts_per_iteration``
questions, so each visit meets a newer policy. The SGS logs every finished sample
(``generation.genlog``: prompt text, length in tokens, weight version, finish time). The export keeps
one row per group (draw) with all of its samples:

    {"prompt": <the chat-templated prompt text>, "visit": <0-based visit of this prompt>,
     "version": <weight version that generated it>, "lengths": [<tokens, in finishing order>]}

into ``bench/traces/gsm8k_smollm2_visits.jsonl.gz`` (``--out``), with the recipe and the run's
provenance in the ``.json`` beside it. ``bench/run_signals_eval.py`` scores the estimators on it.

    python bench/run_signals_trace.py [--data ../shared/data/gsm8k/train.jsonl.gz] [--quick]
"""

from __future__ import annotations

import gzip
import json
import os
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report_io import RecordParser, provenance, results_dir  # noqa: E402

CONFIG = ROOT / "deploy/configs/smollm2-arith.yaml"
DEFAULT_DATA = ROOT.parent / "shared/data/gsm8k/train.jsonl.gz"
DEFAULT_OUT = ROOT / "bench/traces/gsm8k_smollm2_visits.jsonl.gz"
# declared 2026-11-30, before the recording: 64 questions x 8 samples x 3 visits = 1,536 samples at up to
# 1,024 tokens. The pilot (docs/ranker.md: 16 questions x 8 at 1,024 tokens, 0.58 samples/s) put 3.9% of the
# answers at the cap and 12.5% past 384 tokens, so the cap went from 384 to 1,024 (below it, the cap would be
# the makespan of most groups), and the questions from 96 to 64 to keep the recording near an hour of the two
# cores (generation ~45 min, plus the trainer's steps on the groups with a non-zero advantage). The KV cache
# doubles to 64K tokens so 128 samples in flight are not preempted.
DECLARED = {"prompts": 64, "group_size": 8, "visits": 3, "prompts_per_iteration": 16, "max_new_tokens": 1024,
            "num_blocks": 2048, "seed": 0}
QUICK = {**DECLARED, "prompts": 8, "group_size": 4, "visits": 2, "prompts_per_iteration": 4, "max_new_tokens": 32,
         "num_blocks": 1024}


RECORDING = "recording.json"  # the recording's meta, kept beside its generation log in the run directory
HELD_OUT = 8  # other questions of the file: the run's own held-out evaluation (not part of the trace)


def subset(src: Path, n: int, seed: int) -> list[dict]:
    """``n`` distinct questions of a GSM8K-style JSONL(.gz) file, drawn with ``seed``."""
    opener = gzip.open if src.suffix == ".gz" else open
    with opener(src, "rt") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    seen, unique = set(), []
    for r in rows:
        q = r.get("question")
        if isinstance(q, str) and q.strip() and q not in seen and r.get("answer") is not None:
            seen.add(q)
            unique.append({"question": q, "answer": r["answer"]})
    if len(unique) < n + HELD_OUT:
        raise SystemExit(f"bench/run_signals_trace.py: {src} has {len(unique)} questions, the recipe needs {n}")
    return random.Random(seed).sample(unique, n + HELD_OUT)


def overrides(regime: dict, train: Path, heldout: Path, run_dir: Path) -> list[str]:
    """The recipe as config overrides of the shipped real-model config."""
    iterations = regime["visits"] * regime["prompts"] // regime["prompts_per_iteration"]
    return [f"runs_dir={run_dir.parent}", f"run_id={run_dir.name}",
            f"task.dataset.train={train}", f"task.dataset.heldout={heldout}", "task.dataset.prompt_field=question",
            "task.dataset.answer_field=answer", "task.dataset.group_field=null", "task.dataset.name=gsm8k-subset",
            f"task.seed={regime['seed']}",
            f"trainer.iterations={iterations}", f"trainer.prompts_per_iteration={regime['prompts_per_iteration']}",
            f"trainer.group_size={regime['group_size']}", f"generation.max_new_tokens={regime['max_new_tokens']}",
            f"generation.num_blocks={regime['num_blocks']}",
            f"generation.genlog={run_dir / 'genlog.sqlite'}", f"eval.prompts={HELD_OUT}"]


def record(run_dir: Path, sets: list[str]) -> dict:
    """The run itself, through the CLI, from this checkout."""
    cmd = [sys.executable, "-m", "flows.cli", "run", "--config", str(CONFIG), *[x for s in sets for x in ("--set", s)]]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode != 0:
        raise SystemExit(f"the recording run failed; see {run_dir}")
    return json.loads((run_dir / "summary.json").read_text())


def group_of(prompt_id: str) -> str:
    """The group (draw) a logged sample belongs to: a sample resumed on another instance after its own was
    lost is submitted alone as ``<draw>/<sample>#<attempt>`` (``d112/3#0``), and is still its draw's."""
    return prompt_id.split("/", 1)[0]


def export(genlog: Path, group_size: int) -> list[dict]:
    """One row per complete group of the log, visits numbered per prompt text in draw order: every draw
    of a prompt is a visit, so a group that did not finish whole (left out) still moves the count."""
    with sqlite3.connect(genlog) as db:
        rows = db.execute("SELECT prompt_id, prompt, response_length, weight_version, finished_at "
                          "FROM generations ORDER BY finished_at").fetchall()
    groups: dict[str, dict] = {}
    for pid, prompt, length, version, _ in rows:
        g = groups.setdefault(group_of(pid), {"prompt": prompt, "version": version, "lengths": []})
        g["lengths"].append(length)
        g["version"] = min(g["version"], version)
    draw = sorted(groups, key=lambda gid: (len(gid), gid))  # draw order: the sampler numbers its draws
    visits: dict[str, int] = {}
    out = []
    for gid in draw:
        g = groups[gid]
        visit = visits.get(g["prompt"], 0)
        visits[g["prompt"]] = visit + 1
        if len(g["lengths"]) < group_size:
            continue  # not a whole group (an evaluation prompt's samples, or a group dropped unfinished)
        out.append({"prompt": g["prompt"], "visit": visit, "version": g["version"],
                    "lengths": g["lengths"][:group_size]})
    return out


def write_trace(out: Path, groups: list[dict], meta: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt") as fh:
        fh.writelines(json.dumps(g) + "\n" for g in groups)
    out.with_suffix("").with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{len(groups)} groups -> {out}")


def export_only(run_dir: Path, out: Path, src: Path) -> int:
    """Export an earlier recording's generation log again (``--export-only``): the recording's recipe
    and provenance as it wrote them, this export's beside them."""
    kept = run_dir / RECORDING
    if not kept.is_file():
        raise SystemExit(f"bench/run_signals_trace.py: {kept} is missing (the recording's meta, written beside its "
                         "generation log)")
    old = json.loads(kept.read_text())
    regime = old["recipe"]
    prov = provenance(Path(__file__), {"recipe": regime, "export_only": str(run_dir)}, inputs=[src])
    groups = export(run_dir / "genlog.sqlite", regime["group_size"])
    meta = {**old, "groups": len(groups),
            "visits_complete": sum(1 for g in groups if g["visit"] == regime["visits"] - 1),
            "recorded": old.get("recorded") or old.get("provenance"), "provenance": prov}
    write_trace(out, groups, meta)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = RecordParser(description=__doc__)
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="GSM8K training file (question/answer rows)")
    parser.add_argument("--out", default=None,
                        help=f"trace file (default {DEFAULT_OUT.relative_to(ROOT)}; --quick: the scratch results dir)")
    parser.add_argument("--runs-dir", default=str(ROOT / "runs" / "run-signals-trace"))
    parser.add_argument("--quick", action="store_true", help="a few questions and tokens: the pipeline, not a trace")
    parser.add_argument("--export-only", default=None, metavar="RUN_DIR",
                        help="export an earlier recording's generation log again (no run)")
    ns = parser.parse_args(argv)
    src = Path(ns.data)
    if not src.is_file():
        raise SystemExit(f"bench/run_signals_trace.py: no data at {src} (pass --data)")
    regime = QUICK if ns.quick else DECLARED
    out = Path(ns.out) if ns.out else (results_dir(None, True) / DEFAULT_OUT.name if ns.quick else DEFAULT_OUT)
    if ns.export_only:
        return export_only(Path(ns.export_only), out, src)
    run_dir = Path(ns.runs_dir) / ("quick" if ns.quick else "full")
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = subset(src, regime["prompts"], regime["seed"])
    train, heldout = run_dir / "train.jsonl", run_dir / "heldout.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows[:regime["prompts"]]))
    heldout.write_text("".join(json.dumps(r) + "\n" for r in rows[regime["prompts"]:]))
    (run_dir / "genlog.sqlite").unlink(missing_ok=True)
    # before anything is written into the tree: the trace itself would make the tree look dirty
    prov = provenance(Path(__file__), {"recipe": regime}, inputs=[src])
    t0 = time.time()
    summary = record(run_dir, overrides(regime, train, heldout, run_dir))
    groups = export(run_dir / "genlog.sqlite", regime["group_size"])
    meta = {"recipe": regime, "data": src.name, "groups": len(groups),
            "visits_complete": sum(1 for g in groups if g["visit"] == regime["visits"] - 1),
            "wall_s": round(time.time() - t0, 1), "rl_seconds": summary.get("rl_seconds"), "provenance": prov}
    (run_dir / RECORDING).write_text(json.dumps(meta, indent=2) + "\n")  # for an --export-only later
    write_trace(out, groups, meta)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
