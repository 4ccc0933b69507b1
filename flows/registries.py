"""Checks a run passes before anything starts.

The config schema (``services.common.config``) is pure data: it imports no runtime code and checks
only structure and values (types, ranges, fields that must agree). Which keys the registries hold
(engines, dispatch policies, pool hardware, environment kinds, reward kinds) is checked here, in one
place, when a run is prepared (``braid run``, ``braid config``, ``braid reward train``, the flow's
``prepare-run``, ``prefect deploy``'s ``run_config`` step), so a typo fails at once, naming the field
and what is registered. The launcher checks the run directory's config again before it starts any
process (benchmarks write that file themselves); the processes it starts read a checked config.
``check_task`` reads a dataset task's files here too (``check_suites`` the evaluation suites'), so a
bad file, row or field is refused before any process starts, naming the file, the line and the field,
and imports the reward functions the workers will call.
"""

from __future__ import annotations

from pathlib import Path

from services.common.config import ConfigError, RunConfig
from services.common.pool_config import CPU_HARDWARE


def check_registries(cfg: RunConfig) -> RunConfig:
    """Return ``cfg`` if every registry key it names exists; raise ``ConfigError`` naming the field otherwise."""
    from services.agentic.registry import ENVIRONMENTS
    from services.generation.engine import ENGINES
    from services.generation.scheduling.dispatch import policy_names
    from services.reward.registry import REWARD_KINDS

    if cfg.generation.engine not in ENGINES:
        raise ConfigError(f"generation.engine {cfg.generation.engine!r} is not one of {sorted(ENGINES)}")
    if cfg.generation.dispatch.policy not in policy_names():
        raise ConfigError(
            f"generation.dispatch.policy {cfg.generation.dispatch.policy!r} is not one of {policy_names()}"
        )
    for i, pool in enumerate(cfg.generation.pools):
        if pool.hardware not in known_hardware():
            raise ConfigError(
                f"generation.pools.{i}.hardware: unknown hardware {pool.hardware!r}; known: {known_hardware()}"
            )
    from ranker.base import kinds as ranker_kinds

    if cfg.generation.retrain.every and cfg.generation.retrain.kind not in ranker_kinds():
        raise ConfigError(f"generation.retrain.kind {cfg.generation.retrain.kind!r} is not one of {ranker_kinds()}")
    for field, registry, key in (("agentic.env", ENVIRONMENTS, cfg.agentic.env),
                                 ("reward.kind", REWARD_KINDS, cfg.reward.kind)):
        if key not in registry:
            raise ConfigError(f"{field}: unknown {registry.what} {key!r}; registered: {registry.names()}")
    return cfg


def known_hardware() -> list[str]:
    """What a pool may run on: the GPU kinds with spec sheets, and this machine's CPU engine."""
    from services.generation.scheduling.hardware import HARDWARE

    return [*sorted(HARDWARE), CPU_HARDWARE]


def check_task(cfg: RunConfig) -> RunConfig:
    """``cfg`` with a dataset task's files and the reward's import path made absolute (every service
    finds them whatever its working directory), after reading the files: ``ConfigError`` with the
    loader's message (file, line, field) for a bad one, when the run needs more prompts than
    ``task.dataset.epochs`` passes give, when the dataset's name is a built-in task's, or when a
    reward function does not load."""
    if cfg.task.kind != "dataset":
        return cfg
    from services.reward.protocol import tasks
    from services.tasks.dataset import DatasetError, load_dataset, prompts_needed_check

    ds = cfg.task.dataset
    assert ds is not None
    if ds.name in tasks():
        raise ConfigError(f"task.dataset.name {ds.name!r} is a built-in task's name ({tasks()}): choose another")
    absolute = ds.model_copy(update={"train": str(Path(ds.train).resolve()),
                                     "heldout": str(Path(ds.heldout).resolve()) if ds.heldout else None})
    try:
        train, _ = load_dataset(absolute, cfg.eval.prompts, cfg.eval.seed)
        prompts_needed_check(len(train), ds.epochs, cfg.trainer.iterations * cfg.trainer.prompts_per_iteration, ds.name)
    except DatasetError as err:
        raise ConfigError(f"task.dataset: {err}") from None
    data = cfg.model_dump(mode="json")
    data["task"]["dataset"] = absolute.model_dump(mode="json")
    data["reward"]["python_path"] = [str(Path(p).resolve()) for p in cfg.reward.python_path]
    check_reward_functions(cfg)
    return RunConfig.model_validate(data)


