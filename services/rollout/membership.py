"""SGS instances that join and leave a running rollout (dynamic scale-out without the router).

The launcher's scale-out controller (``flows/scaleout.py``) writes the instances it wants in
``sgs-membership.json`` (``{"instances": [{"address": "host:port", "state": "active" | "leaving"}]}``,
replaced atomically). The orchestrator reads it when it changes: a new address gets a slot, is
brought to the newest weights (``readmit.py``'s path) and routable from then on; a ``leaving``
address takes no new work and, once it holds nothing, is released. Each transition is answered
in ``sgs-membership-ack.json`` (``{address: {"state": "joined" | "drained", "version", "held"}}``)
that the controller waits for before it reports the change (and, for a leaving instance, stops
its process). A file, like the reward pool's membership, because the orchestrator is a thread of
the trainer process, which serves no RPC.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from services.common.atomic import write_json_atomic

log = logging.getLogger("braid.rollout")

MEMBERSHIP = "sgs-membership.json"
ACK = "sgs-membership-ack.json"


class MembershipError(ValueError):
    """A membership file that cannot be followed (bad JSON, fields or states)."""


def read_membership(path: Path) -> dict[str, str]:
    """address -> state from a membership file, checked."""
    try:
        doc = json.loads(path.read_text())
        entries = doc["instances"]
        out = {str(e["address"]): str(e["state"]) for e in entries}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise MembershipError(f"{path}: not a membership file ({err})") from err
    bad = {a: s for a, s in out.items() if s not in ("active", "leaving") or ":" not in a}
    if bad:
        raise MembershipError(f"{path}: bad entries {bad} (address host:port, state active or leaving)")
    return out


class MembershipFile:
    """The orchestrator's side: what changed since the last look, and the acknowledgements."""

    def __init__(self, run_dir: Path) -> None:
        self.path, self.ack_path = run_dir / MEMBERSHIP, run_dir / ACK
        self._seen: str | None = None  # the text last followed (compared whole: a rewrite may keep size and mtime)
        self.acks: dict[str, dict] = {}

    def changed(self) -> dict[str, str] | None:
        """The wanted membership when the file changed since the last call (None: no file, no change)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        if text == self._seen:
            return None
        self._seen = text
        return read_membership(self.path)

    def ack(self, address: str, state: str, **fields) -> None:
        self.acks[address] = {"state": state, **fields}
        write_json_atomic(self.ack_path, self.acks)
        log.info("SGS instance %s %s (%s)", address, state, fields)
