"""Configuration: one pydantic model per component, composed into ``RunConfig``.

Every field has a docstring-like description and explicit bounds, so a bad file fails fast
naming the field and the allowed range. Files are YAML, or JSON when named ``*.json``;
``key.sub=value`` overrides are applied on top (values parsed as YAML scalars). The resolved
config is written into the run directory as JSON (``write_config``) and every service loads it
from there, so ``load_config`` reads a ``.json`` file with the JSON parser: PyYAML is a YAML 1.1
parser, not a JSON one, and decodes the surrogate-pair escapes JSON writes for a character outside
the BMP (``"\\ud83d\\ude00"``) as two lone surrogates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, Field, NonNegativeInt, ValidationError, field_validator, model_validator

from services.common.agentic_config import AgenticConfig, check_agentic_run
from services.common.config_errors import ConfigError, format_errors
from services.common.eval_config import EvalConfig, check_suites_fit
from services.common.generation_config import (  # noqa: F401  (part of this schema)
    MAX_REAL_INSTANCES,
    DispatchConfig,
    GenerationConfig,
)
from services.common.ranker_config import ranker_dir_problem
from services.common.reward_config import RewardConfig
from services.common.strict import StrictModel
from services.common.task_config import CountdownDistribution, DatasetConfig
from services.common.trainer_config import AlgorithmConfig, TrainerConfig  # noqa: F401  (part of this schema)

M = TypeVar("M", bound=BaseModel)


class TaskConfig(CountdownDistribution):
    """What the policy is trained on (``services.tasks.source``): the built-in count-down family
    (``kind: arith``, its distribution below) or your own data (``kind: dataset``, ``dataset``)."""

    kind: Literal["arith", "dataset"] = Field(
        "arith", description="arith: the built-in count-down task; dataset: your own rows (task.dataset)."
    )
    seed: int = Field(0, ge=0, description="Seed of the training prompt stream (a dataset's shuffling).")
    dataset: DatasetConfig | None = Field(None, description="Your own data (kind 'dataset').")

    @model_validator(mode="after")
    def _kind_has_data(self) -> TaskConfig:
        if (self.kind == "dataset") != (self.dataset is not None):
            raise ValueError("task.kind 'dataset' needs task.dataset (its files and fields)" if self.dataset is None
                             else f"task.dataset applies to task.kind 'dataset', not {self.kind!r}")
        return self


class ModelConfig(StrictModel):
    """The policy. Built from this config (tiny, for CPU) unless ``path`` names a local HF checkpoint."""

    path: str | None = Field(None, description="Local HF checkpoint dir; None builds a tiny model.")
    arch: Literal["qwen2", "llama"] = Field("qwen2", description="Architecture of the built model.")
    hidden_size: int = Field(128, ge=16, le=8192, description="Hidden width of the built model.")
    num_layers: int = Field(4, ge=1, le=128, description="Decoder layers of the built model.")
    num_heads: int = Field(4, ge=1, le=128, description="Attention heads of the built model.")
    num_kv_heads: int = Field(2, ge=1, le=128, description="KV heads (GQA) of the built model.")
    intermediate_size: int = Field(384, ge=16, le=65536, description="MLP width of the built model.")
    max_positions: int = Field(512, ge=64, le=131072, description="Max sequence length.")
    init_seed: int = Field(0, ge=0, description="Seed of the built model's initial weights.")
    chat_template: bool = Field(
        False,
        description="Wrap each task prompt as a user message with the checkpoint's chat template "
        "(add_generation_prompt=True); needs model.path and a tokenizer that has a template.",
    )

    @model_validator(mode="after")
    def _template_needs_path(self) -> ModelConfig:
        if self.chat_template and not self.path:
            raise ValueError("chat_template needs model.path (the built tiny model's tokenizer has no chat template)")
        return self

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelConfig:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must divide by num_heads ({self.num_heads}) "
                f"and num_heads by num_kv_heads ({self.num_kv_heads})"
            )
        return self


class WarmstartConfig(StrictModel):
    """Supervised warm start on task demonstrations; cached by content hash."""

    steps: int = Field(600, ge=0, le=1_000_000,
                       description="SFT optimizer steps (0 = skip); with target_accuracy, the most it may take.")
    batch_size: int = Field(64, ge=1, le=4096, description="Demonstrations per SFT step.")
    lr: float = Field(3e-3, gt=0.0, le=1.0, description="Peak SFT learning rate (cosine decay over steps).")
    micro_batch_tokens: int = Field(2048, ge=16, le=10**7, description="Padded tokens per forward/backward.")
    seed: int = Field(1, ge=0, description="Seed of the demonstration stream.")
    target_accuracy: float | None = Field(
        None, gt=0.0, le=1.0,
        description="Stop the SFT at the first check whose accuracy reaches this (services/policy/warmcheck.py): "
        "the warm start then lands at the same accuracy on every CPU, where a fixed step count lands wherever "
        "the CPU's numerics take it. None: exactly `steps` steps.")
    check_every: int = Field(10, ge=1, le=1_000_000,
                             description="SFT steps between accuracy checks (four times as many while the last "
                             "check stood below half the target).")
    check_prompts: int = Field(256, ge=8, le=100_000,
                               description="Training-distribution prompts (never held-out ones) each check samples "
                               "once, at generation.temperature, scored by the run's reward.")


class WeightsConfig(StrictModel):
    """The weight plane (``services.weights``, docs/weights.md): how new versions reach the SGS instances."""

    transport: Literal["direct", "relay"] = Field(
        "relay",
        description="direct: the trainer streams every version to every SGS instance (UpdateWeights); "
        "relay: it pushes each version once to the master relay, instances pull from their local relay.",
    )
    relays: int = Field(
        1, ge=1, le=64,
        description="Relay processes started on this machine (relay transport; the first is the master).",
    )
    chunk_bytes: int = Field(
        4 << 20, ge=4096, le=1 << 30,
        description="Chunk size of relay pushes, pulls and chain forwarding (bytes).",
    )
    keep_versions: int = Field(
        2, ge=1, le=64,
        description="Versions each relay keeps in memory (K); older ones are evicted.",
    )
    streams: int = Field(2, ge=1, le=32, description="Parallel gRPC streams of one push or pull over the network path.")
    shm: bool = Field(
        True,
        description="Same-host fast path: versions live in /dev/shm; same-host pushes and pulls hand over the file.",
    )
    data_path: Literal["tcp", "grpc"] = Field(
        "tcp",
        description="Network path of relay pushes and pulls: tcp (gRPC opens a transfer, "
        "the bytes flow over the relay's "
        "raw-TCP data channel; falls back to grpc when it cannot be reached) or grpc (chunk streams over gRPC).",
    )
    digest: Literal["xxh3_128", "sha256"] = Field(
        "xxh3_128",
        description="Chunk digest (xxh3_128: fast corruption check; sha256: cryptographic).",
    )
    heartbeat_s: float = Field(0.2, gt=0.0, le=60.0, description="Chain controller heartbeat period (s).")
    heartbeat_timeout_s: float = Field(
        1.0, gt=0.0, le=60.0,
        description="A relay not answering a heartbeat within this is cut out of the chain (s).",
    )
    pull_wait_s: float = Field(
        300.0, gt=0.0, le=3600.0,
        description="How long an instance's pull waits for a version to reach its relay (s).",
    )
    max_message_mb: int = Field(
        256, ge=1, le=2047,
        description="gRPC max message size of relay traffic (MiB); must exceed chunk_bytes.",
    )
    sgs_auto_pull_s: float = Field(
        0.0, ge=0.0, le=3600.0,
        description="Between requests: an idle SGS instance checks its relay this often and takes a newer version "
        "(0 = only when the coordinator tells it; the trainer does so in every mode).",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="The dtype weight versions travel and are held in: the trainer's publisher casts each version "
        "to it, and a vLLM SGS takes versions in it (it serves in generation.dtype). Set it to the serving dtype "
        "(bfloat16 on GPUs): nothing then crosses the link that the SGS would round away, and deltas pay. The "
        "learner then takes its gradients at that rounding of its float32 masters (trainer.device.ServedWeights).",
    )
    delta: bool = Field(
        False,
        description="Send each version as the delta from the one before it (only the changed elements; relay "
        "transport): relays forward deltas and commit the full version; a relay or instance without the base takes "
        "the version whole (counted). Pays in bfloat16/float16 (weights.dtype), not in float32.",
    )

    @model_validator(mode="after")
    def _chunk_fits(self) -> WeightsConfig:
        if self.chunk_bytes + 65536 > self.max_message_mb * 1024 * 1024:
            raise ValueError(f"chunk_bytes ({self.chunk_bytes}) must fit in max_message_mb ({self.max_message_mb} MiB) "
                             "with 64 KiB to spare")
        return self


class ScaleoutConfig(StrictModel):
    """Dynamic DP scale-out of the SGS (StreamRL §4.2; ``allocator/scaleout.py``, docs/scaleout.md)."""

    enabled: bool = Field(
        False,
        description="Run the scale-out controller: add/remove SGS instances as delta = T_gen - T_train moves.",
    )
    min_instances: int = Field(1, ge=1, le=1024, description="Never scale in below this many SGS instances.")
    max_instances: int = Field(
        4, ge=1, le=1024,
        description="Never scale out beyond this many SGS instances (more than 64 only on the emulated engine).",
    )
    window: int = Field(
        2, ge=1, le=1000,
        description="Iterations averaged (at the current instance count) before a decision.",
    )
    cooldown: int = Field(
        2, ge=0, le=1000,
        description="Iterations ignored after a change (one_step mode: the next iteration was dispatched before it).",
    )
    scale_in: bool = Field(True, description="Also remove an instance when generation is far ahead of training.")
    scale_in_margin: float = Field(
        0.25, ge=0.0, le=100.0,
        description="Scale in only when T_train - T_gen >= (1 + margin) x the time one fewer instance adds.",
    )
    cpus: list[NonNegativeInt] = Field(
        default_factory=list,
        description="CPU ids an added SGS instance pins itself to (on one host: the trainer's core idles while "
        "generation is behind); empty = generation.cpus.",
    )
    drain_timeout_s: float = Field(
        600.0, gt=0.0, le=86400.0,
        description="How long a removed instance may take to finish its in-flight work (s).",
    )
    max_step: int = Field(
        1, ge=1, le=1024,
        description="Most instances one decision adds (StreamRL: 1); more applies the rule to its own prediction "
        "(allocator.scaleout.units_to_add: a fleet of dozens, where one instance is a small step).",
    )
    emulated_start_s: float = Field(
        30.0, ge=0.0, le=3600.0,
        description="Emulated engine: modelled seconds an added instance takes to come up (a cold inference-server "
        "start: weights loaded, graphs captured), x generation.emulation.time_scale. The launcher keeps the pool "
        "(max_instances - instances) as standby instances in its emulator processes (flows.scaleout.StandbyUnits).",
    )

    @model_validator(mode="after")
    def _bounds(self) -> ScaleoutConfig:
        if self.min_instances > self.max_instances:
            raise ValueError(f"min_instances ({self.min_instances}) must be <= max_instances ({self.max_instances})")
        return self


class ForcedLengthRamp(StrictModel):
    """Forced-length replay driven by the trainer: iteration k's samples are exactly
    ``max(1, start + k * per_iteration)`` tokens long (StreamRL Figure 11: output length grows
    linearly; a negative slope shrinks it, which makes generation run ahead: scale-in).
    In bounded mode k is the trainer's weight version when the group is launched."""

    start: int = Field(
        0, ge=0, le=65536,
        description="Forced length of iteration 0 (0 = off: the policy decides lengths).",
    )
    per_iteration: float = Field(
        0.0, ge=-65536.0, le=65536.0, description="Tokens added per iteration (negative: removed, down to 1 token)."
    )

    def length(self, iteration: int) -> int:
        return max(1, round(self.start + iteration * self.per_iteration)) if self.start else 0