def check_reward_functions(cfg: RunConfig) -> None:
    """Import every ``module:function`` term as the reward workers will, so a spec that does not load
    (no module, an import error, no function, a signature that cannot take the arguments) is refused now."""
    from services.reward.dataset import RewardFunctionError, load_function

    for i, term in enumerate(cfg.reward.terms):
        if ":" in term.fn:
            try:
                load_function(term.fn, cfg.reward.python_path)
            except RewardFunctionError as err:
                raise ConfigError(f"reward.terms.{i}: {err}") from None


def check_suites(cfg: RunConfig) -> RunConfig:
    """``cfg`` with every evaluation suite's file and the reward's import path made absolute, after
    reading the files as the trainer will (``services.tasks.dataset.load_suite``: ``ConfigError`` naming
    the suite and the loader's file, line and field) and importing the suites' reward functions; a
    suite named like a built-in task is refused."""
    if not cfg.eval.suites:
        return cfg
    from services.reward.dataset import RewardFunctionError, load_function
    from services.reward.protocol import tasks
    from services.tasks.dataset import DatasetError, load_suite

    data = cfg.model_dump(mode="json")
    data["reward"]["python_path"] = python_path = [str(Path(p).resolve()) for p in cfg.reward.python_path]
    for i, suite in enumerate(cfg.eval.suites):
        where = f"eval.suites.{i} ({suite.name})"
        if suite.name in tasks():
            raise ConfigError(f"{where}: the name is a built-in task's ({tasks()}): choose another")
        absolute = str(Path(suite.data).resolve())
        try:
            load_suite(absolute, suite, suite.prompts, cfg.eval.seed)
        except DatasetError as err:
            raise ConfigError(f"{where}: {err}") from None
        for j, term in enumerate(suite.terms):
            if ":" in term.fn:
                try:
                    load_function(term.fn, python_path)
                except RewardFunctionError as err:
                    raise ConfigError(f"{where}.terms.{j}: {err}") from None
        data["eval"]["suites"][i]["data"] = absolute
    return RunConfig.model_validate(data)


def check_run(cfg: RunConfig) -> RunConfig:
    """Every check of this module: the emulated parts together (``check_emulated``), registries,
    then the task's data and the evaluation suites'."""
    check_emulated(cfg)
    return check_suites(check_task(check_registries(cfg)))


EMULATED_PARTS = ("generation.engine", "trainer.backend", "reward.kind")


def check_emulated(cfg: RunConfig) -> None:
    """An emulated run emulates all three of the engine, the learner and the reward, or none: the
    emulated engine's tokens are SYNTHETIC, so a real learner would train on them and a real reward
    would judge them; an emulated learner over a real engine would publish weights that never
    changed. ``ConfigError`` names the parts that are and are not emulated."""
    values = (cfg.generation.engine, cfg.trainer.backend, cfg.reward.kind)
    emulated = [part for part, value in zip(EMULATED_PARTS, values, strict=True) if value == "emulated"]
    if emulated and len(emulated) < len(EMULATED_PARTS):
        real = [f"{part} {value!r}" for part, value in zip(EMULATED_PARTS, values, strict=True) if value != "emulated"]
        raise ConfigError(f"{', '.join(emulated)} emulated but {', '.join(real)}: an EMULATED run sets all three of "
                          f"{', '.join(EMULATED_PARTS)} to 'emulated' (emulation measures time, never learning; "
                          "see deploy/configs/emulated.yaml)")


def is_emulated(cfg: RunConfig) -> bool:
    """Whether ``cfg`` is an EMULATED run (``check_emulated`` holds: one part says it for all)."""
    return cfg.generation.engine == "emulated"
