"""Gym's memory is checked, not assumed: :func:`vanished_results`.

A Gym server that restarts on an empty state dir (or without one) forgets every result it held.
The ledger's book knows which sealed results each endpoint must still hold (sealed, not yet
ACKed); at a checkpoint the gate compares them with the endpoint's listing before it releases
anything. A result the listing lacks is asked for by key: ACKed meanwhile (its owner's report
not yet folded) is fine; unknown or tombstoned (lost in a restart) means the server lost it.
Any other answer is no verdict. Our server also reports a store epoch (:func:`epoch_change`):
a change means it forgot what it held, even when the book had nothing sealed there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from rl_gym_actors.core.attempt_book import AttemptBook
from rl_gym_actors.core.attempt_reports import AttemptState
from rl_gym_actors.core.prepare_plan import gym_attempts
from rl_gym_actors.errors import GymError, GymUnavailable, StaleAttempt, UnknownExecution
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.listing import GymListing
from rl_gym_actors.protocol import ExecutionState, StatusReport

logger = logging.getLogger(__name__)

CONCURRENCY = 16
_COMPLETED = ExecutionState.COMPLETED.value


async def vanished_results(
    book: AttemptBook,
    client: GymClient,
    status: StatusReport | GymListing,
    deadline_ts: float,
    *,
    released: Callable[[tuple[str, int]], None] | None = None,
) -> list[tuple[str, int]]:
    """The sealed, un-ACKed results of the book that the endpoint no longer holds. One Gym
    answers ACKed is recorded ACKed (its owner's report is on its way), or handed to
    ``released`` when given (a gate of this checkpoint before this one released it)."""
    url = client.endpoint.url
    sealed = book.sealed_unacked(url)
    if not sealed:  # (the listing is read only when the book holds results there)
        return []
    attempts = gym_attempts(status)
    candidates = [key for key in sealed if key not in attempts or attempts[key].state != _COMPLETED]
    if not candidates:
        return []
    limit = asyncio.Semaphore(CONCURRENCY)

    async def lost(key: tuple[str, int]) -> bool:
        async with limit:
            try:
                answer = await client.receipt(key[0], key[1], deadline_ts=deadline_ts)
            except (UnknownExecution, StaleAttempt):
                return True
            except (GymError, GymUnavailable) as exc:  # no verdict
                logger.debug("receipt %s on %s: %r", key, url, exc)
                return False
        if answer.state == "acknowledged":
            if released is not None:
                released(key)
            else:  # its owner ACKed it; the report comes
                book.record(url, key[0], key[1], AttemptState.ACKED)
        return False

    answers = await asyncio.gather(*(lost(k) for k in candidates))
    return [k for k, gone in zip(candidates, answers, strict=True) if gone]


async def epoch_change(client: GymClient, deadline_ts: float) -> tuple[str, str] | None:
    """``(first, now)`` when the endpoint's (ext) store epoch changed since the client first saw
    it (the server forgot what it held); None when unchanged, unreported (a real Gym) or not
    readable now (no verdict)."""
    try:
        return await client.epoch_change(deadline_ts=deadline_ts)
    except (GymError, GymUnavailable) as exc:  # no verdict
        logger.debug("store epoch on %s: %r", client.endpoint.url, exc)
        return None
