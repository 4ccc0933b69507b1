"""The batches ``bench/train_profile.py`` times (``Case``): groups of (prompt, response) token counts
in completion order, from a recorded lengths file (``LENGTHS_FORMAT``, count-down runs), from
MMLU-Pro chain-of-thought response lengths, or as ``braid allocate`` plans a workload; and the
batches a finished run trained, read back from its ledger and generation log (``extract_run``),
which the lengths file is written from."""

from __future__ import annotations

import gzip
import json
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from allocator.padding import backward_calls, deal_groups

ROOT = Path(__file__).resolve().parents[1]
LENGTHS_FORMAT = "braid-train-lengths/1"
WORKLOAD = ROOT / "deploy/workloads/tiny.yaml"
MMLU_MODELS = ("Meta-Llama-3_1-8B-Instruct", "Meta-Llama-3_1-70B-Instruct", "mathstral-7B", "Mistral-7B-Instruct-v0.2",
               "Qwen1.5-7B-Chat", "Phi-3-mini-4k-instruct", "Yi-6b-Chat", "gemma-7b")
MMLU_CAP = 2048  # the source's max_new_tokens
MMLU_QUESTIONS = 16


@dataclass(frozen=True)
class Case:
    """One batch: groups of (prompt, response) token counts in completion order."""

    name: str
    source: str
    groups: tuple[tuple[tuple[int, int], ...], ...]
    micro_batch_groups: int

    @property
    def seqs(self) -> list[int]:
        return [p + r for g in self.groups for p, r in g]

    def calls(self) -> list[list[int]]:
        return backward_calls([[p + r for p, r in g] for g in self.groups], self.micro_batch_groups)


def consumed_groups(ledger: Path) -> dict[int, list[dict]]:
    """Per optimizer step of a run (1..N), the ``consume`` records of ``ledger.jsonl`` that made
    its final weights, in the order the step trained them (a restart's rolled-back steps dropped)."""
    from services.run.ledger import read_records

    effective: dict[int, list[dict]] = {}
    for r in read_records(ledger)[0]:
        if r.get("event") == "start":
            for step in [s for s in effective if s > r["version"]]:
                del effective[step]
        elif r.get("event") == "consume":
            effective.setdefault(r["step"], []).append(r)
    return effective


def logged_lengths(genlog: Path) -> tuple[dict[str, list[tuple[float, int]]], dict[str, str]]:
    """Every finished sample of a run's generation log: prompt id -> (finished at, tokens) by
    finish, and prompt id -> the prompt text the log decoded."""
    import sqlite3

    db = sqlite3.connect(f"file:{genlog}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT prompt_id, prompt, finished_at, response_length FROM generations "
                          "ORDER BY finished_at").fetchall()
    finally:
        db.close()
    out: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for pid, _, t, n in rows:
        out[pid].append((t, n))
    return out, {pid: text for pid, text, _, _ in rows}


def extract_run(run_dir: Path) -> list[dict]:
    """Per iteration of a run: its groups ([prompt tokens, [response tokens...]]) in the order its
    optimizer step trained them, from the run's ``ledger.jsonl`` (which prompts each step consumed),
    its generation log ``genlog.sqlite`` (``generation.genlog``: every sample's length) and the
    trainer's seeded prompt sampler (prompt lengths, checked against the log's prompt text)."""
    from services.common.config import load_config
    from services.policy.model import Policy, char_tokenizer
    from services.tasks.arith import ProblemSampler, eval_problems

    cfg = load_config(run_dir / "config.json")
    for need in ("ledger.jsonl", "genlog.sqlite"):
        if not (run_dir / need).exists():
            raise SystemExit(f"{run_dir}: no {need} (run with generation.genlog={run_dir / 'genlog.sqlite'})")
    steps = consumed_groups(run_dir / "ledger.jsonl")
    lengths, texts = logged_lengths(run_dir / "genlog.sqlite")
    dist = cfg.task.distribution()
    held_out = frozenset(p.prompt for p in eval_problems(cfg.eval.seed, cfg.eval.prompts, **dist))
    sampler = ProblemSampler(cfg.task.seed, exclude=held_out, **dist)
    wanted = {r["prompt_id"] for recs in steps.values() for r in recs}
    enc = Policy(model=None, tokenizer=char_tokenizer())  # type: ignore[arg-type]  # the tokenizer only
    problems = {p.prompt_id: p.prompt for p in sampler.batch(1 + max(int(pid.lstrip("p")) for pid in wanted))}
    wrong = sorted(pid for pid in wanted if problems.get(pid) is None or problems[pid] not in texts.get(pid, ""))
    if wrong:  # the sampler mirrored here is not the run's prompt stream: its prompt lengths would be wrong
        raise SystemExit(f"{run_dir}: {len(wrong)} consumed prompts (first {wrong[0]}) are not the seeded sampler's")
    plen = {pid: len(enc.encode_prompt(problems[pid])) for pid in wanted}
    out = []
    for step in sorted(steps):
        groups = []
        for r in steps[step]:
            got = [n for _, n in lengths.get(r["prompt_id"], [])][:len(r["samples"])]
            # the log skips samples with no generated token: a trained sample it lacks had none
            groups.append([plen[r["prompt_id"]], got + [0] * (len(r["samples"]) - len(got))])
        out.append({"run": run_dir.name, "mode": cfg.trainer.mode, "iteration": step - 1, "groups": groups})
    return out


