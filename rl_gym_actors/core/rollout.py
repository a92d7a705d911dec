"""One rollout's tries as a pure, synchronous state machine: events in, effects out.

No Ray, no sockets, no clock reads: every event carries the time it happened (``now``, Unix
seconds) and every effect that waits carries an absolute deadline. The rollout actor performs the
effects and feeds back what came of them; tests drive the machine against a model of Gym.

The rule it keeps is "retire, then adopt or cancel": whenever it gives up on a try (its
``rollout_s`` deadline fired, it was abandoned, the receipt fetch failed, the connection broke,
the digest did not match, a plain 5xx) it first retires that try on Gym.

- retired (the try was still running, now tombstoned): the try is cancelled; the next try starts
  if tries remain and the reason allows, else the rollout fails with the reason.
- completed, not ACKed: it replays ``/run`` for the same key (Gym answers with the stored reply
  and does not run the agent), fetches the receipt, seals the reply and ACKs it. That is the
  rollout's result (``adopted``); there is no next try.

``/run`` refused because admission is closed (a checkpoint is between prepare and resume) is not
a failed try: the machine waits with backoff and sends the same key again, for at most
``policy.admission_wait_s``. A retire, replay, receipt fetch or ACK is retried by its call
(``policy.retry``) on a lost connection or a 5xx; the machine repeats it itself, backing off by the
same policy until that step's deadline, only for what passes once Gym's state changed (a key not
completed yet, a checkpoint in the way: see :class:`~rl_gym_actors.failures.Repeat`). If it still
fails, the attempt is handed over to the ledger (reported ``released``), which settles it at the
next checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any

from rl_gym_actors import errors
from rl_gym_actors.config import TryPolicy
from rl_gym_actors.core.attempt_reports import AttemptReport, AttemptState

# the machine's vocabulary, also reachable from here: callers use ``rollout.StartRun`` etc.
from rl_gym_actors.core.rollout_events import (  # noqa: F401
    BLOCKING,
    AbandonRequested,
    Ack,
    AckAnswered,
    AdoptRequested,
    DeadlineFired,
    DigestMismatch,
    Effect,
    Event,
    FetchReceipt,
    Finish,
    ReceiptReceived,
    Replay,
    ReplayReplied,
    Report,
    Retire,
    RetireAnswered,
    RunAdmissionClosed,
    RunFailed,
    RunReplied,
    Seal,
    Start,
    StartRun,
    StepFailed,
    WaitUntil,
    Woke,
    receipt_problem,
)
from rl_gym_actors.errors import IllegalTransition
from rl_gym_actors.failures import FailureKind, Repeat
from rl_gym_actors.outcome import Outcome, OutcomeStatus, reward_of
from rl_gym_actors.protocol import CompletionReceipt


class RolloutPhase(StrEnum):
    """Where one rollout stands. Every phase but NEW and DONE waits on exactly one effect."""

    NEW = "new"
    RUNNING = "running"  # /run in flight for the current try
    ADMISSION_WAIT = "admission_wait"  # /run refused while admission is closed; waiting to resend
    RECEIPT = "receipt"  # reply in hand; fetching its receipt
    RETIRING = "retiring"  # giving up on the current try: retire in flight
    REPLAYING = "replaying"  # retire said completed: replaying /run for the stored reply
    ADOPT_RECEIPT = "adopt_receipt"  # stored reply in hand; fetching its receipt
    ACKING = "acking"  # sealed; ACK in flight
    RELEASING = "releasing"  # ACKing a stored reply that could not be sealed
    STALE_CHECK = "stale_check"  # a new rollout's first try is stale: ACKed or tombstoned?
    DONE = "done"


# ---------------------------------------------------------------- the machine


class RolloutMachine:
    """The tries of one rollout on one endpoint.

    ``first_attempt`` is the index of the first fresh try; ``previous_attempt`` (a re-dispatch)
    is an earlier try of this rollout that did not end sealed: the machine starts by retiring it,
    and adopts it when it had finished. ``handle`` returns the effects to perform, in order; at
    most one of them waits (``BLOCKING``) or ends the rollout (``Finish``), and it comes last.
    """

    def __init__(
        self,
        rollout_id: str,
        *,
        endpoint: str,
        owner: str,
        policy: TryPolicy,
        first_attempt: int = 0,
        previous_attempt: int | None = None,
    ) -> None:
        if first_attempt < 0 or (previous_attempt is not None and previous_attempt < 0):
            raise errors.ConfigError("attempt indices must be >= 0")
        self.rollout_id = rollout_id
        self.endpoint = endpoint
        self.owner = owner
        self.policy = policy
        self.previous_attempt = previous_attempt
        self.phase = RolloutPhase.NEW
        self.attempt: int | None = None  # the current try
        self.tries = 0
        self.abandoning = False
        self.reason: str | None = None
        self.failure: FailureKind | None = None  # the kind of ``reason``
        self.handed_over: list[int] = []
        self.outcome: Outcome | None = None
        self.sealed: Seal | None = None
        self.acked = False
        self._next_index = first_attempt
        if previous_attempt is not None:
            self._next_index = max(first_attempt, previous_attempt + 1)
        self._reply: Any = None
        self._replayed = False
        self._next_try_allowed = True
        self._step: Effect | None = None  # the pending control call, repeated on Woke
        self._make: Callable[[float], Effect] | None = None
        self._step_started = self._budget_s = 0.0
        self._step_deadline = self._repeat_limit = 0.0
        self._retries = 0
        self._asleep = False
        self._admission_since: float | None = None
        self._duplicate_until: float | None = None
        self._reported: dict[int, AttemptState] = {}
        self._released: set[int] = set()

    # -------------------------------------------------------- public

    @property
    def done(self) -> bool:
        return self.phase is RolloutPhase.DONE

    @property
    def reply(self) -> Any:
        """The reply in hand for the current try (from /run or its replay), if any."""
        return self._reply

    def attempt_state(self, attempt_index: int) -> AttemptState | None:
        """The last state this machine reported for one of its attempts."""
        return self._reported.get(attempt_index)

    def handle(self, event: Event) -> list[Effect]:
        """Apply one event; return the effects to perform. Raises IllegalTransition."""
        name = _TABLE.get((self.phase, type(event)))
        if name is None:
            raise IllegalTransition(
                f"rollout {self.rollout_id}: {type(event).__name__} in phase {self.phase.value}",
                state=self.phase.value,
                event=type(event).__name__,
            )
        if isinstance(event, Woke):
            if not self._asleep:
                raise IllegalTransition(
                    f"rollout {self.rollout_id}: Woke while not waiting",
                    state=self.phase.value,
                    event="Woke",
                )
            self._asleep = False
        out: list[Effect] = []
        getattr(self, name)(event, out)
        return out

    # -------------------------------------------------------- starting tries

    def _on_start(self, ev: Start, out: list[Effect]) -> None:
        if self.previous_attempt is not None:
            # A re-dispatch: settle the earlier try first (adopt it if it finished).
            self.attempt = self.previous_attempt
            self._give_up(ev.now, out, reason=None, next_try=True)
        elif self.abandoning:
            self._finish(
                "abandoned",
                out,
                reason="abandoned before it started",
                failure=FailureKind.ABANDONED,
            )
        else:
            self._start_try(ev.now, out)

    def _start_try(self, now: float, out: list[Effect]) -> None:
        self.attempt = self._next_index
        self._next_index += 1
        self.tries += 1
        self._reply, self._replayed = None, False
        self._admission_since = self._duplicate_until = None
        self._report(out, AttemptState.RUNNING)
        self._dispatch(now, out)

    def _dispatch(self, now: float, out: list[Effect]) -> None:
        self.phase = RolloutPhase.RUNNING
        out.append(StartRun(self._attempt, now + self.policy.rollout_s))

    # -------------------------------------------------------- RUNNING

    def _on_run_replied(self, ev: RunReplied, out: list[Effect]) -> None:
        self._reply, self._replayed = ev.reply, ev.replayed
        self._begin_step(
            RolloutPhase.RECEIPT,
            ev.now,
            self.policy.receipt_s,
            out,
            lambda d: FetchReceipt(self._attempt, d),
        )

    def _on_run_failed(self, ev: RunFailed, out: list[Effect]) -> None:
        f = ev.failure
        text = f"{f.value}: {ev.detail}" if ev.detail else f.value
        if f is FailureKind.ADMISSION_CLOSED:
            self._on_admission_closed(RunAdmissionClosed(ev.now), out)
        elif f is FailureKind.STALE and self.previous_attempt is None and self.tries == 1:
            # The first try of a rollout its dispatcher calls new is stale on Gym: tombstoned
            # (someone retired it: the next try is fine) or ACKed, i.e. it sealed before and was
            # forgotten (another try would seal it a second time). Its receipt tells which.
            self._why(text, f)
            self._begin_step(
                RolloutPhase.STALE_CHECK,
                ev.now,
                self.policy.control_s,
                out,
                lambda d: FetchReceipt(self._attempt, d),
            )
        elif f is FailureKind.STALE:
            # Gym already tombstoned the key (someone retired it).
            self._why(text, f)
            self._report(out, AttemptState.TOMBSTONED)
            self._after_try(ev.now, out)
        elif f is FailureKind.DUPLICATE:
            self._on_duplicate(ev, out)
        else:
            # an agent failure (a 5xx) too: retire first, which confirms it did not complete
            self._give_up(
                ev.now,
                out,
                reason=f"/run failed: {text}",
                failure=f,
                next_try=f.may_pass or f is FailureKind.AGENT_FAILED,
            )

    def _on_duplicate(self, ev: RunFailed, out: list[Effect]) -> None:
        # The key already runs on Gym, started by an earlier dispatcher (a driver that died):
        # wait for it and take its stored reply instead of running the agent again.
        if self._duplicate_until is None:
            self._duplicate_until, self._retries = ev.now + self.policy.rollout_s, 0
        if ev.now >= self._duplicate_until:
            self._give_up(
                ev.now,
                out,
                reason="the key kept running elsewhere past rollout_s",
                failure=FailureKind.DUPLICATE,
                next_try=True,
            )
            return
        self.phase = RolloutPhase.ADMISSION_WAIT
        self._sleep(ev.now, self._duplicate_until, out)

    def _on_stale_result(self, ev: ReceiptReceived | DigestMismatch, out: list[Effect]) -> None:
        # a receipt exists: the key completed once and was ACKed (released) since
        self._report(out, AttemptState.ACKED)
        self._finish_failed(
            f"rollout id {self.rollout_id} sealed before and was forgotten: "
            f"try {self._attempt} is ACKed on Gym",
            FailureKind.FORGOTTEN,
            out,
        )

    def _on_stale_no_result(self, ev: StepFailed, out: list[Effect]) -> None:
        if self._may_repeat(ev.failure, ev.now, out):
            return
        # no receipt (tombstoned, or not telling): the try never completed; the next one may run
        self._report(out, AttemptState.TOMBSTONED)
        self._after_try(ev.now, out)

    def _on_admission_closed(self, ev: RunAdmissionClosed, out: list[Effect]) -> None:
        if self._admission_since is None:
            self._admission_since, self._retries = ev.now, 0
        limit = self._admission_since + self.policy.admission_wait_s
        if ev.now >= limit:
            self._give_up(
                ev.now,
                out,
                reason="admission stayed closed past admission_wait_s",
                failure=FailureKind.ADMISSION_CLOSED,
                next_try=False,
            )
            return
        self.phase = RolloutPhase.ADMISSION_WAIT
        self._sleep(ev.now, limit, out)

    def _on_deadline(self, ev: DeadlineFired, out: list[Effect]) -> None:
        self._give_up(
            ev.now,
            out,
            reason="rollout_s deadline fired while /run was waiting",
            failure=FailureKind.DEADLINE,
            next_try=True,
        )

    def _on_abandon_running(self, ev: AbandonRequested, out: list[Effect]) -> None:
        # also while waiting on admission or on a receipt: the call or wait in flight is dropped
        self._asleep = False
        self.abandoning = True
        self._give_up(
            ev.now, out, reason="abandoned", failure=FailureKind.ABANDONED, next_try=False
        )

    def _on_adopt_running(self, ev: AdoptRequested, out: list[Effect]) -> None:
        # Gym holds the try as completed while our /run still waits: its reply is lost.
        self._give_up(
            ev.now,
            out,
            reason="reply lost: the ledger found the try completed",
            failure=FailureKind.LOST,
            next_try=True,
        )

    def _on_admission_woke(self, ev: Woke, out: list[Effect]) -> None:
        self._dispatch(ev.now, out)

    # -------------------------------------------------------- receipts and sealing

    def _on_receipt(self, ev: ReceiptReceived, out: list[Effect]) -> None:
        adopted = self._replayed or self.phase is RolloutPhase.ADOPT_RECEIPT
        self._seal(ev.receipt, adopted, out)
        if self.policy.ack == "at_checkpoint":
            # Gym keeps it completed and un-ACKed; the checkpoint gate ACKs it with the trainer's
            # checkpoint (_finish hands the sealed attempt over to the ledger)
            self._finish(
                "abandoned" if self.abandoning else "sealed",
                out,
                reason="abandoned" if self.abandoning else None,
                failure=FailureKind.ABANDONED if self.abandoning else None,
            )
            return
        self._begin_step(
            RolloutPhase.ACKING, ev.now, self.policy.control_s, out, lambda d: Ack(ev.receipt, d)
        )

    def _on_receipt_failed(self, ev: StepFailed, out: list[Effect]) -> None:
        if self._may_repeat(ev.failure, ev.now, out):
            return
        detail = f"receipt fetch failed: {ev.failure.value} {ev.detail}".strip()
        if self.phase is RolloutPhase.RECEIPT:
            self._give_up(ev.now, out, reason=detail, failure=ev.failure, next_try=True)
        else:
            self._hand_over(AttemptState.RUNNING, out)
            self._finish_failed(detail, ev.failure, out)

    def _on_digest_mismatch(self, ev: DigestMismatch, out: list[Effect]) -> None:
        reason = f"digest mismatch: {ev.detail}".strip(": ")
        if self.phase is RolloutPhase.RECEIPT:
            self._give_up(ev.now, out, reason=reason, failure=FailureKind.PROTOCOL, next_try=True)
        else:
            # The stored reply itself does not match its receipt: release it without sealing.
            self._why(reason, FailureKind.PROTOCOL)
            self._begin_step(
                RolloutPhase.RELEASING,
                ev.now,
                self.policy.control_s,
                out,
                lambda d: Ack(ev.receipt, d),
            )

    def _seal(self, receipt: CompletionReceipt, adopted: bool, out: list[Effect]) -> None:
        if self.sealed is not None:
            raise IllegalTransition(
                f"rollout {self.rollout_id}: a second seal", state=self.phase.value, event="seal"
            )
        self.sealed = Seal(self._attempt, self._reply, receipt, adopted)
        out.append(self.sealed)
        self._report(
            out,
            AttemptState.SEALED,
            adopted=adopted,
            reward=reward_of(self._reply),
            result_digest=receipt.result_digest,
        )

    def _on_ack(self, ev: AckAnswered, out: list[Effect]) -> None:
        self._report(out, AttemptState.ACKED, adopted=self._is_adopted)
        if self.phase is RolloutPhase.RELEASING:
            self._after_try(ev.now, out)
            return
        self.acked = True
        self._finish(
            "abandoned" if self.abandoning else "sealed",
            out,
            reason="abandoned" if self.abandoning else None,
            failure=FailureKind.ABANDONED if self.abandoning else None,
        )

    def _on_ack_failed(self, ev: StepFailed, out: list[Effect]) -> None:
        if self._may_repeat(ev.failure, ev.now, out):
            return
        if self.phase is RolloutPhase.RELEASING:
            self._hand_over(AttemptState.RUNNING, out)
            self._after_try(ev.now, out)
            return
        # Sealed but not released on Gym: the result stands; the ledger ACKs it later.
        self._hand_over(AttemptState.SEALED, out)
        self._finish(
            "abandoned" if self.abandoning else "sealed",
            out,
            reason=f"ACK failed: {ev.failure.value} {ev.detail}".strip(),
            failure=ev.failure,
        )

    # -------------------------------------------------------- retire, then adopt or cancel

    def _give_up(
        self,
        now: float,
        out: list[Effect],
        *,
        reason: str | None,
        next_try: bool,
        failure: FailureKind | None = None,
    ) -> None:
        if reason is not None:
            assert failure is not None, "a reason always comes with its kind"
            self._why(reason, failure)
        self._next_try_allowed = next_try
        self._begin_step(
            RolloutPhase.RETIRING,
            now,
            self.policy.control_s,
            out,
            lambda d: Retire(self._attempt, d),
        )

    def _on_retire_answered(self, ev: RetireAnswered, out: list[Effect]) -> None:
        answer = ev.answer
        if answer.completed_unacknowledged:
            self._begin_step(
                RolloutPhase.REPLAYING,
                ev.now,
                self.policy.control_s,
                out,
                lambda d: Replay(self._attempt, d),
            )
            return
        # Tombstoned now (cancelled) or already; neither means ACKed by someone else.
        self._report(out, AttemptState.TOMBSTONED if answer.tombstoned else AttemptState.ACKED)
        self._after_try(ev.now, out)

    def _on_retire_failed(self, ev: StepFailed, out: list[Effect]) -> None:
        if self._may_repeat(ev.failure, ev.now, out):
            return
        # We cannot tell whether the try still runs: do not start another beside it.
        self._hand_over(AttemptState.RUNNING, out)
        self._finish_failed(
            self._and_then(f"retire failed: {ev.failure.value} {ev.detail}"), ev.failure, out
        )

    def _on_replay_replied(self, ev: ReplayReplied, out: list[Effect]) -> None:
        self._reply = ev.reply
        self._begin_step(
            RolloutPhase.ADOPT_RECEIPT,
            ev.now,
            self.policy.control_s,
            out,
            lambda d: FetchReceipt(self._attempt, d),
        )

    def _on_replay_failed(self, ev: StepFailed, out: list[Effect]) -> None:
        if ev.failure in (FailureKind.STALE, FailureKind.UNKNOWN):
            # Released or tombstoned in between (by the ledger): nothing of it is left to adopt.
            self._report(out, AttemptState.TOMBSTONED)
            self._after_try(ev.now, out)
            return
        if self._may_repeat(ev.failure, ev.now, out):
            return
        self._hand_over(AttemptState.RUNNING, out)
        self._finish_failed(
            self._and_then(f"replay failed: {ev.failure.value} {ev.detail}"), ev.failure, out
        )

    def _after_try(self, now: float, out: list[Effect]) -> None:
        """The current try is over without a result: next try, or the end."""
        if self.abandoning:
            self._finish("abandoned", out, reason="abandoned", failure=FailureKind.ABANDONED)
        elif not self._next_try_allowed or self.tries >= self.policy.max_tries:
            reason = self.reason or "no result"
            if self._next_try_allowed:
                reason = f"{reason} (after {self.tries} of {self.policy.max_tries} tries)"
            self._finish_failed(reason, self.failure or FailureKind.INTERNAL, out)
        else:
            self._next_try_allowed = True
            self._start_try(now, out)

    # -------------------------------------------------------- flags while busy

    def _on_abandon_flag(self, ev: AbandonRequested, out: list[Effect]) -> None:
        self.abandoning = True

    def _on_noop(self, ev: Event, out: list[Effect]) -> None:
        pass

    def _on_woke(self, ev: Woke, out: list[Effect]) -> None:
        assert self._make is not None
        # waiting out a checkpoint may carry the step past its first deadline: renew it
        renewed = min(ev.now + self._budget_s, self._repeat_limit)
        if renewed > self._step_deadline:
            self._step_deadline = renewed
            self._step = self._make(renewed)
        out.append(self._step)

    # -------------------------------------------------------- helpers

    @property
    def _attempt(self) -> int:
        assert self.attempt is not None
        return self.attempt

    @property
    def _is_adopted(self) -> bool:
        return self.sealed is not None and self.sealed.adopted

    def _begin_step(
        self,
        phase: RolloutPhase,
        now: float,
        budget_s: float,
        out: list[Effect],
        make: Callable[[float], Effect],
    ) -> None:
        self.phase = phase
        self._step_started, self._budget_s, self._make = now, budget_s, make
        self._step_deadline = now + budget_s
        self._repeat_limit = self._step_deadline
        self._retries = 0
        self._step = make(self._step_deadline)
        out.append(self._step)

    def _may_repeat(self, failure: FailureKind, now: float, out: list[Effect]) -> bool:
        """Schedule the pending step again when the failure passes once the server's state
        changed (``Repeat.LATER``) and time remains. A failure the call retries itself
        (``Repeat.IN_CALL``: a lost connection, a 5xx, a try's timeout) came back because the
        call's retry gave up within the step's deadline: repeating it here would retry twice."""
        if failure.repeat is not Repeat.LATER:
            return False
        limit = self._step_deadline
        if failure in (FailureKind.CONFLICT, FailureKind.ADMISSION_CLOSED):
            # a checkpoint holds the server: wait for it as a refused /run would
            limit = max(limit, self._step_started + self.policy.admission_wait_s)
        if now >= limit:
            return False
        self._repeat_limit = limit
        self._sleep(now, limit, out)
        return True

    def _sleep(self, now: float, limit: float, out: list[Effect]) -> None:
        # the retry policy's backoff, without jitter: the machine draws no random numbers
        self._retries += 1
        delay = self.policy.retry.backoff(self._retries)
        self._asleep = True
        out.append(WaitUntil(min(now + delay, limit)))

    def _report(
        self,
        out: list[Effect],
        state: AttemptState,
        *,
        adopted: bool = False,
        released: bool = False,
        reward: float | None = None,
        result_digest: str | None = None,
    ) -> None:
        self._reported[self._attempt] = state
        out.append(
            Report(
                AttemptReport(
                    rollout_id=self.rollout_id,
                    attempt_index=self._attempt,
                    endpoint=self.endpoint,
                    state=state,
                    owner=self.owner,
                    adopted=adopted,
                    released=released,
                    reward=reward,
                    result_digest=result_digest,
                )
            )
        )

    def _and_then(self, what: str) -> str:
        """A failure while giving up, after the reason the try was given up for (which names
        the real cause: a retire that cannot reach a dead server must not hide why)."""
        what = what.strip()
        return f"{self.reason}; then {what}" if self.reason else what

    def _hand_over(self, state: AttemptState, out: list[Effect]) -> None:
        """Give the current attempt up to the ledger, which settles it at the next checkpoint."""
        self.handed_over.append(self._attempt)
        self._released.add(self._attempt)
        self._report(out, state, adopted=self._is_adopted, released=True)

    def _why(self, reason: str, failure: FailureKind) -> None:
        self.reason, self.failure = reason, failure

    def _finish_failed(self, reason: str, failure: FailureKind, out: list[Effect]) -> None:
        if self.abandoning:
            self._finish("abandoned", out, reason=f"abandoned; {reason}", failure=failure)
        else:
            self._finish("failed", out, reason=reason, failure=failure)

    def _finish(
        self,
        status: OutcomeStatus,
        out: list[Effect],
        *,
        reason: str | None,
        failure: FailureKind | None,
    ) -> None:
        self.phase = RolloutPhase.DONE
        self._asleep = False
        if self.attempt is not None and self.attempt not in self._released:
            state = self._reported.get(self.attempt)
            if state is not None:
                self._report(out, state, adopted=self._is_adopted, released=True)
                self._released.add(self.attempt)
        seal = self.sealed
        self.outcome = Outcome(
            rollout_id=self.rollout_id,
            status=status,
            attempt_index=seal.attempt_index if seal else self.attempt,
            reply=seal.reply if seal else None,
            reward=reward_of(seal.reply) if seal else None,
            receipt=seal.receipt if seal else None,
            adopted=seal.adopted if seal else False,
            acked=self.acked,
            tries=self.tries,
            endpoint=self.endpoint,
            reason=reason,
            failure=failure,
        )
        out.append(Finish(self.outcome))


# ---------------------------------------------------------------- the transition table

_STEP_PHASES = (
    RolloutPhase.RECEIPT,
    RolloutPhase.RETIRING,
    RolloutPhase.REPLAYING,
    RolloutPhase.ADOPT_RECEIPT,
    RolloutPhase.ACKING,
    RolloutPhase.RELEASING,
    RolloutPhase.STALE_CHECK,
)


def _table() -> dict[tuple[RolloutPhase, type], str]:
    t: dict[tuple[RolloutPhase, type], str] = {
        (RolloutPhase.NEW, Start): "_on_start",
        (RolloutPhase.NEW, AbandonRequested): "_on_abandon_flag",
        (RolloutPhase.NEW, AdoptRequested): "_on_noop",
        (RolloutPhase.RUNNING, RunReplied): "_on_run_replied",
        (RolloutPhase.RUNNING, RunFailed): "_on_run_failed",
        (RolloutPhase.RUNNING, RunAdmissionClosed): "_on_admission_closed",
        (RolloutPhase.RUNNING, DeadlineFired): "_on_deadline",
        (RolloutPhase.RUNNING, AbandonRequested): "_on_abandon_running",
        (RolloutPhase.RUNNING, AdoptRequested): "_on_adopt_running",
        (RolloutPhase.ADMISSION_WAIT, Woke): "_on_admission_woke",
        (RolloutPhase.ADMISSION_WAIT, AbandonRequested): "_on_abandon_running",
        (RolloutPhase.ADMISSION_WAIT, AdoptRequested): "_on_noop",
        (RolloutPhase.RECEIPT, ReceiptReceived): "_on_receipt",
        (RolloutPhase.RECEIPT, StepFailed): "_on_receipt_failed",
        (RolloutPhase.RECEIPT, DigestMismatch): "_on_digest_mismatch",
        (RolloutPhase.ADOPT_RECEIPT, ReceiptReceived): "_on_receipt",
        (RolloutPhase.ADOPT_RECEIPT, StepFailed): "_on_receipt_failed",
        (RolloutPhase.ADOPT_RECEIPT, DigestMismatch): "_on_digest_mismatch",
        (RolloutPhase.STALE_CHECK, ReceiptReceived): "_on_stale_result",
        (RolloutPhase.STALE_CHECK, DigestMismatch): "_on_stale_result",
        (RolloutPhase.STALE_CHECK, StepFailed): "_on_stale_no_result",
        (RolloutPhase.RETIRING, RetireAnswered): "_on_retire_answered",
        (RolloutPhase.RETIRING, StepFailed): "_on_retire_failed",
        (RolloutPhase.REPLAYING, ReplayReplied): "_on_replay_replied",
        (RolloutPhase.REPLAYING, StepFailed): "_on_replay_failed",
        (RolloutPhase.ACKING, AckAnswered): "_on_ack",
        (RolloutPhase.ACKING, StepFailed): "_on_ack_failed",
        (RolloutPhase.RELEASING, AckAnswered): "_on_ack",
        (RolloutPhase.RELEASING, StepFailed): "_on_ack_failed",
    }
    for phase in _STEP_PHASES:
        t[(phase, Woke)] = "_on_woke"
        t[(phase, AbandonRequested)] = "_on_abandon_flag"
        t[(phase, AdoptRequested)] = "_on_noop"
    # the reply is in hand but its receipt is not: give up at once (retire, then adopt)
    t[(RolloutPhase.RECEIPT, AbandonRequested)] = "_on_abandon_running"
    return t


_TABLE = _table()
