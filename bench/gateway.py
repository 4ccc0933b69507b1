"""What the OpenAI-compatible gateway costs (issue 33): a call through it against a direct SGS
request, and episodes per second of an agent playing through it against Braid's own loop.

Declared before the run of record (DESIGN.md §5); nothing here is chosen after seeing results:

- **Model**: the tiny policy of ``deploy/configs/smoke.yaml`` with ``TRAJECTORY_TEMPLATE``, the chat template
  that lays a conversation out as Braid's own multi-turn trajectories (as
  ``tests/integration/test_gateway_run.py``); the config's engine (vLLM).
- **call_overhead_s**: one SGS process; ``CALLS`` pairs after ``WARMUP`` unrecorded ones, each pair
  the same prompt sent directly (``GenerationClient``, one sample) and through the gateway (the
  official ``openai`` client, ``chat.completions`` with the user message that renders to that
  prompt), which goes first alternating; ``MAX_NEW`` new tokens at most. Only pairs where both
  calls generated ``MAX_NEW`` tokens count (equal work; their number is reported). Overhead =
  gateway latency - direct latency of the pair: median and p99, and each side's.
- **episodes_per_s**: one-step agentic runs of the config (``ITERATIONS`` iterations of 2 episodes
  x 4 trajectories, ``agentic.max_turns`` 6, the hf engine as the agentic tests run it), the
  built-in loop (EnvManager and environment workers) against ``examples/calculator_agent.py`` through
  the gateway, ``ROUNDS`` interleaved rounds; trained trajectories per second of the rollout span
  (first iteration's start to last iteration's end); the ratio agent/built-in per round, median
  and range.

A run of record starts from a clean checkout (refused otherwise; ``--allow-dirty`` writes into
/tmp/braid-bench-scratch). Writes ``bench/results/gateway.{json,md,png}`` (``--quick``: 40 pairs,
1 round, into /tmp).

    python bench/gateway.py [--quick] [--allow-dirty]
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report_io import (  # noqa: E402
    RecordParser,
    provenance,
    provenance_line,
    ratio_spread,
    results_dir,
    spread,
    write_results,
)
from services.gateway.transcript import TRAJECTORY_TEMPLATE  # noqa: E402

CONFIG = ROOT / "deploy/configs/smoke.yaml"
CALLS, WARMUP, MAX_NEW = 200, 10, 8
ROUNDS, ITERATIONS = 3, 4
AGENTIC = ["agentic.enabled=true", "agentic.concurrency=8", "trainer.prompts_per_iteration=2", "trainer.group_size=4",
           "trainer.micro_batch_groups=1", "eval.prompts=4", "agentic.max_turns=6", "trainer.mode=one_step",
           "generation.engine=hf"]
AGENT = "examples.calculator_agent:play"


def chat_checkpoint(work: Path) -> Path:
    """The config's tiny policy (random init, seeded) with ``TRAJECTORY_TEMPLATE`` in its tokenizer."""
    from services.common.config import load_config
    from services.policy.model import build_policy, save_policy

    path = work / "policy"
    save_policy(build_policy(load_config(CONFIG).model), path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TRAJECTORY_TEMPLATE}))
    return path


def _p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98] if len(xs) >= 2 else xs[0]


def call_overhead(ckpt: Path, work: Path, calls: int) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    import openai
    from transformers import AutoTokenizer

    from flows.processes import Supervisor, start_instances
    from services.agentic.runner import SgsGenerator
    from services.common.config import load_config, write_config
    from services.common.types import GenerateParams, PromptSpec
    from services.gateway.app import GatewaySettings
    from services.gateway.serve import GatewayServer, sgs_backend
    from services.gateway.sessions import Sessions
    from services.gateway.transcript import HFChatTokenizer
    from services.generation.client import GenerationClient

    work.mkdir(parents=True)
    write_config(load_config(CONFIG, [f"generation.max_new_tokens={MAX_NEW}"]), work / "config.json")
    sup = Supervisor(work)
    (address,) = start_instances(sup, work, str(ckpt), 1, threads=1)
    client = GenerationClient(address)
    client.wait_ready()
    tok = AutoTokenizer.from_pretrained(ckpt)
    sessions = Sessions(HFChatTokenizer(tok), max_segments=1 << 20)
    rows = []
    with ThreadPoolExecutor(4) as ex:
        gen = SgsGenerator(client, ex, temperature=1.0)
        settings = GatewaySettings(model="braid-policy", max_context=256, max_new_tokens=MAX_NEW, temperature=1.0,
                                   eos_id=tok.eos_token_id)
        server = GatewayServer(sessions, sgs_backend(gen), settings).start()
        try:
            session = sessions.open("bench", 0)
            agent = openai.OpenAI(base_url=server.url, api_key=session.key, max_retries=0, timeout=120)
            for i in range(calls + WARMUP):
                text = f"{100 + i}-7>50="
                ids = tuple(tok.encode(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False),
                                       add_special_tokens=False))
                row = {}
                for side in (("gateway", "direct") if i % 2 else ("direct", "gateway")):
                    t0 = time.perf_counter()
                    if side == "direct":
                        (s,) = list(client.start([PromptSpec(f"d{i}", ids)], GenerateParams(max_new_tokens=MAX_NEW)))
                        n = len(s.token_ids)
                    else:
                        out = agent.chat.completions.create(model="braid-policy", max_tokens=MAX_NEW,
                                                            messages=[{"role": "user", "content": text}])
                        n = out.usage.completion_tokens
                    row[side] = (time.perf_counter() - t0, n)
                if i >= WARMUP:
                    rows.append(row)
        finally:
            server.stop()
            sup.stop_all()
    full = [r for r in rows if r["direct"][1] == r["gateway"][1] == MAX_NEW]
    over = [r["gateway"][0] - r["direct"][0] for r in full]
    return {"pairs": len(rows), "pairs_counted": len(full), "max_new_tokens": MAX_NEW,
            "overhead_s": {"median": statistics.median(over), "p99": _p99(over), "mean": statistics.fmean(over)},
            "direct_s": {"median": statistics.median([r["direct"][0] for r in full]),
                         "p99": _p99([r["direct"][0] for r in full])},
            "gateway_s": {"median": statistics.median([r["gateway"][0] for r in full]),
                          "p99": _p99([r["gateway"][0] for r in full])},
            "overhead_per_pair_s": over}


