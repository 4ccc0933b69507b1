"""Property-based fuzzing of every config and data file the ``braid`` CLI reads (issue 20 item 5).

Each file kind starts from a good file (a shipped config, cluster or workload, the ranker test
fixture, a real generation log, a saved ranker) and hypothesis breaks it: values of the wrong type,
out of range, NaN/inf, huge integers, unknown and missing keys, whole documents replaced by random
YAML/JSON values, text and bytes, and byte-level damage (truncation, flipped and inserted bytes,
not UTF-8; for the SQLite generation log, rows with wrong types). The file is then read the way the
CLI reads it: ``braid config``, ``braid allocate``, ``braid ranker convert-mmlu / convert-log / train
/ eval / annotate`` in-process (``flows.cli.main``), and the readers ``braid run --plan``, the
router (PTL profiles) and the site file use. The property: the command succeeds, or exits 2 with a
message (a traceback, an exception escaping the CLI, an empty message, or a silently accepted
config that the services could not load back, are failures). Shared by
``tests/unit/test_fuzz_files.py`` and ``bench/fuzz.py``; a failure there records the failing
example's bytes. Hypothesis also draws constants from the project modules loaded at the time, so a
seed replays the same examples only with the same modules imported (``bench/fuzz.py --parts files``
draws other file inputs than a full run).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import shutil
import sqlite3
import tempfile
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from bench.fuzz_documents import BYTE_OP, VALUE, damage, document, jsonl_dump, key_paths, yaml_dump

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests/fixtures/ranker_small.jsonl"

# ---------------------------------------------------------------- running the CLI
@dataclass
class Outcome:
    code: int  # 0 = accepted, 2 = refused with a message; anything else fails the property
    message: str
    stdout: str = ""


def cli(argv: list[str]) -> Outcome:
    """``braid ARGV`` in-process; an exception escaping it (a traceback) propagates."""
    from flows.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse, or a command's SystemExit("message")
            if isinstance(exit_.code, str):
                return Outcome(2, exit_.code, out.getvalue())
            code = exit_.code if isinstance(exit_.code, int) else 1
    return Outcome(code, err.getvalue(), out.getvalue())


def refusal(call, *errors: type[BaseException]) -> Outcome:
    """A reader called directly: ``errors`` are its clean refusals (what its caller reports)."""
    try:
        call()
    except errors as err:
        return Outcome(2, str(err))
    return Outcome(0, "")


# ---------------------------------------------------------------- the file kinds
class Kind:
    """A file the CLI reads: a strategy for its bytes and how the CLI reads it."""

    name = ""
    suffix = ""

    def __init__(self, work: Path) -> None:
        self.work = work

    def strategy(self) -> st.SearchStrategy:
        raise NotImplementedError

    def read(self, path: Path) -> Outcome:
        raise NotImplementedError

    def check_accepted(self, path: Path, outcome: Outcome) -> None:
        """What an accepted file must also satisfy (default: nothing more)."""


class RunConfig(Kind):
    name, suffix = "run config (braid config/run --config)", ".yaml"

    def strategy(self):
        seeds = [yaml.safe_load((ROOT / "deploy/configs" / f).read_text())
                 for f in ("default.yaml", "smoke.yaml", "bounded.yaml")]
        return document(seeds, yaml_dump)

    def read(self, path):
        return cli(["config", "--config", str(path)])

    def check_accepted(self, path, outcome):
        # the resolved config is written into the run directory and every service loads it from there
        from services.common.config import load_config

        resolved = path.with_suffix(".json")
        resolved.write_text(outcome.stdout)
        written, back = json.loads(outcome.stdout), load_config(resolved).model_dump(mode="json")
        assert back == written, f"resolved config does not load back: {_differences(written, back)[:3]}"


def _differences(a, b, path: str = "") -> list[str]:
    """Where two JSON documents differ: ``path: a != b`` per differing leaf."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in a.keys() | b.keys() for d in _differences(a.get(k), b.get(k), f"{path}.{k}".lstrip("."))]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


