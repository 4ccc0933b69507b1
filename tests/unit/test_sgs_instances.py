"""Several SGS instances per process (``python -m services.generation --instances N``, emulated engine
only): the launcher's grouping arithmetic and process arguments (``flows.processes``), the refusal
of other engines and of bad port flags, and a dead core failing the whole process. The process
itself is exercised in ``tests/integration/test_emulated_engine.py``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from flows.processes import (
    group_service,
    instance_groups,
    instance_service,
    instances_per_process,
    start_instances,
)
from services.common.config import load_config, write_config
from services.generation import __main__ as sgs_main
from services.generation.instances import _failed, instance_ports

ROOT = Path(__file__).resolve().parents[2]
EMULATION = "{profile: H20-qwen2.5-7b, lengths: {distribution: fixed, tokens: 8}}"


def test_instances_are_cut_in_order_into_processes_of_at_most_per_process():
    assert instance_groups(0, 256, 64) == [range(64), range(64, 128), range(128, 192), range(192, 256)]
    assert instance_groups(0, 130, 64) == [range(64), range(64, 128), range(128, 130)]
    assert instance_groups(5, 3, 64) == [range(5, 8)]
    assert instance_groups(2, 3, 1) == [range(2, 3), range(3, 4), range(4, 5)]
    assert instance_groups(0, 0, 64) == []
    with pytest.raises(ValueError, match="per_process >= 1"):
        instance_groups(0, 4, 0)


def test_a_process_is_named_by_its_instances_and_found_from_any_of_them():
    groups = instance_groups(0, 130, 64)
    assert [group_service(g) for g in groups] == ["sgs-0-63", "sgs-64-127", "sgs-128-129"]
    assert group_service(range(7, 8)) == "sgs-7"  # one instance: the name it always had
    assert [instance_service(i, groups) for i in (0, 63, 64, 129)] == ["sgs-0-63", "sgs-0-63", "sgs-64-127",
                                                                      "sgs-128-129"]
    with pytest.raises(KeyError):
        instance_service(130, groups)


def test_only_the_emulated_engine_groups_instances():
    emulated = load_config(ROOT / "deploy/configs/smoke.yaml", ["generation.engine=emulated",
                                                                 f"generation.emulation={EMULATION}"])
    assert instances_per_process(emulated.generation) == 64  # the default
    set_to_3 = emulated.generation.model_copy(
        update={"emulation": emulated.generation.emulation.model_copy(update={"instances_per_process": 3})})
    assert instances_per_process(set_to_3) == 3
    assert instances_per_process(load_config(ROOT / "deploy/configs/smoke.yaml").generation) == 1  # vllm


class FakeSupervisor:
    """Records the processes ``start_instances`` starts; each "binds" 40000 + instance on port 0."""

    def __init__(self) -> None:
        self.started: list[tuple[str, list[str]]] = []
        self.ports = SimpleNamespace(hold=lambda host, port=0: port)  # holds nothing: port 0 stays 0

    def start(self, name: str, module: str, args: list[str], **_: object) -> None:
        self.started.append((name, args))

    def wait_for_file(self, path: Path, timeout_s: float) -> str:
        args = next(a for _, a in self.started if a[a.index("--port-file") + 1] == str(path))
        first = int(args[args.index("--instance") + 1])
        asked = args[args.index("--ports") + 1].split(",") if "--ports" in args else [args[args.index("--port") + 1]]
        return "\n".join(p if p != "0" else str(40000 + first + k) for k, p in enumerate(asked))


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_start_instances_starts_one_process_per_group_and_returns_addresses_in_instance_order(tmp_path):
    sup = FakeSupervisor()
    relays = ["r0", "r1", "r2"]
    addresses = start_instances(sup, tmp_path, "ckpt", 5, 1, per_process=2, relays=relays)  # type: ignore[arg-type]
    assert addresses == [f"127.0.0.1:{40000 + i}" for i in range(5)]
    assert [name for name, _ in sup.started] == ["sgs-0-1", "sgs-2-3", "sgs-4"]
    (_, a), (_, b), (_, c) = sup.started
    assert (_arg(a, "--instances"), _arg(a, "--ports"), _arg(a, "--port")) == ("2", "0,0", None)
    assert (_arg(c, "--instances"), _arg(c, "--port")) == (None, "0")  # one instance: today's arguments
    # instance i pulls from relay i % 3, however the instances are grouped
    assert [_arg(x, "--relay") for x in (a, b, c)] == ["r0,r1", "r2,r0", "r1"]
    assert _arg(b, "--port-file") == str(tmp_path / "sgs-2-3.port")


def test_start_instances_binds_base_port_plus_index_or_the_ports_given(tmp_path):
    sup = FakeSupervisor()
    start_instances(sup, tmp_path, "ckpt", 3, 1, per_process=3, base_port=7000, first=2)  # type: ignore[arg-type]
    assert _arg(sup.started[0][1], "--ports") == "7002,7003,7004"
    sup = FakeSupervisor()
    restarted = start_instances(sup, tmp_path, "ckpt", 2, 1, per_process=2, first=4,  # type: ignore[arg-type]
                                ports=[9001, 9005])
    assert restarted == ["127.0.0.1:9001", "127.0.0.1:9005"] and sup.started[0][0] == "sgs-4-5"
    with pytest.raises(ValueError, match="2 ports for 3 instances"):
        start_instances(sup, tmp_path, "ckpt", 3, 1, ports=[1, 2])  # type: ignore[arg-type]


def _parser_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        sgs_main.main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_several_instances_of_an_engine_that_holds_a_model_are_refused(tmp_path, capsys):
    write_config(load_config(ROOT / "deploy/configs/smoke.yaml", ["generation.engine=hf"]), tmp_path / "c.json")
    err = _parser_error(["--config", str(tmp_path / "c.json"), "--model", "m", "--instances", "2"], capsys)
    assert "only generation.engine 'emulated' serves several instances in one process" in err
    assert "engine 'hf' holds a model per instance" in err


@pytest.mark.parametrize("flags,message", [
    (["--instances", "0"], "--instances must be in [1, 256]"),
    (["--instances", "3", "--ports", "1,2"], "--ports lists 2 ports for 3 instances"),
    (["--instances", "2", "--port", "65535"], "must be a port number"),
    (["--ports", "x"], "--ports must be comma-separated integers"),
])
def test_bad_instance_and_port_flags_are_refused_before_anything_starts(flags, message, capsys):
    assert message in _parser_error(["--config", "c.json", "--model", "m", *flags], capsys)


def test_instance_ports_follow_the_base_port_or_are_all_free():
    assert instance_ports(7000, 3) == [7000, 7001, 7002]
    assert instance_ports(0, 3) == [0, 0, 0]


def test_one_dead_core_fails_the_whole_process(caplog):
    def instance(alive: bool, i: int) -> SimpleNamespace:
        core = SimpleNamespace(alive=lambda: alive, error=None if alive else RuntimeError("boom"),
                               label=f"instance {i}: ")
        return SimpleNamespace(core=core)

    assert _failed([instance(True, 0), instance(True, 1)], None) is None
    assert _failed([instance(True, 0), instance(False, 1)], None) == 1
    assert "instance 1: generation core died: RuntimeError('boom')" in caplog.text
    assert _failed([instance(True, 0)], SimpleNamespace(error=OSError("disk"))) == 1