def _agentic_run(ckpt: Path, work: Path, agent: str | None, cache: Path) -> float:
    """Trained trajectories per second of one run's rollout span."""
    from flows.launcher import run_processes
    from services.common.config import load_config, write_config

    work.mkdir(parents=True)
    extra = [f"agentic.agent={agent}"] if agent else []
    cfg = load_config(CONFIG, [*AGENTIC, f"trainer.iterations={ITERATIONS}", f"cache_dir={cache}", *extra])
    write_config(cfg, work / "config.json")
    (work / "metrics.jsonl").write_text("")
    run_processes(work, str(ckpt), poll_s=0.2)
    rows = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
    trajs = sum(1 for _ in (work / "trajectories.jsonl").read_text().splitlines())
    return trajs / (rows[-1]["t_end"] - rows[0]["t_start"])


def episodes_per_s(ckpt: Path, work: Path, rounds: int) -> dict:
    cache = work / "cache"  # one warm start for every run
    builtin, agent = [], []
    for r in range(rounds):
        order = (None, AGENT) if r % 2 == 0 else (AGENT, None)
        for which in order:
            rate = _agentic_run(ckpt, work / f"r{r}-{'agent' if which else 'builtin'}", which, cache)
            (agent if which else builtin).append(rate)
            print(f"round {r} {'agent' if which else 'built-in'}: {rate:.2f} trajectories/s", flush=True)
    return {"builtin": spread(builtin), "agent": spread(agent), "agent_vs_builtin": ratio_spread(agent, builtin)}


def markdown(res: dict) -> str:
    c, e = res["call_overhead"], res["episodes_per_s"]
    lines = ["# Gateway cost (bench/gateway.py)", "",
             f"A call through the gateway vs a direct SGS request ({c['pairs_counted']} of {c['pairs']} pairs with "
             f"{c['max_new_tokens']} new tokens each):", "",
             "| | median (ms) | p99 (ms) |", "|---|---|---|",
             f"| direct | {1e3 * c['direct_s']['median']:.1f} | {1e3 * c['direct_s']['p99']:.1f} |",
             f"| gateway | {1e3 * c['gateway_s']['median']:.1f} | {1e3 * c['gateway_s']['p99']:.1f} |",
             f"| **overhead** | **{1e3 * c['overhead_s']['median']:.1f}** "
             f"| **{1e3 * c['overhead_s']['p99']:.1f}** |", "",
             f"Trajectories/s: built-in loop {e['builtin']['median']:.2f} "
             f"[{e['builtin']['min']:.2f}-{e['builtin']['max']:.2f}], agent through the gateway "
             f"{e['agent']['median']:.2f} [{e['agent']['min']:.2f}-{e['agent']['max']:.2f}]; "
             f"agent / built-in **{e['agent_vs_builtin']['median']:.2f}x** "
             f"[{e['agent_vs_builtin']['min']:.2f}-{e['agent_vs_builtin']['max']:.2f}] "
             f"({e['agent_vs_builtin']['n']} interleaved rounds).", "",
             provenance_line(res["provenance"])]
    return "\n".join(lines) + "\n"


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist([1e3 * x for x in res["call_overhead"]["overhead_per_pair_s"]], bins=30, color="tab:blue")
    ax.set_xlabel("gateway - direct, per call (ms)")
    ax.set_ylabel("pairs")
    ax.set_title("What a call through the gateway adds")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = RecordParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 pairs and 1 round, into a scratch directory")
    parser.add_argument("--out", default=None, help="default bench/results (--quick: /tmp/braid-bench-quick)")
    ns = parser.parse_args(argv)
    calls, rounds = (40, 1) if ns.quick else (CALLS, ROUNDS)
    prov = provenance(Path(__file__), {"calls": calls, "warmup": WARMUP, "max_new": MAX_NEW, "rounds": rounds,
                                       "iterations": ITERATIONS, "agentic": AGENTIC, "agent": AGENT, "quick": ns.quick},
                      CONFIG, "vllm")
    t0 = time.time()
    work = Path(tempfile.mkdtemp(prefix="braid-gateway-"))
    try:
        ckpt = chat_checkpoint(work)
        result = {"call_overhead": call_overhead(ckpt, work / "calls", calls),
                  "episodes_per_s": episodes_per_s(ckpt, work / "runs", rounds)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.update(seconds=round(time.time() - t0, 1), quick=ns.quick, provenance=prov)
    print(write_results(results_dir(ns.out, ns.quick), "gateway", result, markdown, plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
