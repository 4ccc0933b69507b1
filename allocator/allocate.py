"""``braid allocate`` and the ``plan_allocation`` flow: files in, a plan (JSON-able dict) out.

The edge around the pure planner (``allocator.planner``): reads the cluster and workload files
(``allocator.cluster``), resolves each site's GPU kind (``services.generation.scheduling.hardware`` or the file's
custom numbers) and the generation PTL profile of kind x model (the site's ``profile`` file,
else the shipped one in ``allocator/profiles/``, else derived from the spec sheet) and the
training site's measured step-time profile (the one it names in ``train_profile``, else the
shipped one of its kind, the model, the workload's algorithm and its ``train_backend``, else the
roofline; ``train_profile: roofline`` forces the roofline), builds the memoised cost model,
plans, and formats the result as JSON or a table. The training workload carries the padded
work the learner computes (``allocator.padding.expected_work``: the workload's lengths dealt
into groups of the profile's ``group_size``, ``micro_batch_groups`` per backward call), which a
measured profile prices.

Every input problem raises ``AllocationInputError`` saying what is missing: the file and field,
the known GPU kinds or models, or the memory needed vs available per GPU.
"""

from __future__ import annotations

import time
from pathlib import Path

from allocator.cluster import (
    AllocationInputError,
    ClusterSpec,
    SiteSpec,
    WorkloadSpec,
    load_cluster,
    load_workload,
    workload_lengths,
)
from allocator.padding import expected_work
from allocator.planner import (
    CostModel,
    GenPool,
    GenWorkload,
    Objective,
    Plan,
    TrainPool,
    evaluate_two_sites,
    plan_single_site,
    plan_two_sites,
)
from allocator.training import MFU, TrainSite, TrainWorkload
from services.generation.scheduling.hardware import HARDWARE, Hardware
from services.generation.scheduling.models import MODELS, ModelSpec
from services.policy.bucketing import MICRO_BATCH_TOKENS

PLAN_FIELDS = ("gen_gpus", "train_gpus", "gen_parallel", "train_parallel", "t_gen_s", "t_train_s", "iteration_s",
               "samples_per_s", "samples_per_s_per_cost", "planning_time_s")


def find_model(name: str) -> ModelSpec:
    for key, spec in MODELS.items():
        if key.lower() == name.lower():
            return spec
    raise AllocationInputError(f"unknown model {name!r}; known: {sorted(MODELS)}")


def site_hardware(site: SiteSpec, where: str) -> tuple[Hardware, float]:
    """(hardware, cost per GPU) of a site; custom kinds need tflops, memory_gb and a cost."""
    if site.gpu in HARDWARE:
        hw = HARDWARE[site.gpu]
        cost = site.cost_per_gpu if site.cost_per_gpu is not None else hw.cost
        if cost is None:
            raise AllocationInputError(
                f"{where}.cost_per_gpu: {site.gpu} has no cost in StreamRL Table 1; set cost_per_gpu"
            )
        return hw, cost
    missing = [f for f in ("tflops", "memory_gb", "cost_per_gpu") if getattr(site, f) is None]
    if missing:
        raise AllocationInputError(
            f"{where}.gpu: unknown GPU kind {site.gpu!r}; known: {sorted(HARDWARE)} "
            f"(a custom kind needs {', '.join(missing)})")
    assert site.tflops is not None and site.memory_gb is not None and site.cost_per_gpu is not None
    intra = site.inter_node_gbps / 8.0
    hw = Hardware(site.gpu, site.tflops, site.memory_gb, site.memory_tb_s or 0.1, intra, site.cost_per_gpu,
                  "cluster file")
    return hw, site.cost_per_gpu


