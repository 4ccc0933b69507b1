import json
import re
from pathlib import Path

import pytest

from services.common.config import ConfigError, RunConfig, load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((ROOT / "deploy" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    from flows.registries import check_registries

    assert isinstance(check_registries(load_config(path)), RunConfig)


def test_overrides_apply_and_parse_scalars():
    cfg = load_config(None, ["trainer.mode=sync", "trainer.lr=0.01", "model.path=/x"])
    assert cfg.trainer.mode == "sync" and cfg.trainer.lr == 0.01 and cfg.model.path == "/x"


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("trainer.group_size=1", "trainer.group_size: Input should be greater than or equal to 2"),
        ("trainer.mode=fast", "trainer.mode: Input should be 'sequential', 'sync', 'one_step' or 'bounded'"),
        ("generation.temperature=0", "generation.temperature: Input should be greater than 0"),
        ("trainer.typo=3", "trainer.typo: Extra inputs are not permitted"),
        ("trainer.eta=-1", "trainer.eta: Input should be greater than or equal to 0"),
        ("generation.dtype=int8", "generation.dtype: Input should be 'auto', 'float32', 'bfloat16' or 'float16'"),
        ("generation.step_delay_ms=[1, 2]", "step_delay_ms has 2 entries for 1 instances"),
        ("task.min_steps=9", None),
    ],
)
def test_invalid_values_name_field_and_range(override, fragment):
    overrides = [override] + (["task.max_steps=3"] if fragment is None else [])
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert (fragment or "min_steps (9) must be <= max_steps (3)") in str(err.value)


@pytest.mark.parametrize("mode", ["sync", "one_step", "bounded"])
def test_groups_in_flight_must_fit_the_instance_server_threads(mode):
    # every open Generate call holds an SGS server thread (max_inflight + 16 of them)
    with pytest.raises(ConfigError, match=r"= 128 samples in flight per instance "
                                          r"exceeds generation.max_inflight \(64\)"):
        load_config(None, [f"trainer.mode={mode}", "trainer.max_inflight_groups=16", "generation.max_inflight=64"])
    assert load_config(None, [f"trainer.mode={mode}", "generation.max_inflight=64"]).trainer.max_inflight_groups == 0


def test_every_mode_fills_the_engines_admission_unless_capped():
    """One capacity rule: a looser staleness bound never means less work in flight."""
    from services.rollout.modes import instance_capacity

    assert instance_capacity(8, 0, 256) == 256 and instance_capacity(8, 0, 260) == 256  # whole groups
    assert instance_capacity(8, 16, 256) == 128  # trainer.max_inflight_groups caps it
    assert instance_capacity(8, 0, 4) == 8  # one group at least
    assert instance_capacity(9, 0, 256, behind=3) == 28 * 9 * 3  # a router in front of 3 engines


def test_bad_file_and_bad_override_syntax(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"key\.sub=value"):
        load_config(None, ["novalue"])