class ForcedLengthReplay(StrictModel):
    """Forced-length replay of recorded lengths (``services.rollout.length_replay``): each GRPO
    group is exactly as long as a length drawn for its prompt (a hash of seed and prompt id) from a
    file of recorded output lengths, so the run's length distribution, long tail included, is the
    recorded one (bench/coordination.py ``--workload replay``, bench/dispatch_train.py)."""

    file: str | None = Field(
        None,
        description="JSON list of output lengths in tokens, each in [1, generation.max_new_tokens], or a multi-visit "
        "trace (*.jsonl.gz of {prompt, visit, lengths} groups, bench/run_signals_trace.py: each draw of a prompt "
        "replays its next recorded visit, one length per sample) (None = off).",
    )
    seed: int = Field(0, ge=0, description="Seed of the per-prompt draw (same seed and prompt id: same length).")
    estimates: Literal["none", "recorded", "oracle"] = Field(
        "none",
        description="The groups' length estimates for dispatch: none (the ranker of generation.ranker_dir, if any), "
        'recorded (the estimate beside each length: a file of {"length", "estimate"} objects, or a visit trace '
        'whose groups carry an "estimate" of their prompt), oracle (the true length).',
    )


class RunConfig(StrictModel):
    """A whole RL run."""

    run_id: str | None = Field(None, description="Run directory name (default: timestamp).")
    runs_dir: str = Field("runs", description="Where run directories are created.")
    cache_dir: str = Field(".cache", description="Warm-start checkpoints and Prefect home.")
    task: TaskConfig = Field(default_factory=TaskConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    warmstart: WarmstartConfig = Field(default_factory=WarmstartConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)
    scaleout: ScaleoutConfig = Field(default_factory=ScaleoutConfig)
    forced_length_ramp: ForcedLengthRamp = Field(default_factory=ForcedLengthRamp)
    forced_length_replay: ForcedLengthReplay = Field(default_factory=ForcedLengthReplay)
    agentic: AgenticConfig = Field(default_factory=AgenticConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    tracking: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=list, description="Experiment trackers the run logs to, any subset (flows/tracking.py; "
        "docs/tracking.md): metrics.jsonl's rows, this config, summary.json and the report's plots.")

    @property
    def uses_router(self) -> bool:
        """Whether the run puts the SGS router in front of its instances (``generation.dispatch.router``):
        auto = when instances join and leave (scale-out); otherwise the orchestrator dials every
        instance itself, in every mode, so each instance takes a new version on its own."""
        mode = self.generation.dispatch.router
        return mode == "on" or (mode == "auto" and self.scaleout.enabled)

    @model_validator(mode="after")
    def _router_mode(self) -> RunConfig:
        tc = self.trainer
        staleflow = tc.coordination.policy == "staleflow"
        moving = [name for name, on in (("trainer.partial_rollout", tc.partial_rollout),
                                        ("trainer.repack.enabled", tc.repack.enabled),
                                        ("trainer.coordination 'staleflow'", staleflow)) if on]
        if staleflow and (tc.repack.enabled or self.generation.affinity or self.agentic.enabled):
            other = ("trainer.repack (Laminar's migration; StaleFlow migrates by its own rule)" if tc.repack.enabled
                     else "generation.affinity" if self.generation.affinity else "agentic (multi-turn) rollouts")
            raise ValueError(f"trainer.coordination 'staleflow' routes single-turn trajectories over every instance; "
                             f"it does not combine with {other}: turn one of them off")
        if moving and self.uses_router:
            raise ValueError(
                f"{' and '.join(moving)} interrupt trajectories on the instance that runs them, which the SGS router "
                "does not do: let the trainer reach the instances (generation.dispatch.router 'off', no scale-out)"
            )
        return self

    @model_validator(mode="after")
    def _warmstart_target(self) -> RunConfig:
        ws = self.warmstart
        if ws.target_accuracy is not None and (ws.steps == 0 or self.agentic.enabled):
            why = "warmstart.steps is 0 (no SFT)" if ws.steps == 0 else "agentic warm starts train multi-turn episodes"
            raise ValueError(f"warmstart.target_accuracy ({ws.target_accuracy}) cannot apply: {why}; "
                             "leave it unset (null)")
        return self

    @field_validator("tracking")
    @classmethod
    def _trackers_once(cls, names: list[str]) -> list[str]:
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"tracking names {', '.join(twice)} more than once")
        return names

    @model_validator(mode="after")
    def _calls_fit(self) -> RunConfig:
        tc = self.trainer
        per_instance = tc.max_inflight_groups * (tc.group_size + tc.redundancy_samples)
        if per_instance > self.generation.max_inflight:
            raise ValueError(
                f"trainer.max_inflight_groups x (group_size + redundancy_samples) = {per_instance} samples in flight "
                f"per instance exceeds generation.max_inflight ({self.generation.max_inflight}): every open call "
                f"holds one of the instance's max_inflight + 16 server threads"
            )
        return self

    @model_validator(mode="after")
    def _scaleout_fits(self) -> RunConfig:
        so = self.scaleout
        if so.enabled and so.max_instances > MAX_REAL_INSTANCES and self.generation.engine != "emulated":
            raise ValueError(f"scaleout.max_instances {so.max_instances}: more than {MAX_REAL_INSTANCES} instances run "
                             "on the emulated engine only (an emulated fleet)")
        if so.enabled and not so.min_instances <= self.generation.instances <= so.max_instances:
            raise ValueError(
                f"generation.instances ({self.generation.instances}) must lie in "
                f"[scaleout.min_instances, scaleout.max_instances] = [{so.min_instances}, {so.max_instances}]"
            )
        ramp = self.forced_length_ramp
        if ramp.per_iteration and not ramp.start:
            raise ValueError("forced_length_ramp.per_iteration needs forced_length_ramp.start > 0 "
                             "(start 0 turns the ramp off)")
        if ramp.start:
            if not self.generation.forced_lengths:
                raise ValueError("forced_length_ramp needs generation.forced_lengths: true")
            if self.trainer.partial_rollout:
                raise ValueError("forced_length_ramp does not apply with trainer.partial_rollout (a resumed "
                                 "trajectory's forced length would have to count the segments before it)")
            k = self.trainer.iterations - 1 if ramp.per_iteration > 0 else 0  # where the ramp is longest
            if ramp.length(k) > self.generation.max_new_tokens:
                raise ValueError(
                    f"forced_length_ramp reaches {ramp.length(k)} tokens at iteration {k}, "
                    "above generation.max_new_tokens "
                    f"({self.generation.max_new_tokens})"
                )
        return self

    @model_validator(mode="after")
    def _replay_fits(self) -> RunConfig:
        if self.forced_length_replay.file is None:
            if self.forced_length_replay.estimates != "none":
                raise ValueError("forced_length_replay.estimates needs forced_length_replay.file "
                                 "(the lengths it estimates)")
            return self
        if not self.generation.forced_lengths:
            raise ValueError("forced_length_replay needs generation.forced_lengths: true")
        if self.trainer.partial_rollout:
            raise ValueError("forced_length_replay does not apply with trainer.partial_rollout")
        if self.forced_length_ramp.start:
            raise ValueError("forced_length_replay and forced_length_ramp are exclusive (both set the forced length)")
        return self


    @model_validator(mode="after")
    def _weights_fit(self) -> RunConfig:
        w = self.weights
        if w.delta and w.transport != "relay":
            raise ValueError("weights.delta needs weights.transport: relay (deltas travel through the relays)")
        if w.dtype != "float32" and self.generation.engine != "vllm":
            raise ValueError(f"weights.dtype {w.dtype} needs generation.engine: vllm (the {self.generation.engine} "
                             "engine takes float32 versions)")
        if w.dtype != "float32" and self.trainer.lora is not None:
            raise ValueError(f"weights.dtype {w.dtype} does not apply with trainer.lora: adapters travel in float32")
        return self

    @model_validator(mode="after")
    def _agentic_fits(self) -> RunConfig:
        check_agentic_run(self)
        return self

    @model_validator(mode="after")
    def _suites_fit(self) -> RunConfig:
        check_suites_fit(self)
        return self

    @model_validator(mode="after")
    def _ranker_is_read(self) -> RunConfig:
        problem = ranker_dir_problem(self)
        if problem:
            raise ValueError(problem)
        return self


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b=value`` overrides (value parsed as a YAML scalar) to a nested dict."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        try:
            node[parts[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: the value is not a YAML scalar or flow value: {err}") from None
    return data


def _parse(path: Path) -> Any:
    """The document in ``path``: JSON for ``*.json`` (what ``write_config`` writes), YAML otherwise."""
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)


def load_model(cls: type[M], path: str | Path | None = None, overrides: list[str] | None = None) -> M:
    """Load a YAML (or JSON) file into the pydantic model ``cls``, apply overrides, validate;
    ``ConfigError`` names the file, the field and the rule."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            loaded = _parse(Path(path))
        except yaml.YAMLError as err:
            raise ConfigError(f"invalid config ({source}): not YAML: {err}") from None
        except json.JSONDecodeError as err:
            raise ConfigError(f"invalid config ({source}): not JSON: {err}") from None
        except UnicodeDecodeError as err:
            raise ConfigError(f"invalid config ({source}): not UTF-8 text ({err.reason} at byte {err.start})") from None
        except (IsADirectoryError, PermissionError) as err:
            raise ConfigError(f"invalid config ({source}): cannot read it: {err.strerror}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"invalid config ({source}): top level must be a mapping")
        data = loaded or {}
    data = apply_overrides(data, overrides or [])
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_errors(err, source)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Load a run config file (YAML or JSON), apply overrides, validate."""
    return load_model(RunConfig, path, overrides)


def write_config(cfg: RunConfig, path: Path) -> None:
    path.write_text(json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")
