"""Property-based fuzzing of Braid's gRPC services (issue 20 item 5): the property and its tally.

Shared by ``tests/integration/test_fuzz_services.py`` (a few examples per method, in ``make test``)
and ``bench/fuzz.py`` (many, for the record). The stack is ``bench/fuzz_stack.py`` (a weight relay,
an SGS instance, the router, an environment worker and a reward worker, real processes on loopback); the inputs are
``bench/fuzz_inputs.py`` (protobuf messages built to be wrong, weight streams mutated from a good
version, raw random bytes), sent to every method of ``braid.proto`` and the relay's data channel.
The property, per example:

- the reply is OK or a status from the method's allowed set (``ALLOWED``; never UNKNOWN or
  INTERNAL: those are an unhandled exception or a framework failure), and a refusal says why
  (non-empty details);
- a wait (DEADLINE_EXCEEDED) only where the caller asked for one (a future ``min_weight_version``,
  a relay pull of a version not held yet with a wait longer than the call's deadline);
- afterwards every process is alive and answers Health / Versions.

After a method's examples, ``Stack.check_nothing_lost`` pulls every version the relay holds and
checks it byte-exact against the good weights (a refused push never touches a committed version; a
mutated push that is accepted can only be the good bytes under another version number), pushes
and pulls a fresh version, has the SGS and the router generate greedily with the same tokens
as before the fuzzing (the installed weights are still the good ones), and plays an expert's
calculator episode through the environment worker and scores it on the reward worker with the
same observations, rewards and score as before.
"""

from __future__ import annotations

import time
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, seed, settings

from bench.fuzz_inputs import build, data_call, strategy
from bench.fuzz_stack import CALL_TIMEOUT_S, OK, STREAM_REQUEST, Stack
from services.proto import braid_pb2 as pb

CRASH_CODES = ("UNKNOWN", "INTERNAL")
_W = ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "DATA_LOSS", "RESOURCE_EXHAUSTED")
GEN = {
    "Generate": {OK, "INVALID_ARGUMENT", "FAILED_PRECONDITION", "DEADLINE_EXCEEDED"},
    "UpdateWeights": {OK, *_W},
    "Health": {OK},
    "PullWeights": {OK, *_W, "NOT_FOUND"},
}
ALLOWED = {
    "sgs": {**GEN, "AddInstance": {"UNIMPLEMENTED"}, "RemoveInstance": {"UNIMPLEMENTED"},
            "Interrupt": {OK, "INVALID_ARGUMENT"}},
    "router": {
        **GEN,
        "AddInstance": {OK, "INVALID_ARGUMENT", "ALREADY_EXISTS", "UNAVAILABLE", "DEADLINE_EXCEEDED"},
        "RemoveInstance": {"INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION"},
        "Interrupt": {"UNIMPLEMENTED"},
    },
    "relay": {
        "Push": {OK, *_W, "ALREADY_EXISTS"},
        "Pull": {OK, "INVALID_ARGUMENT", "NOT_FOUND", "DEADLINE_EXCEEDED"},
        "Versions": {OK},
        "Heartbeat": {OK},
        "SetChain": {OK, "INVALID_ARGUMENT"},
        "OpenTransfer": {OK, *_W, "NOT_FOUND", "ALREADY_EXISTS", "DEADLINE_EXCEEDED"},
        # the raw-TCP data channel beside gRPC: a granted push whose frames are broken, or raw bytes;
        # CLOSED: the relay closed without a status (a stream cut short: it keeps the prefix for a resume)
        "DataChannel": {OK, *_W, "ALREADY_EXISTS", "PERMISSION_DENIED", "CLOSED"},
    },
    # an environment bug is INTERNAL (the session fails, the worker lives): a crash here too
    "env": {
        "Reset": {OK, "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"},
        "Step": {OK, "INVALID_ARGUMENT", "NOT_FOUND", "FAILED_PRECONDITION"},
        "Close": {OK, "NOT_FOUND"},
        "Health": {OK},
    },
    "reward": {"Score": {OK, "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"}, "Health": {OK}},
}
VARIANTS = ("message", "bytes")


EMPTY_REQUEST = {"Health", "Versions"}  # their request has no fields: only raw bytes vary


def cases() -> list[tuple[str, str, str]]:
    """Every (service, method, variant) fuzzed."""
    return [(s, m, v) for s in ALLOWED for m in ALLOWED[s] for v in VARIANTS
            if not (m in EMPTY_REQUEST and v == "message")]


