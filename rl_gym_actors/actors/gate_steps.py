"""One round of the gate's plan performed on one endpoint: :func:`perform_steps`.

The plan (:func:`~rl_gym_actors.core.prepare_plan.plan_endpoint`) says per attempt ADOPT (ask
its owner to seal and ACK it), RETIRE (tombstone it on Gym) or ORPHAN_ACK (ACK its completed
result, nobody will). The gate holds every ACK back (``hold_acks``) until all endpoints are ready
but for the results it will release, then releases them (:meth:`StepPerformer.release`): an ACK
cannot be taken back. Adopts and retires run first, concurrently (at most :data:`CONCURRENCY`
calls at a time; retires go :data:`RETIRE_CHUNK` keys per call to a server that offers the
(ext) ``retire-batch``, one call per key otherwise); what they turn into orphans joins the ACK
phase: receipts fetched where the status had none, then ACKed in chunks of :data:`ACK_CHUNK`,
:data:`ACKS_IN_FLIGHT` at once (one by one when Gym rejects a chunk; halved on a 413), receipts
sent back as the listing gave them. The book learns what each call did.
"""

from __future__ import annotations

import asyncio
import logging

from rl_gym_actors import metrics
from rl_gym_actors.actors.gate_endpoint import EndpointTally, OwnerAnswer, Owners
from rl_gym_actors.core.attempt_book import AttemptBook
from rl_gym_actors.core.attempt_reports import AttemptState
from rl_gym_actors.core.prepare_plan import PrepareAction, Step, orphan_step
from rl_gym_actors.errors import AckRejected, GymError, GymUnavailable, InvalidRequest, StaleAttempt
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.listing import AnyReceipt, receipt_digest, receipt_key, receipt_wire
from rl_gym_actors.protocol import ExecutionKey, RetireAnswer

logger = logging.getLogger(__name__)

ACK_CHUNK = 2000  # receipts per acknowledge-completed request (halved on a 413)
ACKS_IN_FLIGHT = 4  # per endpoint: acknowledge-completed requests at once
CONCURRENCY = 32  # per endpoint: concurrent retire / receipt / adopt calls
RETIRE_BATCH = "retire-batch"  # the (ext) feature: many retires in one call
RETIRE_CHUNK = 2000  # keys per retire-batch request


