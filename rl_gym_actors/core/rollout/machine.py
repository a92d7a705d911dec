"""The tries of one rollout on one endpoint: :class:`RolloutMachine` (see the package's
docstring for the rule it keeps). Events in, effects out; the phases and their table live in
:mod:`.phases` (with the call each step sends), the pending control call in :mod:`.steps`."""

from __future__ import annotations

from typing import Any

from rl_gym_actors import errors
from rl_gym_actors.config import TryPolicy
from rl_gym_actors.core.attempt_reports import AttemptLog, AttemptState
from rl_gym_actors.core.rollout import events
from rl_gym_actors.core.rollout.phases import TABLE, RolloutPhase, step_call
from rl_gym_actors.core.rollout.steps import PendingStep
from rl_gym_actors.errors import IllegalTransition
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.outcome import Outcome, OutcomeStatus, reward_of
from rl_gym_actors.protocol import CompletionReceipt

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
        self.outcome: Outcome | None = None
        self.sealed: events.Seal | None = None
        self.acked = False
        self._next_index = first_attempt
        if previous_attempt is not None:
            self._next_index = max(first_attempt, previous_attempt + 1)
        self._reply: Any = None
        self._replayed = False
        self._next_try_allowed = True
        self._steps = PendingStep(policy)  # the control call waited on, repeated on Woke
        self._admission_since: float | None = None
        self._duplicate_until: float | None = None
        self._log = AttemptLog(rollout_id, endpoint, owner)  # what was reported per attempt

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
        return self._log.state(attempt_index)

    @property
    def handed_over(self) -> list[int]:
        """The attempts handed over to the ledger unsettled."""
        return self._log.handed_over

    def handle(self, event: events.Event) -> list[events.Effect]:
        """Apply one event; return the effects to perform. Raises IllegalTransition."""
        name = TABLE.get((self.phase, type(event)))
        if name is None:
            raise IllegalTransition(
                f"rollout {self.rollout_id}: {type(event).__name__} in phase {self.phase.value}",
                state=self.phase.value,
                event=type(event).__name__,
            )
        if isinstance(event, events.Woke):
            self._steps.woken(f"rollout {self.rollout_id}", self.phase.value)
        out: list[events.Effect] = []
        getattr(self, name)(event, out)
        return out

    # -------------------------------------------------------- starting tries

    def _on_start(self, ev: events.Start, out: list[events.Effect]) -> None:
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

    def _start_try(self, now: float, out: list[events.Effect]) -> None:
        self.attempt = self._next_index
        self._next_index += 1
        self.tries += 1
        self._reply, self._replayed = None, False
        self._admission_since = self._duplicate_until = None
        self._report(out, AttemptState.RUNNING)
        self._dispatch(now, out)

    def _dispatch(self, now: float, out: list[events.Effect]) -> None:
        self.phase = RolloutPhase.RUNNING
        out.append(events.StartRun(self._attempt, now + self.policy.rollout_s))

    # -------------------------------------------------------- RUNNING

    def _on_run_replied(self, ev: events.RunReplied, out: list[events.Effect]) -> None:
        self._reply, self._replayed = ev.reply, ev.replayed
        self._begin_step(RolloutPhase.RECEIPT, ev.now, out)

    def _on_run_failed(self, ev: events.RunFailed, out: list[events.Effect]) -> None:
        f = ev.failure
        text = f"{f.value}: {ev.detail}" if ev.detail else f.value
        if f is FailureKind.ADMISSION_CLOSED:
            self._on_admission_closed(events.RunAdmissionClosed(ev.now), out)
        elif f is FailureKind.STALE and self.previous_attempt is None and self.tries == 1:
            # The first try of a rollout its dispatcher calls new is stale on Gym: tombstoned
            # (someone retired it: the next try is fine) or ACKed, i.e. it sealed before and was
            # forgotten (another try would seal it a second time). Its receipt tells which.
            self._why(text, f)
            self._begin_step(RolloutPhase.STALE_CHECK, ev.now, out)
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

    def _on_duplicate(self, ev: events.RunFailed, out: list[events.Effect]) -> None:
        # The key already runs on Gym, started by an earlier dispatcher (a driver that died):
        # wait for it and take its stored reply instead of running the agent again.
        if self._duplicate_until is None:
            self._duplicate_until = ev.now + self.policy.rollout_s
            self._steps.retries = 0
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
        out.append(self._steps.sleep(ev.now, self._duplicate_until))

    def _on_stale_result(
        self, ev: events.ReceiptReceived | events.DigestMismatch, out: list[events.Effect]
    ) -> None:
        # a receipt exists: the key completed once and was ACKed (released) since
        self._report(out, AttemptState.ACKED)
        self._finish_failed(
            f"rollout id {self.rollout_id} sealed before and was forgotten: "
            f"try {self._attempt} is ACKed on Gym",
            FailureKind.FORGOTTEN,
            out,
        )

    def _on_stale_no_result(self, ev: events.StepFailed, out: list[events.Effect]) -> None:
        if self._may_repeat(ev, out):
            return
        # no receipt (tombstoned, or not telling): the try never completed; the next one may run
        self._report(out, AttemptState.TOMBSTONED)
        self._after_try(ev.now, out)

    def _on_admission_closed(self, ev: events.RunAdmissionClosed, out: list[events.Effect]) -> None:
        if self._admission_since is None:
            self._admission_since = ev.now
            self._steps.retries = 0
        limit = self._admission_since + self.policy.admission_wait_s
        if ev.now >= limit:
            reason = "admission stayed closed past admission_wait_s"
            kind = FailureKind.ADMISSION_CLOSED
            if self._duplicate_until is None:  # every /run of this try was refused: none ran
                self._finish_failed(reason, kind, out)
            else:  # the key ran elsewhere before admission closed: retire it first
                self._give_up(ev.now, out, reason=reason, failure=kind, next_try=False)
            return
        self.phase = RolloutPhase.ADMISSION_WAIT
        out.append(self._steps.sleep(ev.now, limit))

    def _on_deadline(self, ev: events.DeadlineFired, out: list[events.Effect]) -> None:
        self._give_up(
            ev.now,
            out,
            reason="rollout_s deadline fired while /run was waiting",
            failure=FailureKind.DEADLINE,
            next_try=True,
        )

    def _on_abandon_running(self, ev: events.AbandonRequested, out: list[events.Effect]) -> None:
        # also while waiting on admission or on a receipt: the call or wait in flight is dropped
        self._steps.asleep = False
        self.abandoning = True
        self._give_up(
            ev.now, out, reason="abandoned", failure=FailureKind.ABANDONED, next_try=False
        )

    def _on_adopt_running(self, ev: events.AdoptRequested, out: list[events.Effect]) -> None:
        # Gym holds the try as completed while our /run still waits: its reply is lost.
        self._give_up(
            ev.now,
            out,
            reason="reply lost: the ledger found the try completed",
            failure=FailureKind.LOST,
            next_try=True,
        )

    def _on_admission_woke(self, ev: events.Woke, out: list[events.Effect]) -> None:
        self._dispatch(ev.now, out)

    # -------------------------------------------------------- receipts and sealing

    def _on_receipt(self, ev: events.ReceiptReceived, out: list[events.Effect]) -> None:
        adopted = self._replayed or self.phase is RolloutPhase.ADOPT_RECEIPT
        self._seal(ev.receipt, adopted, out)
        if self.policy.ack == "at_checkpoint":
            # Gym keeps it completed and un-ACKed; the checkpoint gate ACKs it with the trainer's
            # checkpoint (_finish hands the sealed attempt over to the ledger)
            self._finish_with_result(out)
            return
        self._begin_step(RolloutPhase.ACKING, ev.now, out, receipt=ev.receipt)

    def _on_receipt_deferred(self, ev: events.ReceiptDeferred, out: list[events.Effect]) -> None:
        # only a deferrable fetch (ack at_checkpoint) is answered so: the gate ACKs it, with the
        # receipt its status listing carries, checked against the digest sealed here
        assert self.policy.ack == "at_checkpoint", "a receipt is deferred only to a checkpoint"
        adopted = self._replayed or self.phase is RolloutPhase.ADOPT_RECEIPT
        self._seal(None, adopted, out)
        self._finish_with_result(out)

    def _on_receipt_failed(self, ev: events.StepFailed, out: list[events.Effect]) -> None:
        if self._may_repeat(ev, out):
            return
        detail = f"receipt fetch failed: {ev.failure.value} {ev.detail}".strip()
        if self.phase is RolloutPhase.RECEIPT:
            self._give_up(ev.now, out, reason=detail, failure=ev.failure, next_try=True)
        else:
            self._hand_over(AttemptState.RUNNING, out)
            self._finish_failed(detail, ev.failure, out)

    def _on_digest_mismatch(self, ev: events.DigestMismatch, out: list[events.Effect]) -> None:
        reason = f"digest mismatch: {ev.detail}".strip(": ")
        if self.phase is RolloutPhase.RECEIPT:
            self._give_up(ev.now, out, reason=reason, failure=FailureKind.PROTOCOL, next_try=True)
        else:
            # The stored reply itself does not match its receipt: release it without sealing.
            self._why(reason, FailureKind.PROTOCOL)
            self._begin_step(RolloutPhase.RELEASING, ev.now, out, receipt=ev.receipt)

    def _seal(
        self, receipt: CompletionReceipt | None, adopted: bool, out: list[events.Effect]
    ) -> None:
        if self.sealed is not None:
            raise IllegalTransition(
                f"rollout {self.rollout_id}: a second seal", state=self.phase.value, event="seal"
            )
        seal = self.sealed = events.Seal(self._attempt, self._reply, receipt, adopted)
        out.append(seal)
        reward = reward_of(self._reply)
        self._report(
            out, AttemptState.SEALED, adopted=adopted, reward=reward, result_digest=seal.digest
        )

    def _on_ack(self, ev: events.AckAnswered, out: list[events.Effect]) -> None:
        self._report(out, AttemptState.ACKED, adopted=self._is_adopted)
        if self.phase is RolloutPhase.RELEASING:
            self._after_try(ev.now, out)
            return
        self.acked = True
        self._finish_with_result(out)

    def _on_ack_failed(self, ev: events.StepFailed, out: list[events.Effect]) -> None:
        if self._may_repeat(ev, out):
            return
        if self.phase is RolloutPhase.RELEASING:
            self._hand_over(AttemptState.RUNNING, out)
            self._after_try(ev.now, out)
            return
        # Sealed but not released on Gym: the result stands; the ledger ACKs it later.
        self._hand_over(AttemptState.SEALED, out)
        self._finish_with_result(
            out, f"ACK failed: {ev.failure.value} {ev.detail}".strip(), ev.failure
        )

    # -------------------------------------------------------- retire, then adopt or cancel

    def _give_up(
        self,
        now: float,
        out: list[events.Effect],
        *,
        reason: str | None,
        next_try: bool,
        failure: FailureKind | None = None,
    ) -> None:
        if reason is not None:
            assert failure is not None, "a reason always comes with its kind"
            self._why(reason, failure)
        self._next_try_allowed = next_try
        self._begin_step(RolloutPhase.RETIRING, now, out)

    def _on_retire_answered(self, ev: events.RetireAnswered, out: list[events.Effect]) -> None:
        answer = ev.answer
        if answer.completed_unacknowledged:
            self._begin_step(RolloutPhase.REPLAYING, ev.now, out)
            return
        # Tombstoned now (cancelled) or already; neither means ACKed by someone else.
        self._report(out, AttemptState.TOMBSTONED if answer.tombstoned else AttemptState.ACKED)
        self._after_try(ev.now, out)

    def _on_retire_failed(self, ev: events.StepFailed, out: list[events.Effect]) -> None:
        if self._may_repeat(ev, out):
            return
        # We cannot tell whether the try still runs: do not start another beside it.
        self._hand_over(AttemptState.RUNNING, out)
        self._finish_failed(
            self._and_then(f"retire failed: {ev.failure.value} {ev.detail}"), ev.failure, out
        )

    def _on_replay_replied(self, ev: events.ReplayReplied, out: list[events.Effect]) -> None:
        self._reply = ev.reply
        self._begin_step(RolloutPhase.ADOPT_RECEIPT, ev.now, out)

    def _on_replay_failed(self, ev: events.StepFailed, out: list[events.Effect]) -> None:
        if ev.failure in (FailureKind.STALE, FailureKind.UNKNOWN):
            # Released or tombstoned in between (by the ledger): nothing of it is left to adopt.
            self._report(out, AttemptState.TOMBSTONED)
            self._after_try(ev.now, out)
            return
        if self._may_repeat(ev, out):
            return
        self._hand_over(AttemptState.RUNNING, out)
        self._finish_failed(
            self._and_then(f"replay failed: {ev.failure.value} {ev.detail}"), ev.failure, out
        )

    def _after_try(self, now: float, out: list[events.Effect]) -> None:
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

    def _on_abandon_flag(self, ev: events.AbandonRequested, out: list[events.Effect]) -> None:
        self.abandoning = True

    def _on_noop(self, ev: events.Event, out: list[events.Effect]) -> None:
        pass

    def _on_woke(self, ev: events.Woke, out: list[events.Effect]) -> None:
        step = self._steps.woke(ev.now)
        if isinstance(step, events.StepFailed):  # woken too late to send it: the failure stands
            getattr(self, TABLE[(self.phase, events.StepFailed)])(step, out)
        else:
            out.append(step)

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
        out: list[events.Effect],
        *,
        receipt: CompletionReceipt | None = None,
    ) -> None:
        """Enter a step phase and send the call it waits on (``step_call``), on the current
        try (an ACK: on ``receipt``)."""
        self.phase = phase
        budget = self.policy.receipt_s if phase is RolloutPhase.RECEIPT else self.policy.control_s
        may_defer = self.policy.ack == "at_checkpoint" and self.policy.defer_receipts
        make = step_call(phase, self._attempt, may_defer=may_defer, receipt=receipt)
        out.append(self._steps.begin(now, budget, make))

    def _may_repeat(self, ev: events.StepFailed, out: list[events.Effect]) -> bool:
        """Wait and send the pending step again, when its failure allows (see PendingStep)."""
        wait = self._steps.may_repeat(ev)
        if wait is not None:
            out.append(wait)
        return wait is not None

    def _report(self, out: list[events.Effect], state: AttemptState, **fields: Any) -> None:
        out.append(events.Report(self._log.report(self._attempt, state, **fields)))

    def _and_then(self, what: str) -> str:
        """A failure while giving up, after the reason the try was given up for (which names
        the real cause: a retire that cannot reach a dead server must not hide why)."""
        what = what.strip()
        return f"{self.reason}; then {what}" if self.reason else what

    def _hand_over(self, state: AttemptState, out: list[events.Effect]) -> None:
        """Give the current attempt up to the ledger, which settles it at the next checkpoint."""
        out.append(events.Report(self._log.hand_over(self._attempt, state, self._is_adopted)))

    def _why(self, reason: str, failure: FailureKind) -> None:
        self.reason, self.failure = reason, failure

    def _finish_with_result(
        self,
        out: list[events.Effect],
        reason: str | None = None,
        failure: FailureKind | None = None,
    ) -> None:
        """End with the sealed result: ``sealed``, or ``abandoned`` (keeping it) when an abandon
        came; ``reason`` says what went wrong after sealing (an ACK that failed)."""
        if self.abandoning and reason is None:
            reason, failure = "abandoned", FailureKind.ABANDONED
        self._finish(
            "abandoned" if self.abandoning else "sealed", out, reason=reason, failure=failure
        )

    def _finish_failed(self, reason: str, failure: FailureKind, out: list[events.Effect]) -> None:
        if self.abandoning:
            self._finish("abandoned", out, reason=f"abandoned; {reason}", failure=failure)
        else:
            self._finish("failed", out, reason=reason, failure=failure)

    def _finish(
        self,
        status: OutcomeStatus,
        out: list[events.Effect],
        *,
        reason: str | None,
        failure: FailureKind | None,
    ) -> None:
        self.phase = RolloutPhase.DONE
        self._steps.asleep = False
        last = self._log.release(self.attempt, self._is_adopted)
        if last is not None:
            out.append(events.Report(last))
        self.outcome = events.outcome_of(
            self.rollout_id,
            status,
            self.sealed,
            self.attempt,
            acked=self.acked,
            tries=self.tries,
            endpoint=self.endpoint,
            reason=reason,
            failure=failure,
        )
        out.append(events.Finish(self.outcome))
