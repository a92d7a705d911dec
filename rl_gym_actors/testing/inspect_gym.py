"""What a Gym server holds for one key, read through its receipt route.

For tests, examples and benchmarks."""

from __future__ import annotations

import asyncio
import time

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.errors import NotCompleted, StaleAttempt, UnknownExecution
from rl_gym_actors.gym.agent_checkpoint.client import GymClient


async def key_state(
    client: GymClient, rollout_id: str, attempt_index: int, timeout_s: float = 5.0
) -> str:
    """One of ``completed``, ``acknowledged``, ``tombstoned``, ``running`` or ``unknown``."""
    try:
        answer = await client.receipt(
            rollout_id, attempt_index, deadline_ts=time.time() + timeout_s
        )
        return answer.state
    except StaleAttempt:
        return "tombstoned"
    except UnknownExecution:
        return "unknown"
    except NotCompleted:
        return "running"


def key_state_sync(endpoint: GymEndpoint, rollout_id: str, attempt_index: int) -> str:
    """:func:`key_state` from sync code: a fresh client on a fresh event loop."""

    async def go() -> str:
        async with GymClient(endpoint) as client:
            return await key_state(client, rollout_id, attempt_index)

    return asyncio.run(go())
