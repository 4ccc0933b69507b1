"""GPU trainer benchmark (CUDA only): the learner's optimizer steps on one GPU against the
allocator's H100 roofline.

Measured: one optimizer step of the trainer's real learner on one CUDA device, timed exactly as
``braid profile-train`` times it (``allocator.train_profiler.measure_grid``: ``Learner.begin()``,
``backward()`` per ``micro_batch_groups`` groups, ``step()``, a CUDA synchronize; one warm-up
step per point, then the median of ``REPEATS`` timed steps), in bfloat16 autocast over float32
master weights, on two real architectures with **random weights** (the lent GPU machine has no
network and the checkpoints do not travel; step time does not depend on the weights' values):

- ``smollm2-135m``: SmolLM2-135M-Instruct's architecture (Llama, 30 layers, h576, vocab 49,152,
  tied), the real model of ``deploy/configs/smollm2-arith.yaml``;
- ``qwen2.5-1.5b``: Qwen2.5-1.5B's (Qwen2, 28 layers, h1536, vocab 151,936, tied), the largest
  Qwen2.5 whose full AdamW training fits one 80 GB GPU beside a reference copy.

Two variants (``VARIANTS``), each at a budget of padded tokens per forward/backward pass
(``trainer.micro_batch_tokens``; ``RUNS`` lists the runs per model):

- ``roofline``: what the allocator's roofline prices (``allocator.training``: GRPO at 5
  forward-equivalents = forward + recomputed forward + backward + a reference forward), i.e.
  ``trainer.activation_checkpointing`` on and ``trainer.kl_coef`` > 0. Its points are judged
  against the roofline's H100 prediction (989.4 TFLOP/s bf16 x MFU 0.40, one GPU, no
  communication): ``roofline_error`` per point = |predicted - measured| / measured;
- ``plain``: Braid's default trainer settings on a GPU (no recomputation, no reference model).

Per point: measured seconds, trained tokens/s, and the achieved MFU (the FLOPs the learner
really computed: ``allocator.training.step_flops`` at the variant's forward-equivalents, over
seconds x the H100's bf16 peak). Per model and variant: the measured profile's fit
(``allocator.train_profile.make_train_profile``: fixed seconds per step and effective FLOP/s),
the peak GPU memory; ``micro_batch_speedup``: the plain variant's trained tokens/s at the
largest budget over the CPU default of 4,096 tokens (a pass costs thousands of kernel launches
whatever its size: on a 135M model at 4,096 tokens the GPU was busy 22 % of a step, a profile of
2026-11-27 on an H100). All points have equal lengths (sigma 0: no padding), prompts of 12 tokens.

Declared before the run of record (``TARGETS``): the roofline's median relative error over the
``roofline`` points of each model <= 0.30, i.e. the allocator's derived H100 training model is
within 30 % of Braid's learner on a real H100. A miss is reported as missed.

Writes ``gpu_train.{json,md,png}`` to ``--out`` (default ``bench/results``; ``--quick``: a
smaller grid to a scratch directory). Refuses to run without CUDA.

    python bench/gpu_train.py [--out DIR] [--models smollm2-135m,qwen2.5-1.5b] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report_io import RecordParser, provenance, provenance_line, results_dir, write_results  # noqa: E402

# public architecture configs (Hugging Face config.json fields), weights drawn at random
ARCHS = {
    "smollm2-135m": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                                   rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True)),
    "qwen2.5-1.5b": ("qwen2", dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                   num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                                   rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True)),
}
# per model: (samples per step, median response tokens) grid and groups per backward call
GRIDS = {"smollm2-135m": ((64, 128), (256, 1024), 8), "qwen2.5-1.5b": ((32, 64), (256, 1024), 2)}
QUICK_GRIDS = {"smollm2-135m": ((16, 64), (64, 256), 8), "qwen2.5-1.5b": ((16, 32), (64, 256), 2)}
# variant -> (activation checkpointing, kl_coef, forward-equivalents of the work the learner does)
VARIANTS = {"roofline": (True, 0.05, 5.0), "plain": (False, 0.0, 3.0)}
# per model: the (variant, trainer.micro_batch_tokens) runs, in order. 4096 is the CPU default;
# the larger budgets are what one H100's memory holds beside each model (logits of 49K / 152K vocab)
RUNS = {"smollm2-135m": (("plain", 4096), ("plain", 32768), ("roofline", 32768)),
        "qwen2.5-1.5b": (("plain", 8192), ("roofline", 8192))}
REPEATS = 3
HARDWARE = "H100"
TARGETS = {"roofline_median_rel_error": 0.30}


def build_model(name: str):
    """``name``'s architecture with random weights (float32; the learner autocasts to bfloat16)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from services.policy.model import Policy, char_tokenizer

    arch, fields = ARCHS[name]
    config = (LlamaConfig if arch == "llama" else Qwen2Config)(**fields, bos_token_id=0, eos_token_id=1, pad_token_id=1)
    torch.manual_seed(0)
    return Policy(model=AutoModelForCausalLM.from_config(config, dtype=torch.float32), tokenizer=char_tokenizer())


