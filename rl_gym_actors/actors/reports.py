"""A rollout actor's outbox of attempt reports to the ledger: batched, ordered, flushable."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from rl_gym_actors.core.attempt_reports import AttemptReport, merge_reports

logger = logging.getLogger(__name__)

Send = Callable[[list[AttemptReport]], Awaitable[object]]

MAX_PENDING = 1_000_000  # past this (a ledger gone for good) the oldest reports are dropped


class ReportOutbox:
    """Sends reports in batches of up to ``batch_size``, or ``interval_s`` after the first one
    waiting, whichever comes first. One batch is in flight at a time, so batches leave in order;
    :meth:`flush` returns once everything added before it has been delivered. A report of an
    attempt that already has one waiting (not yet in flight) is merged into it
    (:func:`~rl_gym_actors.core.attempt_reports.merge_reports`): the ledger folds the same, from one
    report instead of several."""

    def __init__(self, send: Send, *, batch_size: int, interval_s: float) -> None:
        self._send = send
        self._batch_size = batch_size
        self._interval_s = interval_s
        self._pending: list[AttemptReport] = []
        self._seq0 = 0  # the sequence number of _pending[0]
        self._in_flight = 0  # how many of the first pending are being sent
        self._waiting: dict[tuple[str, int], int] = {}  # attempt -> its pending seq number
        self.merged = 0
        self._lock = asyncio.Lock()
        self._timer: asyncio.Task | None = None
        self._failing = False
        self.sent = 0
        self.dropped = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, report: AttemptReport) -> None:
        key = (report.rollout_id, report.attempt_index)
        seq = self._waiting.get(key)
        if seq is not None and seq >= self._seq0 + self._in_flight:
            merged = merge_reports(self._pending[seq - self._seq0], report)
            if merged is not None:
                self._pending[seq - self._seq0] = merged
                self.merged += 1
                return
        self._waiting[key] = self._seq0 + len(self._pending)
        self._pending.append(report)
        if len(self._pending) > MAX_PENDING:
            self._drop_first(1)
            self.dropped += 1
        if len(self._pending) >= self._batch_size:
            self._schedule(0.0)
        elif self._timer is None:
            self._schedule(self._interval_s)

    def _schedule(self, delay: float) -> None:
        if self._timer is not None and not self._timer.done():
            if delay > 0:
                return
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().create_task(self._flush_later(delay))

    async def _flush_later(self, delay: float) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        self._timer = None
        try:
            await self.flush()
        except Exception:  # already logged; the reports stay queued for the next flush
            pass

    async def flush(self) -> int:
        """Deliver every report queued so far; how many this call delivered."""
        delivered = 0
        async with self._lock:
            while self._pending:
                batch = self._pending[: self._batch_size]
                self._in_flight = len(batch)
                try:
                    await self._send(batch)
                except Exception as exc:
                    self._in_flight = 0
                    if not self._failing:
                        logger.warning(
                            "reports to the ledger failed (%d queued): %r", len(self._pending), exc
                        )
                    self._failing = True
                    if self._pending and self._timer is None:
                        self._schedule(max(self._interval_s, 0.5))
                    raise
                self._failing = False
                self._in_flight = 0
                self._drop_first(len(batch))
                delivered += len(batch)
                self.sent += len(batch)
        return delivered

    def _drop_first(self, n: int) -> None:
        for report in self._pending[:n]:
            key = (report.rollout_id, report.attempt_index)
            if self._waiting.get(key, -1) < self._seq0 + n:
                self._waiting.pop(key, None)
        del self._pending[:n]
        self._seq0 += n

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
