"""One row's way to a rollout actor and back: :class:`RowRunner`.

A row leases a slot of the warm pool, travels to its rollout actor in the next chunk
(:class:`~rl_gym_actors.actors.chunks.ChunkSender`), and comes back as an
:class:`~rl_gym_actors.outcome.Outcome`; a rollout actor that dies or raises becomes a failed
outcome, never an exception. The item carries how its dispatch ended (``news``, ``lost``) to
the stream, which tells the rollout memory. A
:class:`Batch` is the rows of one stream: with ``fail_fast`` its first failed row stops it
(:meth:`RowRunner.stop`): every running rollout is abandoned, rows still waiting for a slot are
never dispatched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ray.exceptions import RayActorError, RayTaskError

from rl_gym_actors.actors.chunks import ChunkSender
from rl_gym_actors.actors.ledger_client import LedgerClient
from rl_gym_actors.actors.messages import RolloutTask
from rl_gym_actors.actors.pool import WarmPool
from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.errors import ConfigError, LedgerLost, RlGymError
from rl_gym_actors.failures import FailureKind, failure_kind
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.rows import RowItem

logger = logging.getLogger(__name__)

CALL_SLACK_S = 30.0  # a ledger call may take this much beyond its own deadline


@dataclass
class Batch:
    """The rows of one stream: those waiting for a slot, those running, abandons sent."""

    fail_fast: bool
    stopped: bool = False
    waiting: dict[str, asyncio.Task] = field(default_factory=dict)
    running: dict[str, tuple[Any, int]] = field(default_factory=dict)  # rid -> (handle, first)
    abandons: list[Any] = field(default_factory=list)


class UnackedCount:
    """Sealed results Gym holds un-ACKed until the next checkpoint; a warning at ``threshold``
    and at each doubling of it."""

    def __init__(self, threshold: int, ack: str) -> None:
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1:
            raise ConfigError(f"warn_unacked must be an int >= 1, got {threshold!r}")
        self.threshold = threshold
        self.ack = ack
        self.count = 0
        self.by_endpoint: dict[str, int] = {}  # of ``count``, per server URL
        self._warned_at = 0

    def add(self, n: int, endpoint: str = "") -> None:
        self.count += n
        if endpoint:
            self.by_endpoint[endpoint] = self.by_endpoint.get(endpoint, 0) + n
        if self.count >= max(self.threshold, 2 * self._warned_at):
            self._warned_at = self.count
            logger.warning(
                "%d sealed results are held un-ACKed on Gym since the last checkpoint (ack=%r): "
                "Gym keeps each in memory until a checkpoint releases it. Call "
                "Orchestrator.checkpoint() more often, or pass ack='on_seal' to release each "
                "result at once (a crash then loses the results since the last checkpoint).",
                self.count,
                self.ack,
            )

    def reset(self) -> None:
        """A checkpoint committed: Gym released what it held."""
        self.count = self._warned_at = 0
        self.by_endpoint.clear()


class RowRunner:
    """Runs rows on the warm pool's rollout actors (on the orchestrator's loop)."""

    def __init__(
        self,
        pool: WarmPool,
        chunks: ChunkSender,
        ledger: LedgerClient,
        unacked: UnackedCount,
        endpoints: Sequence[GymEndpoint],
    ) -> None:
        self.pool = pool
        self._chunks = chunks
        self._ledger = ledger
        self._unacked = unacked
        self._endpoints = endpoints

    async def run(self, item: RowItem, batch: Batch, bar: Any) -> Outcome:
        """The row's outcome (its ready one, or its rollout's); ticks ``bar`` if any."""
        outcome = item.ready
        if outcome is None:
            try:
                outcome = await self._dispatch(item, batch)
            except asyncio.CancelledError:
                if not batch.stopped or item.rollout_id in batch.running:
                    raise
                outcome = not_dispatched(item, self._endpoints)
        if bar is not None:
            bar.update(outcome.status, adopted=outcome.adopted)
        return outcome

    def stop(self, batch: Batch) -> None:
        """fail_fast: abandon what runs; rows still waiting for a slot are never dispatched."""
        if batch.stopped:
            return
        batch.stopped = True
        for task in list(batch.waiting.values()):
            task.cancel()
        for rid, (handle, first) in list(batch.running.items()):
            batch.abandons.append(handle.abandon.remote(rid, first))

    async def _dispatch(self, item: RowItem, batch: Batch) -> Outcome:
        rid = item.rollout_id
        async with self.pool.lease(rid) as slot:
            batch.waiting.pop(rid, None)
            if batch.stopped:
                return not_dispatched(item, self._endpoints)
            batch.running[rid] = (slot.handle, item.first_attempt)
            try:
                if item.plan.lost_from is not None:
                    item.previous_attempt = await self._learn_current(item)
                task = RolloutTask(
                    item.row, rid, item.endpoint_index, item.first_attempt, item.previous_attempt
                )
                outcome = await self._chunks.run(slot.handle, task)
            except asyncio.CancelledError:
                # the caller gave up on the batch: the rollout retires its try on its own
                slot.handle.abandon.remote(rid, item.first_attempt)
                item.lost = True
                raise
            except RayActorError as exc:
                item.lost = True
                await self.pool.actor_failed(slot, exc)
                outcome = self._failed(
                    item,
                    f"rollout actor {slot.name} died: {type(exc).__name__}",
                    FailureKind.ACTOR_DIED,
                )
            except (RayTaskError, RlGymError) as exc:
                cause = (
                    exc.cause
                    if isinstance(exc, RayTaskError) and isinstance(exc.cause, BaseException)
                    else exc
                )
                outcome = self._failed(
                    item, f"rollout actor {slot.name} raised: {cause!r}", failure_kind(cause)
                )
            else:
                item.news = outcome
                if outcome.has_result and not outcome.acked:
                    self._unacked.add(1, self._endpoints[item.endpoint_index].url)
            finally:
                batch.running.pop(rid, None)
        if outcome.status == "failed" and batch.fail_fast:
            self.stop(batch)
        return outcome

    async def _learn_current(self, item: RowItem) -> int | None:
        """A rollout whose actor died (LOST): the ledger knows which try was current (the dead
        actor's reports reached it); that try is the one to retire, and adopt if it finished."""
        rid = item.rollout_id
        try:
            current = await self._ledger.current_attempt(rid, timeout_s=CALL_SLACK_S)
        except (LedgerLost, RayTaskError) as exc:
            logger.warning(
                "ledger did not say the current try of %s (%r): retiring try %s",
                rid,
                exc,
                item.previous_attempt,
            )
            return item.previous_attempt
        return item.plan.retire_given(current)

    def _failed(self, item: RowItem, reason: str, failure: FailureKind) -> Outcome:
        return Outcome(
            rollout_id=item.rollout_id,
            status="failed",
            attempt_index=item.first_attempt,
            endpoint=self._endpoints[item.endpoint_index].url,
            reason=reason,
            failure=failure,
        )


def not_dispatched(item: RowItem, endpoints: Sequence[GymEndpoint]) -> Outcome:
    """The outcome of a row that a stopped batch never dispatched."""
    return Outcome(
        rollout_id=item.rollout_id,
        status="abandoned",
        endpoint=endpoints[item.endpoint_index].url,
        reason="batch stopped (fail_fast) before this row was dispatched",
        failure=FailureKind.ABANDONED,
    )