def achieved_mfu(spec, point, fwd_equivalents: float, peak_flops: float) -> float:
    """FLOPs the learner computed in ``point`` (``step_flops`` at ``fwd_equivalents``) per second, over the peak."""
    from allocator.training import step_flops

    wl = point.workload("grpo")
    return step_flops(spec, wl) * fwd_equivalents / wl.fwd_equivalents / (point.seconds * peak_flops)


def roofline_seconds(spec, point, hw) -> float:
    """The allocator's roofline step time of ``point`` on one GPU of kind ``hw`` (no profile)."""
    from allocator.memory import ParallelConfig
    from allocator.training import TrainSite, step_time

    return step_time(spec, ParallelConfig(1, 1, 1), TrainSite(hw, 8, 25.0), point.workload("grpo")).total_s


def summarize(spec, points, variant: str, hw) -> dict:
    """Per-point rows and the variant's summary (pure: no device needed)."""
    fwd = VARIANTS[variant][2]
    rows = []
    for p in points:
        pred = roofline_seconds(spec, p, hw)
        rows.append({"samples": p.samples, "response_tokens": p.response_tokens, "tokens": p.tokens,
                     "seconds": p.seconds, "tokens_per_s": p.tokens / p.seconds,
                     "mfu": achieved_mfu(spec, p, fwd, hw.bf16_tflops * 1e12),
                     "roofline_s": pred, "roofline_rel_error": abs(pred - p.seconds) / p.seconds})
    errs = [r["roofline_rel_error"] for r in rows]
    return {"points": rows, "mfu_median": statistics.median(r["mfu"] for r in rows),
            "mfu_largest": max(rows, key=lambda r: r["tokens"])["mfu"],
            "roofline_median_rel_error": statistics.median(errs), "roofline_max_rel_error": max(errs),
            "roofline_over_measured_median": statistics.median(r["roofline_s"] / r["seconds"] for r in rows)}


def fit_profile(spec, points, variant: str, *, device: str, group_size: int, micro_batch_groups: int,
                micro_batch_tokens: int) -> dict:
    """The measured points as a training profile (its fit), or the fit's error: a failed fit
    (time not growing with FLOPs) must not lose the points."""
    import torch

    from allocator.train_profile import make_train_profile
    from allocator.train_profiler import PROMPT_TOKENS

    ckpt, kl, _ = VARIANTS[variant]
    try:
        return make_train_profile(
            spec, points, hardware=HARDWARE, algorithm="grpo", reference_model=kl > 0, device=device,
            threads=torch.get_num_threads(), backend="torch", dtype="bfloat16", group_size=group_size,
            micro_batch_groups=micro_batch_groups, micro_batch_tokens=micro_batch_tokens,
            activation_checkpointing=ckpt,
            notes=f"MEASURED by bench/gpu_train.py ({variant}); random weights, prompts of {PROMPT_TOKENS} "
                  "tokens, equal response lengths").model_dump(mode="json")
    except ValueError as err:
        return {"error": str(err)}


