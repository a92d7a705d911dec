"""Whether one Gym endpoint is up, as one client sees it: a small circuit breaker.

A failure is a call that got no answer at all: the connection was refused (or could not be made),
or a control call that the server answers at once (status, retire, receipt, ACK, resume) timed
out. Any HTTP answer, whatever its status, is a success. After ``threshold`` failures in a row
that span at least ``span_s`` (so that a quick restart, which the retry policy rides out, does not
trip it), the endpoint is down: calls raise :class:`~rl_gym_actors.errors.EndpointDown` at once,
carrying the last failure, until a probe reaches the server again (the client runs the probe in
the background; see :meth:`GymClient._probe_until_up`). A down endpoint also lets one real call
through every ``trial_every_s`` (a half-open breaker): its answer brings the endpoint back even
where a background task cannot run (an event loop that runs only while its actor serves a call).

Pure and synchronous: the clock is passed in; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable

from rl_gym_actors.errors import EndpointDown

THRESHOLD = 3  # failures in a row ...
SPAN_S = 2.0  # ... over at least this long mark an endpoint down
PROBE_EVERY_S = 0.5  # a down endpoint is probed this often
PROBE_TIMEOUT_S = 1.0  # and a probe that gets no answer within this counts as still down
TRIAL_EVERY_S = 1.0  # a down endpoint lets one call through this often
UP_POLL_S = 0.05  # a caller waiting for a down endpoint to come back looks this often
WAITED_PROBE_EVERY_S = 0.1  # and while someone waits, the endpoint is probed this often


class EndpointHealth:
    """Consecutive failures of one endpoint and the down mark they lead to."""

    def __init__(
        self,
        label: str,
        *,
        threshold: int = THRESHOLD,
        span_s: float = SPAN_S,
        trial_every_s: float = TRIAL_EVERY_S,
        clock: Callable[[], float],
    ) -> None:
        self.label = label
        self.threshold = threshold
        self.span_s = span_s
        self._clock = clock
        self.failures = 0
        self.first_failure_ts = 0.0
        self.down = False
        self.downs = 0  # how often it was marked down
        self.cause_type = ""
        self.cause = ""
        self.trial_every_s = trial_every_s
        self.last_failure_ts = 0.0
        self._trial_ts = 0.0

    def succeeded(self) -> bool:
        """An answer came. True when this brings a down endpoint back up."""
        was_down = self.down
        self.failures = 0
        self.down = False
        return was_down

    def failed(self, exc: BaseException) -> bool:
        """A call got no answer. True when this marks the endpoint down."""
        now = self._clock()
        if self.failures == 0:
            self.first_failure_ts = now
        self.failures += 1
        self.last_failure_ts = now
        self.cause_type = type(exc).__name__
        self.cause = str(exc)[:500]
        if (
            not self.down
            and self.failures >= self.threshold
            and now - self.first_failure_ts >= self.span_s
        ):
            self.down = True
            self.downs += 1
            return True
        return False

    def check(self, what: str, url: str) -> None:
        """Raise EndpointDown when the endpoint is down (the call is not sent), but for one
        trial call every ``trial_every_s`` since the last failure or trial."""
        if self.down:
            now = self._clock()
            if now - max(self.last_failure_ts, self._trial_ts) >= self.trial_every_s:
                self._trial_ts = now
                return
            raise EndpointDown(
                f"{what}: {self.label} is down ({self.failures} calls in a row got no answer); "
                f"last: {self.cause_type}: {self.cause}",
                url=url,
                cause=self.cause,
                cause_type=self.cause_type,
            )
