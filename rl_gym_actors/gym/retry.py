"""Retry policy as data, deadline arithmetic, and the one place tenacity is applied.

Every call carries an absolute deadline (Unix time). A retried call makes its tries, and sleeps
between them, inside that one deadline: a try never starts with less than ``min_try_s`` left, and
a backoff that would cross the deadline stops the retrying instead (the last error is raised).

Which errors a call may retry on is decided by its kind, never by the policy:

- ``RetryOn.IDEMPOTENT`` (receipt, acknowledge, retire, status, replay, resume, capabilities):
  ``ConnectionLost``, ``DeadlineExceeded`` of one try while the call's deadline has not passed,
  and ``GymServerError`` (a 5xx with a JSON error body that is no known rejection).
- ``RetryOn.TRANSPORT`` (prepare, commit: safe to repeat with the same checkpoint id, but a
  server-side failure should surface): ``ConnectionLost`` only.
- ``RetryOn.NOTHING`` (run: a blind retry could start a second execution).

``GymRejected`` (any 4xx), ``AdmissionClosed``, ``ProtocolViolation`` and cancellation are never
retried: tenacity would retry on any exception, cancellation included, unless told otherwise.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base

from rl_gym_actors.errors import ConfigError
from rl_gym_actors.failures import FailureKind, failure_kind

logger = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class RetryOn(str, Enum):
    """What a call may retry on (see the module docstring)."""

    NOTHING = "nothing"
    TRANSPORT = "transport"
    IDEMPOTENT = "idempotent"


def _check_finite(name: str, value: float, *, positive: bool = False) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise ConfigError(f"{name} must be > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How an idempotent call repeats itself inside its deadline.

    ``attempts`` bounds the tries (1 = no retry). The n-th sleep is
    ``min(backoff_max_s, backoff_initial_s * backoff_multiplier ** (n - 1))``, of which a random
    fraction up to ``jitter`` is taken off (0 = no jitter, 1 = "full jitter").
    ``try_timeout_s`` bounds one try (``None``: a try may use all the time left), so that a hung
    try still leaves time for another. ``reply_margin_s`` is kept off the deadline sent in a
    request body, so that a server that waits until that deadline still has time to answer.
    The defaults ride out about 1.5 s of refused connections (a quick restart), deadline allowing.
    """

    attempts: int = 6
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 1.0
    backoff_multiplier: float = 2.0
    jitter: float = 0.5
    try_timeout_s: float | None = None
    min_try_s: float = 0.01
    reply_margin_s: float = 0.25

    def __post_init__(self) -> None:
        attempts = self.attempts
        if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
            raise ConfigError(f"attempts must be an int >= 1, got {self.attempts!r}")
        _check_finite("backoff_initial_s", self.backoff_initial_s)
        _check_finite("backoff_max_s", self.backoff_max_s)
        _check_finite("backoff_multiplier", self.backoff_multiplier)
        _check_finite("jitter", self.jitter)
        _check_finite("min_try_s", self.min_try_s)
        _check_finite("reply_margin_s", self.reply_margin_s)
        if self.try_timeout_s is not None:
            _check_finite("try_timeout_s", self.try_timeout_s, positive=True)
        if min(self.backoff_initial_s, self.backoff_max_s, self.min_try_s, self.reply_margin_s) < 0:
            raise ConfigError("backoff, min_try_s and reply_margin_s must be >= 0")
        if self.backoff_multiplier < 1:
            raise ConfigError("backoff_multiplier must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ConfigError("jitter must be within [0, 1]")

    def backoff(self, retry_number: int, rand: float = 0.0) -> float:
        """The sleep before try ``retry_number + 1``; ``rand`` in [0, 1) draws the jitter."""
        exponent = max(retry_number - 1, 0)
        # cap the exponent so that a large attempts bound cannot overflow the float
        base = min(self.backoff_max_s,
                   self.backoff_initial_s * self.backoff_multiplier ** min(exponent, 64))
        return base * (1.0 - self.jitter * rand)

    def try_deadline(self, deadline_ts: float, now: float) -> float:
        """The absolute deadline of one try started at ``now``."""
        if self.try_timeout_s is None:
            return deadline_ts
        return min(deadline_ts, now + self.try_timeout_s)

    def wire_deadline(self, deadline_ts: float, now: float) -> float:
        """The deadline to send in a body: ours, less a margin (at most a tenth of what is left)
        for the answer to travel back before our own timeout fires."""
        left = max(deadline_ts - now, 0.0)
        return deadline_ts - min(self.reply_margin_s, left / 10.0)


NO_RETRY = RetryPolicy(attempts=1)
DEFAULT_RETRY = RetryPolicy()


def remaining(deadline_ts: float, now: float) -> float:
    """Seconds left until ``deadline_ts`` (never negative)."""
    return max(deadline_ts - now, 0.0)


def check_deadline(deadline_ts: float) -> float:
    """Refuse a deadline that is no absolute Unix time (not a number, not finite, or so small
    that it must be a relative budget by mistake)."""
    _check_finite("deadline_ts", deadline_ts)
    if deadline_ts < 1_000_000_000:   # 2001-09-09: anything below is a budget, not a time
        raise ConfigError(f"deadline_ts must be absolute Unix time, got {deadline_ts!r}")
    return float(deadline_ts)


# the failure kinds each kind of call retries on
_RETRIED: dict[RetryOn, frozenset[FailureKind]] = {
    RetryOn.NOTHING: frozenset(),
    RetryOn.TRANSPORT: frozenset({FailureKind.LOST}),
    RetryOn.IDEMPOTENT: frozenset({FailureKind.LOST, FailureKind.SERVER_ERROR,
                                   FailureKind.DEADLINE}),
}


def is_retryable(exc: BaseException, kind: RetryOn, *, deadline_ts: float, now: float) -> bool:
    """Whether ``exc`` from one try of a call of ``kind`` may be retried (pure)."""
    if not isinstance(exc, Exception):
        return False                      # cancellation and other BaseExceptions: never
    failure = failure_kind(exc)
    if failure not in _RETRIED[kind]:
        return False
    # a try's own timeout may be retried; the call's deadline passing ends the call
    return failure is not FailureKind.DEADLINE or now < deadline_ts


class _StopBeforeDeadline(stop_base):
    """Stop when the next try could not start ``min_try_s`` before the deadline."""

    def __init__(self, deadline_ts: float, min_try_s: float, clock: Clock) -> None:
        self.deadline_ts = deadline_ts
        self.min_try_s = min_try_s
        self.clock = clock

    def __call__(self, retry_state: RetryCallState) -> bool:
        # tenacity computes the wait before it asks stop, so upcoming_sleep is the coming sleep
        return self.clock() + retry_state.upcoming_sleep + self.min_try_s > self.deadline_ts


async def call_with_retry(attempt: Callable[[float], Awaitable[T]], *, kind: RetryOn,
                          policy: RetryPolicy, deadline_ts: float, clock: Clock = time.time,
                          sleep: Sleep = asyncio.sleep,
                          rand: Callable[[], float] = random.random, what: str = "") -> T:
    """Run ``attempt(try_deadline_ts)`` until it succeeds, a try fails with an error that
    ``kind`` does not retry, the attempts bound is reached, or the deadline would be passed.
    The last error is raised as is.

    Only an ``IDEMPOTENT`` call bounds its tries by ``try_timeout_s``: a single try has all the
    time there is, and a ``TRANSPORT`` call (prepare) is one that the server itself lets wait
    until the deadline."""
    if kind is RetryOn.NOTHING or policy.attempts == 1:
        return await attempt(deadline_ts)
    if kind is RetryOn.TRANSPORT:
        policy = replace(policy, try_timeout_s=None)

    def retry_on(exc: BaseException) -> bool:
        return is_retryable(exc, kind, deadline_ts=deadline_ts, now=clock())

    # the lean path: the first try runs bare; only a retryable failure builds the machinery
    try:
        return await attempt(policy.try_deadline(deadline_ts, clock()))
    except Exception as exc:
        if not retry_on(exc):
            raise
        first_error = exc
    return await _retry_after_first(attempt, first_error, policy=policy, deadline_ts=deadline_ts,
                                    clock=clock, sleep=sleep, rand=rand, what=what,
                                    retry_on=retry_on)


async def _retry_after_first(attempt: Callable[[float], Awaitable[T]], first_error: Exception,
                             *, policy: RetryPolicy, deadline_ts: float, clock: Clock,
                             sleep: Sleep, rand: Callable[[], float], what: str,
                             retry_on: Callable[[BaseException], bool]) -> T:
    """Tries 2..n of :func:`call_with_retry`, with the backoff the first try's failure earns."""

    def wait(retry_state: RetryCallState) -> float:
        # tenacity counts from this function's first try, which is the call's second
        return policy.backoff(retry_state.attempt_number + 1, rand())

    def log_retry(retry_state: RetryCallState) -> None:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        logger.debug("retrying %s after try %d failed (%r); sleeping %.3fs", what,
                     retry_state.attempt_number, exc, retry_state.upcoming_sleep)

    logger.debug("retrying %s after try 1 failed (%r)", what, first_error)
    delay = policy.backoff(1, rand())
    if clock() + delay + policy.min_try_s > deadline_ts:
        raise first_error
    await sleep(delay)
    retrying = AsyncRetrying(
        stop=stop_after_attempt(policy.attempts - 1)
        | _StopBeforeDeadline(deadline_ts, policy.min_try_s, clock),
        wait=wait, retry=retry_if_exception(retry_on), reraise=True, sleep=sleep,
        before_sleep=log_retry)

    async def one_try() -> T:
        return await attempt(policy.try_deadline(deadline_ts, clock()))

    return await retrying(one_try)
