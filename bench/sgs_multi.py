"""What one SGS process serving N emulated instances costs (``python -m services.generation --instances N``).

For each N: start one process of N emulated instances (the tiny policy of
``deploy/configs/smoke.yaml``, profile ``H20-qwen2.5-7b`` at ``TIME_SCALE``: a step of ~7 ms takes
~35 ms; sample lengths uniform in ``LENGTHS``); measure its start-up (wall seconds until its port file
lists every port, and its CPU seconds by then), its CPU share idle (``IDLE_S`` seconds, nothing
asked), then its CPU share and RSS under a steady load: one client thread per instance keeping one
Generate call of ``SAMPLES`` samples open on it at all times
(``services.generation.client.GenerationClient``), the threads' first calls spread over
``WARM_S`` seconds so that completions are spread as in a run, for ``LOAD_S`` seconds after that
warm-up: about 1.1 samples/s per instance (8 samples every ~7 s), what an instance of a few dozen
sequences of ~1000 tokens at 30 ms a step finishes. CPU share = the server process's user +
system CPU seconds (every thread) / wall seconds; 100% = one core. The client threads run in this
process, on the same cores. EMULATED: the instances compute nothing; this measures the SGS's own
control plane.

Not a result of record (it writes no ``bench/results`` file); it prints JSON, or writes it with ``--out``.

    python bench/sgs_multi.py [--instances 1,32,256] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROFILE, TIME_SCALE, LENGTHS, SAMPLES, MAX_INFLIGHT = "H20-qwen2.5-7b", 5.0, (100, 300), 8, 16
IDLE_S, WARM_S, LOAD_S = 10.0, 8.0, 20.0
START_TIMEOUT_S = 300.0


def prepare(work: Path) -> tuple[Path, Path]:
    """The tiny checkpoint and a config serving it with the emulated engine."""
    from services.common.config import load_config, write_config
    from services.policy.model import build_policy, save_policy

    base = ROOT / "deploy/configs/smoke.yaml"
    model = work / "policy"
    save_policy(build_policy(load_config(base).model), model)
    lengths = f"{{distribution: uniform, low: {LENGTHS[0]}, high: {LENGTHS[1]}}}"
    emulation = f"{{profile: {PROFILE}, lengths: {lengths}, time_scale: {TIME_SCALE}}}"
    cfg = load_config(base, ["generation.engine=emulated", f"generation.emulation={emulation}",
                             f"generation.max_new_tokens={LENGTHS[1]}", f"generation.max_inflight={MAX_INFLIGHT}"])
    write_config(cfg, work / "config.json")
    return model, work / "config.json"


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def share(proc: psutil.Process, seconds: float) -> float:
    """The process's CPU share (1.0 = one core) over the next ``seconds``."""
    c0, t0 = cpu_s(proc), time.monotonic()
    time.sleep(seconds)
    return (cpu_s(proc) - c0) / (time.monotonic() - t0)


def load(addresses: list[str], stop: threading.Event, counts: list[int]) -> list[threading.Thread]:
    """One thread per instance, each keeping one Generate call of SAMPLES samples open until ``stop``."""
    from services.common.types import GenerateParams, PromptSpec
    from services.generation.client import GenerationClient

    def run(k: int, address: str) -> None:
        client = GenerationClient(address, timeout_s=120)
        prompts = [PromptSpec(f"p{j}", (1, 4, 5, 6)) for j in range(SAMPLES)]
        stop.wait(random.Random(k).uniform(0.0, WARM_S))  # spread the first calls
        try:
            while not stop.is_set():
                counts[k] += sum(1 for _ in client.generate(prompts, GenerateParams(max_new_tokens=LENGTHS[1])))
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(k, a), daemon=True) for k, a in enumerate(addresses)]
    for t in threads:
        t.start()
    return threads


def measure(n: int, model: Path, config: Path, work: Path) -> dict:
    port_file = work / f"sgs-{n}.port"
    port_file.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    with (work / f"sgs-{n}.log").open("w") as log:
        popen = subprocess.Popen([sys.executable, "-m", "services.generation", "--config", str(config), "--model",
                                  str(model), "--instances", str(n), "--port-file", str(port_file)],
                                 cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    t0 = time.monotonic()
    proc = psutil.Process(popen.pid)
    while not port_file.exists():
        if popen.poll() is not None or time.monotonic() - t0 > START_TIMEOUT_S:
            popen.kill()
            log_tail = (work / f"sgs-{n}.log").read_text()[-3000:]
            raise RuntimeError(f"{n} instances did not start (exit code {popen.poll()}):\n{log_tail}")
        time.sleep(0.02)
    row: dict = {"instances": n, "startup_s": round(time.monotonic() - t0, 2), "startup_cpu_s": round(cpu_s(proc), 2)}
    addresses = [f"127.0.0.1:{p}" for p in port_file.read_text().split()]
    assert len(addresses) == n, addresses
    try:
        time.sleep(2.0)
        row["idle_cpu_pct"] = round(100 * share(proc, IDLE_S), 1)
        row["idle_rss_mib"] = round(proc.memory_info().rss / 2**20, 1)
        stop, counts = threading.Event(), [0] * n
        threads = load(addresses, stop, counts)
        time.sleep(WARM_S)
        before, t1 = sum(counts), time.monotonic()
        row["loaded_cpu_pct"] = round(100 * share(proc, LOAD_S), 1)
        row["load_average"] = round(os.getloadavg()[0], 1)  # the machine is shared: how busy it was
        row["loaded_samples_per_s"] = round((sum(counts) - before) / (time.monotonic() - t1), 1)
        row["loaded_rss_mib"] = round(proc.memory_info().rss / 2**20, 1)
        row["threads"] = proc.num_threads()
        stop.set()
        for t in threads:
            t.join(timeout=60)
    finally:
        t2 = time.monotonic()
        popen.terminate()
        row["exit_code"] = popen.wait(timeout=120)
        row["shutdown_s"] = round(time.monotonic() - t2, 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--instances", default="1,32,256", help="comma list of instance counts")
    parser.add_argument("--out", help="write the JSON here too")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sgs-multi-") as tmp:
        work = Path(tmp)
        model, config = prepare(work)
        rows = []
        for n in (int(x) for x in ns.instances.split(",")):
            rows.append(measure(n, model, config, work))
            print(json.dumps(rows[-1]), flush=True)
    result = {"profile": PROFILE, "time_scale": TIME_SCALE, "lengths": LENGTHS, "samples_per_call": SAMPLES,
              "idle_s": IDLE_S, "load_s": LOAD_S, "cpus": os.cpu_count(), "rows": rows}
    if ns.out:
        Path(ns.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