def run_ref(run_dir: Path) -> dict:
    """A source run of a lengths file: its directory, config hash and when its trainer started."""
    import hashlib

    from services.run.ledger import read_records

    cfg = json.loads((run_dir / "config.json").read_text())
    start = next((r["time"] for r in read_records(run_dir / "ledger.jsonl")[0] if r.get("event") == "start"), None)
    return {"run_dir": str(run_dir),
            "config_hash": hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16],
            "first_event_unix_s": start}


def countdown_cases(path: Path, micro_batch_groups: int, limit: int | None = None, regroup: int = 2) -> list[Case]:
    """Cases from a lengths file (``LENGTHS_FORMAT``): each iteration as recorded, and the first
    ``regroup`` also with one group per backward call."""
    data = json.loads(path.read_text())
    if data.get("format") != LENGTHS_FORMAT:
        raise ValueError(f"{path}: not a {LENGTHS_FORMAT} file (format {data.get('format')!r})")
    its = data["iterations"][:limit]
    cases = []
    for it in its:
        groups = tuple(tuple((int(p), int(r)) for r in rs) for p, rs in it["groups"])
        cases.append(Case(f"countdown {it['run']} it{it['iteration']}", str(path), groups, micro_batch_groups))
    for case in cases[:regroup]:
        cases.append(Case(case.name + " (1 group/call)", case.source, case.groups, 1))
    return cases


def mmlu_groups(path: Path, questions: int, steps: int, seed: int = 0) -> list[tuple[tuple[tuple[int, int], ...], ...]]:
    """``steps`` batches of ``questions`` groups: one question's responses from ``MMLU_MODELS``
    (tokens = characters / 4, capped at ``MMLU_CAP``; prompt = question + options / 4), in
    completion order (by the longest response)."""
    rows = []
    with gzip.open(path, "rt") as f:
        for line in f:
            row = json.loads(line)
            chars = row["resp_chars"]
            if all(m in chars for m in MMLU_MODELS):
                prompt = max(1, round((len(row["question"]) + sum(len(o) for o in row["options"])) / 4))
                rows.append(tuple((prompt, max(1, min(MMLU_CAP, round(chars[m] / 4)))) for m in MMLU_MODELS))
    if len(rows) < questions * steps:
        raise ValueError(f"{path}: {len(rows)} questions with all of {MMLU_MODELS}, need {questions * steps}")
    picked = random.Random(seed).sample(rows, questions * steps)
    return [tuple(sorted(picked[i:i + questions], key=lambda g: max(p + r for p, r in g)))
            for i in range(0, len(picked), questions)]


def mmlu_cases(path: Path, micro_batch_groups: int, steps: int) -> list[Case]:
    return [Case(f"mmlu-pro-cot batch {i}", str(path), groups, micro_batch_groups)
            for i, groups in enumerate(mmlu_groups(path, MMLU_QUESTIONS, steps))]


def workload_case(path: Path, group_size: int, micro_batch_groups: int) -> Case:
    """The batch the allocator plans for ``path`` (its drawn lengths), dealt into groups as a
    task's are (``allocator.padding.GROUP_CORRELATION``), in completion order."""
    from allocator.cluster import load_workload, workload_lengths
    from allocator.padding import GROUP_CORRELATION

    wl = load_workload(path)
    prompts, outputs = workload_lengths(wl)
    by_length: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for p, o in zip(prompts, outputs, strict=True):
        by_length[p + o].append((p, o))
    lengths = [p + o for p, o in zip(prompts, outputs, strict=True)]
    dealt = deal_groups(lengths, group_size, random.Random(1), GROUP_CORRELATION)
    groups = [tuple(by_length[n].pop() for n in g) for g in dealt]
    return Case(f"{wl.name} workload", str(path), tuple(sorted(groups, key=lambda g: max(p + r for p, r in g))),
                micro_batch_groups)


def load_cases(data: list[Path], micro_batch_groups: int, group_size: int, quick: bool) -> list[Case]:
    cases: list[Case] = []
    for path in data:
        if path.name.endswith(".jsonl.gz"):
            cases += mmlu_cases(path, micro_batch_groups, 1 if quick else 2)
        else:
            cases += countdown_cases(path, micro_batch_groups, 2 if quick else None, 1 if quick else 2)
    cases.append(workload_case(WORKLOAD, group_size, micro_batch_groups))
    return cases
