"""Server time: what each Gym server's clock says, as it sends it and as a client estimates it.

Every ``deadline_ts`` on the wire is read by the server against its own clock (when to answer a
prepare that is not ready, when a checkpoint's lease lapses). A server whose clock runs ahead of
ours sees every deadline as passed already; one behind keeps a dead driver's checkpoint for as
long as it is behind. So a client sends deadlines in the server's time: ``local + offset``.

- Server side: :class:`ServerTimeHeaders`, an ASGI middleware our server puts around every app,
  stamps each answer with the (ext) :data:`SERVER_TIME_HEADER` (Unix time as a float) and the
  HTTP ``Date`` header, both from the participant's clock (uvicorn's own ``Date`` is off).
- Client side: :class:`ServerClock` (one per client) takes a sample from each answer:
  ``server time - the midpoint of the exchange``; from ``x-gym-time`` when sent (error: half the
  round trip), else from ``Date`` (1 s resolution: the middle of its second is used, and an
  estimate within :data:`DATE_RESOLUTION_S` of zero counts as zero). The offset is the median of
  the last :data:`SAMPLES` samples, so one slow answer does not move it.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping
from email.utils import formatdate, parsedate_to_datetime
from typing import Any

SERVER_TIME_HEADER = "x-gym-time"  # (ext) the server's Unix time when it answered
SAMPLES = 16
DATE_RESOLUTION_S = 1.0

Clock = Callable[[], float]


def server_time(headers: Mapping[str, str]) -> tuple[float, bool] | None:
    """The server's time from an answer's headers, and whether it is exact (``x-gym-time``) or
    from ``Date`` (the middle of its second); None when neither is there or readable."""
    raw = headers.get(SERVER_TIME_HEADER)
    if raw is not None:
        try:
            value = float(raw)
        except ValueError:
            value = float("nan")
        if value == value and 1e9 < value < 1e11:  # a finite Unix time
            return value, True
    date = headers.get("Date")
    if date is None:
        return None
    try:
        return parsedate_to_datetime(date).timestamp() + 0.5, False
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


class ServerClock:
    """One server's clock offset (server minus local, seconds), estimated from its answers."""

    def __init__(self, samples: int = SAMPLES) -> None:
        self._samples: deque[float] = deque(maxlen=samples)
        self._exact: deque[bool] = deque(maxlen=samples)
        self.offset = 0.0

    def sample(self, headers: Mapping[str, str], sent: float, received: float) -> None:
        """Fold one answer (``sent`` / ``received``: local times around the exchange)."""
        found = server_time(headers)
        if found is None:
            return
        value, exact = found
        self._samples.append(value - 0.5 * (sent + received))
        self._exact.append(exact)
        offset = statistics.median(self._samples)
        if not any(self._exact) and abs(offset) <= DATE_RESOLUTION_S:
            offset = 0.0  # Date alone cannot tell this from no skew at all
        self.offset = offset

    @property
    def samples(self) -> int:
        return len(self._samples)

    def to_server(self, local_ts: float) -> float:
        """A local Unix time in the server's clock."""
        return local_ts + self.offset


class ServerTimeHeaders:
    """ASGI middleware: every HTTP answer carries :data:`SERVER_TIME_HEADER` and ``Date`` from
    ``clock`` (run uvicorn with ``date_header=False``, or answers carry two dates)."""

    def __init__(self, app: Any, clock: Clock = time.time) -> None:
        self.app = app
        self.clock = clock
        self._second = -1
        self._date = b""

    def _date_of(self, now: float) -> bytes:
        second = int(now)
        if second != self._second:
            self._second, self._date = second, formatdate(second, usegmt=True).encode()
        return self._date

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def stamped(message: Any) -> None:
            if message["type"] == "http.response.start":
                now = self.clock()
                headers = list(message.get("headers", ()))
                headers.append((SERVER_TIME_HEADER.encode(), f"{now:.6f}".encode()))
                headers.append((b"date", self._date_of(now)))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, stamped)


#: test-only: with ``gym serve --allow-faults``, the server's clock runs this many seconds off
CLOCK_OFFSET_ENV = "RL_GYM_FAULT_CLOCK_OFFSET_S"


def shifted(offset_s: float, base: Clock = time.time) -> Clock:
    """``base`` shifted by ``offset_s`` seconds (``base`` itself when 0)."""
    if not offset_s:
        return base
    return lambda: base() + offset_s


def fault_clock(allow_faults: bool, environ: Mapping[str, str]) -> Clock:
    """The server's clock: Unix time, shifted by :data:`CLOCK_OFFSET_ENV` only when fault
    injection is allowed (a test server's skewed host clock; no route ever sees it)."""
    raw = environ.get(CLOCK_OFFSET_ENV, "") if allow_faults else ""
    try:
        return shifted(float(raw) if raw else 0.0)
    except ValueError as exc:
        raise ValueError(f"{CLOCK_OFFSET_ENV} must be a number of seconds, got {raw!r}") from exc
