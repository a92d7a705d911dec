"""The checkpoint gate alone, without Ray: the 100,000-finished and 10,000-running checkpoints
of ``scale.py`` over the same 16 durable Gym servers, driven by the ledger's own
:class:`~rl_gym_actors.actors.checkpoint_gate.CheckpointGate` in this process (an empty book, no
rollout owner) instead of through the orchestrator and the ledger actor, next to the
hand-written minimum with the client (``scale.direct_checkpoint``), in the same run.

What is left out is Ray (the ledger actor's call and its owner flush); what stays is every
byte the gate and the servers handle. It runs where a Ray cluster will not start (a machine
loaded past ~50), and it is what an A/B of the gate's or the server's code needs:

    PYTHONPATH=<tree> .venv/bin/python benchmarks/gate_alone.py --quick [--trials 2]

Results: results/gate_alone.json and .md.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import common
from common import Result, bench_main, progress, ratio
from fleet import leave_running
from scale import SERVERS, DurableFleet, _clean, direct_checkpoint

DEADLINE_S = 300.0


class _NoOwners:
    """No rollout actor: every listed attempt is an orphan (or forgotten, when running)."""

    def live(self) -> frozenset[str]:
        return frozenset()

    async def adopt(self, owner: str, rollout_id: str, attempt_index: int, deadline_ts: float):
        raise AssertionError("no owner to adopt")

    async def flush(self, deadline_ts: float) -> int:
        return 0


async def gate_checkpoint(fleet: DurableFleet, cid: str, cdir: str) -> Any:
    from rl_gym_actors.actors.checkpoint_gate import CheckpointGate
    from rl_gym_actors.config import LedgerConfig
    from rl_gym_actors.core.attempt_book import AttemptBook
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient

    eps = fleet.endpoints
    clients = [GymClient(ep, control_limit=32) for ep in eps]
    try:
        book = AttemptBook([ep.url for ep in eps])
        gate = CheckpointGate(book, eps, clients, _NoOwners(), LedgerConfig())
        return await gate.run(cid, cdir, time.time() + DEADLINE_S)
    finally:
        for c in clients:
            await c.close()


def body(result: Result, args: Any) -> None:
    finished = 100_000 if not args.small else 10_000
    running = 10_000 if not args.small else 1_000
    tmp = Path(tempfile.mkdtemp(prefix="rlga-gate-alone-"))
    fleet = DurableFleet(SERVERS, tmp / "gym").start()
    rows: list[dict[str, Any]] = []
    counter = 0
    try:
        for trial in range(args.trials):
            for kind, n in (("finished", finished), ("running", running)):
                times, left, load = {}, {}, os.getloadavg()[0]
                for policy in ("gate", "direct"):
                    counter += 1
                    prefix = f"ga-{kind[0]}{counter}"
                    if kind == "finished":
                        fleet.fresh(prefix, n)
                        left[policy] = n
                    else:
                        eps = fleet.endpoints
                        left[policy] = asyncio.run(leave_running(eps, n, prefix, concurrency=1024))
                    cid = f"ck-{counter}"
                    t0 = time.perf_counter()
                    if policy == "gate":
                        asyncio.run(gate_checkpoint(fleet, cid, str(tmp / cid)))
                    else:
                        asyncio.run(direct_checkpoint(fleet.endpoints, cid, str(tmp / cid)))
                    times[policy] = time.perf_counter() - t0
                    _clean(fleet, f"{policy} {kind} n={n}")
                row = {
                    "trial": trial,
                    "kind": kind,
                    "attempts": n,
                    "left": left,
                    "gate_s": times["gate"],
                    "direct_s": times["direct"],
                    "ratio": ratio(times["gate"], times["direct"]),
                    "load_1min": load,
                }
                rows.append(row)
                progress(
                    f"{kind} {n:,}: gate {times['gate']:.2f}s, direct {times['direct']:.2f}s "
                    f"(left {left}); load {load:.1f}"
                )
    finally:
        fleet.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    result.rows = rows
    result.add_table(
        f"Checkpoint over {SERVERS} durable servers, from the gate's start to committed "
        "everywhere, without Ray (the gate in this process, no owner); baseline: the "
        "hand-written minimum with the client, same run:",
        ["trial", "left behind", "attempts", "gate (s)", "direct (s)", "gate / direct", "load"],
        [
            [
                r["trial"],
                r["kind"],
                r["attempts"],
                r["gate_s"],
                r["direct_s"],
                r["ratio"],
                r["load_1min"],
            ]
            for r in rows
        ],
    )


def _args(parser: Any) -> None:
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--small", action="store_true", help="10,000 finished, 1,000 running")


if __name__ == "__main__":
    assert common  # (puts the repository on sys.path)
    bench_main("gate_alone", "The checkpoint gate alone, without Ray", body, extra_args=_args)