class StepPerformer:
    """Performs plan steps on one endpoint for one checkpoint id, recording in ``book``."""

    def __init__(
        self, book: AttemptBook, owners: Owners, tally: EndpointTally, client: GymClient, cid: str
    ) -> None:
        self._book = book
        self._owners = owners
        self.tally = tally
        self.client = client
        self.cid = cid

    async def perform(
        self, steps: list[Step], deadline_ts: float, *, hold_acks: bool = False
    ) -> list[Step]:
        """Adopt and retire what the steps say, then ACK every orphan; with ``hold_acks``
        nothing is ACKed: the orphans (completed results to release) are returned for
        :meth:`release`, which the gate calls only once every endpoint is ready but for them."""
        tally, client, cid = self.tally, self.client, self.cid
        limit = asyncio.Semaphore(CONCURRENCY)
        orphans = [s for s in steps if s.action is PrepareAction.ORPHAN_ACK]

        async def adopt(step: Step) -> None:
            async with limit:
                answer = await self._owners.adopt(
                    step.owner or "", step.rollout_id, step.attempt_index, deadline_ts
                )
            if answer is OwnerAnswer.ADOPTED:
                tally.adopted += 1
                self._book.record_adopted(tally.endpoint.url, step.rollout_id, step.attempt_index)
            elif answer in (OwnerAnswer.REFUSED, OwnerAnswer.GONE):
                orphans.append(orphan_step(step))

        def retired(step: Step, answer: RetireAnswer) -> None:
            if answer.completed_unacknowledged:
                orphans.append(orphan_step(step))
            elif answer.tombstoned:
                tally.retired += 1
                self._book.record_retired(tally.endpoint.url, step.rollout_id, step.attempt_index)

        async def retire(step: Step) -> None:
            async with limit:
                try:
                    answer = await client.retire(
                        step.rollout_id,
                        step.attempt_index,
                        checkpoint_id=cid,
                        deadline_ts=deadline_ts,
                    )
                except (GymError, GymUnavailable) as exc:
                    # checkpoint_conflict / admission closed from a real Gym: the next round
                    logger.debug("retire %s on %s: %r", step.key, tally.endpoint.label, exc)
                    return
            retired(step, answer)

        async def retire_batch(chunk: list[Step]) -> None:
            async with limit:
                try:
                    answers = await client.retire_batch(
                        [(s.rollout_id, s.attempt_index) for s in chunk],
                        checkpoint_id=cid,
                        deadline_ts=deadline_ts,
                    )
                except (GymError, GymUnavailable) as exc:
                    logger.debug("retire-batch on %s: %r", tally.endpoint.label, exc)
                    return
            for step, answer in zip(chunk, answers, strict=True):
                retired(step, answer)

        retires = [s for s in steps if s.action is PrepareAction.RETIRE]
        # one call per RETIRE_CHUNK keys where the server offers it (ours), else one per key
        batched = bool(retires) and await client.offers(RETIRE_BATCH, deadline_ts=deadline_ts)
        await asyncio.gather(
            *(adopt(s) for s in steps if s.action is PrepareAction.ADOPT),
            *(
                (
                    retire_batch(retires[i : i + RETIRE_CHUNK])
                    for i in range(0, len(retires), RETIRE_CHUNK)
                )
                if batched
                else (retire(s) for s in retires)
            ),
        )
        if hold_acks:
            return orphans
        if orphans:
            await self._ack_orphans(orphans, deadline_ts, limit)
        return []

    async def release(self, steps: list[Step], deadline_ts: float) -> None:
        """ACK the completed results ``steps`` name (receipts fetched where missing)."""
        if steps:
            await self._ack_orphans(steps, deadline_ts, asyncio.Semaphore(CONCURRENCY))

    async def _ack_orphans(
        self, steps: list[Step], deadline_ts: float, limit: asyncio.Semaphore
    ) -> None:
        tally, client = self.tally, self.client
        url = tally.endpoint.url
        # by key: each receipt as the listing gave it (JSON text from our server: never decoded)
        by_key: dict[ExecutionKey, AnyReceipt] = {
            (s.rollout_id, s.attempt_index): s.receipt for s in steps if s.receipt is not None
        }

        async def fetch(step: Step) -> None:
            async with limit:
                try:
                    answer = await client.receipt(
                        step.rollout_id, step.attempt_index, deadline_ts=deadline_ts
                    )
                except StaleAttempt:
                    self._book.record(
                        url, step.rollout_id, step.attempt_index, AttemptState.TOMBSTONED
                    )
                    return
                except (GymError, GymUnavailable) as exc:  # not completed, unknown, ...
                    logger.debug("receipt %s on %s: %r", step.key, tally.endpoint.label, exc)
                    return
            if answer.state != "completed":  # ACKed meanwhile (by its owner)
                self._book.record(url, step.rollout_id, step.attempt_index, AttemptState.ACKED)
            elif answer.completion_receipt is not None:  # (a completed key always has one)
                by_key[step.key] = answer.completion_receipt

        await asyncio.gather(*(fetch(s) for s in steps if s.receipt is None))
        unique = [(k, r) for k, r in by_key.items() if self._matches_seal(k, r)]
        in_flight = asyncio.Semaphore(ACKS_IN_FLIGHT)
        await asyncio.gather(
            *(
                self._ack_chunk(unique[i : i + ACK_CHUNK], deadline_ts, limit, in_flight)
                for i in range(0, len(unique), ACK_CHUNK)
            )
        )

    async def _ack_chunk(
        self,
        chunk: list[tuple[ExecutionKey, AnyReceipt]],
        deadline_ts: float,
        limit: asyncio.Semaphore,
        in_flight: asyncio.Semaphore,
    ) -> None:
        """One acknowledge-completed; a body over the server's limit (413) is sent in halves,
        a rejected one (all or nothing: one stale receipt spoils it) key by key."""
        tally, client = self.tally, self.client
        url = tally.endpoint.url
        try:
            async with in_flight:
                acked = await client.acknowledge_wire(
                    [r for _, r in chunk], keys=[k for k, _ in chunk], deadline_ts=deadline_ts
                )
        except AckRejected:
            one = (self._ack_one(client, r, deadline_ts, limit) for _, r in chunk)
            oks = await asyncio.gather(*one)
            acked = [k for (k, _), ok in zip(chunk, oks, strict=True) if ok]
        except InvalidRequest as exc:
            if exc.status != 413 or len(chunk) < 2:
                logger.debug("acknowledge-completed on %s: %r", tally.endpoint.label, exc)
                return
            half = len(chunk) // 2
            await asyncio.gather(
                self._ack_chunk(chunk[:half], deadline_ts, limit, in_flight),
                self._ack_chunk(chunk[half:], deadline_ts, limit, in_flight),
            )
            return
        except (GymError, GymUnavailable) as exc:
            logger.debug("acknowledge-completed on %s: %r", tally.endpoint.label, exc)
            return
        # an owner may have ACKed one since the status was read: the book does not count it
        orphans, sealed = self._book.record_gate_acks(url, acked)
        tally.orphans_acked += orphans
        tally.sealed_acked += sealed
        metrics.ORPHANS_ACKED.inc(orphans, tags={"endpoint": url})

    def _matches_seal(self, key: ExecutionKey, receipt: AnyReceipt) -> bool:
        """A receipt for a result a rollout sealed must prove the reply it sealed (its receipt
        may have been deferred to this listing: a server without a per-key receipt). One that
        does not is never ACKed: it stays on Gym, a blocker the checkpoint fails on. (Only
        such a receipt is decoded.)"""
        sealed = self._book.sealed_digest(*key)
        if sealed is None:
            return True
        try:
            digest = receipt_digest(receipt)
            if receipt_key(receipt) != key:
                raise ValueError(f"the receipt is of {receipt_key(receipt)}")
        except (ValueError, KeyError, TypeError) as exc:
            digest = f"unreadable: {exc}"
        if sealed == digest:
            return True
        self.tally.receipt_mismatches += 1
        logger.error(
            "%s: receipt of %s has digest %s..., the sealed reply %s...: not ACKed",
            self.tally.endpoint.label,
            key,
            digest[:12],
            sealed[:12],
        )
        return False

    @staticmethod
    async def _ack_one(
        client: GymClient, receipt: AnyReceipt, deadline_ts: float, limit: asyncio.Semaphore
    ) -> bool:
        async with limit:
            try:
                answer = await client.acknowledge(receipt_wire(receipt), deadline_ts=deadline_ts)
            except (GymError, GymUnavailable) as exc:
                logger.debug("acknowledge %s: %r", receipt_key(receipt), exc)
                return False
        return answer.acknowledged or answer.idempotent
