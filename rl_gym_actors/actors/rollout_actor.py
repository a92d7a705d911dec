"""The rollout actor: a thin async shell that performs what core/rollout.py decides.

One actor is created once by the warm pool and kept; it owns up to ``rollouts_per_actor``
rollouts at a time, one :class:`~rl_gym_actors.core.rollout.RolloutMachine` each, with one
:class:`~rl_gym_actors.gym.agent_checkpoint.client.GymClient` per endpoint shared by its
rollouts. Every attempt transition goes to the ledger as an
:class:`~rl_gym_actors.core.attempt_reports.AttemptReport`, batched.

One writer per rollout: only the rollout's own driver coroutine feeds its machine. ``abandon``
and ``adopt`` (from the orchestrator and the ledger) only queue a signal and wake the driver,
which feeds it between awaits; when the machine answers a signal with a new call, the call in
flight is obsolete and is cancelled (only a ``/run`` or a wait ever is: a retire, replay, receipt
fetch or ACK in flight always completes).

:class:`RolloutWorker` is the plain async class (tests drive it in-process);
:class:`RolloutActor` is the same as a Ray actor whose reports go to the ledger actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from pydantic import BaseModel, ConfigDict

from rl_gym_actors import metrics
from rl_gym_actors.actors.reports import ReportOutbox, Send
from rl_gym_actors.actors.runtime import watch_driver
from rl_gym_actors.config import GymEndpoint, LedgerConfig, TryPolicy
from rl_gym_actors.core import rollout as core
from rl_gym_actors.core.attempt_reports import AttemptState
from rl_gym_actors.core.rollout_memory import RolloutMemory
from rl_gym_actors.errors import (
    ConfigError,
    DeadlineExceeded,
    InvalidRequest,
    NotCompleted,
    PoolClosed,
    StaleAttempt,
)
from rl_gym_actors.failures import FailureKind, failure_kind
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.protocol import (
    ATTEMPT_INDEX_FIELD,
    ROLLOUT_ID_FIELD,
    CompletionReceipt,
    is_valid_rollout_id,
)

logger = logging.getLogger(__name__)

DEADLINE_GRACE_S = 0.5  # our own timeout trails the client's deadline by this much
CHUNK_LINGER_S = 0.002  # run_chunk bunches outcomes that end within this of each other
# finished rollouts an actor remembers for adopt() and late abandons (they come within seconds
# of the end); bounded so that an actor's memory stays flat over a long run
FINISHED_MEMORY = 2_000


class RolloutCounters(BaseModel):
    """Counters a rollout actor keeps; the orchestrator sums them over the pool."""

    model_config = ConfigDict(frozen=True)

    in_flight: int = 0
    started: int = 0
    sealed: int = 0
    failed: int = 0
    abandoned: int = 0
    tries: int = 0
    seals: int = 0
    adoptions: int = 0
    acks: int = 0
    cancelled: int = 0
    handed_over: int = 0
    adopt_requests: int = 0
    receipts_with_run: int = 0  # receipts the /run answer carried (no fetch)
    receipts_fetched: int = 0


class RolloutActorSnapshot(RolloutCounters):
    """A rollout actor's counters: rollouts in flight, tries, seals, adoptions and the rest."""

    name: str
    slots: int
    reports_sent: int = 0
    reports_pending: int = 0


@dataclass
class _Live:
    """One rollout in flight: its machine and the signals waiting for its driver."""

    machine: core.RolloutMachine
    row: dict[str, Any]
    client: GymClient
    first_attempt: int
    endpoint_index: int
    signals: list[core.Event] = field(default_factory=list)
    waiter: asyncio.Future | None = None  # the driver's wait on its call or a signal
    task: asyncio.Task | None = None
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)  # the machine moved
    reports: dict[int, Any] = field(default_factory=dict)  # attempt -> its last report
    receipts: dict[int, CompletionReceipt] = field(default_factory=dict)  # sent with /run

    def signal(self, event: core.Event) -> None:
        self.signals.append(event)
        self.wake()

    def wake(self, *_: object) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def notify(self) -> None:
        """Wake whoever waits for this rollout's machine to move (an adopt call)."""
        async with self.changed:
            self.changed.notify_all()