def measure(name: str, variant: str, quick: bool, device: str = "cuda", micro_batch_tokens: int = 4096) -> dict:
    """Build the learner for ``name`` x ``variant`` on ``device``, measure its grid, fit a profile
    (``device`` 'cpu' only to check this script without a GPU: its numbers mean nothing)."""
    import torch

    from allocator.train_profiler import build_learner, measure_grid
    from services.common.config import load_config
    from services.generation.scheduling.hardware import get_hardware
    from services.generation.scheduling.models import spec_from_hf_config

    ckpt, kl, _ = VARIANTS[variant]
    samples, responses, mbg = (QUICK_GRIDS if quick else GRIDS)[name]
    cfg = load_config(None, [f"trainer.device={device}", "trainer.dtype=bfloat16", f"trainer.kl_coef={kl}",
                             f"trainer.activation_checkpointing={str(ckpt).lower()}",
                             f"trainer.micro_batch_groups={mbg}", f"trainer.micro_batch_tokens={micro_batch_tokens}",
                             "trainer.learner=inline", "generation.max_new_tokens=4096"])
    policy = build_model(name)
    spec = spec_from_hf_config(name, policy.model.config.to_dict(), dtype_bytes=2)
    cuda = device == "cuda"
    label = torch.cuda.get_device_name() if cuda else device
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    learner = build_learner(cfg, policy)
    t0 = time.perf_counter()
    print(f"{name} / {variant}: {spec.params() / 1e6:.0f}M parameters on {label}", flush=True)
    grid = [(s, r, 0.0) for s in samples for r in responses]
    points = measure_grid(learner, cfg.trainer, spec.vocab, grid, repeats=REPEATS, cap=cfg.generation.max_new_tokens,
                          sync=torch.cuda.synchronize if cuda else (lambda: None))
    profile = fit_profile(spec, points, variant, device=f"{device} ({label})", group_size=cfg.trainer.group_size,
                          micro_batch_groups=mbg, micro_batch_tokens=micro_batch_tokens)
    out = {**summarize(spec, points, variant, get_hardware(HARDWARE)), "params": spec.params(),
           "micro_batch_groups": mbg, "micro_batch_tokens": micro_batch_tokens, "activation_checkpointing": ckpt,
           "kl_coef": kl, "variant": variant,
           "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
           "seconds": time.perf_counter() - t0,
           "profile": profile}
    del learner, policy
    if cuda:
        torch.cuda.empty_cache()
    return out


def headlines(models: dict) -> dict:
    """The results' headline numbers from the runs so far (pure): each model's roofline error on
    its ``roofline`` run of the largest micro-batch budget, and the speedup of the plain variant's
    largest budget over its 4096-token CPU default (median over the grid points)."""
    errs, speedup = {}, {}
    for name, runs in models.items():
        done = {k: v for k, v in runs.items() if "points" in v}
        roof = sorted((v["micro_batch_tokens"], k) for k, v in done.items() if v["variant"] == "roofline")
        if roof:
            errs[name] = done[roof[-1][1]]["roofline_median_rel_error"]
        plain = sorted((v["micro_batch_tokens"], k) for k, v in done.items() if v["variant"] == "plain")
        if len(plain) > 1 and plain[0][0] == 4096:
            small, large = done[plain[0][1]]["points"], done[plain[-1][1]]["points"]
            speedup[name] = statistics.median(b["tokens_per_s"] / a["tokens_per_s"]
                                              for a, b in zip(small, large, strict=True))
    return {"models": models, "roofline_median_rel_error": errs, "micro_batch_speedup": speedup, "targets": TARGETS,
            "targets_met": {n: e <= TARGETS["roofline_median_rel_error"] for n, e in errs.items()}}


