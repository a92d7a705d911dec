"""The control call a rollout machine waits on, and when to send it again: :class:`PendingStep`.

Pure: no clock reads (``now`` is passed in), no random numbers. A step (a receipt fetch, a retire,
a replay or an ACK) gets a budget from its start; a failure that passes once the server's state
changed is sent again after the retry policy's backoff until the budget (or, with a checkpoint
in the way, ``admission_wait_s``) runs out. A repeat is never sent without time left for it: the
last wait ends while a call still fits (:attr:`PendingStep.least_s`), and a wake that comes later
than that sends nothing (the machine takes the failure that began the wait as the step's end).
A failure the call retries itself is never repeated here (see
:class:`~rl_gym_actors.failures.Repeat`).
"""

from __future__ import annotations

from collections.abc import Callable

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.core.rollout.events import Effect, StepFailed, WaitUntil
from rl_gym_actors.errors import IllegalTransition
from rl_gym_actors.failures import FailureKind, Repeat


class PendingStep:
    """One machine's pending step. ``asleep`` while a :class:`WaitUntil` it asked for runs;
    ``retries`` counts the backoffs since the step (or a wait of the machine's own) began."""

    def __init__(self, policy: TryPolicy) -> None:
        self.policy = policy
        self.asleep = False
        self.retries = 0
        self._effect: Effect | None = None
        self._make: Callable[[float], Effect] | None = None
        self._started = self._budget_s = 0.0
        self._deadline = self._repeat_limit = 0.0
        self._failed: StepFailed | None = None  # the failure the pending repeat waits out

    @property
    def least_s(self) -> float:
        """The least time a repeat is sent with: a call's shortest try and the margin kept for
        its answer (at most the step's budget)."""
        retry = self.policy.retry
        return min(self._budget_s, retry.min_try_s + retry.reply_margin_s)

    def begin(self, now: float, budget_s: float, make: Callable[[float], Effect]) -> Effect:
        """A new step: ``make`` builds its effect for a deadline; the effect to perform now."""
        self._started, self._budget_s, self._make = now, budget_s, make
        self._deadline = self._repeat_limit = now + budget_s
        self.retries = 0
        self._failed = None
        self._effect = make(self._deadline)
        return self._effect

    def may_repeat(self, failed: StepFailed) -> WaitUntil | None:
        """The wait before sending the step again when its failure passes once the server's
        state changed (``Repeat.LATER``) and a repeat still has :attr:`least_s` after the wait;
        None when it may not be repeated. A failure the call retries itself
        (``Repeat.IN_CALL``: a lost connection, a 5xx, a try's timeout) came back because the
        call's retry gave up within the step's deadline: repeating it here would retry twice."""
        failure, now = failed.failure, failed.now
        if failure.repeat is not Repeat.LATER:
            return None
        limit = self._deadline
        if failure in (FailureKind.CONFLICT, FailureKind.ADMISSION_CLOSED):
            # a checkpoint holds the server: wait for it as a refused /run would
            limit = max(limit, self._started + self.policy.admission_wait_s)
        last_send = limit - self.least_s  # a repeat sent later would have no time left
        if now >= last_send:
            return None
        self._repeat_limit = limit
        self._failed = failed
        return self.sleep(now, last_send)

    def sleep(self, now: float, limit: float) -> WaitUntil:
        """The next backoff, ending by ``limit``: the retry policy's, without jitter."""
        self.retries += 1
        delay = self.policy.retry.backoff(self.retries)
        self.asleep = True
        return WaitUntil(min(now + delay, limit))

    def woken(self, who: str, phase: str) -> None:
        """A ``Woke`` arrived: the wait is over; IllegalTransition when none was asked for."""
        if not self.asleep:
            raise IllegalTransition(f"{who}: Woke while not waiting", state=phase, event="Woke")
        self.asleep = False

    def woke(self, now: float) -> Effect | StepFailed:
        """The step to send again after a wait; waiting out a checkpoint may carry it past its
        first deadline, which is then renewed (up to the repeat limit). A wake too late for
        :attr:`least_s` sends nothing: the failure the wait began with, as of ``now``."""
        assert self._make is not None and self._effect is not None
        if self._failed is not None and now > self._repeat_limit - self.least_s:
            return StepFailed(now, self._failed.failure, self._failed.detail)
        renewed = min(now + self._budget_s, self._repeat_limit)
        if renewed > self._deadline:
            self._deadline = renewed
            self._effect = self._make(renewed)
        return self._effect
