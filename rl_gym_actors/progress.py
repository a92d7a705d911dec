"""A one-line progress bar for ``run_batch`` on a terminal: stderr, no dependency.

It draws only when its stream is a TTY, and not at all when turned off (``enabled=False`` or
the environment variable ``RLGA_PROGRESS=0``). Redraws are throttled to ``min_interval_s`` so
a batch of thousands of rows costs a handful of writes. The clock is injectable for tests.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

PROGRESS_ENV = "RLGA_PROGRESS"


def progress_wanted(stream: TextIO | None = None, enabled: bool | None = None) -> bool:
    """Whether a bar should draw on ``stream`` (stderr by default)."""
    if enabled is not None:
        return enabled
    if os.environ.get(PROGRESS_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    stream = stream if stream is not None else sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class ProgressBar:
    """Counts finished rows of a batch and draws ``label [####....] done/total ...``.

    ``update(status)`` takes an outcome status (``sealed``, ``failed``, ``abandoned``) and
    whether the row was adopted; ``close()`` draws the final line and a newline. Thread-safe:
    the orchestrator may report from a callback thread.
    """

    def __init__(
        self,
        total: int,
        *,
        label: str = "rollouts",
        stream: TextIO | None = None,
        enabled: bool | None = None,
        width: int = 24,
        min_interval_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = max(0, int(total))
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = progress_wanted(self.stream, enabled)
        self.width = max(4, width)
        self.min_interval_s = min_interval_s
        self._clock = clock
        self._started = clock()
        self._last_draw = -float("inf")
        self._lock = threading.Lock()
        self._closed = False
        self.done = 0
        self.counts: dict[str, int] = {}
        self.adopted = 0

    def update(self, status: str = "sealed", *, adopted: bool = False, n: int = 1) -> None:
        with self._lock:
            self.done += n
            self.counts[status] = self.counts.get(status, 0) + n
            if adopted:
                self.adopted += n
            now = self._clock()
            if self.done >= self.total or now - self._last_draw >= self.min_interval_s:
                self._draw(now)

    def render(self, now: float | None = None) -> str:
        """The bar's current text (without the carriage return)."""
        now = self._clock() if now is None else now
        total = self.total or 1
        filled = min(self.width, int(self.width * self.done / total))
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = max(now - self._started, 1e-9)
        rate = self.done / elapsed
        parts = [f"{self.label} [{bar}] {self.done}/{self.total}"]
        parts += [f"{k} {v}" for k, v in sorted(self.counts.items())]
        if self.adopted:
            parts.append(f"adopted {self.adopted}")
        parts.append(f"{rate:.1f}/s")
        if 0 < self.done < self.total and rate > 0:
            parts.append(f"eta {int((self.total - self.done) / rate)}s")
        return "  ".join(parts)

    def _draw(self, now: float) -> None:
        self._last_draw = now
        if not self.enabled or self._closed:
            return
        try:
            self.stream.write("\r" + self.render(now) + "\x1b[K")
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False  # the terminal went away; stop drawing, never raise

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._draw(self._clock())
            self._closed = True
            if self.enabled:
                try:
                    self.stream.write("\n")
                    self.stream.flush()
                except (OSError, ValueError):
                    pass

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bar_for(total: int, enabled: bool | None) -> ProgressBar | None:
    """A bar for a batch of ``total`` rows, or None when it would not draw."""
    if enabled is False or total == 0:
        return None
    bar = ProgressBar(total, enabled=enabled)
    return bar if bar.enabled else None
