"""The checkpoint lease of one agent-checkpoint server, on its event loop: :class:`LeaseTimer`.

:class:`~rl_gym_actors.gym.agent_checkpoint.core.ParticipantCore` decides when a lease runs out
(``renew``, ``expire``); this keeps a loop timer on the fence's ``lease_until``, lets an expired
lease go when it fires (or when a request comes first), logs it, and hands the expiry to the
participant to make durable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from rl_gym_actors.gym.agent_checkpoint.core import ParticipantCore

logger = logging.getLogger(__name__)


class LeaseTimer:
    """The lease timer of ``core``'s fence. ``clock`` gives Unix time; ``on_expired`` runs (as
    a task) after the timer let a lease go, to write the expiry and wake the waiters."""

    def __init__(
        self,
        core: ParticipantCore,
        clock: Callable[[], float],
        on_expired: Callable[[], Awaitable[None]],
    ) -> None:
        self._core = core
        self._clock = clock
        self._on_expired = on_expired
        self._timer: asyncio.TimerHandle | None = None
        self._expiry: asyncio.Future[None] | None = None  # keeps a reference to the task

    def renew(self, checkpoint_id: str | None, deadline_ts: float | None) -> None:
        """A call of ``checkpoint_id`` (None: none named) moves the lease, then the timer."""
        self._core.renew(checkpoint_id, deadline_ts, self._clock())
        self.arm()

    def arm(self) -> None:
        """Set the timer on the fence's ``lease_until`` (none without a lease)."""
        self.cancel()
        until = self._core.fence.lease_until
        if until is None:
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(0.0, until - self._clock()) + 0.01, self._fired)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fired(self) -> None:
        self._timer = None
        if self.expire():
            self._expiry = asyncio.ensure_future(self._on_expired())
        elif self._core.fence.lease_until is not None:
            self.arm()

    def expire(self) -> bool:
        """Let the lease go when it ran out (True then): admission reopens, the id is spent."""
        expired = self._core.expire(self._clock())
        if expired is None:
            return False
        logger.warning(
            "checkpoint lease expired: checkpoint_id=%s phase=%s lease_until=%.3f; admission "
            "reopened and the id is spent",
            expired.checkpoint_id,
            expired.phase.value,
            expired.lease_until,
            extra={
                "event": "checkpoint_lease_expired",
                "checkpoint_id": expired.checkpoint_id,
                "phase": expired.phase.value,
                "lease_until": expired.lease_until,
            },
        )
        return True
