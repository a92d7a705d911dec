"""The one retry decider (built on tenacity), configured by :class:`RetryPolicy`; deadline
arithmetic.

Every call carries an absolute deadline (Unix time). A retried call makes its tries, and sleeps
between them, inside that one deadline: a try never starts with less than ``min_try_s`` left, and
a backoff that would cross the deadline stops the retrying instead (the last error is raised).

Which errors a call may retry on is decided by its kind, never by the policy:

- ``RetryOn.IDEMPOTENT`` (receipt, acknowledge, retire, status, replay, resume, capabilities):
  ``ConnectionLost``, ``DeadlineExceeded`` of one try while the call's deadline has not passed,
  and ``GymServerError`` (a 5xx with a JSON error body that is no known rejection).
- ``RetryOn.TRANSPORT`` (prepare, commit: safe to repeat with the same checkpoint id, but a
  server-side failure should surface): ``ConnectionLost``, and ``ServerBusy``.
- ``RetryOn.NOTHING`` (run: a blind retry could start a second execution): only
  ``ServerBusy`` (503 ``too_many_connections``), the one answer that says nothing ran.

Every kind retries ``ServerBusy``: the server refused the connection before it read the request.
- ``RetryOn.CHECKPOINT_HELD`` (the checkpoint gate's prepare while another checkpoint id holds
  the server): ``CheckpointConflict`` only, until the deadline.

The failures an ``IDEMPOTENT`` call retries are those the failure table
(:class:`~rl_gym_actors.failures.FailureKind`) marks ``Repeat.IN_CALL``; whoever makes such a
call never repeats it for those (it was retried already), only for ``Repeat.LATER`` ones.

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
from enum import Enum
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_base

from rl_gym_actors.config import RetryPolicy
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.failures import FailureKind, Repeat, failure_kind

logger = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class RetryOn(str, Enum):
    """What a call may retry on (see the module docstring)."""

    NOTHING = "nothing"
    TRANSPORT = "transport"
    IDEMPOTENT = "idempotent"
    CHECKPOINT_HELD = "checkpoint_held"  # a prepare waiting out another checkpoint id


NO_RETRY = RetryPolicy(attempts=1)
DEFAULT_RETRY = RetryPolicy()
_UNBOUNDED = 2**62  # tries when only the deadline bounds a wait


def remaining(deadline_ts: float, now: float) -> float:
    """Seconds left until ``deadline_ts`` (never negative)."""
    return max(deadline_ts - now, 0.0)


def check_deadline(deadline_ts: float) -> float:
    """Refuse a deadline that is no absolute Unix time (not a number, not finite, or so small
    that it must be a relative budget by mistake)."""
    if (
        not isinstance(deadline_ts, (int, float))
        or isinstance(deadline_ts, bool)
        or not math.isfinite(deadline_ts)
    ):
        raise ConfigError(f"deadline_ts must be a finite number, got {deadline_ts!r}")
    if deadline_ts < 1_000_000_000:  # 2001-09-09: anything below is a budget, not a time
        raise ConfigError(f"deadline_ts must be absolute Unix time, got {deadline_ts!r}")
    return float(deadline_ts)


# the failure kinds each kind of call retries on (the failure table says which are repeated
# within a call); TRANSPORT leaves a server-side failure to surface
_RETRIED: dict[RetryOn, frozenset[FailureKind]] = {
    RetryOn.NOTHING: frozenset({FailureKind.BUSY}),
    RetryOn.TRANSPORT: frozenset({FailureKind.LOST, FailureKind.BUSY}),
    RetryOn.IDEMPOTENT: frozenset(k for k in FailureKind if k.repeat is Repeat.IN_CALL),
    RetryOn.CHECKPOINT_HELD: frozenset({FailureKind.CONFLICT}),
}


def is_retryable(exc: BaseException, kind: RetryOn, *, deadline_ts: float, now: float) -> bool:
    """Whether ``exc`` from one try of a call of ``kind`` may be retried (pure)."""
    if not isinstance(exc, Exception):
        return False  # cancellation and other BaseExceptions: never
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


async def call_with_retry(
    attempt: Callable[[float], Awaitable[T]],
    *,
    kind: RetryOn,
    policy: RetryPolicy,
    deadline_ts: float,
    clock: Clock = time.time,
    sleep: Sleep = asyncio.sleep,
    rand: Callable[[], float] = random.random,
    what: str = "",
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """Run ``attempt(try_deadline_ts)`` until it succeeds, a try fails with an error that
    ``kind`` does not retry, the attempts bound is reached, or the deadline would be passed.
    The last error is raised as is. ``on_retry`` hears each retried error before its backoff.

    Only an ``IDEMPOTENT`` call bounds its tries by ``try_timeout_s``: a single try has all the
    time there is, a ``TRANSPORT`` call (prepare) is one that the server itself lets wait
    until the deadline, and a ``NOTHING`` call (run) is the agent's work. A
    ``CHECKPOINT_HELD`` wait is bounded by the deadline alone."""
    if kind is RetryOn.CHECKPOINT_HELD:
        policy = policy.model_copy(update={"try_timeout_s": None, "attempts": _UNBOUNDED})
    if policy.attempts == 1:
        return await attempt(deadline_ts)
    if kind in (RetryOn.TRANSPORT, RetryOn.NOTHING):
        policy = policy.model_copy(update={"try_timeout_s": None})

    def retry_on(exc: BaseException) -> bool:
        return is_retryable(exc, kind, deadline_ts=deadline_ts, now=clock())

    # the lean path: the first try runs bare; only a retryable failure builds the machinery
    try:
        return await attempt(policy.try_deadline(deadline_ts, clock()))
    except Exception as exc:
        if not retry_on(exc):
            raise
        first_error = exc
    return await _retry_after_first(
        attempt,
        first_error,
        policy=policy,
        deadline_ts=deadline_ts,
        clock=clock,
        sleep=sleep,
        rand=rand,
        what=what,
        retry_on=retry_on,
        on_retry=on_retry,
    )


async def _retry_after_first(
    attempt: Callable[[float], Awaitable[T]],
    first_error: Exception,
    *,
    policy: RetryPolicy,
    deadline_ts: float,
    clock: Clock,
    sleep: Sleep,
    rand: Callable[[], float],
    what: str,
    retry_on: Callable[[BaseException], bool],
    on_retry: Callable[[BaseException], None] | None,
) -> T:
    """Tries 2..n of :func:`call_with_retry`, with the backoff the first try's failure earns."""

    def wait(retry_state: RetryCallState) -> float:
        # tenacity counts from this function's first try, which is the call's second
        return policy.backoff(retry_state.attempt_number + 1, rand())

    def log_retry(retry_state: RetryCallState) -> None:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        logger.debug(
            "retrying %s after try %d failed (%r); sleeping %.3fs",
            what,
            retry_state.attempt_number,
            exc,
            retry_state.upcoming_sleep,
        )
        if on_retry is not None and exc is not None:
            on_retry(exc)

    logger.debug("retrying %s after try 1 failed (%r)", what, first_error)
    delay = policy.backoff(1, rand())
    if clock() + delay + policy.min_try_s > deadline_ts:
        raise first_error
    if on_retry is not None:
        on_retry(first_error)
    await sleep(delay)
    retrying = AsyncRetrying(
        stop=stop_after_attempt(policy.attempts - 1)
        | _StopBeforeDeadline(deadline_ts, policy.min_try_s, clock),
        wait=wait,
        retry=retry_if_exception(retry_on),
        reraise=True,
        sleep=sleep,
        before_sleep=log_retry,
    )

    last_error = first_error  # the latest failure: the cause if the deadline runs out

    async def one_try() -> T:
        nonlocal last_error
        if clock() >= deadline_ts:
            # the backoff ended past the deadline (a loaded machine's sleep overran): the call
            # fails with its real cause, not with a DeadlineExceeded of a try never sent
            raise last_error
        try:
            return await attempt(policy.try_deadline(deadline_ts, clock()))
        except Exception as exc:
            last_error = exc
            raise

    return await retrying(one_try)
