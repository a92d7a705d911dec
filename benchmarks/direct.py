"""The direct-loop baseline: a plain asyncio loop over one Gym server with no Ray.

Per rollout it does what a rollout actor does on the happy path, and nothing else: ``/run``, the
receipt fetch, the digest check, the ACK. ``concurrency`` rollouts are in flight at once. The
benchmarks measure it in the same run as the orchestrator and report the ratio.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import common  # noqa: F401  (puts the repository on sys.path)

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.errors import ProtocolViolation
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.protocol import ROLLOUT_ID_FIELD


@dataclass
class DirectBatch:
    """One batch through the direct loop: wall time and each rollout's latency (seconds)."""

    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)


async def direct_rollout(
    client: GymClient, row: Mapping[str, Any], rollout_id: str, *, timeout_s: float = 120.0
) -> float:
    """One rollout the direct way; returns its latency in seconds."""
    t0 = time.perf_counter()
    deadline = time.time() + timeout_s
    body = {k: v for k, v in row.items() if k != ROLLOUT_ID_FIELD}
    result = await client.run(body, rollout_id=rollout_id, attempt_index=0, deadline_ts=deadline)
    answer = await client.receipt(rollout_id, 0, deadline_ts=deadline)
    if answer.completion_receipt.result_digest != result.digest:
        raise ProtocolViolation(f"{rollout_id}: digest mismatch")
    await client.acknowledge(answer.completion_receipt, deadline_ts=deadline)
    return time.perf_counter() - t0


async def direct_batch(
    clients: Sequence[GymClient],
    rows: Sequence[Mapping[str, Any]],
    *,
    concurrency: int,
    timeout_s: float = 120.0,
) -> DirectBatch:
    """Every row through the direct loop, ``concurrency`` at once, spread over ``clients`` by
    row position. Each row must carry ``_ng_rollout_id``."""
    sem = asyncio.Semaphore(concurrency)
    out = DirectBatch()

    async def one(i: int, row: Mapping[str, Any]) -> None:
        async with sem:
            try:
                out.latencies.append(
                    await direct_rollout(
                        clients[i % len(clients)],
                        row,
                        str(row[ROLLOUT_ID_FIELD]),
                        timeout_s=timeout_s,
                    )
                )
                out.ok += 1
            except Exception as exc:  # a benchmark counts failures instead of dying on one
                name = type(exc).__name__
                out.errors[name] = out.errors.get(name, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i, r) for i, r in enumerate(rows)))
    out.seconds = time.perf_counter() - t0
    return out


def make_clients(endpoints: Sequence[GymEndpoint], concurrency: int) -> list[GymClient]:
    """One client per endpoint with a connection pool large enough for ``concurrency``."""
    return [
        GymClient(ep, limit=max(100, concurrency), control_limit=max(16, concurrency))
        for ep in endpoints
    ]
