"""aiohttp's exceptions -> the project's typed errors, as one table applied at the boundary.

A call that got no HTTP answer becomes one of :mod:`rl_gym_actors.errors` (raised ``from`` the
original, so the cause stays on the traceback); nothing above :mod:`rl_gym_actors.gym.transport`
sees an aiohttp or socket exception. The first rule whose exception type matches (and whose
``when_closed`` agrees with the client's pools) wins:

- ``TimeoutError`` (ours or aiohttp's) -> ``DeadlineExceeded``; counts against the endpoint's
  health on a call the server answers at once (a frozen server), never on ``/run`` or prepare;
- ``ClientError``, ``OSError`` or ``RuntimeError`` once the client's pools are closed ->
  ``PoolClosed``;
- ``ClientConnectorError`` (never reached the server) -> ``ConnectionLost``; always counts;
- any other ``ClientError`` or ``OSError`` -> ``ConnectionLost``; never counts (the server may
  have the request).

Any other exception (a ``RuntimeError`` of an open pool: a bug) propagates unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import aiohttp

from rl_gym_actors.errors import (
    ConnectionLost,
    DeadlineExceeded,
    GymUnavailable,
    PoolClosed,
    RlGymError,
)


class Counts(Enum):
    """Whether a failure counts against the endpoint's health (see :mod:`.health`)."""

    NEVER = "never"
    QUICK_CALLS = "quick_calls"  # only on a call the server answers at once (not /run, prepare)
    ALWAYS = "always"


@dataclass(frozen=True, slots=True)
class Rule:
    caught: tuple[type[BaseException], ...]
    error: type[GymUnavailable] | type[PoolClosed]
    counts: Counts
    detail: str  # formatted with call, left, name (the exception's type), exc, label
    when_closed: bool | None = None  # None: whether or not the client's pools are closed


RULES: tuple[Rule, ...] = (
    Rule((TimeoutError,), DeadlineExceeded, Counts.QUICK_CALLS, "{call}: no answer within {left}"),
    Rule(
        (aiohttp.ClientError, OSError, RuntimeError),
        PoolClosed,
        Counts.NEVER,
        "the session of the GymClient for {label} is closed ({call})",
        when_closed=True,
    ),
    Rule((aiohttp.ClientConnectorError,), ConnectionLost, Counts.ALWAYS, "{call}: {name}: {exc}"),
    Rule((aiohttp.ClientError, OSError), ConnectionLost, Counts.NEVER, "{call}: {name}: {exc}"),
)


@dataclass(frozen=True, slots=True)
class Mapped:
    """The typed error for a transport failure, and whether it counts against the endpoint."""

    error: RlGymError
    counts: bool


def map_transport_error(
    exc: BaseException, *, call: str, url: str, left_s: float, label: str, closed: bool, quick: bool
) -> Mapped | None:
    """The first rule's typed error for ``exc`` (None: no rule; let it propagate). ``call`` is
    ``"METHOD path"``; ``quick``: the server answers this call at once (a timeout means it is
    frozen)."""
    for rule in RULES:
        if not isinstance(exc, rule.caught):
            continue
        if rule.when_closed is not None and rule.when_closed != closed:
            continue
        detail = rule.detail.format(
            call=call, left=f"{left_s:.3f}s", name=type(exc).__name__, exc=exc, label=label
        )
        error: RlGymError = (
            rule.error(detail, url=url)
            if issubclass(rule.error, GymUnavailable)
            else rule.error(detail)
        )
        counts = rule.counts is Counts.ALWAYS or (rule.counts is Counts.QUICK_CALLS and quick)
        return Mapped(error, counts)
    return None
