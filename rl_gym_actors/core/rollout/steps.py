"""The control call a rollout machine waits on, and when to send it again: :class:`PendingStep`.

Pure: no clock reads (``now`` is passed in), no random numbers. A step (a receipt fetch, a retire,
a replay or an ACK) gets a budget from its start; a failure that passes once the server's state
changed is sent again after the retry policy's backoff until the budget (or, with a checkpoint
in the way, ``admission_wait_s``) runs out. A failure the call retries itself is never repeated
here (see :class:`~rl_gym_actors.failures.Repeat`).
"""

from __future__ import annotations

from collections.abc import Callable

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.core.rollout.events import Effect, WaitUntil
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

    def begin(self, now: float, budget_s: float, make: Callable[[float], Effect]) -> Effect:
        """A new step: ``make`` builds its effect for a deadline; the effect to perform now."""
        self._started, self._budget_s, self._make = now, budget_s, make
        self._deadline = self._repeat_limit = now + budget_s
        self.retries = 0
        self._effect = make(self._deadline)
        return self._effect

    def may_repeat(self, failure: FailureKind, now: float) -> WaitUntil | None:
        """The wait before sending the step again when the failure passes once the server's
        state changed (``Repeat.LATER``) and time remains; None when it may not be repeated. A
        failure the call retries itself (``Repeat.IN_CALL``: a lost connection, a 5xx, a try's
        timeout) came back because the call's retry gave up within the step's deadline:
        repeating it here would retry twice."""
        if failure.repeat is not Repeat.LATER:
            return None
        limit = self._deadline
        if failure in (FailureKind.CONFLICT, FailureKind.ADMISSION_CLOSED):
            # a checkpoint holds the server: wait for it as a refused /run would
            limit = max(limit, self._started + self.policy.admission_wait_s)
        if now >= limit:
            return None
        self._repeat_limit = limit
        return self.sleep(now, limit)

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

    def woke(self, now: float) -> Effect:
        """The step to send again after a wait; waiting out a checkpoint may carry it past its
        first deadline, which is then renewed (up to the repeat limit)."""
        assert self._make is not None and self._effect is not None
        renewed = min(now + self._budget_s, self._repeat_limit)
        if renewed > self._deadline:
            self._deadline = renewed
            self._effect = self._make(renewed)
        return self._effect
