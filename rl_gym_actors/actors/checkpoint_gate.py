"""The checkpoint gate: drives every Gym endpoint from status to commit, performing the plan.

No Ray here: owners are reached through the small :class:`Owners` interface that the ledger actor
implements with Ray handles. One gate object runs one checkpoint.

Per endpoint, concurrently: status -> act on the plan -> prepare with a short deadline slice ->
if not ready, act on its lists again -> ... until ready or the deadline. Then commit every
endpoint and resume every endpoint. On failure or deadline: resume every endpoint and raise
:class:`CheckpointFailed` with the blockers per endpoint.

Attempts the book never heard of are not retired while admission is still open and some owner is
alive: that owner may have dispatched them after the last flush. The first prepare closes
admission; the gate then asks every owner to flush again, and from then on an unknown running
attempt is truly forgotten.

A prepare refused with ``checkpoint_conflict`` (another checkpoint id holds the server: another
run's, or one whose driver died) is sent again with backoff until the deadline: the holder
resumes, or its lease on the server lapses. At the deadline :class:`CheckpointFailed` names the id
in the way (``active_checkpoint_id`` in the endpoint's blockers), which
:func:`abort_everywhere` (``Orchestrator.abort_checkpoint``) resumes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from rl_gym_actors import metrics
from rl_gym_actors.config import GymEndpoint, LedgerConfig
from rl_gym_actors.core.attempt_reports import AttemptState
from rl_gym_actors.core.ledger import (
    Book,
    CheckpointReport,
    EndpointCheckpoint,
    PrepareAction,
    Step,
    blockers,
    orphan_step,
    plan_endpoint,
)
from rl_gym_actors.core.prepare_plan import gym_attempts
from rl_gym_actors.errors import (
    AckRejected,
    CheckpointConflict,
    CheckpointFailed,
    DeadlineExceeded,
    GymError,
    GymUnavailable,
    RlGymError,
    StaleAttempt,
)
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.retry import RetryOn, call_with_retry
from rl_gym_actors.protocol import CommitAnswer, CompletionReceipt, StatusReport

logger = logging.getLogger(__name__)

RESUME_SLACK_S = 0.4  # a failed checkpoint still resumes every endpoint within this slack
FIRST_SLICE_S = 0.5  # the prepare that closes admission while unknown runs are deferred
ACK_CHUNK = 500  # receipts per acknowledge-completed request
CONCURRENCY = 32  # per endpoint: concurrent retire / receipt / adopt calls


class OwnerAnswer(str, Enum):
    ADOPTED = "adopted"  # the owner says the attempt is now sealed and ACKed
    REFUSED = "refused"  # the owner does not own it: an orphan
    GONE = "gone"  # the owner is dead or unknown: an orphan
    UNSURE = "unsure"  # no answer in time, or the owner may still be alive: ask again


class Owners(Protocol):
    """The rollout actors, as the gate sees them."""

    def live(self) -> frozenset[str]:
        """Names of the registered owners not known to be dead."""

    async def adopt(
        self, owner: str, rollout_id: str, attempt_index: int, deadline_ts: float
    ) -> OwnerAnswer:
        """Ask ``owner`` to make sure the attempt ends sealed and ACKed."""

    async def flush(self, deadline_ts: float) -> int:
        """Ask every live owner to send its pending reports; how many confirmed in time."""


@dataclass
class _Tally:
    endpoint: GymEndpoint
    label: str
    adopted: int = 0
    orphans_acked: int = 0
    sealed_acked: int = 0
    retired: int = 0
    rounds: int = 0
    last: StatusReport | None = None
    ready: bool = False
    error: str | None = None
    commit: CommitAnswer | None = None
    resumed: bool = False
    may_hold: bool = False  # a prepare was sent that the server did not refuse
    conflict: str | None = None  # the checkpoint id that held the server at our last prepare

    def failure(self, foreign: Callable[[str], bool]) -> dict[str, Any]:
        """What :class:`CheckpointFailed` says about this endpoint; attempts of another run on
        the same server are marked ``"foreign": True``."""
        out: dict[str, Any] = {"endpoint": self.endpoint.url, "prepare_rounds": self.rounds}
        if self.conflict is not None:
            out["active_checkpoint_id"] = self.conflict
        if self.last is not None:
            out["summary"] = self.last.summary()
            out["attempts"] = [
                {**b, "foreign": True} if foreign(str(b["rollout_id"])) else b
                for b in blockers(self.last)
            ]
        if self.error:
            out["error"] = self.error
        if not self.resumed:
            out["resumed"] = False
        return out


def dir_labels(endpoints: Sequence[GymEndpoint]) -> list[str]:
    """Sub-folder names for a checkpoint of several endpoints: the endpoint's name when it is a
    plain, unique folder name, else its index."""
    names = [e.name or "" for e in endpoints]
    safe = [
        n
        if n and n not in (".", "..") and os.sep not in n and "/" not in n and names.count(n) == 1
        else ""
        for n in names
    ]
    return [n or str(i) for i, n in enumerate(safe)]


class CheckpointGate:
    """Runs one checkpoint over ``clients`` (one per endpoint, same order)."""

    def __init__(
        self,
        book: Book,
        endpoints: Sequence[GymEndpoint],
        clients: Sequence[GymClient],
        owners: Owners,
        config: LedgerConfig,
        *,
        run_id: str | None = None,
        sweep_foreign: bool = False,
        claims: frozenset[str] = frozenset(),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._book = book
        # shared servers: with a run id, attempts of other runs are never touched (see
        # core/prepare_plan); this run's are those with its prefix and the ids it claims
        prefix = f"{run_id}-"
        self._own = (
            None
            if run_id is None or sweep_foreign
            else lambda rid: rid.startswith(prefix) or rid in claims
        )
        self._clients = list(clients)
        self._owners = owners
        self._config = config
        self._clock = clock
        labels = dir_labels(endpoints) if len(endpoints) > 1 else [""]
        self._tallies = [_Tally(ep, label) for ep, label in zip(endpoints, labels)]
        self._flush_task: asyncio.Task[int] | None = None
        self._flush_started = 0.0

    async def run(
        self, checkpoint_id: str, checkpoint_dir: str, deadline_ts: float
    ) -> CheckpointReport:
        start = self._clock()
        # leave room for the commits after the last prepare
        prepare_deadline = deadline_ts - min(1.0, 0.1 * max(deadline_ts - start, 0.0))
        flushed = await self._owners.flush(
            min(prepare_deadline, start + _flush_budget(prepare_deadline - start))
        )
        try:
            await self._until(
                deadline_ts,
                [
                    self._make_ready(t, c, checkpoint_id, prepare_deadline)
                    for t, c in zip(self._tallies, self._clients)
                ],
            )
            if all(t.ready for t in self._tallies):
                metrics.CHECKPOINT_PREPARE_SECONDS.observe(self._clock() - start)
                await self._until(
                    deadline_ts,
                    [
                        self._commit(t, c, checkpoint_id, checkpoint_dir, deadline_ts)
                        for t, c in zip(self._tallies, self._clients)
                    ],
                )
        finally:
            self._follow_gym()
            resume_by = max(deadline_ts, self._clock()) + RESUME_SLACK_S
            await self._until(
                resume_by,
                [
                    self._resume(t, c, checkpoint_id, resume_by)
                    for t, c in zip(self._tallies, self._clients)
                ],
            )
        if not all(t.ready and t.commit is not None and t.resumed for t in self._tallies):
            bad = [t for t in self._tallies if not t.ready or t.error] or self._tallies
            raise CheckpointFailed(
                f"checkpoint {checkpoint_id} failed on {len(bad)} of {len(self._tallies)} "
                f"endpoint(s): "
                + "; ".join(f"{t.endpoint.label}: {t.error or 'not ready'}" for t in bad),
                checkpoint_id=checkpoint_id,
                blockers={t.endpoint.label: t.failure(self._foreign) for t in bad},
            )
        return CheckpointReport(
            checkpoint_id=checkpoint_id,
            checkpoint_dir=checkpoint_dir,
            owners_flushed=flushed,
            elapsed_s=self._clock() - start,
            endpoints=[
                EndpointCheckpoint(
                    endpoint=t.endpoint.url,
                    label=t.endpoint.label,
                    checkpoint_dir=_subdir(checkpoint_dir, t.label),
                    adopted=t.adopted,
                    orphans_acked=t.orphans_acked,
                    sealed_acked=t.sealed_acked,
                    retired=t.retired,
                    prepare_rounds=t.rounds,
                    commit=t.commit,
                )
                for t in self._tallies
            ],
        )

    def _foreign(self, rollout_id: str) -> bool:
        return (
            self._own is not None
            and self._book.current_attempt(rollout_id) is None
            and not self._own(rollout_id)
        )

    def _follow_gym(self) -> None:
        """The book follows Gym: what Gym last listed as active on each endpoint is all that
        can still run there (see :meth:`Book.settle_unlisted`)."""
        live = self._owners.live()
        for tally in self._tallies:
            status = tally.last
            if status is None:
                continue
            listed = set(gym_attempts(status))
            if len(listed) < status.running + status.parked + status.completed_unacknowledged:
                continue  # a server that lists less than it counts
            settled = self._book.settle_unlisted(tally.endpoint.url, listed, live)
            if settled:
                logger.info(
                    "%s: %d attempts the book had as running are gone on Gym",
                    tally.endpoint.label,
                    settled,
                )

    async def _until(self, deadline_ts: float, coros: Iterable[Awaitable[None]]) -> None:
        """Run ``coros`` concurrently; cancel whatever is still running at the deadline."""
        tasks = [asyncio.ensure_future(c) for c in coros]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=max(deadline_ts - self._clock(), 0.0))
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ one endpoint

    async def _make_ready(
        self, tally: _Tally, client: GymClient, cid: str, deadline_ts: float
    ) -> None:
        try:
            await self._prepare_loop(tally, client, cid, deadline_ts)
        except asyncio.CancelledError:
            tally.error = tally.error or "deadline passed"
            raise
        except RlGymError as exc:
            tally.error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a bug must not pass as "not ready" without a trace
            logger.exception("checkpoint gate on %s", tally.endpoint.label)
            tally.error = f"{type(exc).__name__}: {exc}"

    async def _prepare_loop(
        self, tally: _Tally, client: GymClient, cid: str, deadline_ts: float
    ) -> None:
        url = tally.endpoint.url
        status = await client.status(cid, deadline_ts=deadline_ts)
        tally.last = status
        # with no live owner, nobody can have dispatched a try the book has not heard of yet
        retire_unknown = not self._owners.live()
        while True:
            round_start = self._clock()
            steps = plan_endpoint(
                status,
                self._book,
                url,
                self._owners.live(),
                retire_unknown=retire_unknown,
                own=self._own,
            )
            deferred = any(
                s.action is PrepareAction.WAIT and s.owner is None and not s.foreign for s in steps
            )
            await self._act(tally, client, cid, steps, deadline_ts)
            tally.rounds += 1
            slice_s = FIRST_SLICE_S if deferred else self._config.prepare_slice_s
            try:
                status = await self._prepare(tally, client, cid, slice_s, deadline_ts)
                closed = True  # Gym answered a prepare: admission is closed
            except DeadlineExceeded:
                # the slice ran out before the answer came back: not ready yet, look again
                if self._clock() >= deadline_ts:
                    tally.error = "deadline passed"
                    return
                status = (await client.status(cid, deadline_ts=deadline_ts)).model_copy(
                    update={"ready_to_commit": False}
                )
                closed = status.state != "accepting"
            tally.last = status
            if status.ready_to_commit:
                tally.ready = True
                return
            if tally.rounds >= self._config.prepare_rounds:
                tally.error = f"not ready after {tally.rounds} prepare rounds"
                return
            if self._clock() >= deadline_ts:
                tally.error = "deadline passed"
                return
            if not retire_unknown and closed:
                # admission is closed now: whatever an owner dispatched before, it reports now;
                # a status read after that flush is at least as new as the book
                await self._flush_since(self._clock(), deadline_ts)
                retire_unknown = True
                status = (await client.status(cid, deadline_ts=deadline_ts)).model_copy(
                    update={"ready_to_commit": False}
                )
            elif self._clock() - round_start < 0.05:
                # nothing ran long (e.g. a retire refused with checkpoint_conflict): back off
                await asyncio.sleep(
                    min(client.retry.backoff(tally.rounds), max(deadline_ts - self._clock(), 0.0))
                )

    async def _prepare(
        self, tally: _Tally, client: GymClient, cid: str, slice_s: float, deadline_ts: float
    ) -> StatusReport:
        """One prepare of at most ``slice_s``; while another checkpoint id holds the server, wait
        for it (the retry decider backs off by the client's policy) until the deadline, then
        raise its CheckpointConflict."""

        def prepare(try_deadline: float) -> Awaitable[StatusReport]:
            return client.prepare(cid, deadline_ts=min(try_deadline, self._clock() + slice_s))

        def held(exc: BaseException) -> None:
            holder = getattr(exc, "active_checkpoint_id", None) or "unknown"
            if tally.conflict is None and tally.rounds == 1:
                logger.warning(
                    "checkpoint %s on %s waits for checkpoint %s to resume",
                    cid,
                    tally.endpoint.label,
                    holder,
                )
            tally.conflict = holder

        try:
            status = await call_with_retry(
                prepare,
                kind=RetryOn.CHECKPOINT_HELD,
                policy=client.retry,
                deadline_ts=deadline_ts,
                clock=self._clock,
                what=f"prepare {cid}",
                on_retry=held,
            )
        except CheckpointConflict as exc:
            tally.conflict = exc.active_checkpoint_id or "unknown"
            raise
        except BaseException:
            tally.may_hold = True  # it may have reached the server all the same
            raise
        tally.may_hold = True
        tally.conflict = None
        return status

    async def _flush_since(self, since: float, deadline_ts: float) -> None:
        """One owner flush that started at or after ``since``, shared by the endpoints."""
        if self._flush_task is None or self._flush_started < since:
            self._flush_started = self._clock()
            self._flush_task = asyncio.ensure_future(
                self._owners.flush(
                    min(deadline_ts, self._flush_started + _flush_budget(deadline_ts - since))
                )
            )
        await asyncio.shield(self._flush_task)

    async def _act(
        self, tally: _Tally, client: GymClient, cid: str, steps: list[Step], deadline_ts: float
    ) -> None:
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
            if answer.completed_unacknowledged:
                orphans.append(orphan_step(step))
            elif answer.tombstoned:
                tally.retired += 1
                self._book.record_retired(tally.endpoint.url, step.rollout_id, step.attempt_index)

        await asyncio.gather(
            *(adopt(s) for s in steps if s.action is PrepareAction.ADOPT),
            *(retire(s) for s in steps if s.action is PrepareAction.RETIRE),
        )
        if orphans:
            await self._ack_orphans(tally, client, orphans, deadline_ts, limit)

    async def _ack_orphans(
        self,
        tally: _Tally,
        client: GymClient,
        steps: list[Step],
        deadline_ts: float,
        limit: asyncio.Semaphore,
    ) -> None:
        url = tally.endpoint.url
        receipts: list[CompletionReceipt] = [s.receipt for s in steps if s.receipt is not None]

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
            if answer.state == "completed":
                receipts.append(answer.completion_receipt)
            else:  # ACKed meanwhile (by its owner)
                self._book.record(url, step.rollout_id, step.attempt_index, AttemptState.ACKED)

        await asyncio.gather(*(fetch(s) for s in steps if s.receipt is None))
        unique = list({r.key: r for r in receipts}.values())
        for i in range(0, len(unique), ACK_CHUNK):
            chunk = unique[i : i + ACK_CHUNK]
            try:
                await client.acknowledge_completed(chunk, deadline_ts=deadline_ts)
                acked = chunk
            except AckRejected:
                # all or nothing: one stale receipt spoils the batch; ACK them one by one
                acked = [
                    r
                    for r, ok in zip(
                        chunk,
                        await asyncio.gather(
                            *(self._ack_one(client, r, deadline_ts, limit) for r in chunk)
                        ),
                    )
                    if ok
                ]
            except (GymError, GymUnavailable) as exc:
                logger.debug("acknowledge-completed on %s: %r", tally.endpoint.label, exc)
                continue
            # an owner may have ACKed one since the status was read: the book does not count it
            kinds = [
                self._book.record_gate_acked(url, r.rollout_id, r.attempt_index) for r in acked
            ]
            counted = kinds.count("orphan")
            tally.orphans_acked += counted
            tally.sealed_acked += kinds.count("sealed")
            metrics.ORPHANS_ACKED.inc(counted, tags={"endpoint": url})

    @staticmethod
    async def _ack_one(
        client: GymClient, receipt: CompletionReceipt, deadline_ts: float, limit: asyncio.Semaphore
    ) -> bool:
        async with limit:
            try:
                answer = await client.acknowledge(receipt, deadline_ts=deadline_ts)
            except (GymError, GymUnavailable) as exc:
                logger.debug("acknowledge %s: %r", receipt.key, exc)
                return False
        return answer.acknowledged or answer.idempotent

    # ------------------------------------------------------------------ commit and resume

    async def _commit(
        self, tally: _Tally, client: GymClient, cid: str, checkpoint_dir: str, deadline_ts: float
    ) -> None:
        try:
            tally.commit = await client.commit(
                cid, _subdir(checkpoint_dir, tally.label), deadline_ts=deadline_ts
            )
        except RlGymError as exc:
            tally.error = f"commit failed: {type(exc).__name__}: {exc}"

    async def _resume(self, tally: _Tally, client: GymClient, cid: str, deadline_ts: float) -> None:
        if not tally.may_hold:
            tally.resumed = True  # every prepare was refused: the id never held it
            return
        try:
            await client.resume(cid, deadline_ts=deadline_ts)
            tally.resumed = True
        except RlGymError as exc:
            tally.error = tally.error or f"resume failed: {type(exc).__name__}: {exc}"
            logger.warning("resume %s on %s failed: %r", cid, tally.endpoint.label, exc)


# ---------------------------------------------------------------------- abort


def _subdir(checkpoint_dir: str, label: str) -> str:
    return os.path.join(checkpoint_dir, label) if label else checkpoint_dir


def _flush_budget(left: float) -> float:
    """How long to wait for owners' flushes: a fifth of what is left, 0.5 s to 10 s."""
    return min(10.0, max(0.5, 0.2 * left))
