"""Which checkpoint protocol a Gym server speaks, found by asking it (once per server).

``GET /ng-control/v1/checkpoint/status`` answering 200 means the server has the v2 routes (the
status says the participant's kind); 404 or 405 means it has none, so it is spoken to with the
agent-checkpoint routes (``/ng-control/v1/agent-checkpoint/*``). A server with both (ours under
``gym serve --protocol both``) is spoken to with the agent-checkpoint routes: they keep every
reply until it is ACKed, and its ``/run`` honours the (ext) ``replay_only`` only there. Such a
server says so in its v2 status ((ext) ``agent_checkpoint: true``); a server that does not is
asked for its agent-checkpoint status: 200 means it has those routes too, 404/405 that it has not.
Anything else is raised as the typed error it is (a 401 means a server that refuses our token:
no fallback would help).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rl_gym_actors.errors import GymError
from rl_gym_actors.gym.answers import ok
from rl_gym_actors.gym.transport import GymTransport
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.wire import StatusAnswer
from rl_gym_actors.protocol import CONTROL_PREFIX

AGENT_CHECKPOINT_FLAG = "agent_checkpoint"  # (ext) in a v2 status: the server has both


class CheckpointProtocol(StrEnum):
    V2 = "v2"  # /ng-control/v1/checkpoint/*
    AGENT = "agent"  # /ng-control/v1/agent-checkpoint/*


@dataclass(frozen=True, slots=True)
class Discovered:
    protocol: CheckpointProtocol  # the protocol to speak to the server
    status: StatusAnswer | None = None  # the v2 status, when the server has the v2 routes

    @property
    def kind(self) -> str | None:
        """The v2 participant's kind (environment, model, agent, resources); None without v2."""
        return None if self.status is None else self.status.kind

    @property
    def both(self) -> bool:
        """The server has both route sets (spoken to with the agent-checkpoint ones)."""
        return self.protocol is CheckpointProtocol.AGENT and self.status is not None


async def discover_protocol(gym: GymTransport, *, deadline_ts: float) -> Discovered:
    """The protocol ``gym``'s server speaks (see the module docstring)."""
    try:
        status = await V2Client(gym).status(deadline_ts=deadline_ts)
    except GymError as exc:
        if exc.status in (404, 405):
            return Discovered(CheckpointProtocol.AGENT)
        raise
    if (status.model_extra or {}).get(AGENT_CHECKPOINT_FLAG) is True:
        return Discovered(CheckpointProtocol.AGENT, status)
    answer = await gym._send(
        "GET", CONTROL_PREFIX + "/status", control=True, deadline_ts=deadline_ts
    )
    if answer.status in (404, 405):
        return Discovered(CheckpointProtocol.V2, status)
    ok(answer)  # any other refusal raised as the typed error it is
    return Discovered(CheckpointProtocol.AGENT, status)
