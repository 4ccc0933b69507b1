"""The external peer of ``bench/e2e.py``: TRL's ``GRPOTrainer`` on Braid's task, model and data order.

Runs inside the benchmark-only TRL virtualenv (``bench/e2e.py`` creates it; TRL is never a
project dependency). Everything that defines the learning problem comes from the same resolved
run config a Braid run uses:

- model: the same warm-started checkpoint dir (HF ``save_pretrained`` + the char-level tokenizer);
- data order: ``ProblemSampler(task.seed, exclude=<eval.prompts held-out prompts>)`` batches of
  ``prompts_per_iteration``, one per optimizer step, in order (``shuffle_dataset=False``), exactly
  the stream ``RLTrainer.request`` draws;
- prompt tokens: ``<bos>`` + one token per character, as ``Policy.encode_prompt`` (checked at start);
- reward: ``services.tasks.arith.reward`` on the decoded completion;
- GRPO: ``num_generations = group_size``, ``prompts_per_iteration x group_size`` completions per
  optimizer step (one generation per step), per-sample token mean (``loss_type="grpo"``, Braid's
  ``sample_mean``), group-std advantages, ratio clip ``clip_eps``, ``beta = kl_coef``, constant
  learning rate ``lr``, ``max_grad_norm``, ``max_completion_length = generation.max_new_tokens``,
  temperature from the config, no top-k/top-p; CPU (``use_cpu=True``), HF ``generate`` (``use_vllm=False``).

Outputs in ``--run-dir`` mirror a Braid run so the benchmark treats both alike:
``metrics.jsonl`` (one row per optimizer step: ``samples``, ``iteration_time_s`` = time since the
previous step ended, ``t_end``, TRL's logged reward and timers), ``checkpoints/vNNNNN`` +
``checkpoints/index.jsonl`` every ``trainer.checkpoint_every`` steps (saved inside the timed loop,
as Braid's trainer does), and ``summary.json`` (``rl_started_at`` = ``on_train_begin``,
``rl_seconds``, versions).

    <trl-venv>/bin/python bench/trl_peer.py --config RUN/config.json --model CKPT --run-dir RUN
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def peer_batching(samples_per_step: int, group_size: int, micro_batch: int) -> tuple[int, int]:
    """(per_device_train_batch_size, gradient_accumulation_steps) giving one optimizer step, and one
    generation, per ``samples_per_step`` completions. TRL needs the product to divide by the group size."""
    micro = min(micro_batch, samples_per_step)
    if samples_per_step % micro:
        raise ValueError(f"micro batch {micro} must divide the samples per step ({samples_per_step})")
    if samples_per_step % group_size:
        raise ValueError(f"samples per step ({samples_per_step}) must divide by the group size ({group_size})")
    return micro, samples_per_step // micro


def grpo_settings(cfg, generation: str, output_dir: Path, micro: int, accum: int) -> dict:
    """``GRPOConfig``'s arguments for the run config ``cfg`` (the module docstring's mapping): one
    optimizer step and one generation per iteration, Braid's loss and sampling, on the CPU."""
    tc = cfg.trainer
    return dict(
        output_dir=str(output_dir),
        use_cpu=True,
        use_vllm=False,
        report_to="none",
        seed=tc.seed,
        max_steps=tc.iterations,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=accum,
        num_generations=tc.group_size,
        max_completion_length=cfg.generation.max_new_tokens,
        temperature=cfg.generation.temperature,
        top_k=0,
        top_p=1.0,
        learning_rate=tc.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=tc.weight_decay,
        max_grad_norm=tc.max_grad_norm,
        beta=tc.kl_coef,
        epsilon=tc.clip_eps,
        num_iterations=1,
        loss_type="grpo",
        scale_rewards="group",
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        use_transformers_continuous_batching=generation == "cb",
        transformers_continuous_batching_config=(
            {
                "num_blocks": cfg.generation.num_blocks, "page_size": cfg.generation.page_size,
                "max_batch_tokens": cfg.generation.max_batch_tokens, "allow_block_sharing": False,
            } if generation == "cb" else None
        ),
    )


