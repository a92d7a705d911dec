"""Aborting a checkpoint: resume its id on every Gym endpoint (:func:`abort_everywhere`).

On a Gym server resume is the abort: admission reopens and the id is spent. The ledger aborts
with its own clients; an orchestrator whose ledger is lost aborts with clients of its own
(:func:`abort_with_own_clients`), since freeing Gym needs no book.

A trainer killed inside its checkpoint (or a v2 restorer killed between restore and resume)
leaves that id holding the servers: admission closed until its lease lapses (never, on a Gym
without leases). The next trainer of the run knows the id
(:func:`~rl_gym_actors.checkpoint_part.own_open_ids`: the part it
restores from names it, or a newer part of the same run beside it; v2 restore ids carry the
run's :func:`~rl_gym_actors.config.restore_prefix`), so it resumes it at start, before any row
(``GateSelect.clear_own``): Gym takes work again at once and the first checkpoint commits
without waiting out the dead one. Another run's open checkpoint is never resumed: it is left to
its lease, and the checkpoint it blocks fails naming it (``active_checkpoint_id``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.errors import RlGymError
from rl_gym_actors.failures import FailureKind, failure_kind
from rl_gym_actors.gym.agent_checkpoint.client import GymClient

logger = logging.getLogger(__name__)


class EndpointAbort(BaseModel):
    """What a resume of the aborted id did on one endpoint. When it failed, ``failure`` is
    the typed kind (``connection_lost``, ``deadline_exceeded``, ``checkpoint_conflict``, ...)
    and ``error`` the exception in words; ``active_checkpoint_id`` names another id that holds
    the endpoint (the aborted one did not). ``checkpoint_id``: the id resumed, in the entries
    of :meth:`GateSelect.clear_own <rl_gym_actors.actors.gate_select.GateSelect.clear_own>`
    (one per server a dead trainer of this run left held)."""

    model_config = ConfigDict(frozen=True)

    endpoint: str
    resumed: bool
    checkpoint_id: str | None = None
    released: int = 0
    error: str | None = None
    failure: FailureKind | None = None
    active_checkpoint_id: str | None = None

    @classmethod
    def failed(
        cls, endpoint: str, exc: RlGymError, checkpoint_id: str | None = None
    ) -> EndpointAbort:
        """The entry of a resume that raised ``exc``."""
        return cls(
            endpoint=endpoint,
            resumed=False,
            checkpoint_id=checkpoint_id,
            error=f"{type(exc).__name__}: {exc}",
            failure=failure_kind(exc),
            active_checkpoint_id=getattr(exc, "active_checkpoint_id", None),
        )


class AbortReport(BaseModel):
    """:func:`abort_everywhere`'s answer, one entry per endpoint in the order given."""

    model_config = ConfigDict(frozen=True)

    checkpoint_id: str
    endpoints: list[EndpointAbort]

    @property
    def aborted(self) -> bool:
        """Every endpoint resumed the id (or had it spent already)."""
        return all(e.resumed for e in self.endpoints)


async def abort_everywhere(
    clients: Sequence[GymClient], checkpoint_id: str, deadline_ts: float
) -> AbortReport:
    """Resume ``checkpoint_id`` on every endpoint at once: on a Gym server resume is the abort
    (admission reopens, the id is spent); a repeated resume answers as the first did."""

    async def one(client: GymClient) -> EndpointAbort:
        url = client.endpoint.url
        try:
            answer = await client.resume(checkpoint_id, deadline_ts=deadline_ts)
        except RlGymError as exc:
            return EndpointAbort.failed(url, exc)
        return EndpointAbort(endpoint=url, resumed=True, released=answer.released)

    report = AbortReport(
        checkpoint_id=checkpoint_id,
        endpoints=list(await asyncio.gather(*(one(c) for c in clients))),
    )
    for e in report.endpoints:
        if not e.resumed:
            logger.warning(
                "abort of checkpoint %s on %s failed: %s", checkpoint_id, e.endpoint, e.error
            )
    return report


async def abort_with_own_clients(
    endpoints: Sequence[GymEndpoint], checkpoint_id: str, deadline_ts: float
) -> AbortReport:
    """:func:`abort_everywhere` with clients made for the call (and closed after it)."""
    clients = [GymClient(ep) for ep in endpoints]
    try:
        return await abort_everywhere(clients, checkpoint_id, deadline_ts)
    finally:
        for client in clients:
            await client.close()
