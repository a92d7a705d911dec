"""Status bytes per rollout against a real Gym that gives no receipt per key (issue 17, item 4).

A real Gym's first participant version sends no receipt beside ``/run`` and has no per-key
receipt route. With ``ack="at_checkpoint"`` every sealed result stays held (completed, not ACKed)
until the checkpoint, so a client that read each rollout's receipt from a ``status`` listing paid
a listing that grows with every held result: quadratic traffic. Now a rollout seals on its
reply's digest and the checkpoint gate reads the receipts once, from its own listing.

Measured against :class:`~rl_gym_actors.testing.real_gym.RealGymStandIn` (no receipt route, no
receipt header) in front of our server, with a rollout actor's body (RolloutWorker, no Ray): the
server is filled to ``held`` un-ACKed results, then a batch of rollouts runs; the stand-in counts
the status bytes it answered during the batch. ``listing bytes`` is one status listing at that
level: what the old code read per rollout, and what the gate reads once per checkpoint round.

    .venv/bin/python benchmarks/receipts_real_gym.py [--quick]
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import common  # noqa: F401  (puts the repository on sys.path)
from common import Result, bench_main, progress

from rl_gym_actors.actors.rollout_actor import RolloutWorker
from rl_gym_actors.config import TryPolicy
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.protocol import CONTROL_PREFIX
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.real_gym import RealGymStandIn

STATUS = CONTROL_PREFIX + "/status"
POLICY = TryPolicy(rollout_s=30.0, receipt_s=10.0, max_tries=2, control_s=10.0)  # at_checkpoint


async def fill(client: GymClient, start: int, stop: int, concurrency: int = 32) -> None:
    """Runs rows start..stop-1 straight on Gym, left completed and un-ACKed (held)."""
    todo = iter(range(start, stop))

    async def worker() -> None:
        for i in todo:
            await client.run(
                {"reward": 0.5},
                rollout_id=f"held-{i}",
                attempt_index=0,
                deadline_ts=time.time() + 60,
            )

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def measure(levels: list[int], batch: int) -> list[dict[str, Any]]:
    rows = []
    with GymServerThread(token="bench-token") as server, RealGymStandIn(server.endpoint) as real:
        # the held results go straight to the server (the stand-in only forwards /run and
        # counts status traffic): filling through it cost a proxy hop per row
        async with GymClient(real.endpoint) as client, GymClient(server.endpoint) as direct:
            worker = RolloutWorker("bench-receipts", [real.endpoint], POLICY, slots=16)
            held = 0
            for level in levels:
                await fill(direct, held, level)
                held = level
                bytes0, calls0 = real.bytes_out[STATUS], real.calls[STATUS]
                t0 = time.perf_counter()
                outs = await asyncio.gather(
                    *(worker.run_rollout({"reward": 0.25}, f"b{level}-{i}") for i in range(batch))
                )
                seconds = time.perf_counter() - t0
                sealed = sum(o.status == "sealed" for o in outs)
                status_bytes = real.bytes_out[STATUS] - bytes0
                status_calls = real.calls[STATUS] - calls0
                held += sealed
                before = real.bytes_out[STATUS]
                listing = await client.status("bench-probe", deadline_ts=time.time() + 60)
                listing_bytes = real.bytes_out[STATUS] - before
                assert listing.completed_unacknowledged == held, (listing, held)
                snap = await worker.snapshot()
                row = {
                    "held": level,
                    "batch": batch,
                    "sealed": sealed,
                    "status_calls": status_calls,
                    "status_bytes_per_rollout": status_bytes / batch,
                    "listing_bytes": listing_bytes,
                    "listing_bytes_per_held": listing_bytes / held,
                    "receipts_deferred": snap.receipts_deferred,
                    "rollouts_per_s": batch / seconds,
                    "load_1min": os.getloadavg()[0],
                }
                rows.append(row)
                progress(
                    f"held {level}: {sealed}/{batch} sealed, status {status_calls} calls, "
                    f"{row['status_bytes_per_rollout']:.0f} B/rollout; one listing "
                    f"{listing_bytes / 1e6:.2f} MB"
                )
            await worker.close()
    return rows


def body(result: Result, args: Any) -> None:
    levels, batch = [100, 1000, 10_000], (50 if args.quick else 200)
    result.params.update(levels=levels, batch=batch, ack=POLICY.ack)
    rows = asyncio.run(measure(levels, batch))
    result.rows = rows
    result.add_table(
        "A batch of rollouts (ack at_checkpoint) against the real-Gym stand-in (no receipt route, "
        "no receipt header) holding `held` un-ACKed results: status traffic during the batch, "
        "and one status listing (the old per-rollout cost; the gate reads it once per round):",
        [
            "held",
            "batch",
            "sealed",
            "status calls",
            "status B/rollout",
            "one listing (B)",
            "listing B per held",
            "rollouts/s",
            "load (1 min)",
        ],
        [
            [
                r["held"],
                r["batch"],
                r["sealed"],
                r["status_calls"],
                r["status_bytes_per_rollout"],
                r["listing_bytes"],
                r["listing_bytes_per_held"],
                r["rollouts_per_s"],
                r["load_1min"],
            ]
            for r in rows
        ],
    )
    lo, hi = rows[0], rows[-1]
    flat = max(hi["status_bytes_per_rollout"], 1.0) / max(lo["status_bytes_per_rollout"], 1.0)
    result.extra["flat_ratio"] = flat
    result.extra["headline"] = (
        f"status bytes per rollout {lo['status_bytes_per_rollout']:.0f} at {lo['held']} held, "
        f"{hi['status_bytes_per_rollout']:.0f} at {hi['held']} held ({flat:.2f}x); reading a "
        f"listing per rollout would cost {hi['listing_bytes'] / 1e6:.2f} MB each at {hi['held']}"
    )


if __name__ == "__main__":
    bench_main("receipts_real_gym", "Status bytes per rollout against a real Gym", body)