def build_parser() -> argparse.ArgumentParser:
    """The command line: the run's config, warm start and directory; threads, micro batch, backend."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="resolved run config (config.json)")
    parser.add_argument("--model", required=True, help="warm-start checkpoint dir")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch intra-op threads")
    parser.add_argument("--micro-batch", type=int, default=64, help="completions per forward/backward")
    parser.add_argument(
        "--generation", choices=("generate", "cb"), default="generate",
        help="TRL's generation backend: plain batched generate (TRL's default) or transformers continuous "
        "batching sized like Braid's SGS (generation.num_blocks/page_size/max_batch_tokens)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.extras import profiling

    from services.common.config import load_config
    from services.policy.model import Policy, load_policy, save_policy
    from services.tasks.arith import Problem, ProblemSampler, eval_problems, reward

    cfg = load_config(ns.config)
    tc = cfg.trainer
    run_dir = Path(ns.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(ns.threads)

    dist = cfg.task.distribution()
    held_out = frozenset(p.prompt for p in eval_problems(cfg.eval.seed, cfg.eval.prompts, **dist))
    sampler = ProblemSampler(cfg.task.seed, exclude=held_out, **dist)  # type: ignore[arg-type]
    problems = [p for _ in range(tc.iterations) for p in sampler.batch(tc.prompts_per_iteration)]

    policy = load_policy(ns.model)
    tok = policy.tokenizer
    bos = tok.bos_token or ""
    if tok(bos + problems[0].prompt)["input_ids"] != policy.encode_prompt(problems[0].prompt):
        raise RuntimeError("TRL's prompt tokenization differs from Policy.encode_prompt")
    dataset = Dataset.from_list(
        [{"prompt": bos + p.prompt, "prompt_id": p.prompt_id, "n": p.n, "d": p.d, "m": p.m} for p in problems]
    )

    def arith_reward(prompts, completions, prompt_id, n, d, m, **_):
        return [reward(Problem(pid, a, b, c), text)
                for pid, a, b, c, text in zip(prompt_id, n, d, m, completions, strict=True)]

    samples_per_step = tc.prompts_per_iteration * tc.group_size
    micro, accum = peer_batching(samples_per_step, tc.group_size, ns.micro_batch)
    args = GRPOConfig(**grpo_settings(cfg, ns.generation, run_dir / "trl-output", micro, accum))

    timers: dict[str, float] = defaultdict(float)
    original_log = profiling.ProfilingContext._log_metrics

    def record_timer(self, duration: float) -> None:  # TRL logs its timers only to wandb/mlflow/trackio
        timers[self.name] += duration
        original_log(self, duration)

    profiling.ProfilingContext._log_metrics = record_timer

    ckpt_dir = run_dir / "checkpoints"
    metrics_path = run_dir / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)

    class Clock(TrainerCallback):
        """Step end times, TRL's logs and timers per step, and checkpoints at Braid's cadence."""

        def __init__(self) -> None:
            self.t0 = 0.0
            self.last = 0.0
            self.logs: dict = {}

        def on_train_begin(self, args, state, control, **kwargs):
            self.t0 = self.last = time.time()

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs = dict(logs or {})

        def on_step_end(self, args, state, control, model=None, **kwargs):
            step = state.global_step
            if tc.checkpoint_every and step % tc.checkpoint_every == 0:
                out = ckpt_dir / f"v{step:05d}"
                save_policy(Policy(model=model, tokenizer=tok), out)
                with (ckpt_dir / "index.jsonl").open("a") as f:
                    f.write(json.dumps({"version": step, "path": str(out), "time": time.time()}) + "\n")
            now = time.time()
            row = {
                "iteration": step - 1,
                "samples": samples_per_step,
                "iteration_time_s": now - self.last,
                "t_end": now,
                "timers_s": dict(timers),
            }
            timers.clear()
            self.last = now
            with metrics_path.open("a") as f:
                f.write(json.dumps(row) + "\n")

    clock = Clock()
    trainer = GRPOTrainer(
        model=policy.model, reward_funcs=arith_reward, args=args, train_dataset=dataset,
        processing_class=tok, callbacks=[clock],
    )
    trainer.train()
    t_end = time.time()
    rewards = [h.get("reward") for h in trainer.state.log_history if "reward" in h]
    summary = {
        "mode": "trl",
        "iterations": tc.iterations,
        "samples_per_step": samples_per_step,
        "rl_started_at": clock.t0,
        "rl_seconds": t_end - clock.t0,
        "reward_per_step": rewards,
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "threads": ns.threads,
        "generation": ns.generation,
        "grpo_config": {
            k: getattr(args, k) for k in (
                "per_device_train_batch_size", "gradient_accumulation_steps", "steps_per_generation",
                "generation_batch_size", "num_generations", "max_completion_length", "temperature", "learning_rate",
                "lr_scheduler_type", "beta", "epsilon", "loss_type", "scale_rewards", "max_grad_norm", "seed",
            )
        },
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
