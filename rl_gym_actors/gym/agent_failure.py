"""What an agent's exception means for its row, and the answer ``/run`` gives for it (pure).

An agent fails a row one of two ways, and the server answers each its own way:

- **data** (terminal): :class:`~rl_gym_actors.errors.AgentDataError`, and every exception that is
  no infrastructure failure (a ``ValueError``, a ``KeyError``, a bug). The answer is 422
  ``agent_data_failed``; the rollout fails the row at once with ``failure.is_data`` and never
  tries it again. An unexpected exception is more likely a bug than a blip, so it is said at
  once rather than tried into silence (NeMo RL's classifier makes the same call).
- **transient**: :class:`~rl_gym_actors.errors.AgentTransientError`, a ``TimeoutError``, a
  ``ConnectionError``, an aiohttp connection or payload error, or an HTTP answer the agent got
  whose status is 5xx, 408 or 429 (an aiohttp ``ClientResponseError``, or the upstream answer of
  an ``http(s)://`` agent). The answer is 500 ``agent_failed``; the rollout tries the row again,
  up to ``TryPolicy.max_tries``, then fails it with ``failure.is_transport``.

The exception and its ``__cause__`` chain (at most :data:`CAUSE_DEPTH` links) are read; an
explicit :class:`~rl_gym_actors.errors.AgentDataError` anywhere first in the chain wins.
"""

from __future__ import annotations

from typing import Final

import aiohttp

from rl_gym_actors.errors import AgentDataError, AgentDataFailed, AgentFailed, AgentTransientError
from rl_gym_actors.gym.agents import UpstreamAgentError

CAUSE_DEPTH: Final = 8
# statuses below 500 that mean "try again", not "this row is bad"
RETRIABLE_STATUSES: Final = frozenset({408, 429})
TEXT_LIMIT: Final = 2000

_TRANSIENT_TYPES: Final[tuple[type[BaseException], ...]] = (
    AgentTransientError,
    TimeoutError,
    ConnectionError,
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
)


def status_is_transient(status: int) -> bool:
    """Whether an HTTP status an agent got back says its server is unwell, not the row bad."""
    return status >= 500 or status in RETRIABLE_STATUSES


def _one_is_transient(exc: BaseException) -> bool | None:
    """True (transient), False (data) or None (says neither) for one exception of the chain."""
    if isinstance(exc, AgentDataError):
        return False
    if isinstance(exc, (aiohttp.ClientResponseError, UpstreamAgentError)) and exc.status:
        return status_is_transient(exc.status)
    if isinstance(exc, _TRANSIENT_TYPES):
        return True
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether an agent's exception leaves the row worth another try (see the module text)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    for _ in range(CAUSE_DEPTH):
        if current is None or id(current) in seen:
            break
        seen.add(id(current))
        verdict = _one_is_transient(current)
        if verdict is not None:
            return verdict
        current = current.__cause__
    return False


def agent_failure(exc: BaseException) -> AgentFailed | AgentDataFailed:
    """The error ``/run`` answers for an agent's exception: 500 ``agent_failed`` (transient)
    or 422 ``agent_data_failed`` (data). Its detail is the exception's repr."""
    detail = repr(exc)[:TEXT_LIMIT]
    if is_transient(exc):
        return AgentFailed(detail, status=500)
    return AgentDataFailed(detail, status=422)