def test_cli_refuses_invalid_config_before_starting_anything(capsys, tmp_path):
    from flows.cli import main

    assert main(["run", "--config", str(ROOT / "deploy/configs/smoke.yaml"), "--set", "trainer.lr=5",
                 "--set", f"runs_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "trainer.lr: Input should be less than or equal to 1" in err
    assert not any(tmp_path.iterdir())  # no run directory was created


@pytest.mark.parametrize("override, fragment", [
    ("generation.engine=sglang", "generation.engine 'sglang' is not one of ['emulated', 'hf', 'vllm']"),
    ("generation.dispatch.policy=fastest", "generation.dispatch.policy 'fastest' is not one of"),
    ("generation.pools=[{name: a, hardware: A100, instances: [0]}]",
     "generation.pools.0.hardware: unknown hardware 'A100'; known: ['H100', 'H20', 'H800', 'cpu-local']"),
    ("agentic.env=chess", "agentic.env: unknown environment kind 'chess'; registered: ['calculator', 'walk']"),
    ("reward.kind=oracle", "reward.kind: unknown reward kind 'oracle'; registered: ['emulated', 'model', 'rule']"),
])
def test_unknown_registry_keys_fail_when_a_run_is_prepared(override, fragment, capsys):
    from flows.cli import main
    from flows.registries import check_registries

    cfg = load_config(None, [override])  # the schema itself knows no registry
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        check_registries(cfg)
    assert main(["config", "--set", override]) == 2
    assert fragment in capsys.readouterr().err



# The two inputs bench/fuzz.py found (seed 0, 2000 examples per file kind): a run config file and a
# --set override whose strings hold characters outside the BMP (U+EE378, U+12FA1; U+87AC9). The
# resolved JSON escapes them as surrogate pairs, which PyYAML decoded as lone surrogates.
FUZZ_RUN_CONFIG = (
    'runs_dir: runs\ncache_dir: "~\\a\\U000EE378\\U00012FA1\\rÁ\\n\\x1F°¦"\nmodel:\n  hidden_size: 64\n'
    "  num_layers: 1\n  num_heads: 2\n  num_kv_heads: 1\n  intermediate_size: 64\nwarmstart:\n  steps: 20\n"
    "  batch_size: 16\ngeneration:\n  engine: vllm\n  max_new_tokens: 64\n  num_blocks: 128\ntrainer:\n"
    "  mode: one_step\n  iterations: 2\n  prompts_per_iteration: 4\n  group_size: 4\n  micro_batch_groups: 2\n"
    "eval:\n  prompts: 32\n"
)


@pytest.mark.parametrize("text, overrides, field, value", [
    (FUZZ_RUN_CONFIG, [], "cache_dir", "~\a\U000ee378\U00012fa1\rÁ\n\x1f°¦"),
    (None, ["model.path=1Dßj\U00087ac9"], "model.path", "1Dßj\U00087ac9"),
], ids=["run-config-file", "set-override"])
def test_resolved_config_loads_back_the_same(tmp_path, text, overrides, field, value):
    from services.common.config import write_config

    source = ROOT / "deploy/configs/smoke.yaml"
    if text is not None:
        source = tmp_path / "input.yaml"
        source.write_text(text, encoding="utf-8")
    cfg = load_config(source, overrides)
    write_config(cfg, tmp_path / "config.json")
    back = load_config(tmp_path / "config.json")
    section, _, name = field.rpartition(".")
    assert getattr(getattr(back, section) if section else back, name) == value
    assert back.model_dump(mode="json") == cfg.model_dump(mode="json")


@pytest.mark.parametrize("delay", [".nan", ".inf", "-1", "60001"])
def test_step_delays_are_finite_and_bounded(delay):
    with pytest.raises(ConfigError, match=r"generation.step_delay_ms.0: Input should be"):
        load_config(None, [f"generation.step_delay_ms=[{delay}]"])


def test_a_json_config_that_is_not_json_is_refused(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("run_id: yaml-not-json\n")
    with pytest.raises(ConfigError, match="not JSON"):
        load_config(bad)


@pytest.mark.parametrize("mode", ["sequential", "sync", "one_step", "bounded"])
def test_every_mode_takes_the_orchestrators_features(mode):
    """One rollout path: partial rollout, repack, redundancy and the async bound are not bounded-only."""
    cfg = load_config(None, [f"trainer.mode={mode}", "trainer.partial_rollout=true", "trainer.repack.enabled=true",
                             "trainer.redundancy_groups=1", "trainer.redundancy_samples=1", "trainer.async_bound=2"])
    assert cfg.trainer.partial_rollout and cfg.trainer.repack.enabled and not cfg.uses_router


@pytest.mark.parametrize("mode", ["sequential", "sync", "one_step", "bounded"])
def test_the_router_runs_by_default_only_when_instances_join_and_leave(mode):
    """auto: the orchestrator dials every instance itself in every mode; the router fronts a scale-out."""
    assert not load_config(None, [f"trainer.mode={mode}", "generation.instances=2"]).uses_router
    assert load_config(None, [f"trainer.mode={mode}", "generation.instances=2", "scaleout.enabled=true",
                              "scaleout.max_instances=2"]).uses_router


@pytest.mark.parametrize("feature", ["trainer.partial_rollout=true", "trainer.repack.enabled=true",
                                     "trainer.coordination.policy=staleflow"])
def test_interrupting_features_need_the_instances_not_the_router(feature):
    with pytest.raises(ConfigError, match="the SGS router does not do"):
        load_config(None, ["generation.instances=2", "generation.dispatch.router='on'", feature])


@pytest.mark.parametrize("other, fragment", [
    ("trainer.repack.enabled=true", "trainer.repack"),
    ("agentic.enabled=true", "agentic"),
])
def test_staleflow_coordination_refuses_what_it_does_not_route(other, fragment):
    with pytest.raises(ConfigError, match=f"does not combine with {fragment}"):
        load_config(None, ["trainer.mode=bounded", "trainer.coordination.policy=staleflow", other])
    cfg = load_config(None, ["trainer.mode=bounded", "trainer.coordination.policy=staleflow"])
    assert cfg.trainer.coordination.mu == 0.3 and not cfg.uses_router
    with pytest.raises(ConfigError, match="mu"):
        load_config(None, ["trainer.coordination.mu=0"])


def test_the_learner_runs_in_its_own_process_with_one_rank_on_the_cpu():
    def where(**trainer) -> bool:
        return RunConfig.model_validate({"trainer": trainer}).trainer.learner_in_process()

    assert where() and where(learner="process", device="cuda")
    assert not where(device="cuda") and not where(ranks=2) and not where(learner="inline")
    with pytest.raises(ValueError, match=r"trainer\.learner process needs trainer\.ranks 1"):
        where(learner="process", ranks=2)


@pytest.mark.parametrize("word, value", [("on", "on"), ("off", "off"), ("'on'", "on"), ("auto", "auto"), ("yes", "on")])
def test_router_on_off_unquoted_in_a_set_override(word, value):
    """YAML 1.1 reads an unquoted on/off as a boolean; the tri-state field takes it as the word."""
    overrides = [f"generation.dispatch.router={word}", "generation.instances=2"]
    assert load_config(None, overrides).generation.dispatch.router == value


@pytest.mark.parametrize("word, uses_router", [("on", True), ("off", False)])
def test_router_on_off_unquoted_in_a_config_file(tmp_path, word, uses_router):
    path = tmp_path / "run.yaml"
    path.write_text(f"generation:\n  instances: 2\n  dispatch:\n    router: {word}\n")
    cfg = load_config(path)
    assert cfg.generation.dispatch.router == word and cfg.uses_router is uses_router


def test_router_on_off_unquoted_in_a_deployment_override():
    """The rl_training deployment's ``overrides`` parameter and its resolved ``config`` parameter."""
    from flows.deploy_steps import run_config
    from flows.rl_training import resolve_config

    cfg = resolve_config(RunConfig(), None, ["generation.dispatch.router=off", "generation.instances=2"])
    assert cfg.generation.dispatch.router == "off"
    step = run_config(str(ROOT / "deploy/configs/default.yaml"), ["generation.dispatch.router=on"])
    assert step["config"]["generation"]["dispatch"]["router"] == "on"
    cfg = resolve_config(RunConfig.model_validate(step["config"]), None, [])
    assert cfg.generation.dispatch.router == "on"


def test_router_takes_no_other_value():
    with pytest.raises(ConfigError, match=r"generation.dispatch.router: "
                                          r"Input should be 'auto', 'on' or 'off' \(got 1\)"):
        load_config(None, ["generation.dispatch.router=1"])


def test_braid_config_takes_model_as_braid_run_does(capsys, tmp_path):
    from flows.cli import build_parser, config_overrides, main

    argv = ["--set", "model.path=/elsewhere", "--model", str(tmp_path), "--set", "trainer.mode=sync"]
    assert config_overrides(build_parser().parse_args(["config", *argv])) == \
        config_overrides(build_parser().parse_args(["run", *argv]))  # the same overrides, --model last
    assert main(["config", *argv]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["model"]["path"] == str(tmp_path) and printed["trainer"]["mode"] == "sync"


@pytest.mark.parametrize("overrides, refused", [
    ([], None),  # one instance, LPT admission: the orchestrator's estimates order launches and admission
    (["generation.admission=fcfs"], "changes nothing with one instance admitting FCFS"),
    (["generation.admission=fcfs", "generation.instances=2"], None),  # placement over two instances
    (["generation.admission=fcfs", "generation.genlog=g.sqlite",
      "generation.retrain.every=5"], None),  # a store it publishes
    (["agentic.enabled=true", "trainer.mode=sync"], "read by the SGS router only in an agentic run"),
    (["agentic.enabled=true", "trainer.mode=sync", "generation.dispatch.router=on"], None),
])
def test_a_ranker_store_nothing_reads_is_refused(overrides, refused):
    overrides = ["generation.ranker_dir=store", *overrides]
    if refused is None:
        assert load_config(None, overrides).generation.ranker_dir == "store"
    else:
        with pytest.raises(ConfigError, match=re.escape(refused)):
            load_config(None, overrides)


EMULATED_ENGINE = ["generation.engine=emulated",
                   "generation.emulation={profile: cpu-local-braid-tiny, lengths: {distribution: fixed, tokens: 8}}"]


@pytest.mark.parametrize("missing", ["trainer.backend", "reward.kind"])
def test_an_emulated_run_emulates_the_engine_the_learner_and_the_reward_together(capsys, missing):
    """Synthetic tokens must never reach a real trainer or a real reward: braid run and braid config
    refuse a run that emulates some of the three parts, naming which are real."""
    from flows.cli import main
    from flows.registries import check_run

    parts = {"trainer.backend": "trainer.backend=emulated", "reward.kind": "reward.kind=emulated"}
    overrides = [*EMULATED_ENGINE, *(v for k, v in parts.items() if k != missing)]
    cfg = load_config(None, overrides)  # the schema accepts it: an SGS may serve it
    with pytest.raises(ConfigError, match=rf"{missing} '(torch|rule)'"):
        check_run(cfg)
    assert main(["config", *[a for o in overrides for a in ("--set", o)]]) == 2
    assert "EMULATED run sets all three" in capsys.readouterr().err
    full = load_config(None, [*EMULATED_ENGINE, *parts.values()])
    assert check_run(full).trainer.backend == "emulated"
    with pytest.raises(ConfigError, match=r"trainer\.emulation is read only by trainer\.backend 'emulated'"):
        load_config(None, ["trainer.emulation={gpu: H800, gpus: 8}"])