def gen_specs(site: SiteSpec, model: ModelSpec, where: str) -> dict:
    """TP degree -> instance spec: the site's or the shipped profile, and for derived profiles
    of a spec-sheet kind also the larger TP degrees within a node (the planner picks)."""
    from services.generation.scheduling.profiles import derive_profile

    base = gen_profile(site, model, where)
    specs = {base.tensor_parallel: base.instance_spec()}
    if base.source == "derived" and site.profile is None and site.gpu in HARDWARE:
        tp = base.tensor_parallel * 2
        while tp <= min(site.gpus_per_node, site.count) and model.q_heads % tp == 0 and model.kv_heads % tp == 0:
            specs[tp] = derive_profile(site.gpu, model.name, tp).instance_spec()
            tp *= 2
    return specs


def gen_profile(site: SiteSpec, model: ModelSpec, where: str):
    """The generation profile of site kind x model: the file's, shipped, or derived."""
    from services.generation.scheduling.profiles import PROFILE_DIR, ProfileError, derive_profile, load_profile

    try:
        if site.profile is not None:
            return load_profile(site.profile, model=model)
        shipped = PROFILE_DIR / f"{site.gpu}-{model.name}.json"
        if shipped.is_file():
            return load_profile(shipped, model=model)
        if site.gpu not in HARDWARE:
            raise AllocationInputError(f"{where}.profile: no PTL profile of {model.name} on custom kind {site.gpu!r}; "
                                       f"measure one with `braid profile` and name it here")
        return derive_profile(site.gpu, model.name)
    except ProfileError as err:
        raise AllocationInputError(f"{where}.profile: {err}") from None
    except ValueError as err:
        if isinstance(err, AllocationInputError):
            raise
        raise AllocationInputError(f"{where}: generation cannot run: {err}") from None


ROOFLINE = "roofline"  # train_profile: roofline asks for the roofline even where a profile is shipped


def resolve_train_profile(site: SiteSpec, model: ModelSpec, algorithm: str, where: str):
    """(profile, its path) of the training site: the file it names, checked against the site's
    kind and backend, the model and the workload's algorithm; else the shipped profile matching
    them (``allocator/profiles/``); else (None, None): the roofline."""
    from allocator.train_profile import find_train_profile, load_train_profile
    from services.generation.scheduling.profiles import PROFILE_DIR, ProfileError

    field = f"{where}.train_profile"
    if site.train_profile == ROOFLINE:
        return None, None
    if site.train_profile is None:
        try:
            path = find_train_profile(PROFILE_DIR, hardware=site.gpu, model=model, algorithm=algorithm,
                                      backend=site.train_backend)
        except ProfileError as err:
            raise AllocationInputError(f"{field}: a shipped profile is unreadable: {err}") from None
        return (None, None) if path is None else (load_train_profile(path, model=model), path)
    path = Path(site.train_profile)
    if not path.is_file():
        raise AllocationInputError(f"{field}: no such file {str(path)!r} (measure one with `braid profile-train`)")
    try:
        prof = load_train_profile(path, model=model)
    except ProfileError as err:
        raise AllocationInputError(f"{field}: {err}") from None
    if prof.hardware != site.gpu:
        raise AllocationInputError(f"{field}: {path} was measured on {prof.hardware!r}, the site's gpu is {site.gpu!r}")
    if prof.algorithm != algorithm:
        raise AllocationInputError(f"{field}: {path} was measured with {prof.algorithm}, the workload runs {algorithm}")
    if prof.backend != site.train_backend:
        raise AllocationInputError(f"{field}: {path} was measured on the {prof.backend} backend, the site trains "
                                   f"with train_backend {site.train_backend!r}")
    return prof, path


def train_profile(site: SiteSpec, model: ModelSpec, algorithm: str, where: str):
    """The training site's measured step-time profile (None: the roofline); see ``resolve_train_profile``."""
    return resolve_train_profile(site, model, algorithm, where)[0]


def train_source(path: Path | None) -> str:
    """Where the training times of a plan come from (the plan's ``train_source``)."""
    if path is not None:
        return f"measured profile {_shown(path)}"
    return f"roofline (MFU {MFU:.2f})"


