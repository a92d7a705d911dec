"""Which checkpoint protocol a Gym server speaks, found by asking it (once per server).

``GET /ng-control/v1/checkpoint/status`` answering 200 means v2 (the status says the
participant's kind); 404 or 405 means the server has no v2 routes, so it is spoken to with the
agent-checkpoint routes (``/ng-control/v1/agent-checkpoint/*``). Anything else is raised as the
typed error it is (a 401 means a v2 server that refuses our token: no fallback would help).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rl_gym_actors.errors import GymError
from rl_gym_actors.gym.transport import GymTransport
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.wire import StatusAnswer


class CheckpointProtocol(StrEnum):
    V2 = "v2"  # /ng-control/v1/checkpoint/*
    AGENT = "agent"  # /ng-control/v1/agent-checkpoint/*


@dataclass(frozen=True, slots=True)
class Discovered:
    protocol: CheckpointProtocol
    status: StatusAnswer | None = None  # the v2 status that decided it

    @property
    def kind(self) -> str | None:
        """The v2 participant's kind (environment, model, agent, resources); None on agent."""
        return None if self.status is None else self.status.kind


async def discover_protocol(gym: GymTransport, *, deadline_ts: float) -> Discovered:
    """The protocol ``gym``'s server speaks (see the module docstring)."""
    try:
        status = await V2Client(gym).status(deadline_ts=deadline_ts)
    except GymError as exc:
        if exc.status in (404, 405):
            return Discovered(CheckpointProtocol.AGENT)
        raise
    return Discovered(CheckpointProtocol.V2, status)