class Overrides(Kind):
    name, suffix = "config overrides (--set key=value)", ".txt"

    def strategy(self):
        from services.common.config import load_config

        keys = [".".join(map(str, p)) for p in key_paths(load_config(None).model_dump(mode="json"))]
        value = st.one_of(st.text(max_size=20), VALUE.map(lambda v: json.dumps(v, allow_nan=True)),
                          st.sampled_from(["[", "{a: 1", "!!python/object:os.system", "*x", "a: b: c", "'"]))
        item = st.one_of(st.builds(lambda k, v: f"{k}={v}", st.one_of(st.sampled_from(keys), st.text(max_size=10)),
                                   value),
                         st.text(max_size=30))
        return st.lists(item, min_size=1, max_size=3).map(lambda xs: json.dumps(xs).encode())

    def read(self, path):
        argv = ["config", "--config", str(ROOT / "deploy/configs/smoke.yaml")]
        for item in json.loads(path.read_text()):
            argv += [f"--set={item}"]
        return cli(argv)

    check_accepted = RunConfig.check_accepted


class Plan(Kind):
    name, suffix = "allocation plan (braid run --plan)", ".json"

    def strategy(self):
        seed_ = {"model": "braid-tiny", "gen_gpus": 2, "train_gpus": 1, "gen_instances": 2, "cluster": "local-cpu"}
        emulated = {**seed_, "model": "qwen2.5-7b", "gen_gpus": 32, "gen_instances": 8, "train_gpus": 8,
                    "train_kind": "H800", "train_parallel": "DP4xTP2xPP1", "cross_site_weight_transfer_s": 1.5,
                    "emulation": {"gen_profile": "H20:qwen2.5-7b:tp4", "gen_tensor_parallel": 4,
                                  "train_gpus_per_node": 8, "train_inter_node_gbps": 200.0, "train_profile": None}}
        return document([seed_, {**seed_, "model": "qwen2.5-7b", "gen_instances": 8}, emulated], json.dumps)

    def read(self, path):
        from flows.rl_training import load_plan, plan_overrides
        from services.common.config import ConfigError, load_config

        def run_both() -> None:  # a real run takes its instances; an EMULATED one the whole planned fleet
            for config in ("smoke.yaml", "emulated.yaml"):
                cfg = load_config(ROOT / "deploy/configs" / config)
                load_config(ROOT / "deploy/configs" / config, plan_overrides(load_plan(str(path)), cfg))

        return refusal(run_both, ConfigError)


class Cluster(Kind):
    name, suffix = "cluster file (braid allocate --cluster)", ".yaml"

    def strategy(self):
        return document([yaml.safe_load((ROOT / "deploy/clusters/local-cpu.yaml").read_text())], yaml_dump)

    def read(self, path):
        return cli(["allocate", "--cluster", str(path), "--model", "braid-tiny", "--workload",
                    str(ROOT / "deploy/workloads/tiny.yaml"), "--json"])


class Workload(Kind):
    name, suffix = "workload file (braid allocate --workload)", ".yaml"

    def strategy(self):
        return document([yaml.safe_load((ROOT / "deploy/workloads/tiny.yaml").read_text())], yaml_dump)

    def read(self, path):
        return cli(["allocate", "--cluster", str(ROOT / "deploy/clusters/local-cpu.yaml"), "--model", "braid-tiny",
                    "--workload", str(path), "--json"])


class Profile(Kind):
    name, suffix = "PTL profile (braid allocate, via the cluster's profile)", ".json"

    def strategy(self):
        return document([json.loads((ROOT / "allocator/profiles/cpu-local-braid-tiny.json").read_text())], json.dumps)

    def read(self, path):
        cluster = yaml.safe_load((ROOT / "deploy/clusters/local-cpu.yaml").read_text())
        cluster["sites"][0]["profile"] = str(path)
        cluster_file = path.with_name("cluster.yaml")
        cluster_file.write_text(yaml_dump(cluster))
        return cli(["allocate", "--cluster", str(cluster_file), "--model", "braid-tiny", "--workload",
                    str(ROOT / "deploy/workloads/tiny.yaml"), "--json"])


class Sites(Kind):
    name, suffix = "site file (braid certs --sites, two-site runs)", ".yaml"

    def strategy(self):
        files = sorted((ROOT / "deploy/sites").glob("*.yaml"))
        return document([yaml.safe_load(f.read_text()) for f in files], yaml_dump)

    def read(self, path):
        from services.common.config import ConfigError
        from services.common.sites import load_sites

        return refusal(lambda: load_sites(path), ConfigError)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()[:6]]


