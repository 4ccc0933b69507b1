import pytest

from services.common.registry import Registry


def test_a_registry_refuses_twins_and_names_what_it_has():
    reg: Registry[type] = Registry("widget")
    reg.register("a")(int)
    with pytest.raises(ValueError, match="widget 'a' registered twice"):
        reg.register("a")(str)
    assert reg["a"] is int and "a" in reg and reg.names() == ["a"]
    with pytest.raises(ValueError, match=r"unknown widget 'b'; registered: \['a'\]"):
        reg["b"]


def test_the_trainer_backend_and_transport_registries_name_their_members():
    from services.run.transport import TRANSPORTS
    from services.trainer.backends import BACKENDS

    assert "torch" in BACKENDS and {"direct", "relay"} <= set(TRANSPORTS.names())
