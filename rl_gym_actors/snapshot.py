"""What :meth:`Orchestrator.snapshot <rl_gym_actors.orchestrator.Orchestrator.snapshot>` answers:
the outcomes the driver received, the ledger's snapshot (taken after every rollout actor has
delivered its pending reports, so a batch that returned shows nothing running), the pool's, each
endpoint's checkpoint protocol, and the rollout actors' counters summed over the live pool."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from rl_gym_actors.actors.ledger_client import LedgerClient
from rl_gym_actors.actors.pool import PoolSnapshot, WarmPool
from rl_gym_actors.actors.rollout_counters import RolloutActorSnapshot, RolloutCounters
from rl_gym_actors.core.attempt_book import LedgerSnapshot
from rl_gym_actors.core.rollout_memory import RolloutMemory
from rl_gym_actors.received import Received, ReceivedCounts


class ActorTotals(RolloutCounters):
    """The rollout actors' counters, summed over the actors alive now (what a dead actor
    counted is gone with it: :attr:`OrchestratorSnapshot.received` is what the driver got).
    ``acks`` counts the ACKs the actors sent themselves (``ack="on_seal"``); the checkpoint
    gate's ACKs are the ledger's (each endpoint's ``acked``)."""

    actors: int = 0

    @classmethod
    def of(cls, answers: Sequence[object]) -> ActorTotals:
        """The sum over the actors that answered with a snapshot (the others are skipped)."""
        alive = [a for a in answers if isinstance(a, RolloutActorSnapshot)]
        sums = {n: sum(getattr(a, n) for a in alive) for n in RolloutCounters.model_fields}
        return cls(actors=len(alive), **sums)


class OrchestratorSnapshot(BaseModel):
    """The outcomes the driver received, the ledger's snapshot, the pool's, and the rollout
    actors' counters. ``protocols``: each endpoint's checkpoint protocol by URL (``"agent"`` or
    ``"v2"``; an endpoint not yet asked is missing). On a v2 endpoint, which has no ACK, the
    ledger's ``acked`` counts results Gym forgot at a committed checkpoint and
    ``completed_unacked`` the sealed results not yet forgotten."""

    model_config = ConfigDict(frozen=True)

    orchestrator_id: str
    received: ReceivedCounts = ReceivedCounts()
    ledger: LedgerSnapshot
    pool: PoolSnapshot
    actors: ActorTotals
    known_rollouts: int
    in_flight: int
    protocols: dict[str, str] = {}

    @classmethod
    async def take(
        cls,
        orchestrator_id: str,
        pool: WarmPool,
        ledger: LedgerClient,
        memory: RolloutMemory,
        received: Received,
        timeout_s: float,
    ) -> OrchestratorSnapshot:
        """Ask every rollout actor of ``pool`` to deliver its pending reports (within
        ``timeout_s``), then the ledger and the actors (one that does not answer is left out of
        the totals)."""
        handles = list(pool.handles.values())
        with contextlib.suppress(Exception):  # a dead actor or ledger: the book as it stands
            flushes = [h.flush_reports.remote() for h in handles]
            await asyncio.wait_for(asyncio.gather(*flushes, return_exceptions=True), timeout_s)
        book = await ledger.snapshot(timeout_s=timeout_s)
        refs = [h.snapshot.remote() for h in handles]
        answers = await asyncio.gather(*refs, return_exceptions=True)
        protocols: dict[str, str] = {}
        with contextlib.suppress(Exception):  # unknown: the summary names no protocol
            protocols = await ledger.protocols(timeout_s=timeout_s)
        return cls(
            orchestrator_id=orchestrator_id,
            received=received.counts(),
            protocols=protocols,
            ledger=book,
            pool=pool.snapshot(),
            actors=ActorTotals.of(answers),
            known_rollouts=len(memory),
            in_flight=memory.in_flight,
        )

    def __str__(self) -> str:  # print(): a summary (observe.snapshot_summary), no actor names
        from rl_gym_actors.observe import snapshot_summary

        return snapshot_summary(self)

    __repr__ = __str__
