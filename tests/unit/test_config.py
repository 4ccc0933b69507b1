import re
from pathlib import Path

import pytest

from services.common.config import ConfigError, RunConfig, load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", sorted((ROOT / "deploy" / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    assert isinstance(load_config(path), RunConfig)


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
        ("trainer.partial_rollout=true", "partial_rollout only apply to mode 'bounded'"),
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


def test_bounded_calls_must_fit_the_instance_server_threads():
    # every open Generate call holds an SGS server thread (max_inflight + 16 of them)
    with pytest.raises(ConfigError, match=r"= 128 samples in flight per instance exceeds generation.max_inflight \(64\)"):
        load_config(None, ["trainer.mode=bounded", "generation.max_inflight=64"])
    assert load_config(None, ["trainer.mode=bounded", "generation.max_inflight=128"]).generation.max_inflight == 128


def test_bad_file_and_bad_override_syntax(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(None, ["novalue"])


def test_cli_refuses_invalid_config_before_starting_anything(capsys, tmp_path):
    from flows.cli import main

    assert main(["run", "--config", str(ROOT / "deploy/configs/smoke.yaml"), "--set", "trainer.lr=5",
                 "--set", f"runs_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "trainer.lr: Input should be less than or equal to 1" in err
    assert not any(tmp_path.iterdir())  # no run directory was created


@pytest.mark.parametrize("override, fragment", [
    ("generation.engine=sglang", "generation.engine 'sglang' is not one of ['hf', 'vllm']"),
    ("generation.dispatch.policy=fastest", "generation.dispatch.policy 'fastest' is not one of"),
])
def test_unknown_registry_keys_fail_when_a_run_is_prepared(override, fragment, capsys):
    from flows.cli import main
    from flows.registries import check_registries

    cfg = load_config(None, [override])  # the schema itself knows no registry
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        check_registries(cfg)
    assert main(["config", "--set", override]) == 2
    assert fragment in capsys.readouterr().err

