"""The gateway as a running server: uvicorn on its own thread and event loop (port 0 picks a free
one), the SGS behind it through ``SgsGenerator`` (the agentic rollouts' client: an instance per
session kept while it has room, a lost instance's turn re-run elsewhere)."""

from __future__ import annotations

import threading
import time

import uvicorn

from services.gateway.app import Backend, GatewaySettings, Generated, create_app
from services.gateway.sessions import Session, Sessions


def sgs_backend(generator) -> Backend:
    """Turns through ``services.agentic.runner.SgsGenerator`` (its ``generate`` coroutine)."""

    async def generate(session: Session, request_id: str, prompt: tuple[int, ...], max_new_tokens: int) -> Generated:
        turn = len(session.transcript.calls)
        sample = await generator.generate(f"{session.id}/t{turn}", prompt, max_new_tokens,
                                          min_version=session.min_version, task=session.task)
        return Generated(tuple(sample.token_ids), tuple(sample.logprobs), sample.weight_version, sample.finish_reason)

    return generate


class GatewayServer:
    """``start()`` serves ``create_app(...)`` at ``host``:``port``; ``url`` is the agents' base URL
    (``http://host:port/v1``); ``stop()`` ends it."""

    def __init__(self, sessions: Sessions, backend: Backend, settings: GatewaySettings, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        config = uvicorn.Config(create_app(sessions, backend, settings), host=host, port=port, log_level="warning",
                                lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="gateway", daemon=True)
        self.host, self.port = host, port

    def start(self, timeout_s: float = 30.0) -> GatewayServer:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)
