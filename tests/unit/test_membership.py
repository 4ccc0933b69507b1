"""The SGS membership file between the scale-out controller and the orchestrator: checked when
read, changes seen once, acknowledgements waited for (and a missing one is a clear timeout)."""

from __future__ import annotations

import json
import threading

import pytest

from flows.scaleout import FileMembership
from services.rollout.membership import MembershipError, MembershipFile, read_membership


def test_a_bad_membership_file_is_refused_naming_it(tmp_path):
    path = tmp_path / "sgs-membership.json"
    path.write_text("{")
    with pytest.raises(MembershipError, match="not a membership file"):
        read_membership(path)
    path.write_text(json.dumps({"instances": [{"address": "nohost", "state": "active"}]}))
    with pytest.raises(MembershipError, match="bad entries"):
        read_membership(path)
    path.write_text(json.dumps({"instances": [{"address": "h:1", "state": "gone"}]}))
    with pytest.raises(MembershipError, match="state active or leaving"):
        read_membership(path)


def test_the_controller_waits_for_the_orchestrators_acknowledgements(tmp_path):
    controller = FileMembership(tmp_path, ["h:1"])
    controller.POLL_S = 0.01
    rollout = MembershipFile(tmp_path)
    assert rollout.changed() == {"h:1": "active"} and rollout.changed() is None  # seen once

    def orchestrator() -> None:  # what the fleet does on its ticks
        while (wanted := rollout.changed()) is None:
            pass
        assert wanted == {"h:1": "active", "h:2": "active"}
        rollout.ack("h:2", "joined", version=7)
        while (wanted := rollout.changed()) is None:
            pass
        assert wanted["h:2"] == "leaving"
        rollout.ack("h:2", "drained", held=3)

    t = threading.Thread(target=orchestrator)
    t.start()
    assert controller.add_instance("h:2", wait_s=5) == (["h:1", "h:2"], 7)
    assert controller.remove_instance("h:2", wait_s=5) == (["h:1"], 3)
    t.join()
    assert read_membership(tmp_path / "sgs-membership.json") == {"h:1": "active"}
    with pytest.raises(TimeoutError, match="did not report h:9 drained"):
        controller.remove_instance("h:9", wait_s=0.05)
