"""What :meth:`Orchestrator.snapshot <rl_gym_actors.orchestrator.Orchestrator.snapshot>` answers:
the ledger's snapshot, the pool's, and the rollout actors' counters summed over the pool."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from rl_gym_actors.actors.ledger_client import LedgerClient
from rl_gym_actors.actors.pool import PoolSnapshot, WarmPool
from rl_gym_actors.actors.rollout_counters import RolloutActorSnapshot, RolloutCounters
from rl_gym_actors.core.attempt_book import LedgerSnapshot
from rl_gym_actors.core.rollout_memory import RolloutMemory


class ActorTotals(RolloutCounters):
    """The rollout actors' counters, summed over the pool."""

    actors: int = 0

    @classmethod
    def of(cls, answers: Sequence[object]) -> ActorTotals:
        """The sum over the actors that answered with a snapshot (the others are skipped)."""
        alive = [a for a in answers if isinstance(a, RolloutActorSnapshot)]
        sums = {n: sum(getattr(a, n) for a in alive) for n in RolloutCounters.model_fields}
        return cls(actors=len(alive), **sums)


class OrchestratorSnapshot(BaseModel):
    """The ledger's snapshot, the pool's, and the rollout actors' counters."""

    model_config = ConfigDict(frozen=True)

    orchestrator_id: str
    ledger: LedgerSnapshot
    pool: PoolSnapshot
    actors: ActorTotals
    known_rollouts: int
    in_flight: int

    @classmethod
    async def take(
        cls,
        orchestrator_id: str,
        pool: WarmPool,
        ledger: LedgerClient,
        memory: RolloutMemory,
        timeout_s: float,
    ) -> OrchestratorSnapshot:
        """Ask the ledger and every rollout actor of ``pool`` (one that does not answer is
        left out of the totals)."""
        book = await ledger.snapshot(timeout_s=timeout_s)
        refs = [h.snapshot.remote() for h in pool.handles.values()]
        answers = await asyncio.gather(*refs, return_exceptions=True)
        return cls(
            orchestrator_id=orchestrator_id,
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
