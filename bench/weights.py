"""Weight-plane benchmark: relay throughput, chained broadcast, trainer stall, cross-site run.

Side by side on this machine (noisy, shared: ratios, not absolute times); each part's paths and
sizes in one run:

(a) one version of 100 MB / 500 MB / 1 GB through Push then Pull (relay process in between, a
    puller process at the end) vs a raw TCP ``sendall`` of the same bytes between two processes
    on loopback. Three paths: **network** (the raw-TCP data channel: gRPC opens the transfer, the
    bytes go over a plain socket; ``throughput_ratio_vs_raw``), **gRPC streams** (the old network
    path, parallel chunk streams; ``grpc_stream_ratio_vs_raw``) and **same host** (shared-memory
    hand-over, Laminar's PCIe analogue; ``same_host_shm_ratio_vs_raw``).
(b) broadcast to p = 1, 2, 4, 8 relays, each in its own network namespace behind a rate-limited
    veth (tbf, ``--hop-rate``; every hop network-bound as between machines, not CPU-bound on two
    shared cores): time from the push's start until the last relay committed the version. Then a
    relay is killed mid-broadcast (p = 4): repair time and survivors' completion.
(c) trainer stall per push (snapshot + hand-over) vs the push's full transfer time (until the
    master relay holds it over the network path), per model size.
(d) see ``bench/weights_xsite.py``: an RL run across two namespaces joined by a 1 Gbit/s veth with
    20 ms RTT vs the same run on an unlimited link, and the bytes crossing the link per version.

``shaped_link`` (weight versions of the real model and of a LoRA adapter across a tbf-shaped link,
against the link's limit) is ``bench/weights_shaped.py``'s: a run of this script keeps it as it was.

``python bench/weights.py [--quick] [--parts abcd] [--out DIR]`` writes ``weights.{json,md,png}``
to ``bench/results`` (``--quick``: to a scratch directory, never over the results of record).
Needs root for the namespaces (``--no-netns`` skips (b) and (d)). A run of some ``--parts``
carries the others from the results file it replaces; ``parts`` in the JSON and a line under
each heading of the markdown say which part was measured in this run and which was carried, and
from which run (its commit and date).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.report_io import (  # noqa: E402
    RecordParser,
    parts_line,
    parts_record,
    provenance,
    provenance_line,
    results_dir,
    set_json_key,
)

SHM = Path("/dev/shm")
PARTS = {"a": "throughput", "b": "broadcast", "c": "stall", "d": "cross_site"}  # part -> its section of the results
PART_KEYS = {"a": ("throughput_ratio_vs_raw", "throughput_ratio_vs_raw_network", "grpc_stream_ratio_vs_raw",
                   "same_host_shm_ratio_vs_raw", "throughput_ratio_path"),
             "b": ("broadcast_time_s", "broadcast_ratio_8_vs_1"),
             "c": ("trainer_stall_fraction",),
             "d": ("cross_site_iteration_overhead", "cross_site_copies_per_version")}


def _state(mb: int):
    import torch

    n = mb * 1024 * 1024 // 4
    # a few big tensors and some small ones, like a model
    return {"embed": torch.randn(n // 2), "layers": torch.randn(n - n // 2 - 4096), "norm": torch.randn(4096)}


# ---------------------------------------------------------------- (a) throughput
def raw_tcp(nbytes: int) -> tuple[float, float]:
    """(seconds, CPU-seconds) of one raw ``sendall`` of ``nbytes`` to a receiving process."""
    from bench.weights_lib import Child, cpu_busy_s

    payload = bytearray(nbytes)
    payload[:: 4096] = b"x" * len(payload[:: 4096])  # touch every page before timing
    child = Child("raw-recv", str(nbytes))
    child.go()
    c0, t0 = cpu_busy_s(), time.perf_counter()
    with socket.create_connection(("127.0.0.1", int(child.info[0]))) as s:
        s.sendall(payload)
        s.recv(1)
    seconds, cpu = time.perf_counter() - t0, cpu_busy_s() - c0
    child.result()
    return seconds, cpu


def relay_push_pull(client, address: str, state, version: int, *, shm: bool, streams: int, chunk: int) -> dict:
    """``client.data_path`` picks the network path of both the push and the puller."""
    from bench.weights_lib import Child, cpu_busy_s
    from services.weights.client import snapshot_blob

    # the bytes in one buffer, as raw sendall's (the trainer's default: shared memory)
    wb = snapshot_blob(state, chunk, SHM)
    puller = Child("pull", address, str(version), str(streams), "1" if shm else "0", client.data_path,
                   str(wb.manifest.total_bytes))
    c0, t0 = cpu_busy_s(), time.perf_counter()
    client.push(wb, version, streams=streams, use_shm=shm)
    push_s, push_cpu = time.perf_counter() - t0, cpu_busy_s() - c0
    wb.blob.release()
    del wb
    puller.go()
    pulled = puller.result()
    cpu = push_cpu + pulled["cpu_s"]  # the puller brackets its own timed part (its start and exit are not counted)
    return {"push_s": push_s, "pull_s": pulled["seconds"], "total_s": push_s + pulled["seconds"],
            "path": pulled["path"], "cpu_s": cpu}


PATHS = ("network", "grpc_stream", "same_host")  # the data channel, the old gRPC streams, shared memory


def bench_throughput(sizes: list[int], reps: int, streams: int, chunk: int, work: Path, grpc_up_to: int) -> dict:
    rows = {}
    for mb in sizes:
        rows[str(mb)] = r = _throughput_one(mb, reps, streams, chunk, work, grpc_stream=mb <= grpc_up_to)
        print(f"(a) {mb} MB: raw {r['raw_gbps']:.2f} GB/s; " + "; ".join(
            f"{p} ratio {r[p]['ratio']:.2f} (push {r[p]['push_s']:.3f}s pull {r[p]['pull_s']:.3f}s)"
            for p in PATHS if p in r),
            flush=True)
    return rows


def _throughput_one(mb: int, reps: int, streams: int, chunk: int, work: Path, grpc_stream: bool) -> dict:
    """Per repetition, back to back: raw sendall, then each path (a fresh version each)."""
    from bench.weights_lib import start_relay, stop
    from services.weights.client import RelayClient, snapshot_blob

    proc, ports = start_relay(work, f"tput-{mb}", "--keep", "1")  # one relay per model (it holds one model)
    address = f"127.0.0.1:{ports[0]}"
    clients = {"network": RelayClient(address, data_path="tcp"), "grpc_stream": RelayClient(address, data_path="grpc")}
    clients["same_host"] = clients["network"]
    clients["network"].wait_ready()
    paths = [p for p in PATHS if grpc_stream or p != "grpc_stream"]
    try:
        state = _state(mb)
        nbytes = sum(t.numel() * 4 for t in state.values())
        raw, runs, version = [], {p: [] for p in paths}, 1
        warm = snapshot_blob(state, chunk, SHM)  # the relay has held this model before (steady state: its spare
        clients["network"].push(warm, version)  # receive buffer for the next version is ready), untimed
        warm.blob.release()
        time.sleep(1.0)
        for _ in range(reps):
            raw.append(raw_tcp(nbytes))
            for p in paths:
                version += 1
                # between versions, as between training steps: the relay prepares its next receive buffer
                time.sleep(1.0)
                runs[p].append(relay_push_pull(clients[p], address, state, version, shm=p == "same_host",
                                               streams=streams, chunk=chunk))
        raw_s, raw_cpu = statistics.median(r[0] for r in raw), statistics.median(r[1] for r in raw)
        cores = len(os.sched_getaffinity(0))
        row = {"bytes": nbytes, "raw_s": raw_s, "raw_gbps": nbytes / raw_s / 1e9, "raw_cpu_s": raw_cpu, "cores": cores}
        for p in paths:
            row[p] = {k: statistics.median(r[k] for r in runs[p]) for k in ("push_s", "pull_s", "total_s", "cpu_s")}
            row[p]["path"] = runs[p][0]["path"]
            row[p]["ratio"] = raw_s / row[p]["total_s"]
            # the best ratio this path could reach here if its CPU work were spread perfectly over every core
            row[p]["cpu_bound_ratio"] = raw_s / (row[p]["cpu_s"] / cores)
        return row
    finally:
        clients["network"].close()
        clients["grpc_stream"].close()
        stop([proc])


# ---------------------------------------------------------------- (c) trainer stall
def bench_stall(sizes: list[int], streams: int, chunk: int, work: Path, versions: int = 5) -> dict:
    """Stall = the trainer thread's time in ``publish`` (snapshot + hand-over); full transfer =
    until the master relay holds the version, over the network path and the same-host path.
    Between pushes the benchmark waits (as a training step would) until the transport has its next
    snapshot buffer ready (``spare_prepare_s``: how long that took after the push; the first
    version has none: ``first_stall_s``)."""
    import torch

    from bench.weights_lib import start_relay, stop
    from services.common.config import WeightsConfig
    from services.run.transport import RelayTransport
    from services.weights.client import RelayClient

    rows = {}
    for mb in sizes:
        model = torch.nn.Module()
        for k, v in _state(mb).items():
            model.register_buffer(k, v)
        row = {}
        for path, shm in (("network", False), ("same_host", True)):
            proc, ports = start_relay(work, f"stall-{mb}-{path}", "--keep", "1")
            address = f"127.0.0.1:{ports[0]}"
            cfg = WeightsConfig(chunk_bytes=chunk, streams=streams, shm=shm)
            transport = RelayTransport(cfg, relays=[address])
            watcher = RelayClient(address)
            try:
                stalls, fulls, prep = [], [], []
                for v in range(1, versions + 1):
                    t_prep = time.perf_counter()  # a training step: the transport prepares the next snapshot buffer
                    while v > 1 and not transport.spare_ready and time.perf_counter() - t_prep < 30:
                        time.sleep(0.005)
                    prep.append(time.perf_counter() - t_prep)
                    time.sleep(0.2)
                    t0 = time.perf_counter()
                    transport.publish(v, transport.snapshot(model.state_dict()))
                    stalls.append(time.perf_counter() - t0)
                    while transport.pushed < v:
                        transport.raise_if_failed()
                        time.sleep(0.002)
                    fulls.append(time.perf_counter() - t0)
                # the first has no spare buffer
                stall, full = statistics.median(stalls[1:]), statistics.median(fulls[1:])
                row[path] = {"stall_s": stall, "full_transfer_s": full, "fraction": stall / full,
                             "first_stall_s": stalls[0], "spare_prepare_s": statistics.median(prep[1:])}
            finally:
                transport.close()
                watcher.close()
                stop([proc])
        rows[str(mb)] = row
        print(f"(c) {mb} MB: stall {row['network']['stall_s']:.3f}s; network transfer "
              f"{row['network']['full_transfer_s']:.2f}s ({row['network']['fraction']:.1%}); same-host "
              f"{row['same_host']['full_transfer_s']:.3f}s "
              f"({row['same_host']['fraction']:.1%})", flush=True)
        del model
    return rows


# ---------------------------------------------------------------- report
def set_section(out: Path, key: str, entry: dict) -> None:
    """Set ``key`` of ``out/weights.json`` (a part another script measures, with its own provenance:
    ``shaped_link``, ``delta``, ``delta_parity``) and, when that file holds the whole weight
    benchmark, rewrite weights.md with it."""
    path = out / "weights.json"
    set_json_key(path, key, entry)
    doc = json.loads(path.read_text())
    if "machine" in doc and "note" in doc:
        write_report(doc, out)


def write_report(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "weights.json").write_text(json.dumps(result, indent=2) + "\n")
    parts = result.get("parts", {})
    lines = ["# Weight plane benchmark", "", f"Machine: {result['machine']}. {result['note']}", ""]
    tp = result.get("throughput", {})
    if tp:
        lines += ["## (a) Push then Pull vs raw TCP sendall (loopback), ratio of throughputs (>= 0.5 is the target)",
                  "",
                  parts_line(parts, "a"), "",
                  "Network path = the relay's raw-TCP data channel (`throughput_ratio_vs_raw`); the old gRPC-stream "
                  "path and the same-host shared-memory path measured side by side in the same run.", "",
                  "| size MB | raw s | raw GB/s | network (data channel) push s | pull s | **ratio** "
                  "| gRPC streams push s | pull s | ratio | same host (shm) push s | pull s | ratio |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]

        def cells(row, bold=False):
            if row is None:
                return "- | - | - (skipped in --quick)"
            ratio = f"**{row['ratio']:.2f}**" if bold else f"{row['ratio']:.2f}"
            return f"{row['push_s']:.3f} | {row['pull_s']:.3f} | {ratio}"

        for mb, r in tp.items():
            lines.append(f"| {mb} | {r['raw_s']:.3f} | {r['raw_gbps']:.2f} | {cells(r.get('network'), True)} | "
                         f"{cells(r.get('grpc_stream'))} | {cells(r.get('same_host'))} |")
        lines.append("")
        lines += _cpu_table(tp)
    bc = result.get("broadcast", {})
    if bc:
        lines += [f"## (b) Chained broadcast, {bc['model_mb']} MB, each hop limited to {bc['hop_rate']} (tbf), "
                  f"chunks {bc['chunk_bytes'] // 1024} KiB", "", parts_line(parts, "b"), "",
                  "| relays p | time s | vs p=1 |", "|---|---|---|"]
        t1 = result["broadcast_time_s"]["1"]
        for p, t in result["broadcast_time_s"].items():
            lines.append(f"| {p} | {t:.2f} | {t / t1:.2f} |")
        lines += ["", f"T(8)/T(1) = **{result['broadcast_ratio_8_vs_1']:.2f}** (target <= 1.5).", ""]
        if "repair" in bc:
            r = bc["repair"]
            lines += [f"Relay killed mid-broadcast (p = {r['p']}, {r['received_at_kill']} when killed): the "
                      f"controller cut it out and re-planned **{r['detect_s']:.2f} s** after the kill; the chain "
                      f"was re-linked by {r['relinked_by']}; survivors complete and byte-exact: {r['survivors_ok']} "
                      f"({r['complete_after_kill_s']:.2f} s after the kill).", ""]
    st = result.get("stall", {})
    if st:
        lines += ["## (c) Trainer stall per push (snapshot + hand-over) vs the push's full transfer time", "",
                  parts_line(parts, "c"), "",
                  "The snapshot copies into a buffer the push thread allocated and faulted in after the previous push "
                  "(ready after `spare s`; a training step is longer); the first push of a run has none "
                  "(`first stall s`).", "",
                  "| model MB | stall s | network transfer s | **stall fraction** | same-host transfer s "
                  "| stall fraction | spare s | first stall s |", "|---|---|---|---|---|---|---|---|"]
        for mb, r in st.items():
            n, h = r["network"], r["same_host"]
            lines.append(f"| {mb} | {n['stall_s']:.3f} | {n['full_transfer_s']:.2f} | **{n['fraction']:.1%}** | "
                         f"{h['full_transfer_s']:.3f} | {h['fraction']:.1%} | {n.get('spare_prepare_s', 0):.2f} | "
                         f"{n.get('first_stall_s', 0):.3f} |")
        lines.append("")
    xs = result.get("cross_site", {})
    if xs:
        lines += ["## (d) Cross-site RL run (one_step), weights crossing a 1 Gbit/s, 20 ms RTT link", "",
                  parts_line(parts, "d"), "", xs.get("summary", ""), ""]
    if result.get("shaped_link"):  # written by bench/weights_shaped.py, carried by this script's runs
        from bench.weights_shaped import markdown as shaped_markdown

        lines += shaped_markdown(result["shaped_link"])
    if result.get("delta"):  # written by bench/weights_delta.py, carried the same way
        from bench.weights_delta import markdown as delta_markdown

        lines += delta_markdown(result["delta"])
    if result.get("delta_parity"):  # written by bench/weights_delta_parity.py
        from bench.weights_delta_parity import markdown as parity_markdown

        lines += parity_markdown(result["delta_parity"])
    lines += ["## Result fields", "", "```json",
              json.dumps({k: result.get(k) for k in ("throughput_ratio_vs_raw", "broadcast_time_s",
                                                     "broadcast_ratio_8_vs_1",
                                                     "trainer_stall_fraction", "cross_site_iteration_overhead",
                                                     "cross_site_copies_per_version")}, indent=2), "```", ""]
    if "provenance" in result:
        lines += [provenance_line(result["provenance"]), ""]
    (out / "weights.md").write_text("\n".join(lines))
    _plot(result, out)


def _cpu_table(tp: dict) -> list[str]:
    """What the transfers cost in CPU time: on a CPU-bound machine this caps the ratio a path can reach."""
    rows = [(mb, r) for mb, r in tp.items() if "raw_cpu_s" in r and "cpu_s" in r.get("network", {})]
    if not rows:
        return []
    cores = rows[0][1]["cores"]
    lines = [f"CPU-seconds the machine spent per transfer (all processes and the kernel, `/proc/stat`; {cores} cores). "
             "*CPU bound* = raw s / (path CPU s / cores): the ratio the path could reach if its work were spread "
             "perfectly over every core (pipelining the pull into the push cannot beat it).", "",
             "| size MB | raw CPU s | network CPU s | vs raw | **CPU bound** | same host CPU s | CPU bound |",
             "|---|---|---|---|---|---|---|"]
    for mb, r in rows:
        n, h = r["network"], r.get("same_host", {})
        shm = f"{h['cpu_s']:.3f} | {h['cpu_bound_ratio']:.2f}" if "cpu_s" in h else "- | -"
        lines.append(f"| {mb} | {r['raw_cpu_s']:.3f} | {n['cpu_s']:.3f} | {n['cpu_s'] / r['raw_cpu_s']:.2f}x | "
                     f"**{n['cpu_bound_ratio']:.2f}** | {shm} |")
    return [*lines, ""]


def _plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    tp = result.get("throughput", {})
    if tp:
        sizes = list(tp)
        for k, (path, label) in enumerate((("network", "network (data channel)"), ("grpc_stream", "gRPC streams"),
                                           ("same_host", "same host (shm)"))):
            axes[0].bar([i + (k - 1) * 0.27 for i in range(len(sizes))],
                        [tp[s].get(path, {}).get("ratio", 0) for s in sizes], 0.27, label=label)
        axes[0].axhline(0.5, color="k", ls="--", lw=1, label="target 0.5")
        axes[0].set_xticks(range(len(sizes)), [f"{s} MB" for s in sizes])
        axes[0].set_ylabel("throughput / raw TCP")
        axes[0].set_title("(a) Push then Pull vs raw sendall")
        axes[0].legend()
    bt = result.get("broadcast_time_s") or {}
    if bt:
        ps = [int(p) for p in bt]
        axes[1].plot(ps, [bt[str(p)] / bt["1"] for p in ps], "o-", label="T(p)/T(1)")
        axes[1].axhline(1.5, color="k", ls="--", lw=1, label="target 1.5")
        axes[1].set_xlabel("relays p")
        axes[1].set_ylim(0, max(2.0, max(bt.values()) / bt["1"] + 0.2))
        axes[1].set_title("(b) chained broadcast time")
        axes[1].legend()
    fig.tight_layout()
    fig.savefig(out / "weights.png", dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = RecordParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="one repetition, smaller models in (b)-(d): under 5 minutes; writes to a scratch "
                             "directory")
    parser.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    parser.add_argument("--no-netns", action="store_true", help="skip (b) and (d) (they need root and ip/tc)")
    parser.add_argument("--parts", default="abcd", help="which parts to run (default abcd)")
    parser.add_argument("--streams", type=int, default=2, help="parallel streams of the network path")
    parser.add_argument("--chunk-mb", type=int, default=4)
    parser.add_argument("--hop-rate", default="200mbit", help="(b) rate limit of every hop")
    parser.add_argument("--xsite-shared-cpus", action="store_true",
                        help="(d) leave the SGS instances on every CPU with the relays, delay lines and trainer "
                             "(default: one CPU of their own, standing in for the generation site's accelerator)")
    ns = parser.parse_args(argv)
    import platform

    from bench.weights_broadcast import bench_broadcast

    out = results_dir(ns.out, ns.quick)
    result: dict = {
        "provenance": provenance(Path(__file__), {k: getattr(ns, k) for k in (
            "quick", "no_netns", "parts", "streams", "chunk_mb", "hop_rate", "xsite_shared_cpus")}),
        "machine": f"{platform.node()}, {__import__('os').cpu_count()} CPUs",
        "quick": ns.quick,
    }
    previous = json.loads((out / "weights.json").read_text()) if (out / "weights.json").exists() else {}
    chunk = ns.chunk_mb << 20
    t_start = time.time()
    with tempfile.TemporaryDirectory(prefix="braid-wbench-") as tmp:
        work = Path(tmp)
        mark = time.time()

        def part_done(name: str) -> None:
            nonlocal mark
            result.setdefault("part_seconds", {})[name] = round(time.time() - mark, 1)
            mark = time.time()

        if "a" in ns.parts:
            rows = bench_throughput([100, 500, 1000], 1 if ns.quick else 3, ns.streams, chunk, work,
                                    grpc_up_to=100 if ns.quick else 1000)
            result["throughput"] = rows
            result["throughput_ratio_vs_raw"] = {mb: r["network"]["ratio"] for mb, r in rows.items()}
            result["throughput_ratio_vs_raw_network"] = result["throughput_ratio_vs_raw"]  # the same (older name)
            result["grpc_stream_ratio_vs_raw"] = {mb: r["grpc_stream"]["ratio"] for mb, r in rows.items()
                                                  if "grpc_stream" in r}
            result["same_host_shm_ratio_vs_raw"] = {mb: r["same_host"]["ratio"] for mb, r in rows.items()}
            result["throughput_ratio_path"] = ("network: Push then Pull over loopback TCP through the relay's data "
                                               "channel; gRPC streams in grpc_stream_ratio_vs_raw, shared memory in "
                                               "same_host_shm_ratio_vs_raw")
            part_done("a")
        if "b" in ns.parts and not ns.no_netns:
            bc = bench_broadcast(work, model_mb=50 if ns.quick else 200, hop_rate=ns.hop_rate, chunk=256 << 10)
            result["broadcast"] = bc
            result["broadcast_time_s"] = bc["times"]
            result["broadcast_ratio_8_vs_1"] = bc["times"]["8"] / bc["times"]["1"]
            part_done("b")
        if "c" in ns.parts:
            rows = bench_stall([10, 100] if ns.quick else [10, 100, 500], ns.streams, chunk, work,
                               versions=3 if ns.quick else 5)
            result["stall"] = rows
            result["trainer_stall_fraction"] = max(r["network"]["fraction"] for r in rows.values())
            part_done("c")
        if "d" in ns.parts and not ns.no_netns:
            from bench.weights_xsite import bench_cross_site

            xs = bench_cross_site(work, quick=ns.quick, pin=not ns.xsite_shared_cpus)
            result["cross_site"] = xs
            result["cross_site_iteration_overhead"] = xs["iteration_overhead"]
            result["cross_site_copies_per_version"] = xs["copies_per_version"]
            part_done("d")
    measured = result.get("part_seconds", {})
    for part, section in PARTS.items():  # a partial rerun keeps the other parts' results, marked as carried
        if part not in measured and section in previous:
            for key in (section, *PART_KEYS[part]):
                if key in previous:
                    result[key] = previous[key]
    for key in ("shaped_link", "delta", "delta_parity"):  # the other scripts' keys, each with its own provenance
        if key in previous:
            result[key] = previous[key]
    result["parts"] = parts_record(PARTS, measured, previous, result["provenance"])
    carried = [p for p, r in result["parts"].items() if not r["measured_in_this_run"]]
    result["note"] = ("Shared, noisy machine: every part was measured side by side in this run." if not carried else
                      f"Shared, noisy machine: part(s) {', '.join(p for p in result['parts'] if p not in carried)} "
                      f"measured in this run, {', '.join(carried)} carried from earlier runs (each part says which): "
                      "compare numbers within a part, not across parts.")
    result["seconds"] = time.time() - t_start
    write_report(result, out)
    print(json.dumps({k: result.get(k) for k in ("throughput_ratio_vs_raw", "broadcast_ratio_8_vs_1",
                                                 "trainer_stall_fraction", "cross_site_iteration_overhead",
                                                 "cross_site_copies_per_version")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
