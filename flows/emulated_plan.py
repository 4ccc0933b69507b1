"""An allocation plan run as an EMULATED fleet: ``braid run --config <emulated> --cluster FILE``.

The allocator (``allocator.allocate.plan_specs``) plans GPUs per stage for a cluster file; an
emulated run (``flows.registries.is_emulated``) then runs that plan through the same
``rl_training`` flow as a real run, with the plan's numbers as its config:

- ``generation.instances``: the plan's generation instances; ``generation.emulation.profile``:
  one instance's latency profile (the site's file, the shipped one, or derived at the plan's
  tensor parallelism, ``KIND:MODEL:tpN``); its KV cache (``num_blocks``) and batch
  (``max_inflight``) from that profile;
- ``trainer.emulation``: the training site's kind, the plan's GPUs and parallel configuration;
- ``generation.emulation.reload_s``: one read of the weights at the instance's HBM bandwidth (the
  profile's ``k2``) plus, across two sites, the declared model's bytes over the cluster's link
  (the plan's ``cross_site_weight_transfer_s``; with ``weights.delta``, ``cross_site_delta_transfer_s``:
  the declared model's delta share on the wire plus the codec's time, ``allocator.allocate.DELTA_SHARE``).
  This is how an emulated version has the declared model's size on the wire: modelled time; the
  relays carry the run's own (tiny) checkpoint.

Without ``--workload`` the plan's workload is the run's own iteration (``config_workload``): its
batch, the arith prompts' lengths and the emulated output lengths, so the plan and the emulation
see the same lengths.
"""

from __future__ import annotations

import math
from pathlib import Path

from services.common.config import ConfigError, RunConfig
from services.common.emulation_config import DeclaredLengths

PROMPT_TOKENS = [12, 14, 16, 18, 20]  # the count-down task's prompts (deploy/workloads/tiny.yaml)
TRACE_SAMPLES = 10_000  # lengths of a trace the planner draws from


def config_workload(cfg: RunConfig):
    """One iteration of ``cfg`` as the allocator's workload (lengths capped at ``max_new_tokens``)."""
    from allocator.cluster import LengthSpec, LognormalSpec, WorkloadSpec

    emu = cfg.generation.emulation
    if emu is None:
        raise ConfigError("a run planned on a cluster file (--cluster) is an EMULATED run: generation.emulation is "
                          "unset (deploy/configs/emulated.yaml)")
    cap = cfg.generation.max_new_tokens
    lengths = emu.lengths
    if isinstance(lengths, DeclaredLengths) and lengths.distribution == "lognormal":
        response = LengthSpec(lognormal=LognormalSpec(median=lengths.median, sigma=lengths.sigma, max=cap))
    elif isinstance(lengths, DeclaredLengths):
        low, high = ((lengths.tokens, lengths.tokens) if lengths.distribution == "fixed"
                     else (lengths.low, lengths.high))
        span = range(min(low, cap), min(high, cap) + 1)
        response = LengthSpec(samples=list(span)[:TRACE_SAMPLES])
    else:
        from services.generation.emulation import read_trace

        trace = read_trace(Path(lengths), emu.trace_model, emu.chars_per_token)
        response = LengthSpec(samples=[min(n, cap) for n in trace[:TRACE_SAMPLES]])
    tc = cfg.trainer
    return WorkloadSpec(name="the run's iteration", batch_size=tc.prompts_per_iteration * tc.group_size,
                        prompt_tokens=LengthSpec(samples=PROMPT_TOKENS), response_tokens=response,
                        algorithm=tc.algorithm.name, admission=cfg.generation.admission)


def plan_for_run(cfg: RunConfig, cluster: str, workload: str | None = None, objective: str = "time") -> dict:
    """The allocator's plan of ``cluster`` for the emulated run ``cfg`` (its declared model), on
    ``workload`` or the run's own iteration; ``ConfigError`` with the planner's message."""
    from allocator.allocate import AllocationInputError, find_model, plan_specs
    from allocator.cluster import load_cluster, load_workload

    emu = cfg.trainer.emulation
    if cfg.trainer.backend != "emulated" or emu is None or emu.model is None:
        raise ConfigError("--cluster plans an EMULATED run: set trainer.backend emulated and trainer.emulation.model "
                          "(the declared model the plan is for, e.g. qwen2.5-7b)")
    try:
        wl = load_workload(workload) if workload else config_workload(cfg)
        return plan_specs(load_cluster(cluster), cluster, find_model(emu.model), wl, objective=objective)  # type: ignore[arg-type]
    except AllocationInputError as err:
        raise ConfigError(str(err)) from None


def emulated_overrides(plan: dict, page_size: int, delta: bool = False) -> list[str]:
    """The config overrides that make an emulated run the fleet ``plan`` describes; ``delta``
    (``weights.delta``): a version crosses the sites as a delta (the plan's
    ``cross_site_delta_transfer_s``: the declared model's delta share on the wire plus the codec)."""
    from services.generation.emulated_engine import resolve_profile

    if "emulation" not in plan:
        raise ConfigError("this allocation plan predates emulation (no 'emulation' field): plan it again with "
                          "`braid allocate --json` or `braid run --cluster`")
    try:
        emu = plan["emulation"]
        profile = resolve_profile(str(emu["gen_profile"]))
        dp, tp, pp = _parallel(str(plan["train_parallel"]))
        crossing = plan.get("cross_site_delta_transfer_s" if delta else "cross_site_weight_transfer_s", 0.0)
        reload_s = profile.step_cost.k2 + float(crossing)
        trainer = {"gpu": plan["train_kind"], "gpus": plan["train_gpus"], "model": plan["model"],
                   "parallel": f"dp{dp}-tp{tp}-pp{pp}", "gpus_per_node": emu["train_gpus_per_node"],
                   "inter_node_gbps": emu["train_inter_node_gbps"], "train_profile": emu["train_profile"]}
    except (KeyError, TypeError, ValueError) as err:  # ProfileError is a ValueError
        raise ConfigError(f"allocation plan: its emulation fields do not describe a fleet: {err!r}") from None
    flow = "{" + ", ".join(f"{k}: {v}" for k, v in trainer.items() if v is not None) + "}"
    return [f"generation.instances={plan['gen_instances']}",
            f"generation.emulation.profile={emu['gen_profile']}",
            f"generation.emulation.reload_s={reload_s}",
            f"generation.num_blocks={max(4, math.ceil(profile.kv_capacity_tokens / page_size))}",
            f"generation.max_inflight={profile.max_batch}",
            f"trainer.emulation={flow}"]


def _parallel(label: str) -> tuple[int, int, int]:
    """``DP6xTP1xPP4`` -> (6, 1, 4) (``ValueError`` for anything else)."""
    parts = {p[:2].lower(): int(p[2:]) for p in label.split("x")}
    if not parts or set(parts) - {"dp", "tp", "pp"} or min(parts.values()) < 1:
        raise ValueError(f"train_parallel {label!r} is not DPdxTPtxPPp")
    return parts.get("dp", 1), parts.get("tp", 1), parts.get("pp", 1)