def _shown(path: Path) -> str:
    """A shipped profile relative to the repository, a named one as the cluster file names it."""
    from services.generation.scheduling.profiles import PROFILE_DIR

    root = PROFILE_DIR.resolve().parents[1]
    return str(path.resolve().relative_to(root)) if path.resolve().is_relative_to(PROFILE_DIR.resolve()) else str(path)


def train_workload(prompts: list[int], outputs: list[int], algorithm: str, profile, *,
                   group_size: int | None = None, micro_batch_groups: int | None = None) -> TrainWorkload:
    """One iteration's training workload: its tokens and the learner's expected padded work
    (``allocator.padding.expected_work``), grouped as given, else as the profile's trainer config
    was (the trainer's defaults, 8 and 8, without a profile), in passes of the profile's
    ``micro_batch_tokens``."""
    seq = [p + o for p, o in zip(prompts, outputs, strict=True)]
    gs = group_size or (profile.group_size if profile is not None else 8)
    mbg = micro_batch_groups or (profile.micro_batch_groups if profile is not None else 8)
    mbt = profile.micro_batch_tokens if profile is not None else MICRO_BATCH_TOKENS
    return TrainWorkload.from_work(expected_work(seq, gs, mbg, max_tokens=mbt), algorithm)


def build_cost_model(cluster: ClusterSpec, source: str, model: ModelSpec, wl: WorkloadSpec) -> CostModel:
    from services.generation.scheduling.dispatch import policy_names

    if wl.dispatch not in policy_names():
        raise AllocationInputError(
            f"workload {wl.name!r}: dispatch: unknown policy {wl.dispatch!r}; known: {policy_names()}"
        )
    idx = {s.name: i for i, s in enumerate(cluster.sites)}
    gsite, tsite = cluster.site("generation"), cluster.site("training")
    gwhere, twhere = f"{source}: sites[{idx[gsite.name]}]", f"{source}: sites[{idx[tsite.name]}]"
    _, gcost = site_hardware(gsite, gwhere)
    thw, tcost = site_hardware(tsite, twhere)
    specs = gen_specs(gsite, model, gwhere)
    prompts, outputs = workload_lengths(wl)
    prof = train_profile(tsite, model, wl.algorithm, twhere)
    train_wl = train_workload(prompts, outputs, wl.algorithm, prof)
    site = TrainSite(thw, tsite.gpus_per_node, tsite.inter_node_gbps / 8.0, tflops=tsite.tflops, profile=prof)
    return CostModel(
        model=model,
        gen=GenPool(gsite.gpu, gsite.count, gcost, specs, _step(gsite, min(specs))),
        train=TrainPool(tsite.gpu, tsite.count, _step(tsite, 1), tcost, site),
        gen_wl=GenWorkload(tuple(prompts), tuple(outputs), wl.dispatch, wl.admission),
        train_wl=train_wl,
    )


def _step(site: SiteSpec, smallest: int) -> int:
    """Allocation step of a site: whole nodes on a multi-node site, else the smallest unit."""
    step = site.allocation_step or ("node" if site.count >= 2 * site.gpus_per_node else "instance")
    return site.gpus_per_node if step == "node" else smallest


def plan_files(cluster_path: str | Path, model_name: str, workload_path: str | Path, *,
               objective: Objective = "time", max_iteration_s: float | None = None) -> dict:
    """Plan from files; returns the plan as a JSON-able dict (``PLAN_FIELDS`` and more)."""
    cluster, wl = load_cluster(cluster_path), load_workload(workload_path)
    return plan_specs(cluster, str(cluster_path), find_model(model_name), wl, objective=objective,
                      max_iteration_s=max_iteration_s)


