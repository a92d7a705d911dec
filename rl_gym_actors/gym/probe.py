"""Before any row runs: is each Gym endpoint there, and does it take our control token?

:func:`probe_endpoints` asks every endpoint which checkpoint protocol it speaks (the v2 status
route, :mod:`rl_gym_actors.gym.v2.discover`) and, on an agent-checkpoint server, for its
participant status under a checkpoint id no checkpoint ever uses (both are control routes, so the
bearer token is checked), and raises
:class:`~rl_gym_actors.errors.EndpointCheckFailed` naming the first endpoint that is down, refuses
the token, or answers something that is no status. A server held by another checkpoint passes
with a warning naming the holder: admission reopens when it resumes, and rows wait for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.errors import CheckpointConflict, EndpointCheckFailed, RlGymError
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.discover import CheckpointProtocol, discover_protocol

logger = logging.getLogger(__name__)

PROBE_S = 10.0


async def probe_endpoint(endpoint: GymEndpoint, *, timeout_s: float = PROBE_S) -> None:
    """Raise EndpointCheckFailed unless ``endpoint`` answers a status with our token."""
    probe_id = f"rlga-probe-{uuid.uuid4().hex[:16]}"
    async with GymClient(endpoint, control_limit=1) as client:
        deadline_ts = time.time() + timeout_s
        try:
            found = await discover_protocol(client, deadline_ts=deadline_ts)
            if found.protocol is CheckpointProtocol.AGENT:
                status = await client.status(probe_id, deadline_ts=deadline_ts)
                if status.state != "accepting":
                    caps = await client.capabilities(deadline_ts=deadline_ts)
                    _held(endpoint, caps.active_checkpoint_id if caps is not None else None)
        except CheckpointConflict as exc:
            # the server answers and takes our token; another checkpoint holds it (a driver
            # that died, another run): start, and say who holds it
            _held(endpoint, exc.active_checkpoint_id)
        except RlGymError as exc:
            raise EndpointCheckFailed(
                f"Gym endpoint {endpoint.label} failed its start check: {type(exc).__name__}: "
                f"{exc}",
                endpoint=endpoint.url,
                error=type(exc).__name__,
            ) from exc


def _held(endpoint: GymEndpoint, holder: str | None) -> None:
    holder = holder or "unknown"
    logger.warning(
        "Gym endpoint %s is held by checkpoint %s: rows wait for admission until it resumes, "
        "its lease lapses, or `rl-gym-actors gym abort %s --checkpoint-id %s`",
        endpoint.label,
        holder,
        endpoint.url,
        holder,
    )


async def probe_endpoints(endpoints: Sequence[GymEndpoint], *, timeout_s: float = PROBE_S) -> None:
    """Probe every endpoint at once; raise for the first (in the given order) that fails."""
    results = await asyncio.gather(
        *(probe_endpoint(e, timeout_s=timeout_s) for e in endpoints), return_exceptions=True
    )
    for result in results:
        if isinstance(result, BaseException):
            raise result