class RolloutWorker:
    """Runs rollouts on Gym endpoints; see the module docstring. ``send`` delivers a batch of
    reports to the ledger (None: reports are kept and counted, never sent)."""

    def __init__(
        self,
        name: str,
        endpoints: Sequence[GymEndpoint],
        policy: TryPolicy | None = None,
        ledger_config: LedgerConfig | None = None,
        *,
        send: Send | None = None,
        slots: int = 1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not endpoints:
            raise ConfigError("a rollout actor needs at least one Gym endpoint")
        self.name = name
        self._endpoints = list(endpoints)
        self._policy = policy or TryPolicy()
        cfg = ledger_config or LedgerConfig()
        self._outbox = ReportOutbox(
            send or _discard, batch_size=cfg.batch_size, interval_s=cfg.flush_interval_s
        )
        self._slots = slots
        self._clock = clock
        self._clients: dict[int, GymClient] = {}
        self._receipts_from_status: set[int] = set()  # endpoints without the receipt route
        # retire needs a checkpoint id; one that no checkpoint ever uses is never spent
        self._retire_id = f"rlga-retire-{uuid.uuid4().hex[:16]}"
        self._live: dict[str, _Live] = {}
        # what this actor knows of the rollouts it ran: settled results for adopt(), abandons
        # that came before their dispatch
        self._memory = RolloutMemory(FINISHED_MEMORY)
        self._counts: dict[str, int] = dict.fromkeys(
            (
                "started",
                "sealed",
                "failed",
                "abandoned",
                "tries",
                "seals",
                "adoptions",
                "acks",
                "cancelled",
                "handed_over",
                "adopt_requests",
                "receipts_with_run",
                "receipts_fetched",
            ),
            0,
        )
        self._closed = False
        self._chunk_linger_s = CHUNK_LINGER_S
        self.driver_gone = False

    # ------------------------------------------------------------ the API

    async def ping(self) -> str:
        return self.name

    async def run_rollout(
        self,
        row: Mapping[str, Any],
        rollout_id: str,
        endpoint_index: int = 0,
        first_attempt: int = 0,
        previous_attempt: int | None = None,
    ) -> Outcome:
        """Play one rollout to its end: sealed, failed or abandoned. Never raises for what Gym
        does; raises ConfigError for bad arguments and PoolClosed after ``close``."""
        if self._closed:
            raise PoolClosed(f"rollout actor {self.name} is closed")
        row = self._check(row, rollout_id, endpoint_index, first_attempt, previous_attempt)
        if len(self._live) >= self._slots:
            # the pool leases slots; only a batch cancelled mid-flight can overlap briefly
            logger.warning(
                "rollout actor %s runs %d rollouts, more than its %d slots",
                self.name,
                len(self._live) + 1,
                self._slots,
            )
        endpoint = self._endpoints[endpoint_index]
        machine = core.RolloutMachine(
            rollout_id,
            endpoint=endpoint.url,
            owner=self.name,
            policy=self._policy,
            first_attempt=first_attempt,
            previous_attempt=previous_attempt,
        )
        live = _Live(machine, row, self._client(endpoint_index), first_attempt, endpoint_index)
        if self._memory.take_abandon(rollout_id, first_attempt):
            live.signal(core.AbandonRequested(self._clock()))
        live.task = asyncio.current_task()
        self._live[rollout_id] = live
        self._counts["started"] += 1
        try:
            return await self._drive(live)
        finally:
            del self._live[rollout_id]
            await live.notify()
            m = machine
            self._memory.finish(
                rollout_id,
                first_attempt,
                m.sealed.attempt_index if m.sealed else m.attempt,
                result=m.sealed is not None,
                acked=m.acked,
            )

    async def run_chunk(self, items: Sequence[tuple]) -> AsyncIterator[list[tuple[int, Any]]]:
        """Several rollouts in one call: each item is :meth:`run_rollout`'s arguments. Yields
        ``[(position, outcome or the exception it raised), ...]`` as they end, bunching those
        that ended together (a Ray streaming generator: one call carries many rollouts, each
        outcome comes back as soon as its rollout ends). Each rollout is its own, as with
        ``run_rollout``: its tries, its abandon and adopt."""
        ended: list[tuple[int, Any]] = []
        wake = asyncio.Event()

        def on_end(pos: int, task: asyncio.Task) -> None:
            if task.cancelled():
                ended.append((pos, PoolClosed(f"rollout actor {self.name}: rollout cancelled")))
            else:
                ended.append((pos, task.exception() or task.result()))
            wake.set()

        for pos, args in enumerate(items):
            task = asyncio.ensure_future(self.run_rollout(*args))
            task.add_done_callback(functools.partial(on_end, pos))
        left = len(items)
        while left:
            await wake.wait()
            if self._chunk_linger_s and len(ended) < left:
                # others still run: let those about to end join this bunch (each yield costs)
                await asyncio.sleep(self._chunk_linger_s)
            wake.clear()
            out = ended[:]
            del ended[:]
            left -= len(out)
            yield out

    async def abandon(self, rollout_id: str, first_attempt: int | None = None) -> None:
        """Stop a rollout: it retires its current try, adopts it if it had finished, and ends
        ``abandoned`` (keeping an adopted result). With ``first_attempt`` it names one dispatch,
        and an abandon that arrives before that dispatch's ``run_rollout`` still applies."""
        live = self._live.get(rollout_id)
        if live is not None and first_attempt in (None, live.first_attempt):
            live.signal(core.AbandonRequested(self._clock()))
            return
        if first_attempt is not None:
            self._memory.request_abandon(rollout_id, first_attempt)

    async def adopt(self, rollout_id: str, attempt_index: int) -> bool:
        """The ledger's request: make sure this attempt ends sealed and ACKed. True when this
        actor owns it as its rollout's current try and it now is; False when it does not own it
        (or it ended otherwise: cancelled, handed over to the ledger, or sealed and left
        un-ACKed for the checkpoint with ``ack="at_checkpoint"``). Raises
        DeadlineExceeded when it does not settle in time: the ledger then asks again."""
        self._counts["adopt_requests"] += 1
        live = self._live.get(rollout_id)
        if live is None:
            return self._memory.holds_result(rollout_id, attempt_index)
        m = live.machine
        if m.attempt != attempt_index:
            return False
        live.signal(core.AdoptRequested(self._clock()))
        budget = 2 * self._policy.control_s + self._policy.receipt_s
        if not self._attempt_settled(m, attempt_index):
            async with live.changed:
                try:
                    await asyncio.wait_for(
                        live.changed.wait_for(lambda: self._attempt_settled(m, attempt_index)),
                        budget,
                    )
                except TimeoutError:
                    raise DeadlineExceeded(
                        f"{self.name}: {rollout_id}/{attempt_index} did not settle in time"
                    ) from None
        if self._sealed_and_acked(m, attempt_index):
            return True
        if m.sealed is not None and m.sealed.attempt_index == attempt_index:
            # sealed, left to the checkpoint (ack="at_checkpoint"): the ledger ACKs it itself,
            # and learns first that it is a sealed result, not an orphan
            await self._outbox.flush()
        return False

    async def rereport(self) -> int:
        """A restarted ledger asks: report again the last state of every attempt of every
        rollout in flight, and deliver it now. How many reports that was."""
        again = [r for live in list(self._live.values()) for r in live.reports.values()]
        for report in again:
            self._outbox.add(report)
        await self._outbox.flush()
        return len(again)

    async def flush_reports(self) -> int:
        """Send every pending report now; returns once the ledger has them."""
        return await self._outbox.flush()

    async def snapshot(self) -> RolloutActorSnapshot:
        return RolloutActorSnapshot(
            name=self.name,
            slots=self._slots,
            in_flight=len(self._live),
            reports_sent=self._outbox.sent,
            reports_pending=self._outbox.pending,
            **self._counts,
        )

    def stop_for_good(self) -> None:
        """The driver is gone: nothing more is dispatched, retired or ACKed for it. Every live
        rollout stops where it stands (a /run in flight keeps going on Gym, whose result stays
        completed and un-ACKed for the next driver to replay); later rollouts raise PoolClosed."""
        self.driver_gone = self._closed = True
        self._outbox.close()
        for live in list(self._live.values()):
            if live.task is not None:
                live.task.cancel()

    async def close(self) -> None:
        """Close the Gym clients; later rollouts raise PoolClosed."""
        self._closed = True
        self._outbox.close()
        for client in self._clients.values():
            await client.close()

    # ------------------------------------------------------------ driving one machine

    async def _drive(self, live: _Live) -> Outcome:
        m = live.machine
        self._feed_signals(live)  # an abandon may have come first
        effects = m.handle(core.Start(self._clock()))
        while True:
            step = self._apply(live, effects)
            await live.notify()
            if m.done:
                assert m.outcome is not None
                return m.outcome
            # a signal that arrived meanwhile may make this step obsolete before it starts
            effects = (
                self._feed_signals(live)
                or self._receipt_at_hand(live, step)
                or await self._perform(live, step)
            )

    def _receipt_at_hand(self, live: _Live, step: core.Effect | None) -> list[core.Effect]:
        """A receipt fetch that the /run (or replay) answer already answered: fed at once."""
        if not isinstance(step, core.FetchReceipt):
            return []
        receipt = live.receipts.pop(step.attempt_index, None)
        if receipt is None:
            return []
        return live.machine.handle(self._receipt_event(live, receipt, step.attempt_index))

    def _receipt_event(self, live: _Live, receipt: CompletionReceipt, att: int) -> core.Event:
        m = live.machine
        problem = core.receipt_problem(receipt, m.rollout_id, att, m.reply)
        if problem:
            return core.DigestMismatch(self._clock(), receipt, problem)
        return core.ReceiptReceived(self._clock(), receipt)

    def _apply(self, live: _Live, effects: list[core.Effect]) -> core.Effect | None:
        """Do the immediate effects; return the one that waits (None once finished)."""
        step = None
        for e in effects:
            if isinstance(e, core.Report):
                live.reports[e.report.attempt_index] = e.report
                self._outbox.add(e.report)
                self._count_report(e.report.state, e.report.released, e.report.adopted)
            elif isinstance(e, core.Seal):
                self._counts["seals"] += 1
                self._counts["adoptions"] += int(e.adopted)
                metrics.SEALS.inc(tags={"endpoint": live.machine.endpoint})
                if e.adopted:
                    metrics.ADOPTIONS.inc(tags={"endpoint": live.machine.endpoint})
            elif isinstance(e, core.Finish):
                self._counts[e.outcome.status] += 1
                self._counts["tries"] += e.outcome.tries
                metrics.TRIES.inc(e.outcome.tries, tags={"endpoint": live.machine.endpoint})
                self._counts["handed_over"] += len(live.machine.handed_over)
            else:
                step = e
        return step

    def _count_report(self, state: AttemptState, released: bool, adopted: bool) -> None:
        if released:
            return
        if state is AttemptState.ACKED:
            self._counts["acks"] += 1
        elif state is AttemptState.TOMBSTONED:
            self._counts["cancelled"] += 1

    def _feed_signals(self, live: _Live) -> list[core.Effect]:
        """Feed queued signals until one makes the machine act; return what it wants done."""
        while live.signals and not live.machine.done:
            effects = live.machine.handle(live.signals.pop(0))
            if effects:
                return effects
        return []

    async def _perform(self, live: _Live, step: core.Effect) -> list[core.Effect]:
        io = asyncio.ensure_future(self._call(live, step))
        io.add_done_callback(live.wake)
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not io.done() and not live.signals:
                    live.waiter = loop.create_future()
                    await live.waiter  # the call ends, or a signal arrives
                    live.waiter = None
                if io.done():
                    return live.machine.handle(io.result())
                effects = self._feed_signals(live)
                if effects:
                    # the machine moved on (abandon or adopt while /run waits): drop the call
                    io.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await io
                    return effects
        finally:
            live.waiter = None
            if not io.done():
                io.cancel()

    async def _call(self, live: _Live, step: core.Effect) -> core.Event:
        """Perform one waiting effect; every outcome comes back as an event, never raised."""
        m, client, clock = live.machine, live.client, self._clock
        rid = m.rollout_id
        if isinstance(step, core.WaitUntil):
            await asyncio.sleep(max(0.0, step.wake_ts - clock()))
            return core.Woke(clock())
        if isinstance(step, core.StartRun):
            try:
                async with asyncio.timeout(max(0.0, step.deadline_ts - clock())):
                    result = await client.run(
                        live.row,
                        rollout_id=rid,
                        attempt_index=step.attempt_index,
                        deadline_ts=step.deadline_ts,
                    )
            except TimeoutError:  # ours or the client's DeadlineExceeded
                return core.DeadlineFired(clock())
            except Exception as exc:
                failure = failure_kind(exc)
                if failure is FailureKind.ADMISSION_CLOSED:
                    return core.RunAdmissionClosed(clock())
                return core.RunFailed(clock(), failure, _detail(exc))
            self._keep_receipt(live, step.attempt_index, result)
            return core.RunReplied(clock(), result.reply, result.replayed)
        deadline = step.deadline_ts
        try:
            async with asyncio.timeout(max(0.0, deadline - clock()) + DEADLINE_GRACE_S):
                if isinstance(step, core.FetchReceipt):
                    receipt = await self._receipt(live, step.attempt_index, deadline)
                    return self._receipt_event(live, receipt, step.attempt_index)
                if isinstance(step, core.Retire):
                    answer = await client.retire(
                        rid, step.attempt_index, checkpoint_id=self._retire_id, deadline_ts=deadline
                    )
                    return core.RetireAnswered(clock(), answer)
                if isinstance(step, core.Replay):
                    result = await client.replay(
                        live.row,
                        rollout_id=rid,
                        attempt_index=step.attempt_index,
                        deadline_ts=deadline,
                    )
                    self._keep_receipt(live, step.attempt_index, result)
                    return core.ReplayReplied(clock(), result.reply)
                if isinstance(step, core.Ack):
                    await client.acknowledge(step.receipt, deadline_ts=deadline)
                    return core.AckAnswered(clock())
        except Exception as exc:
            return core.StepFailed(clock(), failure_kind(exc), _detail(exc))
        raise AssertionError(f"not a waiting effect: {step!r}")

    def _keep_receipt(self, live: _Live, att: int, result: Any) -> None:
        """Keep the (ext) receipt a /run answer carried, for the fetch the machine asks next."""
        if result.receipt is not None:
            live.receipts[att] = result.receipt
            self._counts["receipts_with_run"] += 1
        else:
            live.receipts.pop(att, None)

    async def _receipt(self, live: _Live, att: int, deadline: float) -> CompletionReceipt:
        """The key's completion receipt: from the (ext) receipt route, or, on a server without
        it (a real Gym), from the status lists."""
        client, rid = live.client, live.machine.rollout_id
        self._counts["receipts_fetched"] += 1
        if live.endpoint_index not in self._receipts_from_status:
            try:
                return (await client.receipt(rid, att, deadline_ts=deadline)).completion_receipt
            except InvalidRequest as exc:
                if exc.status not in (404, 405):
                    raise
                self._receipts_from_status.add(live.endpoint_index)
                logger.info(
                    "%s has no receipt route: receipts come from its status", client.endpoint.label
                )
        status = await client.status(self._retire_id, deadline_ts=deadline)
        for info in (*status.completed_unacknowledged_attempts, *status.executions):
            if info.key == (rid, att):
                if info.completion_receipt is not None:
                    return info.completion_receipt
                raise NotCompleted(f"({rid}, {att}) is {info.state}", status=409)
        raise StaleAttempt(
            f"({rid}, {att}) is no longer completed (released or tombstoned)", status=409
        )

    # ------------------------------------------------------------ helpers

    def _client(self, endpoint_index: int) -> GymClient:
        client = self._clients.get(endpoint_index)
        if client is None:
            # one /run connection per slot at least, so no try queues for a socket inside its deadline
            client = self._clients[endpoint_index] = GymClient(
                self._endpoints[endpoint_index],
                limit=max(100, self._slots),
                retry=self._policy.retry,
            )
        return client

    def _check(
        self,
        row: Mapping[str, Any],
        rollout_id: str,
        endpoint_index: int,
        first_attempt: int,
        previous_attempt: int | None,
    ) -> dict[str, Any]:
        if not isinstance(row, Mapping):
            raise ConfigError(f"row must be a mapping, got {type(row).__name__}")
        if not is_valid_rollout_id(rollout_id):
            raise ConfigError(f"invalid rollout_id {rollout_id!r}")
        if not (isinstance(endpoint_index, int) and 0 <= endpoint_index < len(self._endpoints)):
            raise ConfigError(f"endpoint_index {endpoint_index!r} out of range")
        for value in (first_attempt, previous_attempt):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0
            ):
                raise ConfigError(f"attempt indices must be ints >= 0, got {value!r}")
        if rollout_id in self._live:
            raise ConfigError(f"rollout {rollout_id} is already in flight on {self.name}")
        # the client sets the identity fields per try
        return {k: v for k, v in row.items() if k not in (ROLLOUT_ID_FIELD, ATTEMPT_INDEX_FIELD)}

    @staticmethod
    def _attempt_settled(m: core.RolloutMachine, att: int) -> bool:
        state = m.attempt_state(att)
        return (
            m.done
            or m.attempt != att
            or att in m.handed_over
            or state in (AttemptState.ACKED, AttemptState.TOMBSTONED)
        )

    @staticmethod
    def _sealed_and_acked(m: core.RolloutMachine, att: int) -> bool:
        return (
            m.sealed is not None
            and m.sealed.attempt_index == att
            and m.attempt_state(att) is AttemptState.ACKED
            and att not in m.handed_over
        )