def plan_specs(cluster: ClusterSpec, cluster_path: str, model: ModelSpec, wl: WorkloadSpec, *,
               objective: Objective = "time", max_iteration_s: float | None = None) -> dict:
    """``plan_files`` on loaded inputs (``cluster_path``: where the cluster came from, for messages).
    The plan also says how to emulate it (``emulation``: the generation profile per instance, the
    training site's node size, network and profile)."""
    t0 = time.perf_counter()
    cm = build_cost_model(cluster, str(cluster_path), model, wl)
    try:
        if len(cluster.sites) == 1:
            plan = plan_single_site(cm, cluster.sites[0].count, objective, max_iteration_s)
        else:
            plan = plan_two_sites(cm, cm.gen.gpus, cm.train.gpus, objective, max_iteration_s)
    except ValueError as err:
        raise AllocationInputError(f"{cluster_path}: {model.name}: {err}") from None
    return plan_dict(cm, plan, cluster, str(cluster_path), model, wl, time.perf_counter() - t0)


def allocation_specs(cluster: ClusterSpec, cluster_path: str, model: ModelSpec, wl: WorkloadSpec,
                     gen_gpus: int, train_gpus: int) -> dict:
    """A given two-site allocation priced by the cost model ``plan_specs`` plans with
    (``allocator.planner.evaluate_two_sites``), as the same dict (a baseline beside a plan, which
    ``flows.emulated_plan.emulated_overrides`` runs as it runs a plan); ``AllocationInputError``
    for an allocation the sites cannot hold."""
    t0 = time.perf_counter()
    if len(cluster.sites) != 2:
        raise AllocationInputError(f"{cluster_path}: a given allocation is priced on two sites, the file has "
                                   f"{len(cluster.sites)}")
    cm = build_cost_model(cluster, str(cluster_path), model, wl)
    try:
        plan = evaluate_two_sites(cm, gen_gpus, train_gpus)
    except ValueError as err:
        raise AllocationInputError(f"{cluster_path}: {model.name}: {err}") from None
    out = plan_dict(cm, plan, cluster, str(cluster_path), model, wl, time.perf_counter() - t0)
    return {**out, "objective": "given"}


# Delta versions (``weights.delta``, docs/weights.md), as measured on SmolLM2-135M-Instruct in bfloat16 at lr 2e-5
# across a shaped link (bench/results/weights.json ``delta``, clean 431cce8): a delta carried 3.6% of the version's
# bytes, and encoding, forwarding, applying and checking it cost about a second per 168 MB of version (2 cores).
# A declared model's delta is modelled with both: where the link is fast, the codec makes a delta slower than whole.
DELTA_SHARE = 0.036
DELTA_CODEC_BYTES_PER_S = 168e6


def delta_transfer_s(nbytes: int, gbps: float) -> float:
    """Seconds a version of ``nbytes`` takes as a delta over a ``gbps`` link (wire plus codec)."""
    return nbytes * DELTA_SHARE * 8 / (gbps * 1e9) + nbytes / DELTA_CODEC_BYTES_PER_S


