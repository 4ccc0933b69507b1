"""An agentic trainer's rollout when ``agentic.agent`` is set: the gateway serving the policy's SGS
instances, and one ``AgentManager`` per trajectory whose episode the user's agent plays."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from services.agentic.episodes import first_observation
from services.agentic.manager import Limits
from services.agentic.rollout import EnvScorer, Rollout, RolloutLoop
from services.agentic.runner import PolicyCodec
from services.gateway.app import GatewaySettings
from services.gateway.episodes import AgentEpisode, AgentManager, load_agent
from services.gateway.serve import GatewayServer, sgs_backend
from services.gateway.sessions import Sessions
from services.gateway.transcript import HFChatTokenizer


def agent_rollout(cfg, policy, generator, envs, executor) -> Rollout:
    """The gateway on ``agentic.gateway_host`` (a free port), the agent's episodes on a thread pool
    of their own (an agent holds its thread for the whole episode; the SGS calls its turns make run
    on ``executor``), rewards as the agent returned them."""
    a = cfg.agentic
    agent = load_agent(a.agent)
    sessions = Sessions(HFChatTokenizer(policy.tokenizer))
    settings = GatewaySettings(model=a.agent_model, max_context=a.max_context_tokens,
                               max_new_tokens=a.max_new_tokens_per_turn, temperature=cfg.generation.temperature,
                               eos_id=policy.eos_id)
    server = GatewayServer(sessions, sgs_backend(generator), settings, host=a.gateway_host).start()
    agents = ThreadPoolExecutor(max_workers=a.concurrency, thread_name_prefix="agent")

    def manager(trajectory_id: str, episode, min_version: int) -> AgentManager:
        prompt = first_observation(a, episode.kind, episode.seed)

        def describe(key: str) -> AgentEpisode:
            return AgentEpisode(server.url, key, a.agent_model, episode.kind, episode.seed, prompt, a.max_turns,
                                a.max_new_tokens_per_turn)

        return AgentManager(trajectory_id, episode.kind, episode.seed, agent=agent, sessions=sessions, episode=describe,
                            executor=agents, clock=time.time, min_version=min_version)

    def close() -> None:
        server.stop()
        agents.shutdown(wait=False, cancel_futures=True)

    return Rollout(loop=RolloutLoop(), generator=generator, envs=envs, codec=PolicyCodec(policy),
                   limits=Limits.from_config(a), scorer=EnvScorer("agent"), executor=executor, agents=manager,
                   on_close=[close])