def _detail(exc: BaseException) -> str:
    detail = getattr(exc, "detail", None)  # a Gym error says what happened itself
    text = detail if isinstance(detail, str) and detail else f"{type(exc).__name__}: {exc}"
    return text[:500]


async def _discard(batch: list) -> None:
    return None


@ray.remote(num_cpus=0, max_restarts=0)
class RolloutActor(RolloutWorker):
    """A :class:`RolloutWorker` as a Ray actor, reporting to the ledger actor ``ledger``.
    Created by the warm pool as ``RolloutActor.options(name=..., ...).remote(name, endpoints,
    policy, ledger, ledger_config, slots)``."""

    def __init__(
        self,
        name: str,
        endpoints: Sequence[GymEndpoint],
        policy: TryPolicy,
        ledger: Any,
        ledger_config: LedgerConfig | None = None,
        slots: int = 1,
    ) -> None:
        async def send(batch: list) -> None:
            await ledger.report.remote(batch)

        super().__init__(
            name,
            endpoints,
            policy,
            ledger_config,
            send=send if ledger is not None else None,
            slots=slots,
        )
        self._watch: asyncio.Task | None = None

    async def ping(self) -> str:
        # the first call runs on the actor's loop: the driver watch starts there
        if self._watch is None:
            self._watch = asyncio.ensure_future(watch_driver(self.stop_for_good))
        return self.name