def plan_dict(cm: CostModel, plan: Plan, cluster: ClusterSpec, where: str, model: ModelSpec, wl: WorkloadSpec,
              elapsed: float) -> dict:
    """A priced allocation as JSON: the plan's fields, its instances, workload and trainer memory,
    the weights' time over the cross-site link, and how to emulate it (``emulation``)."""
    out = {**plan.__dict__, "planning_time_s": elapsed,
           "gen_instances": plan.gen_gpus // cm.gen_choice(plan.gen_gpus)[1], "model": model.name,
           "cluster": cluster.name, "workload": wl.name, "batch_size": wl.batch_size, "algorithm": wl.algorithm,
           "train_source": train_source(resolve_train_profile(cluster.site("training"), model, wl.algorithm, "")[1]),
           "train_pad_factor": cm.train_wl.padded_tokens / cm.train_wl.tokens}
    best = cm.train_search(plan.train_gpus).best
    assert best is not None
    out["train_memory_gb_per_gpu"] = round(best.memory.needed / 1e9, 2)
    out["train_memory_available_gb"] = round(best.memory.available / 1e9, 2)
    if cluster.links:
        gbps = min(link.gbps for link in cluster.links)
        out["cross_site_weight_transfer_s"] = model.weight_bytes() * 8 / (gbps * 1e9)
        out["cross_site_delta_transfer_s"] = delta_transfer_s(model.weight_bytes(), gbps)
    out["emulation"] = emulation_of(cluster, where, model, plan.gen_gpus // out["gen_instances"])
    return out


def emulation_of(cluster: ClusterSpec, where: str, model: ModelSpec, gen_tp: int) -> dict:
    """What an emulated run of a plan needs beyond the plan's own fields: the profile of one
    generation instance (the site's file, the shipped one, or ``KIND:MODEL:tpN`` derived: what
    ``generation.emulation.profile`` takes) and the training site's node, network and profile."""
    from services.generation.scheduling.profiles import PROFILE_DIR

    gsite, tsite = cluster.site("generation"), cluster.site("training")
    base = gen_profile(gsite, model, where)
    if base.tensor_parallel != gen_tp:
        profile = f"{gsite.gpu}:{model.name}:tp{gen_tp}"
    elif gsite.profile is not None:
        profile = str(Path(gsite.profile).resolve())
    elif (PROFILE_DIR / f"{gsite.gpu}-{model.name}.json").is_file():
        profile = f"{gsite.gpu}-{model.name}"
    else:
        profile = f"{gsite.gpu}:{model.name}:tp{gen_tp}"
    train_profile = tsite.train_profile
    if train_profile not in (None, ROOFLINE):
        train_profile = str(Path(train_profile).resolve())
    return {"gen_profile": profile, "gen_tensor_parallel": gen_tp,
            "train_gpus_per_node": tsite.gpus_per_node, "train_inter_node_gbps": tsite.inter_node_gbps,
            "train_profile": train_profile}


def format_table(plan: dict) -> str:
    """The plan as a readable table (what ``braid allocate`` prints without --json)."""
    rows = [
        ("stage", "GPUs", "kind", "parallel", "predicted s"),
        ("generation (SGS)", str(plan["gen_gpus"]), plan["gen_kind"], plan["gen_parallel"], f"{plan['t_gen_s']:.1f}"),
        ("training", str(plan["train_gpus"]), plan["train_kind"], plan["train_parallel"], f"{plan['t_train_s']:.1f}"),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [f"{plan['model']} on {plan['cluster']} ({plan['mode']}, objective {plan['objective']}), "
             f"workload {plan['workload']} ({plan['batch_size']} samples/iteration, {plan['algorithm']})", ""]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines += [
        "",
        f"iteration time     {plan['iteration_s']:.1f} s  (max of the two stages: one-step asynchronous pipeline)",
        f"samples/s          {plan['samples_per_s']:.2f}",
        f"samples/s per cost {plan['samples_per_s_per_cost']:.4f}  "
        f"(cost {plan['cost']:.1f}: H20 = 1.00, H800 = 2.85 per GPU)",
        f"training time from {plan['train_source']}",
        f"trainer memory     {plan['train_memory_gb_per_gpu']:.1f} of {plan['train_memory_available_gb']:.1f} "
        "GB per GPU",
        f"surplus GPUs       generation site {plan['surplus_gen_gpus']}, training site {plan['surplus_train_gpus']}",
        f"planning time      {plan['planning_time_s']:.3f} s ({plan['gen_evals']} generation simulations)",
    ]
    if "cross_site_weight_transfer_s" in plan:
        lines.append(f"weights over link  {plan['cross_site_weight_transfer_s']:.1f} s per version "
                     "(overlapped with training)")
    if "cross_site_delta_transfer_s" in plan:
        lines.append(f"  as deltas        {plan['cross_site_delta_transfer_s']:.1f} s per version (weights.delta: "
                     f"{DELTA_SHARE:.1%} of a version on the wire + the codec at {DELTA_CODEC_BYTES_PER_S / 1e6:.0f} "
                     "MB/s, as measured)")
    return "\n".join(lines)
