"""The checkpoint gate: drives every Gym endpoint from status to commit, performing the plan.

No Ray here: owners are reached through the small :class:`Owners` interface that the ledger actor
implements with Ray handles. One gate object runs one checkpoint.

ACK last (an ACK cannot be taken back). Phase 1, per endpoint concurrently: status -> act on the
plan (adopt, retire; **no ACK**) -> prepare with a short deadline slice -> ... until the endpoint
is ready, or ready but for completed results the gate will release (nothing running, admission
closed, every completed un-ACKed attempt one the plan ACKs), or the deadline. Phase 2, only when
every endpoint got there: ACK those results and prepare again (ready at once), then commit every
endpoint; resume every endpoint in any case. A checkpoint that fails in phase 1 (the deadline,
a conflict, an endpoint down) has ACKed nothing; it resumes every endpoint and raises
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
import contextlib
import logging
import operator
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from rl_gym_actors import metrics
from rl_gym_actors.actors.gate_done import GateReports, finish_again, stored_for
from rl_gym_actors.actors.gate_endpoint import (
    EndpointTally,
    Owners,
    dir_labels,
    endpoint_dir,
)
from rl_gym_actors.actors.gate_record import NotRecorded, to_record, unrecorded_results
from rl_gym_actors.actors.gate_steps import StepPerformer
from rl_gym_actors.actors.gym_memory import epoch_change, vanished_results
from rl_gym_actors.actors.handover import handed_over, keep_handed_over
from rl_gym_actors.actors.heal import Healer
from rl_gym_actors.config import GymEndpoint, LedgerConfig
from rl_gym_actors.core.attempt_book import AttemptBook, GateAck
from rl_gym_actors.core.attempt_reports import AttemptState
from rl_gym_actors.core.checkpoint_report import CheckpointReport, EndpointCheckpoint
from rl_gym_actors.core.prepare_plan import PrepareAction, Step, gym_attempts, plan_endpoint
from rl_gym_actors.errors import (
    CheckpointConflict,
    CheckpointFailed,
    DeadlineExceeded,
    GymStateLost,
    RlGymError,
)
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.retry import RetryOn, call_with_retry
from rl_gym_actors.listing import GymListing
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.protocol import CommitAnswer, ExecutionState

logger = logging.getLogger(__name__)


RESUME_SLACK_S = 0.4  # a failed checkpoint still resumes every endpoint within this slack
FIRST_SLICE_S = 0.5  # the prepare that closes admission while unknown runs are deferred
DRAIN_LOG_S = 5.0  # while a checkpoint waits for runs in flight: one progress line this often
_COMPLETED_STATE = ExecutionState.COMPLETED.value
_RID, _ATT = operator.attrgetter("rollout_id"), operator.attrgetter("attempt_index")


class CheckpointGate:
    """Runs one checkpoint over ``clients`` (one per endpoint, same order)."""

    def __init__(
        self,
        book: AttemptBook,
        endpoints: Sequence[GymEndpoint],
        clients: Sequence[GymClient],
        owners: Owners,
        config: LedgerConfig,
        *,
        run_id: str | None = None,
        sweep_foreign: bool = False,
        claims: frozenset[str] = frozenset(),
        clock: Callable[[], float] = time.time,
        healer: Healer | None = None,
        keep: Callable[[list[Outcome]], int] | None = None,
        carried: Sequence[Outcome] = (),
        recorded: frozenset[tuple[str, int]] | None = None,
        reports: GateReports | None = None,
    ) -> None:
        self._book = book
        self._reports = reports  # the report kept between commits and resumes (gate_done.py)
        self._keep_write = keep  # kept handed-over tries into the part (None: orphans ACKed)
        # the results the part holds (actors/gate_record.py); None: the caller keeps no part
        self._recorded = recorded
        self.pending: list[Outcome] = list(carried)  # kept results for the checkpoint's answer
        self._healer = healer  # failed resumes go on in the background; this run's own ids
        self._own_ids = healer.own_ids() if healer is not None else frozenset()
        # shared servers: with a run id, attempts of other runs are never touched (see
        # core/prepare_plan); this run's are those with its prefix and the ids it claims
        prefix = f"{run_id}-"
        self._own = (
            None
            if run_id is None or sweep_foreign
            else lambda rid: rid.startswith(prefix) or rid in claims
        )
        self._own_run = (  # whose results go into the part (also when sweeping others')
            None if run_id is None else (lambda rid: rid.startswith(prefix) or rid in claims)
        )
        self._clients = list(clients)
        self._owners = owners
        self._config = config
        self._clock = clock
        labels = dir_labels(endpoints) if len(endpoints) > 1 else [""]
        self._tallies = [
            EndpointTally(ep, label) for ep, label in zip(endpoints, labels, strict=True)
        ]
        self._flush_task: asyncio.Task[int] | None = None
        self._flush_started = 0.0

    async def run(
        self, checkpoint_id: str, checkpoint_dir: str, deadline_ts: float
    ) -> CheckpointReport:
        start = self._clock()
        # leave room for the commits after the last prepare
        prepare_deadline = deadline_ts - min(1.0, 0.1 * max(deadline_ts - start, 0.0))
        flushed = await self._owners.flush(
            min(prepare_deadline, start + _flush_budget(prepare_deadline - start)), checkpoint_id
        )
        urls = [t.endpoint.url for t in self._tallies]
        stored = await asyncio.to_thread(
            stored_for, self._reports, checkpoint_dir, checkpoint_id, urls
        )
        if stored is not None:  # committed by a gate before this one (a restarted ledger)
            failed = await finish_again(self._book, self._clients, checkpoint_id, deadline_ts)
            if failed:
                raise CheckpointFailed(
                    f"checkpoint {checkpoint_id} committed, then failed to resume on "
                    f"{len(failed)} of {len(urls)} endpoint(s): " + "; ".join(failed),
                    checkpoint_id=checkpoint_id,
                    blockers={},
                    released=stored.sealed_acked + stored.orphans_acked,
                )
            return stored
        try:
            await self._until(  # phase 1: everything but the release
                deadline_ts,
                [
                    self._make_ready(t, c, checkpoint_id, prepare_deadline, hold=True)
                    for t, c in zip(self._tallies, self._clients, strict=True)
                ],
            )
            if all(t.ready or t.held_ready for t in self._tallies) and await self._keep(
                prepare_deadline
            ):
                await self._until(  # phase 2: release (ACK) and prepare again
                    deadline_ts,
                    [
                        self._make_ready(t, c, checkpoint_id, prepare_deadline, hold=False)
                        for t, c in zip(self._tallies, self._clients, strict=True)
                        if not t.ready
                    ],
                )
            if all(t.ready for t in self._tallies):
                metrics.CHECKPOINT_PREPARE_SECONDS.observe(self._clock() - start)
                for t in self._tallies:
                    metrics.CHECKPOINT_DRAIN_SECONDS.observe(t.drain_s)
                await self._until(
                    deadline_ts,
                    [
                        self._commit(t, c, checkpoint_id, checkpoint_dir, deadline_ts)
                        for t, c in zip(self._tallies, self._clients, strict=True)
                    ],
                )
                await self._keep_report(checkpoint_id, checkpoint_dir, flushed, start)
        finally:
            self._follow_gym()
            resume_by = max(deadline_ts, self._clock()) + RESUME_SLACK_S
            await self._until(
                resume_by,
                [
                    self._resume(t, c, checkpoint_id, resume_by)
                    for t, c in zip(self._tallies, self._clients, strict=True)
                ],
            )
        self._gym_state_lost(checkpoint_id)
        commits = [
            t.commit for t in self._tallies if t.ready and t.resumed and t.commit is not None
        ]
        if len(commits) != len(self._tallies):
            bad = [t for t in self._tallies if not t.ready or t.error] or self._tallies
            raise CheckpointFailed(
                f"checkpoint {checkpoint_id} failed on {len(bad)} of {len(self._tallies)} "
                f"endpoint(s): "
                + "; ".join(f"{t.endpoint.label}: {t.error or 'not ready'}" for t in bad),
                checkpoint_id=checkpoint_id,
                blockers={t.endpoint.label: t.failure(self._foreign) for t in bad},
                released=sum(t.sealed_acked + t.orphans_acked for t in self._tallies),
            )
        return self._report(checkpoint_id, checkpoint_dir, flushed, start, commits)

    def _report(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        flushed: int,
        start: float,
        commits: Sequence[CommitAnswer],
    ) -> CheckpointReport:
        return CheckpointReport(
            checkpoint_id=checkpoint_id,
            checkpoint_dir=checkpoint_dir,
            owners_flushed=flushed,
            elapsed_s=self._clock() - start,
            kept=self.pending,
            endpoints=[
                EndpointCheckpoint(
                    endpoint=t.endpoint.url,
                    label=t.endpoint.label,
                    checkpoint_dir=endpoint_dir(checkpoint_dir, t.label),
                    adopted=t.adopted,
                    orphans_acked=t.orphans_acked,
                    sealed_acked=t.sealed_acked,
                    retired=t.retired,
                    prepare_rounds=t.rounds,
                    drain_s=round(t.drain_s, 3),
                    commit=commit,
                )
                for t, commit in zip(self._tallies, commits, strict=True)
            ],
        )

    async def _keep_report(
        self, checkpoint_id: str, checkpoint_dir: str, flushed: int, start: float
    ) -> None:
        """Every commit answered: keep the report before the first resume spends the id, for
        a gate of the same checkpoint after a restart (actors/gate_done.py). A report that
        cannot be written fails nothing: that gate then fails as before, on the spent id."""
        commits = [t.commit for t in self._tallies if t.commit is not None]
        if self._reports is None or len(commits) != len(self._tallies):
            return
        report = self._report(checkpoint_id, checkpoint_dir, flushed, start, commits)
        try:
            await asyncio.to_thread(self._reports.write, checkpoint_dir, report)
        except RlGymError as exc:
            logger.warning("checkpoint %s: its gate report was not kept: %r", checkpoint_id, exc)

    async def _keep(self, deadline_ts: float) -> bool:
        """Before the release: keep the handed-over tries phase 1 held (actors/handover.py);
        False (nothing ACKed, the checkpoint fails) when the part cannot be written."""
        if self._keep_write is None:
            return True
        also: list[Outcome] = []
        if self._recorded is not None:  # results that finished while the gate waited
            skip = {s.key for t in self._tallies for s in handed_over(self._book, t.held)}
            steps = to_record(self._tallies, self._recorded, self._own_run, skip)
            try:
                also = await unrecorded_results(
                    self._book, self._tallies, self._clients, steps, deadline_ts
                )
            except NotRecorded as exc:
                for t in self._tallies:
                    t.ready = t.held_ready = False
                    t.error = f"a result to release could not be recorded first: {exc}"
                return False
        kept = await keep_handed_over(
            self._book,
            self._tallies,
            self._clients,
            deadline_ts,
            self._keep_write,
            self.pending,
            also,
        )
        self.pending = self.pending if kept is None else kept
        return kept is not None

    def _gym_state_lost(self, checkpoint_id: str) -> None:
        """Raise GymStateLost when an endpoint lost sealed results; the book counts them
        settled (the trainer holds them), so the next checkpoint can commit."""
        lost = {t.endpoint.label: t.lost for t in self._tallies if t.lost or t.epoch}
        if not lost:
            return
        for tally in self._tallies:
            for rid, att in tally.lost:
                self._book.record(tally.endpoint.url, rid, att, AttemptState.TOMBSTONED)
            if tally.lost or tally.epoch:  # a server that forgot, even holding nothing: 1
                metrics.GYM_STATE_LOST.inc(
                    max(len(tally.lost), 1), tags={"endpoint": tally.endpoint.url}
                )
        forgot = {t.endpoint.label: t.epoch for t in self._tallies if t.epoch}
        logger.error(
            "checkpoint %s: Gym lost sealed results it held: %s; store epochs changed: %s",
            checkpoint_id,
            {label: len(keys) for label, keys in lost.items()},
            forgot,
        )
        raise GymStateLost(
            f"checkpoint {checkpoint_id}: Gym lost sealed results it held ("
            + ", ".join(
                f"{label}: {len(keys)}"
                + (" (forgot its state: store epoch changed)" if label in forgot else "")
                for label, keys in lost.items()
            )
            + "); nothing was ACKed or committed",
            checkpoint_id=checkpoint_id,
            blockers={
                t.endpoint.label: t.failure(self._foreign)
                for t in self._tallies
                if t.lost or t.epoch
            },
            lost={label: len(keys) for label, keys in lost.items()},
            epochs=forgot,
        )

    def _foreign(self, rollout_id: str) -> bool:
        return (
            self._own is not None
            and self._book.current_attempt(rollout_id) is None
            and not self._own(rollout_id)
        )

    def _follow_gym(self) -> None:
        """The book follows Gym: what Gym last listed as active on each endpoint is all that
        can still run there (see :meth:`AttemptBook.settle_unlisted`)."""
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
        self, tally: EndpointTally, client: GymClient, cid: str, deadline_ts: float, *, hold: bool
    ) -> None:
        try:
            await self._prepare_loop(tally, client, cid, deadline_ts, hold=hold)
        except asyncio.CancelledError:
            tally.error = tally.error or "deadline passed"
            raise
        except RlGymError as exc:
            tally.error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # a bug must not pass as "not ready" without a trace
            logger.exception("checkpoint gate on %s", tally.endpoint.label)
            tally.error = f"{type(exc).__name__}: {exc}"

    async def _prepare_loop(
        self, tally: EndpointTally, client: GymClient, cid: str, deadline_ts: float, *, hold: bool
    ) -> None:
        """Phase 1 (``hold``): until ready, or ready but for ``tally.held``. Phase 2: the same
        loop with ACKs, entered with admission closed and nothing running: the first round
        releases what phase 1 held and its prepare is ready."""
        url = tally.endpoint.url
        performer = StepPerformer(self._book, self._owners, tally, client, cid)
        if not hold:
            await performer.release(tally.held, deadline_ts)
        status = await client.listing(cid, deadline_ts=deadline_ts)
        tally.last = status
        if hold:  # Gym's memory is checked before anything is released
            # held already, before this gate's first prepare: a gate of this checkpoint ran
            # before this one (the ledger restarted and Ray sent the call again) and what it
            # ACKed was released with this checkpoint: the report counts it
            tally.lost = await vanished_results(
                self._book,
                client,
                status,
                deadline_ts,
                released=None if status.state == "accepting" else self._released(tally),
            )
            tally.epoch = await epoch_change(client, deadline_ts)
            if tally.lost or tally.epoch:
                tally.error = f"Gym lost {len(tally.lost)} sealed results it held" + (
                    f" (its store epoch changed from {tally.epoch[0]} to {tally.epoch[1]})"
                    if tally.epoch
                    else ""
                )
                return
        # with no live owner, nobody can have dispatched a try the book has not heard of yet
        retire_unknown = not self._owners.live() or not hold
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
            held = await performer.perform(steps, deadline_ts, hold_acks=hold)
            tally.rounds += 1
            slice_s = FIRST_SLICE_S if deferred else self._config.prepare_slice_s
            self._draining(tally, cid, status, self._clock(), deadline_ts)
            try:
                status = await self._prepare(tally, client, cid, slice_s, deadline_ts)
                closed = True  # Gym answered a prepare: admission is closed
            except DeadlineExceeded:
                # the slice ran out before the answer came back: not ready yet, look again
                if self._clock() >= deadline_ts:
                    tally.error = "deadline passed"
                    return
                status = (await client.listing(cid, deadline_ts=deadline_ts)).not_ready()
                closed = status.state != "accepting"
            tally.last = status
            self._drained(tally)
            if status.ready_to_commit:
                tally.ready = True
                return
            if hold and closed and retire_unknown and _only_held(status, held):
                tally.held, tally.held_ready = held, True
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
                status = (await client.listing(cid, deadline_ts=deadline_ts)).not_ready()
            else:
                if self._clock() - round_start < 0.05:
                    # nothing ran long (e.g. a retire refused with checkpoint_conflict): back off
                    left = max(deadline_ts - self._clock(), 0.0)
                    await asyncio.sleep(min(client.retry.backoff(tally.rounds), left))
                if status.keys_only:  # the prepare listed keys: the receipts for the next round
                    status = (await client.listing(cid, deadline_ts=deadline_ts)).not_ready()

    def _draining(
        self, tally: EndpointTally, cid: str, before: GymListing, now: float, deadline_ts: float
    ) -> None:
        """Before a prepare: the drain wait, visible. Runs still going on a server this gate
        prepares (Gym commits only with none, so the prepare holds admission closed until they
        end): the wait starts now, and an INFO line says so at once and every
        :data:`DRAIN_LOG_S`. Its length goes to ``tally.drain_s`` (:meth:`_drained`)."""
        if not before.running:
            return
        if tally.drain_since is None:
            tally.drain_since = now
        if tally.drain_logged is None or now - tally.drain_logged >= DRAIN_LOG_S:
            tally.drain_logged = now
            logger.info(
                "checkpoint %s: %s waits for %d run(s) in flight to end, admission closed "
                "(%.1f s so far, %.1f s to its deadline; agents that honour park_requested "
                "park, Gym v2 parks at a step boundary)",
                cid,
                tally.endpoint.label,
                before.running,
                now - tally.drain_since,
                max(deadline_ts - now, 0.0),
            )

    def _drained(self, tally: EndpointTally) -> None:
        """After a prepare: how long the drain has lasted (the report's ``drain_s``)."""
        if tally.drain_since is not None:
            tally.drain_s = self._clock() - tally.drain_since

    def _released(self, tally: EndpointTally) -> Callable[[tuple[str, int]], None]:
        """Count a sealed result Gym has as ACKed, released by an earlier gate of this
        checkpoint, as this gate's own release."""
        url = tally.endpoint.url

        def released(key: tuple[str, int]) -> None:
            kind = self._book.record_gate_acked(url, key[0], key[1])
            tally.sealed_acked += kind is GateAck.SEALED
            tally.orphans_acked += kind is GateAck.ORPHAN

        return released

    async def _prepare(
        self, tally: EndpointTally, client: GymClient, cid: str, slice_s: float, deadline_ts: float
    ) -> GymListing:
        """One prepare of at most ``slice_s``; while another checkpoint id holds the server, wait
        for it (the retry decider backs off by the client's policy) until the deadline, then
        raise its CheckpointConflict."""

        async def prepare(try_deadline: float) -> GymListing:
            try:
                # keys only (our server): all a held or ready answer needs; a round after a
                # prepare that is neither reads the listing again, receipts and all
                return await client.prepare_listing(
                    cid, deadline_ts=min(try_deadline, self._clock() + slice_s), keys_only=True
                )
            except CheckpointConflict as exc:
                holder = exc.active_checkpoint_id
                if holder is not None and holder != cid and holder in self._own_ids:
                    # an earlier checkpoint of this run still holds it: ours to clear
                    logger.warning("%s: resuming own checkpoint %s", tally.endpoint.label, holder)
                    with contextlib.suppress(RlGymError):
                        await client.resume(holder, deadline_ts=min(try_deadline, deadline_ts))
                raise

        def held(exc: BaseException) -> None:
            holder = (
                exc.active_checkpoint_id if isinstance(exc, CheckpointConflict) else None
            ) or "unknown"
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

    # ------------------------------------------------------------------ commit and resume

    async def _commit(
        self,
        tally: EndpointTally,
        client: GymClient,
        cid: str,
        checkpoint_dir: str,
        deadline_ts: float,
    ) -> None:
        try:
            tally.commit = await client.commit(
                cid, endpoint_dir(checkpoint_dir, tally.label), deadline_ts=deadline_ts
            )
        except RlGymError as exc:
            tally.error = f"commit failed: {type(exc).__name__}: {exc}"

    async def _resume(
        self, tally: EndpointTally, client: GymClient, cid: str, deadline_ts: float
    ) -> None:
        if not tally.may_hold:
            tally.resumed = True  # every prepare was refused: the id never held it
            return
        try:
            await client.resume(cid, deadline_ts=deadline_ts)
            tally.resumed = True
        except RlGymError as exc:
            tally.error = tally.error or f"resume failed: {type(exc).__name__}: {exc}"
            logger.warning("resume %s on %s failed: %r", cid, tally.endpoint.label, exc)
        finally:  # no answer by the deadline (also when cancelled there): go on in the background
            if not tally.resumed and self._healer is not None:
                self._healer.resume_later(client, cid)


def _only_held(status: GymListing, held: list[Step]) -> bool:
    """Whether a not-ready endpoint waits only for results the gate is about to release: nothing
    runs, nothing is parked without a boundary, and every completed un-ACKed attempt it lists
    (it lists them all) is one of ``held``."""
    if status.running or status.parked_without_boundary:
        return False
    attempts = gym_attempts(status)
    completed = [key for key, info in attempts.items() if info[0] == _COMPLETED_STATE]
    if status.completed_unacknowledged != len(completed):
        return False
    # (by the thousand: keys from the named tuples' fields, not a property per step)
    held_keys = set(zip(map(_RID, held), map(_ATT, held), strict=True))
    return held_keys.issuperset(completed)


def _flush_budget(left: float) -> float:
    """How long to wait for owners' flushes: a fifth of what is left, 0.5 s to 10 s."""
    return min(10.0, max(0.5, 0.2 * left))