class RankerData(Kind):
    name, suffix = "ranker data JSONL (braid ranker train --data)", ".jsonl"

    def strategy(self):
        return document([_rows(FIXTURE)], jsonl_dump)

    def read(self, path):
        return cli(["ranker", "train", "--data", str(path), "--out", str(self.work / "trained"),
                    "--kind", "prompt_length"])


class Prompts(Kind):
    name, suffix = "prompts JSONL (braid ranker annotate --prompts)", ".jsonl"

    def strategy(self):
        return document([[{k: r[k] for k in ("id", "prompt")} for r in _rows(FIXTURE)]], jsonl_dump)

    def read(self, path):
        return cli(["ranker", "annotate", "--ranker", str(saved_ranker(self.work)), "--prompts", str(path),
                    "--out", str(self.work / "annotated.jsonl")])


class Mmlu(Kind):
    name, suffix = "MMLU-Pro lengths JSONL.gz (braid ranker convert-mmlu --src)", ".jsonl.gz"

    def strategy(self):
        row = {"question_id": 1, "category": "math", "question": "1+1?", "options": ["1", "2"],
               "resp_chars": {"Meta-Llama-3_1-8B-Instruct": 120, "other": 7}}
        return st.one_of(document([[row, {**row, "question_id": 2}]], jsonl_dump).map(gzip.compress),
                         st.binary(max_size=100))

    def read(self, path):
        return cli(["ranker", "convert-mmlu", "--src", str(path), "--out", str(self.work / "mmlu")])


class GenLog(Kind):
    name, suffix = "generation log SQLite (braid ranker convert-log --log)", ".sqlite"

    def strategy(self):
        cols = ("prompt_id", "prompt", "response_length", "finished_at", "weight_version", "instance")
        sql = st.tuples(st.sampled_from(cols), st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1),
                                                         st.floats(allow_nan=False), st.text(max_size=8),
                                                         st.binary(max_size=8)))
        return st.one_of(
            st.lists(sql, max_size=3).map(lambda ups: ("rows", ups)),
            st.lists(BYTE_OP, min_size=1, max_size=3).map(lambda ops: ("bytes", ops)),
            st.sampled_from(["drop", "schema", "meta"]).map(lambda k: (k, None)),
            st.binary(max_size=200).map(lambda b: ("raw", b)),
        ).map(lambda op: json.dumps(op, default=lambda b: list(b)).encode())

    def read(self, path):
        return cli(["ranker", "convert-log", "--log", str(path), "--out", str(self.work / "log.jsonl")])

    def materialize(self, path: Path, data: bytes) -> None:
        kind, arg = json.loads(data)
        if kind == "raw":
            path.write_bytes(bytes(arg))
            return
        good_genlog(path)
        with contextlib.closing(sqlite3.connect(path)) as db:
            statements = {"drop": ["DROP TABLE generations"],
                          "schema": ["ALTER TABLE generations RENAME COLUMN response_length TO length"],
                          "meta": ["UPDATE meta SET value = '99' WHERE key = 'schema_version'"]}.get(kind, [])
            updates = [(f"UPDATE generations SET {col} = ? WHERE rowid = 1", (bytes(v) if isinstance(v, list) else v,))
                       for col, v in (arg if kind == "rows" else [])]
            for sql, args in [(s, ()) for s in statements] + updates:
                with contextlib.suppress(sqlite3.Error):  # a value the table's constraints refuse: not written
                    db.execute(sql, args)
            db.commit()
        if kind == "bytes":
            ops = [(o[0], o[1], bytes(o[2])) if o[0] == "insert" else tuple(o) for o in arg]
            path.write_bytes(damage(path.read_bytes(), ops))


class RankerDir(Kind):
    name, suffix = "saved ranker directory (braid ranker eval --ranker)", ""

    def strategy(self):  # its manifest broken, or its model file damaged
        manifest = json.loads((saved_ranker(self.work) / "ranker.json").read_text())
        model = (saved_ranker(self.work) / "prompt_length.json").read_bytes()
        return st.one_of(document([manifest], json.dumps).map(lambda b: b"M" + b),
                         st.one_of(st.lists(BYTE_OP, min_size=1, max_size=2).map(lambda ops: damage(model, ops)),
                                   document([json.loads(model)], json.dumps)).map(lambda b: b"P" + b))

    def read(self, path):
        return cli(["ranker", "eval", "--ranker", str(path), "--data", str(FIXTURE), "--json"])

    def materialize(self, path: Path, data: bytes) -> None:
        shutil.copytree(saved_ranker(self.work), path)
        (path / ("ranker.json" if data[:1] == b"M" else "prompt_length.json")).write_bytes(data[1:])


