"""Local Gym servers for the benchmarks, and ways to fill them with attempts.

``Fleet(n)`` starts ``n`` servers (``rl-gym-actors gym serve`` subprocesses, faults allowed) in
parallel; ``fleet.restart()`` gives fresh, empty servers. ``leave_finished`` and ``leave_running``
create attempts straight through the client, the way a lost reply or a dead owner leaves them:
finished and un-ACKed, or still running with nobody waiting for them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import common  # noqa: F401  (puts the repository on sys.path)

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.gym_process import GymServerProcess


class Fleet:
    """``n`` local Gym servers in subprocesses (context manager)."""

    def __init__(self, n: int, *, agent: str = "simulated", args: Sequence[str] = ()) -> None:
        self.servers = [
            GymServerProcess(agent=agent, token="bench-token", allow_faults=True, args=args)
            for _ in range(n)
        ]

    def start(self) -> Fleet:
        with ThreadPoolExecutor(len(self.servers)) as pool:
            list(pool.map(lambda s: s.start(), self.servers))
        return self

    def stop(self) -> None:
        with ThreadPoolExecutor(len(self.servers)) as pool:
            list(pool.map(lambda s: s.stop(), self.servers))

    def restart(self, count: int | None = None) -> None:
        """Fresh servers (memory store: empty after a restart), on the same ports: all of
        them, or the first ``count``."""
        servers = self.servers[: len(self.servers) if count is None else count]
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.stop(), servers))
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: s.start(), servers))

    @property
    def endpoints(self) -> list[GymEndpoint]:
        return [
            GymEndpoint(url=s.url, token=s.token, name=f"gym{i}")
            for i, s in enumerate(self.servers)
        ]

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.servers if s.pid]

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _spread(
    endpoints: Sequence[GymEndpoint], n: int, prefix: str, concurrency: int, call
) -> None:
    clients = [GymClient(ep, limit=concurrency) for ep in endpoints]
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with sem:
            await call(clients[i % len(clients)], f"{prefix}-{i}")

    try:
        await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        for c in clients:
            await c.close()


async def leave_finished(
    endpoints: Sequence[GymEndpoint], n: int, prefix: str, *, concurrency: int = 100
) -> None:
    """``n`` attempts that finished on Gym and were never ACKed (their replies 'lost'), spread
    round-robin over ``endpoints``."""

    async def call(client: GymClient, rid: str) -> None:
        await client.run(
            {"sleep_s": 0, "reward": 0.5},
            rollout_id=rid,
            attempt_index=0,
            deadline_ts=time.time() + 60,
        )

    await _spread(endpoints, n, prefix, concurrency, call)


async def leave_running(
    endpoints: Sequence[GymEndpoint],
    n: int,
    prefix: str,
    *,
    sleep_s: float = 3600.0,
    concurrency: int = 200,
    reach_s: float = 60.0,
) -> int:
    """``n`` attempts still running on Gym whose caller went away (their owners are gone),
    spread round-robin over ``endpoints``. The ``/run`` calls go out in waves of ``concurrency``;
    a wave is abandoned once the servers count its runs as running (Gym keeps running them), so
    all ``n`` reach Gym on a loaded machine too, or after ``reach_s``. Returns how many of them
    the servers count as running."""
    clients = [GymClient(ep, limit=concurrency) for ep in endpoints]
    base = await running_total(endpoints)
    reached = 0
    try:
        for first in range(0, n, concurrency):
            last = min(n, first + concurrency)
            calls = [
                asyncio.create_task(
                    clients[i % len(clients)].run(
                        {"sleep_s": sleep_s},
                        rollout_id=f"{prefix}-{i}",
                        attempt_index=0,
                        deadline_ts=time.time() + reach_s,
                    )
                )
                for i in range(first, last)
            ]
            end = time.monotonic() + reach_s
            while (reached := await running_total(endpoints) - base) < last:
                if time.monotonic() > end or all(c.done() for c in calls):
                    break
                await asyncio.sleep(0.05)
            for c in calls:
                c.cancel()  # the caller walks away; the run goes on
            await asyncio.gather(*calls, return_exceptions=True)
    finally:
        for c in clients:
            await c.close()
    return reached


async def running_total(endpoints: Sequence[GymEndpoint]) -> int:
    """Attempts running on the servers, summed (the servers' truth)."""
    return sum(c["running"] for c in (await gym_counts(endpoints)).values())


async def gym_counts(
    endpoints: Sequence[GymEndpoint], checkpoint_id: str = "bench-probe"
) -> dict[str, dict[str, Any]]:
    """Each server's status counts (the server's truth), by URL, asked of all at once."""

    async def one(ep: GymEndpoint) -> dict[str, Any]:
        async with GymClient(ep) as client:
            st = await client.status(checkpoint_id, deadline_ts=time.time() + 60)
        return {
            "running": st.running,
            "completed_unacknowledged": st.completed_unacknowledged,
            "acknowledged": st.acknowledged_completed,
            "state": st.state,
        }

    counts = await asyncio.gather(*(one(ep) for ep in endpoints))
    return {ep.url: c for ep, c in zip(endpoints, counts, strict=True)}
