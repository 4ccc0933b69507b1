"""The service stack the gRPC fuzzing runs against (issue 20 item 5): real processes on loopback.

A weight relay, an SGS instance (hf engine, the tiny checkpoint) pulling from it, the SGS router
over that instance, an environment worker and a reward worker (issue 21), started by the
launcher's own code (``flows.processes``, ``flows.reward_pool``). ``Stack`` sends a
request (messages, a request stream, or raw bytes through a generic call) and returns the status
name; it knows the good inputs (the checkpoint's weights as a chunk stream and a push) and the
versions each service holds, and ``check_nothing_lost`` checks after the fuzzing that every version
the relay holds is byte-exact, greedy generation is unchanged, and the environment worker still plays an
expert's episode to its reward and the reward worker still scores it the same. The inputs are drawn by
``bench/fuzz_inputs.py``; the property and the bookkeeping are ``bench/fuzz_services.py``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from services.common.rpc import connect
from services.proto import braid_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
OK = "OK"
CALL_TIMEOUT_S = 10.0
CHUNK_BYTES = 4096  # the tiny model's version in ~20 chunks: mutations have room
MESSAGE_MB = 4
OVERRIDES = [
    "generation.engine=hf", "generation.max_new_tokens=8", "generation.max_sequences_per_request=16",
    "generation.max_prompt_tokens=64", "generation.forced_lengths=true", "generation.num_blocks=64",
    f"generation.max_message_mb={MESSAGE_MB}", "weights.pull_wait_s=1.0", "weights.sgs_auto_pull_s=0",
    "generation.dispatch.policy=round_robin",
]

SERVICE_NAME = {"sgs": "braid.v1.Generation", "router": "braid.v1.Generation", "relay": "braid.v1.WeightRelay",
                "env": "braid.v1.Environment", "reward": "braid.v1.Reward"}
HEALTH_REPLY = {"sgs": pb.HealthReply, "router": pb.HealthReply, "env": pb.EnvHealthReply,
                "reward": pb.RewardHealthReply}
EPISODE_SEED = 7  # the episodes played before and after the fuzzing: the first from this seed on of each kind
ENV_KINDS = ("calculator", "walk")
STREAM_REQUEST = {"UpdateWeights", "Push"}
STREAM_REPLY = {"Generate", "Pull"}
NEWEST_CAP = 2**62 + 2**20  # above it, a held version is an arriving int64-max one (never committed)


def make_checkpoint(path: Path) -> Path:
    """The tiny policy of ``deploy/configs/smoke.yaml`` (the tests' ``tiny_checkpoint``)."""
    from services.common.config import load_config
    from services.policy.model import build_policy, save_policy

    save_policy(build_policy(load_config(ROOT / "deploy/configs/smoke.yaml").model), path)
    return path


@dataclass
class Stack:
    """A relay, an SGS instance pulling from it and the router over the instance, as processes."""

    workdir: Path
    checkpoint: Path
    sup: object = None
    addresses: dict[str, str] = field(default_factory=dict)
    channels: dict[str, grpc.Channel] = field(default_factory=dict)
    good: dict = field(default_factory=dict)  # name -> tensor: the checkpoint's weights
    vocab: int = 0
    greedy: dict[str, list] = field(default_factory=dict)  # the greedy tokens before fuzzing
    episodes: dict = field(default_factory=dict)  # kind -> the expert's episode and its score before fuzzing
    _experts: dict = field(default_factory=dict)

    def start(self) -> Stack:
        from flows.processes import Supervisor, start_env_worker, start_instances, start_relay, start_router
        from flows.reward_pool import RewardPoolController
        from services.common.config import load_config, write_config
        from services.policy.model import load_policy

        self.workdir.mkdir(parents=True, exist_ok=True)
        cfg = load_config(ROOT / "deploy/configs/smoke.yaml", OVERRIDES)
        config = self.workdir / "config.json"
        write_config(cfg, config)
        self.sup = Supervisor(self.workdir)
        relay, _ = start_relay(self.sup, self.workdir, "relay", keep=2, shm=True, max_message_mb=MESSAGE_MB)
        [sgs] = start_instances(self.sup, self.workdir, str(self.checkpoint), 1, threads=1, config=config,
                                relays=[relay])
        router = start_router(self.sup, self.workdir, str(self.checkpoint), [sgs], config=config)
        env = start_env_worker(self.sup, self.workdir, "env-0", config=config)
        [reward] = RewardPoolController(self.sup, self.workdir, cfg, config=config).start()
        self.addresses = {"relay": relay, "sgs": sgs, "router": router, "env": env, "reward": reward}
        self.channels = {k: connect(a, max_message_bytes=64 << 20) for k, a in self.addresses.items()}
        policy = load_policy(self.checkpoint)
        self.good = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
        self.vocab = json.loads((self.checkpoint / "config.json").read_text())["vocab_size"]
        self.wait_healthy(120.0)
        ack = self.push_good()  # the relay's first version fixes its model fingerprint
        assert ack.committed, ack
        self.greedy = {s: self.generate_greedy(s) for s in ("sgs", "router")}
        self.episodes = {kind: self.play_expert_episode(kind) for kind in ENV_KINDS}
        return self

    def stop(self) -> None:
        for ch in self.channels.values():
            ch.close()
        if self.sup is not None:
            self.sup.stop_all()

    # ------------------------------------------------------------ calls
    def call(self, service: str, method: str, request, timeout_s: float = CALL_TIMEOUT_S):
        """Send ``request`` (a message, a list of messages for a request stream, or raw bytes /
        a list of them) and return (status name, details, reply or replies)."""
        path = f"/{SERVICE_NAME[service]}/{method}"
        ch = self.channels[service]
        ser = lambda m: m if isinstance(m, bytes) else m.SerializeToString()  # noqa: E731
        try:
            if method in STREAM_REQUEST:
                reply = ch.stream_unary(path, request_serializer=ser)(iter(request), timeout=timeout_s)
            elif method in STREAM_REPLY:
                reply = list(ch.unary_stream(path, request_serializer=ser)(request, timeout=timeout_s))
            else:
                reply = ch.unary_unary(path, request_serializer=ser)(request, timeout=timeout_s)
        except grpc.RpcError as err:
            return err.code().name, err.details() or "", None
        return OK, "", reply

    def good_transfer(self, version: int) -> pb.TransferRequest:
        from services.common.weights import manifest_of
        from services.weights.convert import manifest_to_pb

        return pb.TransferRequest(direction="push",
                                  manifest=manifest_to_pb(manifest_of(self.good, CHUNK_BYTES), version),
                                  sender="fuzz")

    def health(self, service: str):
        code, details, raw = self.call(service, "Health", pb.HealthRequest())
        if code != OK:
            raise AssertionError(f"{service} Health answered {code}: {details}")
        return HEALTH_REPLY[service].FromString(raw)

    def relay_versions(self) -> pb.VersionsReply:
        code, details, raw = self.call("relay", "Versions", pb.VersionsRequest())
        if code != OK:
            raise AssertionError(f"relay Versions answered {code}: {details}")
        return pb.VersionsReply.FromString(raw)

    def check_alive(self) -> None:
        """Every process runs and answers (raises ``ServiceDied`` / ``AssertionError``)."""
        self.sup.check()
        for service in ("sgs", "router", "env", "reward"):
            self.health(service)
        self.relay_versions()

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.check_alive()
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def newest(self, service: str) -> int:
        """The newest weight version ``service`` holds (installed, staged, committed or arriving)."""
        if service == "relay":
            v = self.relay_versions()
            held = [v.latest, *(i.version for i in v.versions)]
        else:
            h = self.health(service)
            held = [h.weight_version, h.pending_version]
        return max(x for x in held if x <= NEWEST_CAP)  # an arriving int64-max version (never committed) aside

    def next_version(self, service: str) -> int:
        """A version newer than any ``service`` holds (the router's fan-out reaches the SGS too)."""
        if service == "relay":
            return self.newest("relay") + 1
        return max(self.newest("sgs"), self.newest("router")) + 1

    def resolve(self, service: str, version: tuple[str, int]) -> int:
        kind, value = version
        if kind == "abs":
            return value
        return max(-(2**63), min(2**63 - 1, self.newest(service) + value))

    # ------------------------------------------------------------ good inputs
    def good_chunks(self, version: int) -> list[pb.WeightChunk]:
        from services.common.weights import iter_chunks
        from services.generation.convert import chunk_to_pb

        return [chunk_to_pb(c) for c in iter_chunks(self.good, version, CHUNK_BYTES)]

    def good_push(self, version: int) -> list[pb.PushMessage]:
        from services.common.weights import manifest_of
        from services.weights.convert import manifest_to_pb

        chunks = self.good_chunks(version)
        head = pb.PushMessage(manifest=manifest_to_pb(manifest_of(self.good, CHUNK_BYTES), version), part=0, parts=1,
                              sender="fuzz")
        return [head, *(pb.PushMessage(chunk=c) for c in chunks), pb.PushMessage(version_digest=chunks[-1].digest)]

    def push_good(self) -> pb.PushAck:
        version = self.next_version("relay")
        code, details, raw = self.call("relay", "Push", self.good_push(version))
        if code != OK:
            raise AssertionError(f"a good push of version {version} was refused: {code} {details}")
        return pb.PushAck.FromString(raw)

    def generate_greedy(self, service: str) -> list[tuple[str, list[int]]]:
        req = pb.GenerateRequest(
            prompts=[pb.Prompt(prompt_id=f"g{i}", token_ids=[1 + i, 5, 6, 7]) for i in range(3)],
            samples_per_prompt=1, max_new_tokens=8, temperature=1e-6,
        )
        code, details, raw = self.call(service, "Generate", req, timeout_s=60.0)
        if code != OK:
            raise AssertionError(f"{service}: a good Generate answered {code}: {details}")
        return sorted((s.prompt_id, list(s.token_ids)) for s in map(pb.Sample.FromString, raw))

    def _reset(self, kind: str) -> pb.ResetReply:
        code, details, raw = self.call("env", "Reset", pb.ResetRequest(kind=kind, seed=self.expert(kind)[0]))
        if code != OK:
            raise AssertionError(f"env: a good Reset of {kind} answered {code}: {details}")
        return pb.ResetReply.FromString(raw)

    def _step(self, request: pb.StepRequest) -> pb.StepReply:
        code, details, raw = self.call("env", "Step", request)
        if code != OK:
            raise AssertionError(f"env: a good Step answered {code}: {details}")
        return pb.StepReply.FromString(raw)

    def expert(self, kind: str) -> tuple[int, list[str]]:
        """The first episode of environment ``kind`` from seed ``EPISODE_SEED`` on whose expert takes
        two turns or more: (seed, the expert's turns)."""
        if kind not in self._experts:
            from services.agentic.registry import ENVIRONMENTS
            from services.common.config import load_config

            env = ENVIRONMENTS[kind].from_config(load_config(ROOT / "deploy/configs/smoke.yaml").agentic)
            seed = EPISODE_SEED
            while env.reset(seed) and len(env.expert()) < 2:
                seed += 1
            self._experts[kind] = (seed, env.expert())
        return self._experts[kind]

    def open_session(self, kind: str, steps: int = 0) -> str:
        """A fresh session of ``kind`` on the environment worker, ``steps`` expert turns in."""
        session = self._reset(kind).session_id
        for turn, action in enumerate(self.expert(kind)[1][:steps]):
            self._step(pb.StepRequest(session_id=session, turn=turn, action=action))
        return session

    def play_expert_episode(self, kind: str) -> dict:
        """An expert's episode of ``kind`` through the environment worker, scored by the reward worker:
        the transcript, the rewards and the score (what the fuzzing must not change)."""
        opened = self._reset(kind)
        seed, actions = self.expert(kind)
        replies = [self._step(pb.StepRequest(session_id=opened.session_id, turn=t, action=a))
                   for t, a in enumerate(actions)]
        code, details, _ = self.call("env", "Close", pb.CloseRequest(session_id=opened.session_id))
        assert code == OK, f"env: a good Close answered {code}: {details}"
        episode = {"kind": kind, "seed": seed, "prompt": opened.observation, "actions": actions,
                   "observations": [r.observation for r in replies], "rewards": [r.reward for r in replies],
                   "done": [r.done for r in replies]}
        code, details, raw = self.call("reward", "Score", self.transcript(episode))
        if code != OK:
            raise AssertionError(f"reward: a good Score of {kind} answered {code}: {details}")
        episode["score"] = pb.ScoreReply.FromString(raw).reward
        assert episode["done"][-1] and episode["score"] == 1.0, (
            f"the expert's {kind} episode did not succeed: {episode}"
        )
        return episode

    @staticmethod
    def transcript(episode: dict) -> pb.ScoreRequest:
        return pb.ScoreRequest(request_id="expert", task=episode["kind"], seed=episode["seed"],
                               prompt=episode["prompt"], actions=episode["actions"],
                               observations=episode["observations"])

    # ------------------------------------------------------------ nothing lost
    def check_nothing_lost(self) -> dict:
        """Every version the relay holds is the good weights byte-exact; a fresh version goes in
        and out; the SGS and the router generate the same greedy tokens as before the fuzzing."""
        import torch

        from services.weights.client import RelayClient

        self.call("relay", "SetChain", pb.ChainRequest(epoch=2**64 - 1))  # undo any fuzzed forwarding plan
        self.check_alive()
        ack = self.push_good()
        assert ack.committed, f"the relay did not commit a good version: {ack}"
        held = [v.version for v in self.relay_versions().versions if v.complete]
        assert ack.version in held, (ack.version, held)
        for data_path in ("tcp", "grpc"):
            client = RelayClient(self.addresses["relay"], data_path=data_path, max_message_mb=MESSAGE_MB)
            try:
                for v in held:
                    pulled = client.pull(v, allow_shm=data_path == "tcp")
                    bad = [k for k in self.good if not torch.equal(pulled.state[k], self.good[k])]
                    assert not bad, f"relay version {v} ({data_path}) differs from the good weights in {bad[:3]}"
            finally:
                client.close()
        for service in ("sgs", "router"):  # a good update is still taken
            version = self.next_version(service)
            code, details, _ = self.call(service, "UpdateWeights", self.good_chunks(version))
            assert code == OK, f"{service}: a good UpdateWeights of version {version} answered {code}: {details}"
        code, details, _ = self.call("sgs", "PullWeights", pb.PullWeightsRequest(version=-1))
        assert code == OK, f"sgs: PullWeights(-1) answered {code}: {details}"
        for service in ("sgs", "router"):
            got = self.generate_greedy(service)
            assert got == self.greedy[service], f"{service}: greedy tokens changed: {got} != {self.greedy[service]}"
        for kind in ENV_KINDS:
            episode = self.play_expert_episode(kind)
            assert episode == self.episodes[kind], (
                f"the expert's {kind} episode changed: {episode} != {self.episodes[kind]}"
            )
        return {"relay_versions_checked": len(held), "greedy_unchanged": True, "episode_unchanged": True}
