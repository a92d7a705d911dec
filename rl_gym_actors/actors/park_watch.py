"""How long a Gym v2 server held its episodes parked for a checkpoint: :class:`ParkWatch`.

A v2 server parks every running episode at its next boundary while a checkpoint has admission
closed (any phase but ``idle``), and Gym does not count that time against the episode's own
deadline. A rollout's ``rollout_s`` must not count it either, or a checkpoint held open longer
than ``rollout_s`` would give up on (and rerun) work that was only waiting for the resume. So
while a rollout actor has ``/run`` calls in flight on a v2 server, one watch per server reads its
status every :func:`poll_interval` and keeps the spans it saw a checkpoint open
(:class:`ParkedTime`); a ``/run``'s deadline moves out by the parked time since it started.

A span is counted from the last time the server was seen idle to the first time it is seen idle
again, so it errs towards more time, never less: a checkpoint is never charged to a rollout.
There is no cap: a checkpoint lasts until the controller resumes or Gym's lease runs out, and
the time counts as long as it is seen. A status that cannot be read records nothing: an open
span counts only up to one interval past the last read that saw it open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)


def poll_interval(rollout_s: float) -> float:
    """How often a watch reads the status: a twentieth of ``rollout_s``, within [0.1, 1] s."""
    return min(1.0, max(0.1, rollout_s / 20.0))


class ParkedTime:
    """The spans one server was seen with a checkpoint open. Pure: times come in as arguments."""

    def __init__(self, since: float, grace_s: float = 0.0) -> None:
        self._spans: list[tuple[float, float]] = []
        self._open_from: float | None = None
        self._seen_open = since  # the last read that saw the open span
        self._last_idle = since  # a /run admitted at ``since`` found admission open
        self._grace_s = grace_s  # an open span counts this long past its last read

    @property
    def parked(self) -> bool:
        """Whether the last status read had a checkpoint open."""
        return self._open_from is not None

    def saw(self, now: float, parked: bool) -> None:
        """A status read at ``now``: a checkpoint open (``parked``) or idle."""
        if parked:
            if self._open_from is None:
                self._open_from = self._last_idle
            self._seen_open = now
        else:
            if self._open_from is not None:
                self._spans.append((self._open_from, now))
                self._open_from = None
            self._last_idle = now

    def within(self, start: float, now: float) -> float:
        """The parked time between ``start`` and ``now``."""
        spans = list(self._spans)
        if self._open_from is not None:
            spans.append((self._open_from, min(now, self._seen_open + self._grace_s)))
        return sum(max(0.0, min(end, now) - max(begin, start)) for begin, end in spans)

    def forget_before(self, ts: float) -> None:
        """Drop the spans that ended before ``ts`` (no /run in flight started that early)."""
        self._spans = [s for s in self._spans if s[1] >= ts]


class ParkWatch:
    """One v2 server's :class:`ParkedTime`, read by polling ``is_parked(deadline_ts)`` while at
    least one ``/run`` is in flight there (:meth:`enter` / :meth:`leave`)."""

    def __init__(
        self,
        is_parked: Callable[[float], Awaitable[bool]],
        clock: Callable[[], float],
        interval_s: float,
    ) -> None:
        self._is_parked = is_parked
        self._clock = clock
        self.interval_s = interval_s
        self.time = ParkedTime(clock(), interval_s)
        self._starts: dict[int, float] = {}  # the /runs in flight: token -> start
        self._next = 0
        self._task: asyncio.Task[None] | None = None
        self._reading: asyncio.Future[None] | None = None
        self.reads = 0

    def enter(self, start: float) -> int:
        """A ``/run`` that started at ``start`` is in flight; a token for :meth:`leave`."""
        if self._task is None:
            self.time = ParkedTime(start, self.interval_s)
            self._task = asyncio.create_task(self._poll(), name="rlga-park-watch")
        self._next += 1
        self._starts[self._next] = start
        return self._next

    def leave(self, token: int) -> None:
        self._starts.pop(token, None)
        if self._starts:
            self.time.forget_before(min(self._starts.values()))
        elif self._task is not None:
            self._task.cancel()
            self._task = None

    def parked_since(self, start: float) -> float:
        return self.time.within(start, self._clock())

    async def read(self) -> None:
        """Read the status once; callers that come while a read is under way share it (the
        /runs whose deadlines pass at once ask the server once). A failure records nothing."""
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self._read())
        await asyncio.shield(self._reading)

    async def _read(self) -> None:
        try:
            parked = await self._is_parked(self._clock() + max(self.interval_s, 1.0))
        except Exception as exc:  # unreadable: the deadline counts as usual
            logger.debug("park watch: status unreadable: %s", exc)
            return
        self.reads += 1
        self.time.saw(self._clock(), parked)

    async def _poll(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await self.read()
                await asyncio.sleep(self.interval_s)