# ---------------------------------------------------------------- the property
@dataclass
class Tally:
    """Inputs tried and status codes returned, per service and method (and variant)."""

    counts: dict = field(default_factory=lambda: defaultdict(lambda: defaultdict(Counter)))
    crashes: list = field(default_factory=list)
    seconds: dict = field(default_factory=lambda: defaultdict(float))

    def add(self, service: str, method: str, variant: str, code: str) -> None:
        self.counts[service][method][f"{variant}:{code}"] += 1

    def summary(self) -> dict:
        out: dict = {}
        for service, methods in sorted(self.counts.items()):
            per = {}
            for method, c in sorted(methods.items()):
                codes = Counter()
                for key, n in c.items():
                    codes[key.split(":", 1)[1]] += n
                per[method] = {
                    "inputs": sum(c.values()),
                    "by_variant": {v: sum(n for k, n in c.items() if k.startswith(v + ":")) for v in VARIANTS},
                    "codes": dict(sorted(codes.items())),
                    "crashes": sum(1 for x in self.crashes if x["service"] == service and x["method"] == method),
                }
            out[service] = {"inputs": sum(m["inputs"] for m in per.values()),
                            "crashes": sum(m["crashes"] for m in per.values()), "methods": per}
        return out


def check_reply(stack: Stack, service: str, method: str, request, code: str, details: str, timeout_s: float) -> None:
    """The per-example property (see the module docstring); raises ``AssertionError``."""
    allowed = ALLOWED[service][method] | ({"INVALID_ARGUMENT"} if request is None else set())  # raw bytes may not parse
    assert code not in CRASH_CODES, f"{service}.{method} answered {code}: {details}"
    assert code in allowed, f"{service}.{method} answered {code} (allowed {sorted(allowed)}): {details}"
    if code not in (OK, "CLOSED"):
        assert details.strip(), f"{service}.{method} answered {code} with no message"
    if code == "DEADLINE_EXCEEDED" and method == "Generate" and isinstance(request, pb.GenerateRequest):
        newest = stack.newest(service)
        assert request.min_weight_version > newest, (
            f"{service}.Generate timed out although min_weight_version {request.min_weight_version} <= {newest} "
            f"is installed")
    if code == "DEADLINE_EXCEEDED" and method in ("Pull", "OpenTransfer") and request is not None:
        assert request.wait_s >= timeout_s / 2, f"relay.{method} timed out although asked to wait {request.wait_s} s"
    stack.check_alive()


def run_case(stack: Stack, service: str, method: str, variant: str, examples: int, tally: Tally, *,
             seed_: int | None = None, shrink: bool = True) -> None:
    """Fuzz one (service, method, variant) with ``examples`` inputs; raises on the first crash
    (after hypothesis shrinks it unless ``shrink`` is False)."""
    phases = (Phase.explicit, Phase.generate, Phase.shrink) if shrink else (Phase.explicit, Phase.generate)

    @settings(max_examples=examples, deadline=None, database=None, derandomize=seed_ is None, phases=phases,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(strategy(stack, service, method, variant))
    def prop(drawn) -> None:
        t0 = time.monotonic()
        if method == "DataChannel":
            request, timeout_s = drawn, CALL_TIMEOUT_S
            code, details, _ = data_call(stack, drawn, raw=drawn if variant == "bytes" else None)
        else:
            if variant == "bytes":  # one message, or a request stream of them
                parts = [drawn] if isinstance(drawn, bytes) else drawn
                request, timeout_s = (parts if method in STREAM_REQUEST else b"".join(parts)), 3.0
            else:
                request, timeout_s = build(stack, service, method, drawn)
            code, details, _ = stack.call(service, method, request, timeout_s=timeout_s)
        tally.add(service, method, variant, code)
        tally.seconds[f"{service}.{method}"] += time.monotonic() - t0
        check_reply(stack, service, method, request if variant == "message" else None, code, details, timeout_s)

    if seed_ is not None:
        prop = seed(seed_ + zlib.crc32(f"{service}.{method}.{variant}".encode()))(prop)
    prop()


def run_all(stack: Stack, examples: int, tally: Tally, *, seed_: int, cases_: list | None = None,
            progress=None) -> None:
    """Every case, recording crashes in ``tally`` instead of stopping (the bench)."""
    for service, method, variant in cases_ or cases():
        try:
            run_case(stack, service, method, variant, examples, tally, seed_=seed_, shrink=False)
        except Exception as err:  # noqa: BLE001 - a crash is a result here: record it and go on
            tally.crashes.append({"service": service, "method": method, "variant": variant,
                                  "error": f"{type(err).__name__}: {err}"[:2000]})
            try:
                stack.wait_healthy(30.0)
            except Exception as dead:
                tally.crashes.append({"service": service, "method": method, "variant": variant,
                                      "error": f"not healthy afterwards: {dead}"[:2000]})
                raise
        if progress is not None:
            progress(service, method, variant)

