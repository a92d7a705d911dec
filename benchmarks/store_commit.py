"""The durable Gym server's group commit measured apart from the web stack.

The same cycle three ways, at concurrency 1, 16 and 128, in one run:

- **store alone**: the durable writes of one ``/run`` + receipt + ACK cycle straight against
  :class:`~rl_gym_actors.gym.store.SqliteStore` in this process (submit the completed record and
  wait, a read barrier, submit the ACKed record and wait), no HTTP: what the group commit (one
  fsync per transaction of whatever has queued) allows;
- **durable server**: ``gym serve --state-dir`` over HTTP (the gym_server benchmark's load);
- **ceiling**: the aiohttp hello world answering the same three requests with fixed bytes.

Reported: cycles/s, fsyncs (transactions) per cycle for the store, and the ratios. When the store
alone runs far above the durable server, the fsync is not what bounds the server.

    .venv/bin/python benchmarks/store_commit.py [--quick]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from typing import Any

import common  # noqa: F401  (puts the repository on sys.path)
from common import Result, bench_main, progress, ratio
from gym_server import TOKEN, HelloProcess, measure

from rl_gym_actors.testing.gym_process import GymServerProcess

CONCURRENCY = (1, 16, 128)


async def store_cycles(state_dir: str, n: int, concurrency: int, prefix: str) -> dict[str, Any]:
    from rl_gym_actors.gym.agent_checkpoint.core import encode_reply
    from rl_gym_actors.gym.store import Execution, SqliteStore
    from rl_gym_actors.protocol import ExecutionState

    store = SqliteStore(state_dir)
    todo = iter(range(n))
    t0_tx = store.transactions

    async def worker() -> None:
        for i in todo:
            rid = f"{prefix}-{i}"
            raw, receipt = encode_reply((rid, 0), 1, {"id": f"r-{rid}", "reward": 1.0})
            done = Execution(rid, 0, ExecutionState.COMPLETED, 1, raw, receipt)
            await store.wait(store.submit([done]))  # the /run's completion
            await store.wait(store.submit([]))  # the receipt's read barrier
            await store.wait(store.submit([Execution(rid, 0, ExecutionState.ACKNOWLEDGED, 1)]))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - t0
    tx = store.transactions - t0_tx
    store.close()
    return {"seconds": seconds, "rate": n / seconds, "fsyncs_per_cycle": tx / n}


def body(result: Result, args: Any) -> None:
    # quick (`make bench`): a few hundred cycles per trial, enough for the rates at 16 and 128
    n = {1: 75, 16: 300, 128: 640} if args.quick else {1: 600, 16: 3000, 128: 6000}
    trials = 2 if args.quick else 3
    result.params.update(cycles=n, trials=trials)
    tmp = tempfile.mkdtemp(prefix="rlga-store-commit-")
    hello = HelloProcess()
    durable = GymServerProcess(
        token=TOKEN, allow_faults=False, state_dir=os.path.join(tmp, "server")
    ).start()
    rows = []
    try:
        for c in CONCURRENCY:
            got: dict[str, list[dict[str, Any]]] = {"store": [], "durable": [], "ceiling": []}
            load = os.getloadavg()[0]
            for t in range(trials):
                got["store"].append(
                    asyncio.run(store_cycles(os.path.join(tmp, f"s{c}-{t}"), n[c], c, f"s{c}-{t}"))
                )
                got["durable"].append(measure(durable, "state-dir", c, n[c], t))
                got["ceiling"].append(measure(hello, "ceiling", c, n[c], t))
            best = {k: max(v, key=lambda r: r["rate"]) for k, v in got.items()}
            row = {
                "concurrency": c,
                "store_per_s": best["store"]["rate"],
                "store_fsyncs_per_cycle": best["store"]["fsyncs_per_cycle"],
                "durable_per_s": best["durable"]["rate"],
                "durable_server_cpu_ms_per_cycle": best["durable"]["server_cpu_s"] / n[c] * 1e3,
                "ceiling_per_s": best["ceiling"]["rate"],
                "durable_vs_ceiling": ratio(best["durable"]["rate"], best["ceiling"]["rate"]),
                "store_vs_ceiling": ratio(best["store"]["rate"], best["ceiling"]["rate"]),
                "load_1min": load,
            }
            rows.append(row)
            progress(
                f"c={c}: store alone {row['store_per_s']:.0f}/s "
                f"({row['store_fsyncs_per_cycle']:.2f} fsyncs/cycle), durable server "
                f"{row['durable_per_s']:.0f}/s, ceiling {row['ceiling_per_s']:.0f}/s; "
                f"load {load:.1f}"
            )
    finally:
        hello.stop()
        durable.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    result.rows = rows
    result.add_table(
        "Cycles/s (best of the trials) of /run + receipt + ACK: the store's durable writes alone "
        "(no HTTP), the durable server, the aiohttp hello world:",
        [
            "concurrency",
            "store alone /s",
            "fsyncs per cycle (store)",
            "durable server /s",
            "server CPU ms/cycle",
            "ceiling /s",
            "durable / ceiling",
            "store alone / ceiling",
            "load (1 min)",
        ],
        [
            [
                r["concurrency"],
                r["store_per_s"],
                r["store_fsyncs_per_cycle"],
                r["durable_per_s"],
                r["durable_server_cpu_ms_per_cycle"],
                r["ceiling_per_s"],
                r["durable_vs_ceiling"],
                r["store_vs_ceiling"],
                r["load_1min"],
            ]
            for r in rows
        ],
    )
    c16 = next(r for r in rows if r["concurrency"] == 16)
    result.extra["headline"] = (
        f"at concurrency 16 the store alone commits {c16['store_per_s']:.0f} cycles/s "
        f"({c16['store_fsyncs_per_cycle']:.2f} fsyncs per cycle), the durable server serves "
        f"{c16['durable_per_s']:.0f}/s ({c16['durable_vs_ceiling']:.2f}x the hello world's "
        f"{c16['ceiling_per_s']:.0f}/s)"
    )


if __name__ == "__main__":
    bench_main("store_commit", "Group commit apart from the web stack", body)
