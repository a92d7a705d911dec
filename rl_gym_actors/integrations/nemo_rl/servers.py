"""Gym servers the drop-in starts itself at ``_spinup``, as NeMo RL's ``NemoGym`` starts NeMo
Gym's: one per ``servers`` entry, each in a thread of the drop-in's actor with its own event
loop, on 127.0.0.1 and a free port, with a fresh control token.

The policy NeMo RL trains reaches the agents: NeMo RL passes ``base_urls`` (its vLLM servers'
OpenAI-compatible ``/v1`` URLs, one per data-parallel rank) and ``model_name``;
:class:`PolicyEndpoint` carries them, and a ``module:function`` agent whose function takes a
``policy`` argument is called as ``fn(row, policy=endpoint)``. An upstream ``http(s)://`` agent
gets the row alone: it calls whatever model it was started with, so point it at NeMo RL's
servers yourself (NeMo Gym's own agents read ``policy_base_url`` from their config).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import secrets
import threading
from dataclasses import dataclass
from typing import Any

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.gym.agents import Agent, load_callable, make_agent
from rl_gym_actors.integrations.nemo_rl.config import NemoRLSettings, ServerSpec

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
POLICY_API_KEY = "dummy_key"  # NeMo RL's vLLM servers take no key


@dataclass(frozen=True, slots=True)
class PolicyEndpoint:
    """The policy being trained: OpenAI-compatible ``base_urls`` (each ends in ``/v1``) and the
    served ``model_name``."""

    base_urls: tuple[str, ...]
    model_name: str | None
    api_key: str = POLICY_API_KEY

    @classmethod
    def from_settings(cls, nemo: NemoRLSettings) -> PolicyEndpoint:
        return cls(tuple(u.rstrip("/") for u in nemo.base_urls), nemo.model_name)

    def base_url_for(self, key: str) -> str:
        """One base URL per rollout, spread over the data-parallel ranks by ``key``."""
        if not self.base_urls:
            raise ConfigError("NeMo RL passed no base_urls: no policy to call")
        digest = hashlib.sha256(key.encode()).digest()
        return self.base_urls[int.from_bytes(digest[:4], "big") % len(self.base_urls)]


def agent_for(spec: ServerSpec, policy: PolicyEndpoint) -> Agent:
    """The server's agent; a ``module:function`` taking ``policy`` gets the endpoint."""
    if spec.agent.startswith(("http://", "https://")) or spec.agent == "simulated":
        return make_agent(spec.agent)
    agent = load_callable(spec.agent)
    target = inspect.unwrap(agent)
    try:
        takes_policy = "policy" in inspect.signature(target).parameters
    except (TypeError, ValueError):
        takes_policy = False
    if not takes_policy:
        return agent
    bound = functools.partial(target, policy=policy)
    if inspect.iscoroutinefunction(target):
        return bound

    async def threaded(row: dict[str, Any]) -> Any:  # a sync function: in a thread
        return await asyncio.to_thread(bound, row)

    return threaded


class _ServerThread:
    def __init__(self, spec: ServerSpec, agent: Agent) -> None:
        self.spec = spec
        self.agent = agent
        self.token = secrets.token_hex(16)
        self.server: Any = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, timeout_s: float) -> GymEndpoint:
        from rl_gym_actors.gym.agent_checkpoint.participant import Participant
        from rl_gym_actors.gym.server import GymServer
        from rl_gym_actors.gym.store import open_store

        ready = threading.Event()

        def serve() -> None:
            try:
                # named after its agent server: the participant NeMo RL resolves a row's
                # agent_ref to (PR #4093 refuses two participants of one name)
                participant = Participant(
                    self.agent, open_store(self.spec.state_dir), name=self.spec.name
                )
                extensions = []
                if self.spec.allow_faults:
                    from rl_gym_actors.gym.agent_checkpoint.faults import (
                        FaultInjector,
                        fault_injection,
                    )

                    extensions.append(fault_injection(FaultInjector(), participant.knows))
                self.server = GymServer(
                    participant, token=self.token, host=HOST, port=0, extensions=extensions
                )
                asyncio.run(self.server.serve(on_ready=ready.set))
            except BaseException as exc:  # reported to start(), which raises it
                self._error = exc
            finally:
                ready.set()

        self._thread = threading.Thread(
            target=serve, name=f"rlga-gym-{self.spec.name}", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout_s) or self._error is not None or self.server is None:
            raise ConfigError(f"Gym server {self.spec.name!r} did not start: {self._error!r}")
        return GymEndpoint(url=self.server.url, token=self.token, name=self.spec.name)

    def stop(self, timeout_s: float) -> None:
        if self.server is not None:
            self.server.stop()
        if self._thread is not None:
            self._thread.join(timeout_s)


class OwnServers:
    """The Gym servers of one drop-in. ``start`` and ``stop`` block (call them in a thread)."""

    def __init__(self, specs: list[ServerSpec], policy: PolicyEndpoint) -> None:
        self.specs = specs
        self.policy = policy
        self._threads: list[_ServerThread] = []

    def start(self, timeout_s: float = START_TIMEOUT_S) -> list[GymEndpoint]:
        endpoints = []
        try:
            for spec in self.specs:
                thread = _ServerThread(spec, agent_for(spec, self.policy))
                self._threads.append(thread)
                endpoints.append(thread.start(timeout_s))
        except BaseException:
            self.stop()
            raise
        return endpoints

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        threads, self._threads = self._threads, []
        for thread in threads:
            thread.stop(timeout_s)
