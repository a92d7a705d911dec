"""HTTP to one Gym server, whatever the checkpoint protocol: connection pools, deadlines, the
endpoint's health, and aiohttp's exceptions mapped to typed errors at this one boundary.

:class:`GymTransport` is the base of each protocol's client (e.g.
:class:`~rl_gym_actors.gym.agent_checkpoint.client.GymClient`). Its :meth:`~GymTransport._send`
is one HTTP exchange bounded by an absolute ``deadline_ts``: any status comes back as an
:class:`~rl_gym_actors.gym.answers.Answer`; no answer at all raises the error that
:mod:`rl_gym_actors.gym.transport_errors` names. :meth:`~GymTransport._with_retry` runs a call
under the retry policy (:mod:`rl_gym_actors.gym.retry`).

Dead and frozen servers (see :mod:`rl_gym_actors.gym.health`): calls that get no answer at all
(refused, or a quick control call that times out) count against the endpoint; after a few in a
row it is marked down and every call raises ``EndpointDown`` at once, carrying the last cause,
until a background probe (a GET on a connection of its own; any HTTP status is an answer) gets an
answer again. Whoever would rather wait for that than fail (a step that rides out a restart)
waits with :meth:`~GymTransport.until_up`; :attr:`~GymTransport.failing_since` says how long
the endpoint has given no answer.

Connection pools: ``/run`` calls hold a connection for as long as the agent works, so the
control plane has its own small pool and a retire or ACK never queues behind long runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import aiohttp

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.errors import ConfigError, DeadlineExceeded, PoolClosed
from rl_gym_actors.gym import health as _health
from rl_gym_actors.gym.answers import Answer
from rl_gym_actors.gym.clock import ServerClock
from rl_gym_actors.gym.retry import (
    DEFAULT_RETRY,
    Clock,
    RetryOn,
    RetryPolicy,
    call_with_retry,
    check_deadline,
    remaining,
)
from rl_gym_actors.gym.transport_errors import map_transport_error
from rl_gym_actors.protocol import CAPABILITIES_PATH

logger = logging.getLogger(__name__)

T = TypeVar("T")


def _restore(cls: type[GymTransport], endpoint: GymEndpoint, options: dict[str, Any]) -> Any:
    return cls(endpoint, **options)


# how long an idle pooled connection is reused: below common servers' idle timeouts (uvicorn's
# default is 5 s), so that a POST, never retried, rarely meets a connection the server closed
KEEPALIVE_S = 2.0


class GymTransport:
    """HTTP to one Gym server; one per process or actor, shared by its coroutines.

    Construct it anywhere (it pickles as its construction arguments, without a passed-in
    ``session``); the connection pools are created on first use inside the running event loop,
    and the client stays bound to that loop. ``limit`` caps concurrent ``/run`` connections,
    ``control_limit`` the control plane's. ``keepalive_s`` is kept below common server idle
    timeouts so that a ``/run`` (a POST, never retried) rarely meets a connection the server has
    already closed. A passed-in ``session`` serves both planes and is never closed by the client.
    """

    #: what the health probe asks for (any HTTP answer, whatever its status, will do)
    probe_path = CAPABILITIES_PATH

    def __init__(
        self,
        endpoint: GymEndpoint,
        *,
        session: aiohttp.ClientSession | None = None,
        limit: int = 100,
        control_limit: int = 16,
        retry: RetryPolicy = DEFAULT_RETRY,
        keepalive_s: float = KEEPALIVE_S,
        clock: Clock = time.time,
        down_after: int = _health.THRESHOLD,
        down_span_s: float = _health.SPAN_S,
        probe_every_s: float = _health.PROBE_EVERY_S,
    ) -> None:
        if not isinstance(endpoint, GymEndpoint):
            raise ConfigError(f"endpoint must be a GymEndpoint, got {type(endpoint).__name__}")
        if limit < 1 or control_limit < 1:
            raise ConfigError("limit and control_limit must be >= 1")
        self.endpoint = endpoint
        self.retry = retry
        self._options: dict[str, Any] = dict(  # also what a pickled client is rebuilt from
            limit=limit,
            control_limit=control_limit,
            retry=retry,
            keepalive_s=keepalive_s,
            clock=clock,
            down_after=down_after,
            down_span_s=down_span_s,
            probe_every_s=probe_every_s,
        )
        self._clock = clock
        self.health = _health.EndpointHealth(
            endpoint.label, threshold=down_after, span_s=down_span_s, clock=clock
        )
        self._probe_every_s = probe_every_s
        self._probe: asyncio.Task[None] | None = None
        self._probed_at = 0.0
        self._given = session
        self._data: aiohttp.ClientSession | None = None
        self._control: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        #: the server's clock offset, from its answers (see :mod:`rl_gym_actors.gym.clock`)
        self.server_clock = ServerClock()

    def wire_deadline(self, deadline_ts: float) -> float:
        """The ``deadline_ts`` to send for our local ``deadline_ts``: less the reply margin,
        in the server's clock."""
        return self.server_clock.to_server(self.retry.wire_deadline(deadline_ts, self._clock()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), self.endpoint, dict(self._options)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint.label!r})"

    async def __aenter__(self: T) -> T:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the pools this client created. Later calls raise ``PoolClosed``."""
        self._closed = True
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None
        owned = [s for s in (self._data, self._control) if s is not None]
        self._data = self._control = None
        for session in owned:
            await session.close()

    # ------------------------------------------------------------ retry

    async def _with_retry(
        self,
        attempt: Callable[[float], Awaitable[T]],
        kind: RetryOn,
        deadline_ts: float,
        what: str,
    ) -> T:
        """``attempt(try_deadline)`` under the retry policy for calls of ``kind``."""
        return await call_with_retry(
            attempt,
            kind=kind,
            policy=self.retry,
            deadline_ts=check_deadline(deadline_ts),
            clock=self._clock,
            what=f"{self.endpoint.label} {what}",
        )

    # ------------------------------------------------------------ one exchange

    def _session(self, control: bool) -> aiohttp.ClientSession:
        if self._closed:
            raise PoolClosed(f"GymClient for {self.endpoint.label} is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise ConfigError(
                "a GymClient is bound to the event loop that first used it; "
                "create one client per event loop"
            )
        if self._given is not None:
            return self._given
        # creating a session does not await, so two coroutines cannot both create one
        if control:
            if self._control is None:
                self._control = self._new_session(self._options["control_limit"])
            return self._control
        if self._data is None:
            self._data = self._new_session(self._options["limit"])
        return self._data

    def _new_session(self, limit: int) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=limit, limit_per_host=0, keepalive_timeout=self._options["keepalive_s"]
        )
        # our own asyncio.timeout bounds each try; no aiohttp timeout competes with it
        return aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None), raise_for_status=False
        )

    async def _send(
        self,
        method: str,
        path: str,
        *,
        control: bool,
        deadline_ts: float,
        data: bytes | None = None,
        params: Mapping[str, str] | None = None,
        waits: bool = False,
    ) -> Answer:
        """One HTTP exchange, bounded by ``deadline_ts``; any status comes back as an answer.
        ``control``: the control plane (its pool, the bearer token); ``waits``: the server may
        hold this control call on purpose (a timeout then says nothing about its health)."""
        url = self.endpoint.url + path
        left = remaining(deadline_ts, self._clock())
        if left <= 0:
            raise DeadlineExceeded(f"{method} {path}: deadline passed before the call", url=url)
        session = self._session(control)
        if self.health.down:
            self._ensure_probe()  # whatever ended the last probe, one runs now
            if self._clock() - self._probed_at > 2 * self._probe_every_s + _health.PROBE_TIMEOUT_S:
                # the background probe has not run for a while (an event loop that only runs
                # while the actor serves a call: a Ray generator method's): probe here, once
                await self._probe_now(left)
            self.health.check(f"{method} {path}", url)
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        token = self.endpoint.resolved_token if control else None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        sent = self._clock()
        try:
            async with asyncio.timeout(left):
                async with session.request(
                    method, url, data=data, params=params, headers=headers
                ) as resp:
                    raw = await resp.read()
                    answer = Answer(resp.status, raw, url, resp.headers)
        except Exception as exc:
            mapped = map_transport_error(
                exc,
                call=f"{method} {path}",
                url=url,
                left_s=left,
                label=self.endpoint.label,
                closed=self._closed or session.closed,
                quick=control and not waits,
            )
            if mapped is None:
                raise
            if mapped.counts:
                self._failed(mapped.error)
            raise mapped.error from exc
        self.health.succeeded()
        if control and not waits:  # a held answer (a run, a prepare) says little of when
            self.server_clock.sample(answer.headers, sent, self._clock())
        return answer

    # ------------------------------------------------------------ health

    @property
    def failing_since(self) -> float | None:
        """When calls to this endpoint began to get no answer (the first of the current
        failures in a row, on this client's clock); None while the last call got one."""
        return self.health.first_failure_ts if self.health.failures else None

    async def until_up(self, until_ts: float) -> bool:
        """Wait until the endpoint is no longer marked down (a probe got an answer) or
        ``until_ts`` passes. True when it is up (at once when it was not down); False at
        ``until_ts``, or once the client is closed. While someone waits, the endpoint is
        probed every ``WAITED_PROBE_EVERY_S`` (by one waiter at a time), not every
        ``probe_every_s``: a restarted server is seen within a tenth of a second."""
        while self.health.down and not self._closed:
            left = until_ts - self._clock()
            if left <= 0:
                return False
            self._ensure_probe()
            if self._clock() - self._probed_at >= _health.WAITED_PROBE_EVERY_S:
                await self._probe_now(left)
            else:
                await asyncio.sleep(min(_health.UP_POLL_S, left))
        return not self._closed

    def _failed(self, exc: BaseException) -> None:
        if self.health.failed(exc):
            logger.warning("%s marked down: %s", self.endpoint.label, exc)
            self._ensure_probe()

    async def _probe_now(self, budget_s: float) -> None:
        self._probed_at = self._clock()  # concurrent calls do not probe as well
        try:
            await asyncio.wait_for(self._probe_once(), min(_health.PROBE_TIMEOUT_S, budget_s))
        except Exception as exc:  # no answer: still down
            logger.debug("probe of %s: %r", self.endpoint.label, exc)
            return
        if self.health.succeeded():
            logger.warning("%s is up again", self.endpoint.label)

    def _ensure_probe(self) -> None:
        if (self._probe is None or self._probe.done()) and not self._closed:
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_up())

    async def _probe_until_up(self) -> None:
        """While the endpoint is down: probe every ``probe_every_s``, each probe bounded by
        asyncio itself; any HTTP answer marks it up again."""
        self._probed_at = self._clock()
        while self.health.down and not self._closed:
            await asyncio.sleep(self._probe_every_s)
            await self._probe_now(_health.PROBE_TIMEOUT_S)

    async def _probe_once(self) -> None:
        """One GET of :attr:`probe_path` on a session and connection of its own (none of the
        pools' state, which a frozen server may have wedged); any status is an answer."""
        connector = aiohttp.TCPConnector(limit=1, force_close=True)
        async with (
            aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None)
            ) as session,
            session.get(self.endpoint.url + self.probe_path, allow_redirects=False) as resp,
        ):
            resp.release()
