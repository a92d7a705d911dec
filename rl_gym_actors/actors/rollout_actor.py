"""The rollout actor: a thin async shell that performs what core/rollout/ decides.

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
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import ray

from rl_gym_actors import metrics
from rl_gym_actors.actors.gym_calls import GymCalls, LiveRollout
from rl_gym_actors.actors.messages import ChunkResult, RolloutTask
from rl_gym_actors.actors.reports import ReportOutbox, Send
from rl_gym_actors.actors.rollout_counters import RolloutActorSnapshot, RolloutCounters
from rl_gym_actors.actors.runtime import watch_driver
from rl_gym_actors.actors.sealed_finals import SealedFinals
from rl_gym_actors.config import GymEndpoint, LedgerConfig, TryPolicy
from rl_gym_actors.core import rollout as core
from rl_gym_actors.core.attempt_reports import AttemptState
from rl_gym_actors.core.rollout_memory import RolloutMemory
from rl_gym_actors.errors import (
    ConfigError,
    DeadlineExceeded,
    PoolClosed,
)
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.protocol import (
    ATTEMPT_INDEX_FIELD,
    ROLLOUT_ID_FIELD,
    is_valid_rollout_id,
)

logger = logging.getLogger(__name__)

CHUNK_LINGER_S = 0.002  # run_chunk bunches outcomes that end within this of each other
# finished rollouts an actor remembers for adopt() and late abandons (they come within seconds
# of the end); bounded so that an actor's memory stays flat over a long run
FINISHED_MEMORY = 2_000


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
        self._live: dict[str, LiveRollout] = {}
        # this actor's view of the rollouts it ran: released results for adopt(), abandons that
        # came before their dispatch
        self._memory = RolloutMemory(FINISHED_MEMORY, view=True)
        self._finals = SealedFinals()  # sealed, un-ACKed results, for a restarted ledger
        self._finals_turned_for: str | None = None  # the checkpoint id they last turned for
        # every counter of RolloutCounters but in_flight (which is len(self._live))
        self._counts = dict.fromkeys(
            (f for f in RolloutCounters.model_fields if f != "in_flight"), 0
        )
        self._calls = GymCalls(clock, self._counts)
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
        return await self.run(
            RolloutTask(row, rollout_id, endpoint_index, first_attempt, previous_attempt)
        )

    async def run(self, task: RolloutTask) -> Outcome:
        """:meth:`run_rollout` for one :class:`RolloutTask` (the message across Ray)."""
        rollout_id, endpoint_index = task.rollout_id, task.endpoint_index
        first_attempt, previous_attempt = task.first_attempt, task.previous_attempt
        if self._closed:
            raise PoolClosed(f"rollout actor {self.name} is closed")
        row = self._check(task)
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
        live = LiveRollout(
            machine, row, self._client(endpoint_index), first_attempt, endpoint_index
        )
        if self._memory.take_abandon(rollout_id, first_attempt):
            live.signal(core.AbandonRequested(self._clock()))
        live.task = asyncio.current_task()
        self._live[rollout_id] = live
        self._counts["started"] += 1
        self._memory.begin(rollout_id)
        try:
            return await self._drive(live)
        finally:
            del self._live[rollout_id]
            m = machine
            if m.sealed is not None and not m.acked and m.sealed.attempt_index in live.reports:
                self._finals.keep(rollout_id, live.reports[m.sealed.attempt_index])
            self._memory.end_run(
                rollout_id,
                first_attempt,
                m.sealed.attempt_index if m.sealed else m.attempt,
                sealed=m.sealed is not None,
                acked=m.acked,
            )
            await live.notify()

    async def run_chunk(self, tasks: Sequence[RolloutTask]) -> AsyncIterator[list[ChunkResult]]:
        """Several rollouts in one call. Yields a :class:`ChunkResult` per task (its position,
        its outcome or the exception it raised) as they end, bunching those that ended together
        (a Ray streaming generator: one call carries many rollouts, each outcome comes back as
        soon as its rollout ends). Each rollout is its own, as with :meth:`run`: its tries, its
        abandon and adopt."""
        ended: list[ChunkResult] = []
        wake = asyncio.Event()

        def on_end(pos: int, done: asyncio.Task[Outcome]) -> None:
            if done.cancelled():
                error = PoolClosed(f"rollout actor {self.name}: rollout cancelled")
                ended.append(ChunkResult(pos, error=error))
            elif done.exception() is not None:
                ended.append(ChunkResult(pos, error=done.exception()))
            else:
                ended.append(ChunkResult(pos, outcome=done.result()))
            wake.set()

        for pos, task in enumerate(tasks):
            running = asyncio.ensure_future(self.run(task))
            running.add_done_callback(functools.partial(on_end, pos))
        left = len(tasks)
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
        rollout in flight and of every finished rollout's sealed, un-ACKed try (see
        :mod:`~rl_gym_actors.actors.sealed_finals`), and deliver it now. How many reports
        that was."""
        again = [r for live in list(self._live.values()) for r in live.reports.values()]
        again += self._finals.reports()  # finished, sealed, not yet released
        for report in again:
            self._outbox.add(report)
        await self._outbox.flush()
        return len(again)

    async def flush_reports(self, checkpoint_id: str | None = None) -> int:
        """Send every pending report now; returns once the ledger has them. A checkpoint's
        first flush names it: the sealed finals turn over once per checkpoint id (a gate
        flushes again as it goes, and a restarted ledger's gate again for the same id: turned
        each time, the results sealed before it were forgotten before they were released)."""
        if checkpoint_id is not None and checkpoint_id != self._finals_turned_for:
            self._finals_turned_for = checkpoint_id
            self._finals.turn()
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
        metrics.flush_coalesced()
        for client in self._clients.values():
            await client.close()

    # ------------------------------------------------------------ driving one machine

    async def _drive(self, live: LiveRollout) -> Outcome:
        m = live.machine
        self._feed_signals(live)  # an abandon may have come first
        effects = m.handle(core.Start(self._clock()))
        while True:
            step = self._apply(live, effects)
            await live.notify()
            if m.done:
                assert m.outcome is not None
                return m.outcome
            assert step is not None  # a machine that is not done waits on an effect
            # a signal that arrived meanwhile may make this step obsolete before it starts
            at_hand = self._calls.receipt_at_hand(live, step)
            effects = (
                self._feed_signals(live)
                or (m.handle(at_hand) if at_hand is not None else [])
                or await self._perform(live, step)
            )

    def _apply(self, live: LiveRollout, effects: list[core.Effect]) -> core.Effect | None:
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

    def _feed_signals(self, live: LiveRollout) -> list[core.Effect]:
        """Feed queued signals until one makes the machine act; return what it wants done."""
        while live.signals and not live.machine.done:
            effects = live.machine.handle(live.signals.pop(0))
            if effects:
                return effects
        return []

    async def _perform(self, live: LiveRollout, step: core.Effect) -> list[core.Effect]:
        io = asyncio.ensure_future(self._calls.perform(live, step))
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

    # ------------------------------------------------------------ helpers

    def _client(self, endpoint_index: int) -> GymClient:
        client = self._clients.get(endpoint_index)
        if client is None:
            # a /run connection per slot at least: no try waits for a socket inside its deadline
            client = self._clients[endpoint_index] = GymClient(
                self._endpoints[endpoint_index],
                limit=max(100, self._slots),
                retry=self._policy.retry,
            )
        return client

    def _check(self, task: RolloutTask) -> dict[str, Any]:
        row, rollout_id, endpoint_index = task.row, task.rollout_id, task.endpoint_index
        if not isinstance(row, Mapping):
            raise ConfigError(f"row must be a mapping, got {type(row).__name__}")
        if not is_valid_rollout_id(rollout_id):
            raise ConfigError(f"invalid rollout_id {rollout_id!r}")
        if not (isinstance(endpoint_index, int) and 0 <= endpoint_index < len(self._endpoints)):
            raise ConfigError(f"endpoint_index {endpoint_index!r} out of range")
        for value in (task.first_attempt, task.previous_attempt):
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


async def _discard(batch: list) -> None:
    return None


def set_actor_log_level(level: str) -> None:
    """The ``rl_gym_actors`` loggers of this actor process at ``level`` (PoolConfig.log_level),
    written to stderr (Ray's worker log) when below WARNING: Python's last-resort handler shows
    WARNING and up only."""
    root = logging.getLogger("rl_gym_actors")
    root.setLevel(level)
    if logging.getLevelName(level) < logging.WARNING and not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)


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
        *,
        log_level: str = "WARNING",
    ) -> None:
        set_actor_log_level(log_level)

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
            self._watch = asyncio.ensure_future(
                watch_driver(self.stop_for_good, on_tick=metrics.flush_coalesced)
            )
        return self.name
