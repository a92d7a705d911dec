"""One rollout in flight on a rollout actor, and the Gym calls that perform its machine's effects.

:class:`LiveRollout` holds a rollout's machine and the signals (abandon, adopt) waiting for its
driver. :class:`GymCalls` performs one waiting effect of a machine (``/run``, a receipt fetch,
retire, replay, ACK, or a wait) on the rollout's Gym client and turns whatever came of it into
the machine's next event: a call's failure comes back as an event with its
:class:`~rl_gym_actors.failures.FailureKind`, never raised.

On a Gym v2 server (found by asking it, once per endpoint: :mod:`rl_gym_actors.gym.v2.discover`)
the same machine runs; three of its steps are v2's: a receipt is the reply's own digest (v2 has
no receipts), an ACK is a no-op (v2 has none: the ledger's v2 gate forgets the rollout after a
committed checkpoint), and a retire first asks our server for the attempt's kept reply ((ext)
``/run?replay_only=1``, each try bounded by ``receipt_s`` as a receipt fetch is): a reply
finished but lost is adopted by the replay that follows, never rerun; otherwise the attempt is
retired with v2's ``retire`` (refused, stopped, freed).
``/run`` and its replay are the same call on both protocols; 409 ``admission_closed`` (a v2
checkpoint is open) waits and resends without spending a try, as on the agent-checkpoint one. A
``/run`` on a v2 server does not count the time the server held a checkpoint open (its episode
parked) against ``rollout_s`` (:mod:`.park_watch`), as Gym does not count it against its own.

A Gym restart (both protocols): a step that got no answer at all (refused, or not sent because
the endpoint is marked down) waits for the endpoint to answer again and is sent again, within
its deadline and within ``control_s`` of the first call in a row that got none
(:meth:`GymCalls._ride_out`); a ``/run`` that meets the down mark waits the same way before it
is sent. A Gym away for longer than ``control_s`` is taken for dead: nothing waits for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rl_gym_actors.actors.park_watch import ParkWatch, poll_interval
from rl_gym_actors.core import rollout as core
from rl_gym_actors.errors import (
    CheckpointConflict,
    EndpointDown,
    GymUnavailable,
    InvalidRequest,
    NotCompleted,
    StaleAttempt,
)
from rl_gym_actors.failures import FailureKind, failure_kind
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.fence import RETIRE_PHASES
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.discover import CheckpointProtocol, discover_protocol
from rl_gym_actors.gym.v2.wire import EpisodeId, Phase
from rl_gym_actors.protocol import CompletionReceipt, RetireAnswer, result_digest

logger = logging.getLogger(__name__)

DEADLINE_GRACE_S = 0.5  # our own timeout trails the client's deadline by this much
PARKED_MAX_S = 86_400.0  # a backstop on a /run's HTTP exchange; its deadline is watched here
RESEND_PAUSE_S = 0.1  # a step that got no answer is sent again this long after Gym is up
# the failures of a call that got no answer at all (refused, or not sent: the endpoint is down)
_NO_ANSWER = frozenset({FailureKind.LOST, FailureKind.ENDPOINT_DOWN})

T = TypeVar("T")


@dataclass
class LiveRollout:
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


_RETIRE_PHASES = frozenset(p.value for p in RETIRE_PHASES)


class GymCalls:
    """Performs the waiting effects of one actor's rollouts. Shared by them: the retire id (a
    checkpoint id no checkpoint ever uses, so never spent), which endpoints lack the receipt
    route, and the actor's receipt counters (``counts``)."""

    def __init__(self, clock: Callable[[], float], counts: dict[str, int]) -> None:
        self.clock = clock
        self.retire_id = f"rlga-retire-{uuid.uuid4().hex[:16]}"
        self._counts = counts
        self._receipts_from_status: set[int] = set()  # endpoints without the receipt route
        self._v2: dict[int, _V2 | None] = {}  # endpoint index -> its v2 client, None: agent
        self._watches: dict[int, ParkWatch] = {}  # v2 endpoint index -> its park watch
        self._discovering: dict[int, asyncio.Task[None]] = {}

    def receipt_at_hand(self, live: LiveRollout, step: core.Effect | None) -> core.Event | None:
        """The event for a receipt fetch that the /run (or replay) answer already answered."""
        if not isinstance(step, core.FetchReceipt):
            return None
        receipt = live.receipts.pop(step.attempt_index, None)
        if receipt is None:
            return None
        return self._receipt_event(live, receipt, step.attempt_index)

    def _receipt_event(self, live: LiveRollout, receipt: CompletionReceipt, att: int) -> core.Event:
        m = live.machine
        problem = core.receipt_problem(receipt, m.rollout_id, att, m.reply)
        if problem:
            return core.DigestMismatch(self.clock(), receipt, problem)
        return core.ReceiptReceived(self.clock(), receipt)

    async def perform(self, live: LiveRollout, step: core.Effect) -> core.Event:
        """Perform one waiting effect; every outcome comes back as an event, never raised."""
        clock = self.clock
        if isinstance(step, core.WaitUntil):
            await asyncio.sleep(max(0.0, step.wake_ts - clock()))
            return core.Woke(clock())
        if isinstance(step, core.StartRun):
            try:
                result = await self._run(live, step)
            except TimeoutError:  # ours or the client's DeadlineExceeded
                return core.DeadlineFired(clock())
            except Exception as exc:
                failure = failure_kind(exc)
                if failure is FailureKind.ADMISSION_CLOSED:
                    return core.RunAdmissionClosed(clock())
                return core.RunFailed(clock(), failure, _detail(exc))
            self._keep_receipt(live, step.attempt_index, result)
            return core.RunReplied(clock(), result.reply, result.replayed)
        if not isinstance(step, (core.FetchReceipt, core.Retire, core.Replay, core.Ack)):
            raise AssertionError(f"not a waiting effect: {step!r}")
        deadline = step.deadline_ts
        try:
            async with asyncio.timeout(max(0.0, deadline - clock()) + DEADLINE_GRACE_S):
                return await self._ride_out(live, deadline, lambda: self._step(live, step))
        except Exception as exc:
            return core.StepFailed(clock(), failure_kind(exc), _detail(exc))

    async def _step(
        self, live: LiveRollout, step: core.FetchReceipt | core.Retire | core.Replay | core.Ack
    ) -> core.Event:
        """One go at a control step by its deadline; raises what its call raised."""
        client, clock, rid = live.client, self.clock, live.machine.rollout_id
        deadline = step.deadline_ts
        v2 = await self._v2_of(live, deadline)
        if v2 is not None and not isinstance(step, core.Replay):
            return await self._perform_v2(live, step, v2, deadline)
        if isinstance(step, core.FetchReceipt):
            receipt = await self._receipt(live, step, deadline)
            if receipt is None:
                self._counts["receipts_deferred"] += 1
                return core.ReceiptDeferred(clock())
            return self._receipt_event(live, receipt, step.attempt_index)
        if isinstance(step, core.Retire):
            answer = await self._retire(client, rid, step.attempt_index, deadline)
            return core.RetireAnswered(clock(), answer)
        if isinstance(step, core.Replay):
            result = await client.replay(
                live.row, rollout_id=rid, attempt_index=step.attempt_index, deadline_ts=deadline
            )
            self._keep_receipt(live, step.attempt_index, result)
            return core.ReplayReplied(clock(), result.reply)
        await client.acknowledge(step.receipt, deadline_ts=deadline)  # an Ack
        return core.AckAnswered(clock())

    async def _ride_out(
        self, live: LiveRollout, deadline: float, go: Callable[[], Awaitable[T]]
    ) -> T:
        """``go()``, and again while Gym gives no answer at all (refused, or marked down: a
        restart) once the endpoint is up again, until ``deadline`` (the step's; a repeat is
        sent only while a try still fits). Every step it sends is idempotent. A Gym that has
        given no answer for ``control_s`` since the first failure in a row is taken for dead:
        nothing waits for it any more, and its calls fail at once, naming the cause."""
        policy = live.machine.policy
        last_send = deadline - (policy.retry.min_try_s + policy.retry.reply_margin_s)
        while True:
            try:
                return await go()
            except GymUnavailable as exc:
                if failure_kind(exc) not in _NO_ANSWER or not await self._wait_up(live, last_send):
                    raise
                logger.info("%s: %r; Gym answers again: sent again", live.machine.rollout_id, exc)

    async def _wait_up(self, live: LiveRollout, until_ts: float) -> bool:
        """Wait, by ``until_ts`` and within the outage's grace (``control_s`` from the first
        failure in a row), for the endpoint to be up again, and a short pause after; True when
        a call may be sent again now."""
        client, policy = live.client, live.machine.policy
        since = client.failing_since
        if since is not None:
            until_ts = min(until_ts, since + policy.control_s)
        if self.clock() >= until_ts or not await client.until_up(until_ts):
            return False
        self._counts["outage_waits"] += 1
        await asyncio.sleep(max(0.0, min(RESEND_PAUSE_S, until_ts - self.clock())))
        return self.clock() < until_ts

    async def _run(self, live: LiveRollout, step: core.StartRun) -> Any:
        """``/run`` by ``step.deadline_ts``; on a v2 server, that deadline moves out by the time
        the server was seen holding a checkpoint open since the call started
        (:mod:`.park_watch`). TimeoutError when it passes."""
        if live.client.health.down:  # a restart, maybe: wait for it rather than fail unsent
            await self._wait_up(live, step.deadline_ts)
        clock, started = self.clock, self.clock()
        run = asyncio.ensure_future(
            live.client.run(
                live.row,
                rollout_id=live.machine.rollout_id,
                attempt_index=step.attempt_index,
                deadline_ts=step.deadline_ts + PARKED_MAX_S,  # ours below is the one that counts
            )
        )
        watch, token = None, 0
        try:
            while not run.done():
                if watch is None and (watch := self._watch_of(live)) is not None:
                    token = watch.enter(started)
                paused = watch.parked_since(started) if watch is not None else 0.0
                left = step.deadline_ts + paused - clock()
                if left <= 0 and watch is not None:
                    await watch.read()  # at the deadline: does a checkpoint hold it now?
                    if watch.time.parked:
                        left = watch.interval_s
                if left <= 0:
                    raise TimeoutError(f"/run past rollout_s (+{paused:.1f} s parked)")
                if live.endpoint_index not in self._v2:  # look again once discovery answered
                    left = min(left, 1.0)
                await asyncio.wait([run], timeout=left)
            return run.result()
        finally:
            if watch is not None:
                self._counts["deadlines_paused"] += watch.parked_since(started) > 0
                watch.leave(token)
            if not run.done():
                run.cancel()
                with contextlib.suppress(BaseException):
                    await run

    def _watch_of(self, live: LiveRollout) -> ParkWatch | None:
        """The park watch of the endpoint when it speaks v2; None otherwise, or while that is
        not known yet (asked in the background: a /run never waits for it)."""
        index = live.endpoint_index
        if index not in self._v2:
            if index not in self._discovering:

                async def discover() -> None:
                    with contextlib.suppress(Exception):  # unknown: asked again next time
                        await self._v2_of(live, self.clock() + 5.0)
                    self._discovering.pop(index, None)

                self._discovering[index] = asyncio.create_task(discover())
            return None
        v2 = self._v2[index]
        if v2 is None:
            return None
        watch = self._watches.get(index)
        if watch is None:
            client = v2.client

            async def parked(deadline_ts: float) -> bool:
                return (await client.status(deadline_ts=deadline_ts)).phase is not Phase.IDLE

            interval = poll_interval(live.machine.policy.rollout_s)
            watch = self._watches[index] = ParkWatch(parked, self.clock, interval)
        return watch

    async def _v2_of(self, live: LiveRollout, deadline: float) -> _V2 | None:
        """The endpoint's v2 client, or None when it speaks the agent-checkpoint protocol."""
        index = live.endpoint_index
        if index not in self._v2:
            found = await discover_protocol(live.client, deadline_ts=deadline)
            if found.protocol is CheckpointProtocol.V2 and found.status is not None:
                keeps = (found.status.model_extra or {}).get("kept_replies") is not None
                self._v2[index] = _V2(V2Client(live.client), keeps)
            else:
                self._v2[index] = None
        return self._v2[index]

    async def _perform_v2(
        self, live: LiveRollout, step: core.Effect, v2: _V2, deadline: float
    ) -> core.Event:
        m, clock = live.machine, self.clock
        rid = m.rollout_id
        if isinstance(step, core.FetchReceipt):
            if m.reply is None:  # a stale first try: on v2 it was retired, nothing to adopt
                return core.StepFailed(clock(), FailureKind.STALE, "v2: the attempt was retired")
            key = EpisodeId(rollout_id=rid, attempt=step.attempt_index).capture_key
            receipt = CompletionReceipt(
                rollout_id=rid,
                attempt_index=step.attempt_index,
                execution_generation=1,
                result_identity=f"v2:{key}",
                result_digest=result_digest(m.reply),
            )
            return core.ReceiptReceived(clock(), receipt)
        if isinstance(step, core.Ack):
            return core.AckAnswered(clock())  # the ledger forgets it after a commit
        if isinstance(step, core.Retire):
            if v2.keeps_replies:
                try:
                    await self._kept_reply(live, v2, step.attempt_index, deadline)
                    self._counts["v2_kept_replies_found"] += 1
                    done = RetireAnswer(
                        retired=False, tombstoned=False, completed_unacknowledged=True
                    )
                    return core.RetireAnswered(clock(), done)
                except NotCompleted:
                    pass  # running, or never started: retire it
                except StaleAttempt:
                    return core.RetireAnswered(
                        clock(), RetireAnswer(retired=False, tombstoned=True)
                    )
            episode = EpisodeId(rollout_id=rid, attempt=step.attempt_index)
            await v2.client.retire(self.retire_id, [episode], deadline_ts=deadline)
            return core.RetireAnswered(clock(), RetireAnswer(retired=True, tombstoned=True))
        raise AssertionError(f"not a v2 step: {step!r}")

    async def _kept_reply(self, live: LiveRollout, v2: _V2, att: int, deadline: float) -> None:
        """(ext) The attempt's kept reply, fetched as a receipt is: each try bounded by the
        policy's ``receipt_s`` and tried again (it starts nothing) until the step's deadline,
        also after a try that got no answer (a Gym restarting); a dead endpoint fails at once."""
        rid, per_try = live.machine.rollout_id, live.machine.policy.receipt_s
        while True:
            try_deadline = min(deadline, self.clock() + per_try)
            try:
                await v2.client.kept_reply(
                    live.row, rollout_id=rid, attempt=att, deadline_ts=try_deadline
                )
                return
            except EndpointDown:
                raise
            except (TimeoutError, GymUnavailable) as exc:  # no answer within this try
                if try_deadline >= deadline:
                    raise
                logger.info(
                    "%s: kept-reply fetch of try %d got no answer (%r); again", rid, att, exc
                )
                await asyncio.sleep(max(0.0, min(0.2, try_deadline - self.clock())))

    async def _retire(self, client: Any, rid: str, att: int, deadline: float) -> Any:
        """Retire under this actor's id; while a checkpoint holds the server (a real Gym then
        refuses any other id), under the active checkpoint's id, read from capabilities,
        when its phase takes a retire. Otherwise the conflict stands: the machine backs off
        and retires again after the resume."""
        try:
            return await client.retire(rid, att, checkpoint_id=self.retire_id, deadline_ts=deadline)
        except CheckpointConflict:
            caps = await client.capabilities(deadline_ts=deadline)
            active = None if caps is None else caps.active_checkpoint_id
            if active is None or caps is None or caps.phase not in _RETIRE_PHASES:
                raise
            return await client.retire(rid, att, checkpoint_id=active, deadline_ts=deadline)

    def _keep_receipt(self, live: LiveRollout, att: int, result: Any) -> None:
        """Keep the (ext) receipt a /run answer carried, for the fetch the machine asks next."""
        if result.receipt is not None:
            live.receipts[att] = result.receipt
            self._counts["receipts_with_run"] += 1
        else:
            live.receipts.pop(att, None)

    async def _receipt(
        self, live: LiveRollout, step: core.FetchReceipt, deadline: float
    ) -> CompletionReceipt | None:
        """The key's completion receipt: from the per-key route ((ext) ``/receipt`` or a later
        real Gym's ``/completion-receipt``). On a server without one (the first real participant
        version): None when the fetch may be deferred (the checkpoint gate reads every receipt
        from its one status listing), else from the status lists (an ``on_seal`` ACK, whose
        listing stays short, or a stale check)."""
        client, rid, att = live.client, live.machine.rollout_id, step.attempt_index
        if live.endpoint_index not in self._receipts_from_status:
            self._counts["receipts_fetched"] += 1
            try:
                answer = await client.receipt(rid, att, deadline_ts=deadline)
            except InvalidRequest as exc:
                if exc.status not in (404, 405):
                    raise
                self._receipts_from_status.add(live.endpoint_index)
                logger.info(
                    "%s has no receipt route: receipts come from its status listing",
                    client.endpoint.label,
                )
            else:
                if answer.completion_receipt is None:  # ACKed, its receipt no longer kept
                    raise StaleAttempt(f"({rid}, {att}) is {answer.state}", status=409)
                return answer.completion_receipt
        if step.may_defer:
            return None
        self._counts["receipts_fetched"] += 1
        self._counts["receipts_from_status"] += 1
        status = await client.status(self.retire_id, deadline_ts=deadline)
        for info in (*status.completed_unacknowledged_attempts, *status.executions):
            if info.key == (rid, att):
                if info.completion_receipt is not None:
                    return info.completion_receipt
                raise NotCompleted(f"({rid}, {att}) is {info.state}", status=409)
        raise StaleAttempt(
            f"({rid}, {att}) is no longer completed (released or tombstoned)", status=409
        )


@dataclass(frozen=True)
class _V2:
    client: V2Client
    keeps_replies: bool  # our server ((ext) kept replies): a lost reply can be adopted


def _detail(exc: BaseException) -> str:
    detail = getattr(exc, "detail", None)  # a Gym error says what happened itself
    text = detail if isinstance(detail, str) and detail else f"{type(exc).__name__}: {exc}"
    return text[:500]
