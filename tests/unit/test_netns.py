"""The pure half of the namespace harness (bench/netns.py): addresses, slots, tbf, command lines."""

from __future__ import annotations

import ipaddress
import random

import pytest

from bench.netns import (
    BASE,
    CTL_DEV,
    LINK_DEV,
    MIN_BURST,
    NetnsError,
    namespace_name,
    netns_exec,
    owner_pid,
    parse_rate,
    pick_slot,
    plan_addresses,
    root_dev,
    setup_commands,
    slot_network,
    stale,
    tbf_command,
    tbf_params,
)


def test_a_plan_puts_the_link_and_each_control_veth_on_its_own_30_inside_the_slot():
    plan = plan_addresses(3)
    net = slot_network(3)
    assert net == ipaddress.ip_network("10.213.0.48/28")
    assert plan.link == {"train": "10.213.0.49", "gen": "10.213.0.50"}
    assert plan.root == {"train": "10.213.0.53", "gen": "10.213.0.57"}
    assert plan.control == {"train": "10.213.0.54", "gen": "10.213.0.58"}
    thirties = {ipaddress.ip_interface(f"{a}/30").network for a in [*plan.link.values(), *plan.root.values()]}
    assert len(thirties) == 3 and all(t.subnet_of(net) for t in thirties)
    assert (ipaddress.ip_interface(f"{plan.root['gen']}/30").network
            == ipaddress.ip_interface(f"{plan.control['gen']}/30").network)


def test_plans_of_different_slots_never_share_an_address():
    seen: set[str] = set()
    for slot in (0, 1, 2, 4095):
        p = plan_addresses(slot)
        addrs = {*p.link.values(), *p.root.values(), *p.control.values()}
        assert len(addrs) == 6 and not addrs & seen
        seen |= addrs


def test_plan_refuses_a_slot_outside_the_block_and_a_link_to_itself():
    with pytest.raises(ValueError, match=r"outside 10\.213\.0\.0/16"):
        plan_addresses(4096)
    with pytest.raises(ValueError, match="two different roles"):
        plan_addresses(0, ("a", "a"))


def test_pick_slot_avoids_every_network_in_use_and_ignores_the_default_route():
    used = [ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("192.0.2.0/24")]
    used += [slot_network(s) for s in range(4096) if s != 17]  # one slot left
    assert pick_slot(used, random.Random(0)) == 17
    with pytest.raises(NetnsError, match="no free /28"):
        pick_slot([*used, ipaddress.ip_network("10.213.1.20/30")], random.Random(0))
    with pytest.raises(NetnsError, match="no free /28"):
        pick_slot([ipaddress.ip_network("10.0.0.0/8")], random.Random(0))  # someone's route covers the block
    assert BASE.overlaps(slot_network(pick_slot([], random.Random(1))))


@pytest.mark.parametrize("text, bps", [("200mbit", 200_000_000), ("1gbit", 10**9), ("1.5gbit", 1_500_000_000),
                                        ("500kbit", 500_000), ("64000", 64000), (10**8, 10**8)])
def test_rates_read_like_tc_writes_them(text, bps):
    assert parse_rate(text) == bps


@pytest.mark.parametrize("bad", ["fast", "200 mb", "-1mbit", "1000"])
def test_a_rate_tc_cannot_shape_is_refused_with_an_example(bad):
    with pytest.raises(ValueError, match="rate"):
        parse_rate(bad)


def test_tbf_burst_is_five_ms_of_the_rate_but_never_under_a_gso_packet():
    assert tbf_params("1gbit").burst_bytes == 625_000
    assert tbf_params("200mbit").burst_bytes == 125_000
    assert tbf_params("10mbit").burst_bytes == MIN_BURST
    assert tbf_params("1gbit").latency_ms == 50


def test_tbf_command_shapes_the_device_inside_its_namespace():
    assert tbf_command("ns1", LINK_DEV, tbf_params("200mbit")) == [
        "tc", "-n", "ns1", "qdisc", "replace", "dev", LINK_DEV, "root", "tbf",
        "rate", "200000000bit", "burst", "125000",
        "latency", "50ms"]


def test_commands_run_inside_a_namespace_through_ip_netns_exec():
    assert netns_exec("ns1", ["python", "-c", "1"]) == ["ip", "netns", "exec", "ns1", "python", "-c", "1"]


def test_names_carry_the_owner_pid_and_stale_ones_are_those_of_dead_owners():
    name = namespace_name(123, 7, "gen")
    assert name == "braidnet-123-7-gen" and owner_pid(name) == 123
    assert owner_pid("braidnet-5-probe-probe") == 5
    assert owner_pid("someone-else") is None and owner_pid("braidnet-x-1-gen") is None
    names = [namespace_name(1, 0, "train"), namespace_name(2, 1, "gen"), "other-ns"]
    assert stale(names, alive=lambda pid: pid == 2) == ["braidnet-1-0-train"]
    assert len(root_dev(4095, "train")) <= 15


def test_setup_shapes_both_ends_of_the_link_and_routes_each_namespace_to_every_root_address():
    plan = plan_addresses(0)
    names = {"train": "nt", "gen": "ng"}
    cmds = setup_commands(plan, names, tbf_params("200mbit"))
    assert cmds[0] == ["ip", "link", "add", LINK_DEV, "netns", "nt", "type", "veth",
                       "peer", "name", LINK_DEV, "netns", "ng"]
    shaped = [c for c in cmds if c[0] == "tc"]
    assert sorted(c[2] for c in shaped) == ["ng", "nt"] and all(c[6] == LINK_DEV for c in shaped)
    assert ["ip", "-n", "ng", "route", "add", f"{plan.root['train']}/32",
            "via", plan.root["gen"], "dev", CTL_DEV] in cmds
    assert ["ip", "-n", "nt", "route", "add", f"{plan.root['gen']}/32",
            "via", plan.root["train"], "dev", CTL_DEV] in cmds
    assert not any("default" in c for c in cmds)  # nothing can leave the machine
