"""A checkpoint whose gate committed, asked for again: the report, not ``stale_checkpoint``.

The agent-checkpoint gate commits on every endpoint, then resumes each, which spends the id on
Gym. A ledger killed after that resume and before its answer reached the orchestrator is
restarted by Ray, and Ray sends the same checkpoint call again: Gym now refuses the spent id,
and a book rebuilt from the rollout actors still holds as sealed the results that commit
released (Gym forgot them with the commit), so the next checkpoint would count them lost.

So, once every commit answered and before the first resume, the gate writes its report beside
the checkpoint's part (:class:`GateReports`, given by the orchestrator, which owns the part's
files). A gate of the same id and dir that finds it (:func:`finish_again`) does not prepare
again: it resumes every endpoint (a spent id is resumed already), settles in the book what the
commit released, and answers the stored report. What Gym no longer holds completed of the
book's sealed results was released by that commit: the gate that wrote the report found Gym
holding every one of them before it released (its phase 1 fails otherwise), and everything
completed while it ran was released with them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from rl_gym_actors.core.attempt_book import AttemptBook
from rl_gym_actors.core.checkpoint_report import CheckpointReport
from rl_gym_actors.core.prepare_plan import gym_attempts
from rl_gym_actors.errors import RlGymError, StaleCheckpoint
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.protocol import ExecutionState

logger = logging.getLogger(__name__)

_COMPLETED = ExecutionState.COMPLETED.value
SETTLE_ID = "rlga-settle"  # the status read after a spent id: any id not spent will do


class GateReports(Protocol):
    """Where a gate keeps its report between its commits and its resumes."""

    def write(self, checkpoint_dir: str, report: CheckpointReport) -> None:
        """Keep ``report`` durably beside the part under ``checkpoint_dir``."""

    def read(self, checkpoint_dir: str, checkpoint_id: str) -> CheckpointReport | None:
        """The report of ``checkpoint_id`` kept under ``checkpoint_dir`` (None: none)."""


def stored_for(
    reports: GateReports | None, checkpoint_dir: str, checkpoint_id: str, urls: Sequence[str]
) -> CheckpointReport | None:
    """The stored report of this id and dir when it names exactly these endpoints."""
    if reports is None:
        return None
    try:
        stored = reports.read(checkpoint_dir, checkpoint_id)
    except RlGymError as exc:  # unreadable: gate as if none were there
        logger.warning("checkpoint %s: its stored gate report: %r", checkpoint_id, exc)
        return None
    if stored is None or [e.endpoint for e in stored.endpoints] != list(urls):
        return None
    return stored


async def finish_again(
    book: AttemptBook,
    clients: Sequence[GymClient],
    checkpoint_id: str,
    deadline_ts: float,
) -> list[str]:
    """Resume every endpoint for ``checkpoint_id`` and settle what its commit released (see
    the module docstring); the endpoints whose resume failed (an error of theirs each)."""

    async def one(client: GymClient) -> str | None:
        url = client.endpoint.url
        try:
            await client.resume(checkpoint_id, deadline_ts=deadline_ts)
        except StaleCheckpoint:
            pass  # resumed before: spent
        except RlGymError as exc:
            return f"{url}: resume failed: {type(exc).__name__}: {exc}"
        try:
            listing = await client.listing(SETTLE_ID, deadline_ts=deadline_ts)
        except RlGymError as exc:  # the book keeps them; the next checkpoint looks again
            logger.warning("checkpoint %s: settling on %s: %r", checkpoint_id, url, exc)
            return None
        held = gym_attempts(listing)
        released = [
            key
            for key in book.sealed_unacked(url)
            if key not in held or held[key].state != _COMPLETED
        ]
        book.record_gate_acks(url, released)
        if released:
            logger.info(
                "checkpoint %s on %s: %d results its commit released settled after a restart",
                checkpoint_id,
                url,
                len(released),
            )
        return None

    answers = await asyncio.gather(*(one(c) for c in clients))
    return [a for a in answers if a is not None]