class Params(Kind):
    name, suffix = "ranker parameters (braid ranker train --params)", ".json"

    def strategy(self):
        return document([{"epochs": 1}, {}], json.dumps)

    def read(self, path):
        return cli(["ranker", "train", "--data", str(FIXTURE), "--out", str(self.work / "trained-p"),
                    "--kind", "prompt_length", "--params", path.read_bytes().decode("utf-8", "replace")])


KINDS = [RunConfig, Overrides, Plan, Cluster, Workload, Profile, Sites, RankerData, Prompts, Mmlu, GenLog, RankerDir,
         Params]


def saved_ranker(work: Path) -> Path:
    """A prompt_length ranker trained on the fixture (once per work directory)."""
    out = work / "ranker-good"
    if not (out / "ranker.json").exists():
        code = cli(["ranker", "train", "--data", str(FIXTURE), "--out", str(out), "--kind", "prompt_length"])
        assert code.code == 0, code
    return out


def good_genlog(path: Path) -> None:
    from ranker.genlog import GenerationLog, GenRecord

    with GenerationLog(path) as log:
        log.append([GenRecord(f"p{i}", "12+3", 5 + i, 0, 0, 1.0 + i) for i in range(4)])


# ---------------------------------------------------------------- the property
@dataclass
class FileTally:
    counts: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    failed_input: dict = field(default_factory=dict)  # kind -> the bytes of its last failing example

    def add(self, kind: str, outcome: str) -> None:
        self.counts.setdefault(kind, Counter())[outcome] += 1

    def summary(self) -> dict:
        return {k: {"inputs": sum(c.values()), "accepted": c["accepted"], "refused": c["refused"],
                    "failures": sum(1 for f in self.failures if f["kind"] == k)}
                for k, c in self.counts.items()}


def check_outcome(kind: Kind, path: Path, outcome: Outcome) -> str:
    assert outcome.code in (0, 2), f"{kind.name}: exit status {outcome.code}: {outcome.message[-500:]}"
    if outcome.code == 2:
        assert outcome.message.strip(), f"{kind.name}: refused without a message"
        assert "Traceback" not in outcome.message, f"{kind.name}: a traceback: {outcome.message[-800:]}"
        return "refused"
    kind.check_accepted(path, outcome)
    return "accepted"


def run_kind(cls: type[Kind], work: Path, examples: int, tally: FileTally, *, seed_: int | None = None,
             shrink: bool = True) -> None:
    kind = cls(work)
    phases = (Phase.explicit, Phase.generate, Phase.shrink) if shrink else (Phase.explicit, Phase.generate)

    @settings(max_examples=examples, deadline=None, database=None, derandomize=seed_ is None, phases=phases,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(kind.strategy())
    def prop(data: bytes) -> None:
        case = Path(tempfile.mkdtemp(dir=work))
        path = case / f"input{kind.suffix}"
        try:
            if hasattr(kind, "materialize"):
                kind.materialize(path, data)
            else:
                path.write_bytes(data)
            try:
                outcome = kind.read(path)
            except Exception as err:  # escaped the CLI: the user sees a traceback
                raise AssertionError(f"{kind.name}: {type(err).__name__} escaped: {err}"[:1500]) from err
            tally.add(cls.name, check_outcome(kind, path, outcome))
        except AssertionError:
            tally.add(cls.name, "failed")
            tally.failed_input[cls.name] = data
            raise
        finally:
            shutil.rmtree(case, ignore_errors=True)

    if seed_ is not None:
        prop = seed(seed_ + zlib.crc32(cls.name.encode()))(prop)
    prop()


def run_all(work: Path, examples: int, tally: FileTally, *, seed_: int, progress=None) -> None:
    for cls in KINDS:
        t0 = time.monotonic()
        try:
            run_kind(cls, work, examples, tally, seed_=seed_, shrink=False)
        except Exception as err:  # noqa: BLE001 - a failure is a result here: record it and go on
            tally.failures.append({"kind": cls.name, "error": f"{type(err).__name__}: {err}"[:2000],
                                   "input": repr(tally.failed_input.get(cls.name))[:2000]})
        if progress is not None:
            progress(cls.name, time.monotonic() - t0)