def markdown(result: dict) -> str:
    lines = ["# The learner on one GPU vs the allocator's roofline", "", provenance_line(result["provenance"]), "",
             *([f"Provenance note: {result['provenance']['provenance_note']}", ""]
               if result["provenance"].get("provenance_note") else []),
             f"Device: {result['device']}; the roofline is the allocator's {HARDWARE} (989.4 TFLOP/s dense bf16, "
             "the H200's peak too; MFU 0.40). Random weights of the named architectures; bfloat16 autocast over "
             "float32 master weights; equal lengths, prompts of 12 tokens; median of 3 steps per point.", "",
             "| model | variant @ micro-batch tokens | samples | response | tokens/s | MFU | measured s | roofline s "
             "| error |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, variants in result["models"].items():
        for variant, v in variants.items():
            if "error" in v:
                lines.append(f"| {name} | {variant} | failed: {v['error']} | | | | | | |")
                continue
            lines += [f"| {name} | {variant} | {r['samples']} | {r['response_tokens']} | {r['tokens_per_s']:,.0f} | "
                      f"{r['mfu']:.3f} | {r['seconds']:.3f} | {r['roofline_s']:.3f} | {r['roofline_rel_error']:.0%} |"
                      for r in v["points"]]
    lines += ["", "| target | value | goal | met |", "|---|---|---:|---|"]
    for name, ok in result["targets_met"].items():
        lines.append(f"| roofline median error, {name} "
                     f"| {result['roofline_median_rel_error'].get(name, float('nan')):.0%} "
                     f"| <= {TARGETS['roofline_median_rel_error']:.0%} | {'met' if ok else '**missed**'} |")
    for name, x in result.get("micro_batch_speedup", {}).items():
        lines.append(f"\nPlain variant, {name}: {x:.2f}x trained tokens/s with the largest micro-batch budget over the "
                     "4096-token CPU default (median over the grid points).")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, variants in result["models"].items():
        for variant, v in variants.items():
            if "points" in v:
                pts = sorted(v["points"], key=lambda r: r["tokens"])
                ax.plot([r["tokens"] for r in pts], [r["mfu"] for r in pts], "o-", label=f"{name} {variant}")
    ax.axhline(0.40, color="grey", ls="--", label="roofline MFU 0.40")
    ax.set(xscale="log", xlabel="tokens per step", ylabel="achieved MFU (bf16 peak)", title=result["device"])
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = RecordParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--models", default=",".join(ARCHS))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench/gpu_train.py needs a CUDA device (none is visible here)")
    names = [m for m in args.models.split(",") if m]
    if unknown := [m for m in names if m not in ARCHS]:
        sys.exit(f"--models: unknown {unknown}; known: {sorted(ARCHS)}")
    models: dict = {}
    for name in names:
        for variant, mbt in RUNS[name]:
            key = f"{variant}@{mbt}"
            try:
                models.setdefault(name, {})[key] = measure(name, variant, args.quick, micro_batch_tokens=mbt)
            except Exception as err:  # noqa: BLE001 - one failed run must not lose the others' results
                models.setdefault(name, {})[key] = {"error": f"{type(err).__name__}: {err}"}
                print(f"{name} / {key} failed: {err}", flush=True)
            # written after every run: a run cut short by its time limit keeps what it measured
            result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, **headlines(models),
                      "provenance": provenance(Path(__file__), {"grids": QUICK_GRIDS if args.quick else GRIDS,
                                                                "variants": VARIANTS, "runs": RUNS, "repeats": REPEATS,
                                                                "models": names})}
            text = write_results(results_dir(args.out, args.quick), "gpu_train", result, markdown, plot)
    print(text)

if __name__ == "__main__":
    main()
