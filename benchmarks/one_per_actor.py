"""One rollout per actor (issue 20): ours against the direct loop and against Ray's own floor.

Concurrency 16, instant agents, one Gym server (subprocess). Three ways to run the same rows,
trials interleaved:

- direct: the direct asyncio loop (``/run``, receipt, ACK per rollout; no Ray);
- Ray no-op: the Ray floor's 16 actors, a method that returns at once, one call per row, 16
  lanes in the driver: Ray's cost of one actor call with no work in it;
- Ray floor: 16 bare async Ray actors, each running the direct loop's rollout for one row per
  call (the same HTTP, one actor call per rollout, no ledger, no reports, no state machine),
  16 lanes in the driver: what any one-actor-per-rollout design pays to Ray;
- ours: an orchestrator of 16 rollout actors x 1 (``rollouts_per_actor=1``), ``run_batch``.

Per way: rollouts/s, the ratio to the direct loop, CPU ms per rollout over the processes that
way uses (the Gym server apart): the direct loop its driver; the Ray floor the driver, its
actors and Ray's own daemons; ours the driver, the rollout actors, the ledger and Ray's daemons
(the other way's idle actors are left out; their idle share of Ray's daemons is not). "Of
which idle": the same processes' CPU with nothing running (Ray's threads in every process,
timers), per second, times the trial's seconds, per rollout: what the processes cost by being
there rather than by the calls.

    .venv/bin/python benchmarks/one_per_actor.py [--quick]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

import common
from common import Result, bench_main, progress, ratio
from direct import direct_batch, direct_rollout, make_clients
from fleet import Fleet

QUICK = dict(rows=400, trials=3, concurrency=16, idle_s=2.0)
FULL = dict(rows=2000, trials=5, concurrency=16, idle_s=5.0)


# the process kinds (common.process_tree) each way's CPU is summed over
KINDS = {
    "direct": ("driver",),
    "Ray no-op": ("driver", "ray_system", "worker:?", "worker:FloorActor"),
    "Ray floor": ("driver", "ray_system", "worker:?", "worker:FloorActor"),
    "ours": ("driver", "ray_system", "worker:?", "worker:RolloutActor", "worker:LedgerActor"),
}


def _cpu_s(way: str, stats: Any) -> float:
    return sum(v["cpu_s"] for k, v in stats.by_kind.items() if k in KINDS[way])


def _rows(prefix: str, n: int) -> list[dict[str, Any]]:
    return [{"_ng_rollout_id": f"{prefix}-{i}", "sleep_s": 0.0, "reward": 0.5} for i in range(n)]


def _floor_actor() -> Any:
    import ray

    @ray.remote(num_cpus=0, max_restarts=0)
    class FloorActor:
        """A bare async actor that plays the direct loop's rollout for one row per call."""

        def __init__(self, endpoint: Any) -> None:
            self._endpoint = endpoint
            self._client: Any = None

        async def rollout(self, row: dict[str, Any], rollout_id: str) -> float:
            if self._client is None:
                [self._client] = make_clients([self._endpoint], 1)
            return await direct_rollout(self._client, row, rollout_id)

        async def pid(self) -> int:
            return os.getpid()

        async def noop(self, row: dict[str, Any], rollout_id: str) -> str:
            """The same call doing nothing: Ray's own cost of one call."""
            return rollout_id

    return FloorActor


def _floor_batch(actors: list[Any], rows: list[dict[str, Any]], *, noop: bool = False) -> float:
    async def go() -> float:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for r in rows:
            queue.put_nowait(r)

        async def lane(actor: Any) -> None:
            while not queue.empty():
                row = queue.get_nowait()
                method = actor.noop if noop else actor.rollout
                await method.remote(row, row["_ng_rollout_id"])

        t0 = time.perf_counter()
        await asyncio.gather(*(lane(a) for a in actors))
        return time.perf_counter() - t0

    return asyncio.run(go())


def _direct(endpoints: Any, rows: list[dict[str, Any]], c: int) -> float:
    async def go() -> float:
        clients = make_clients(endpoints, c)
        try:
            out = await direct_batch(clients, rows, concurrency=c)
        finally:
            for cl in clients:
                await cl.close()
        if out.errors or out.ok != len(rows):
            raise RuntimeError(f"direct loop failed: {out.errors}")
        return out.seconds

    return asyncio.run(go())


def _ours(orch: Any, rows: list[dict[str, Any]]) -> float:
    t0 = time.perf_counter()
    outs = orch.run_batch(rows)
    dt = time.perf_counter() - t0
    bad = [o for o in outs if o.status != "sealed"]
    if bad:
        raise RuntimeError(f"{len(bad)} rollouts not sealed, e.g. {bad[0]!r}")
    return dt


def body(result: Result, args: Any) -> None:
    from rl_gym_actors.config import TryPolicy
    from rl_gym_actors.orchestrator import Orchestrator

    p = QUICK if args.quick else FULL
    result.params.update(p)
    n, c = p["rows"], p["concurrency"]
    ray = common.start_ray(num_cpus=2)
    seq = iter(range(10**9))
    ways = ("direct", "Ray no-op", "Ray floor", "ours")
    times: dict[str, list[float]] = {w: [] for w in ways}
    stats: dict[str, list[Any]] = {w: [] for w in ways}
    with Fleet(1) as fleet:
        eps = fleet.endpoints
        floor = [_floor_actor().remote(eps[0]) for _ in range(c)]
        orch = Orchestrator(
            eps,
            policy=TryPolicy(rollout_s=60.0, receipt_s=10.0),
            pool_size=c,
            rollouts_per_actor=1,
            progress=False,
            orchestrator_id="bench-one",
        )
        try:
            run = {
                "direct": lambda rows: _direct(eps, rows, c),
                "Ray no-op": lambda rows: _floor_batch(floor, rows, noop=True),
                "Ray floor": lambda rows: _floor_batch(floor, rows),
                "ours": lambda rows: _ours(orch, rows),
            }
            for way in ways:  # warm-up: connections, code paths
                run[way](_rows(f"w{next(seq)}", 2 * c))
            orch.checkpoint(f"one-ck{next(seq)}", f"/tmp/rlga-bench-one/{next(seq)}")
            with common.ProcessSampler(exclude=fleet.pids) as idle:
                time.sleep(p["idle_s"])
            for trial in range(p["trials"]):
                for way in ways:
                    with common.ProcessSampler(exclude=fleet.pids) as s:
                        times[way].append(run[way](_rows(f"t{next(seq)}", n)))
                    stats[way].append(s.stats)
                # not timed: ACK the sealed results (ack at the checkpoint, the default)
                orch.checkpoint(f"one-ck{next(seq)}", f"/tmp/rlga-bench-one/{next(seq)}")
                progress(
                    f"trial {trial}: "
                    + ", ".join(f"{w} {n / times[w][-1]:.0f}/s" for w in ways)
                    + f" (load {common.os.getloadavg()[0]:.1f})"
                )
        finally:
            orch.close()
            for a in floor:
                ray.kill(a)
            common.stop_ray()
    report(result, n, c, p["trials"], times, stats, idle=idle.stats)


def report(
    result: Result,
    n: int,
    c: int,
    trials: int,
    times: dict[str, list[float]],
    stats: dict[str, list[Any]],
    *,
    idle: Any = None,
) -> None:
    """The rows, table and headline from each way's trial times and ProcessSampler stats (this
    script's run, or throughput.py's quick run, which measures direct, Ray floor and ours);
    ``idle``: the processes' stats with nothing running (for "of which idle")."""
    ways = [w for w in KINDS if w in times]
    direct_rate = n / statistics.median(times["direct"])
    rows = []
    for way in ways:
        med = statistics.median(times[way])
        st = stats[way][times[way].index(sorted(times[way])[len(times[way]) // 2])]
        kinds = {
            k: round(v["cpu_s"] / n * 1e3, 3) for k, v in st.by_kind.items() if k in KINDS[way]
        }
        cpu_ms = [_cpu_s(way, s) / n * 1e3 for s in stats[way]]
        idle_per_s = _cpu_s(way, idle) / idle.wall_s if idle is not None else None
        rows.append(
            {
                "way": way,
                "rollouts": n,
                "per_s": n / med,
                "ratio": ratio(n / med, direct_rate),
                "cpu_ms_per_rollout": statistics.median(cpu_ms),
                "cpu_ms_trials": [round(x, 3) for x in cpu_ms],
                "idle_cores": None if idle_per_s is None else round(idle_per_s, 3),
                "idle_ms_per_rollout": None if idle_per_s is None else idle_per_s * med / n * 1e3,
                "cpu_ms_by_kind": kinds,
                "seconds_trials": times[way],
            }
        )
    result.rows = rows
    result.add_table(
        f"{n} rollouts at concurrency {c}, instant agents, median of {trials} interleaved "
        f"trials (load average {common.os.getloadavg()[0]:.1f} at the end); CPU per rollout over "
        "the processes each way uses, the Gym server apart (the median trial's, by process kind):",
        [
            "way",
            "rollouts/s",
            "vs direct",
            "CPU ms / rollout",
            "of which idle",
            "CPU ms by process kind",
        ],
        [
            [
                r["way"],
                r["per_s"],
                r["ratio"],
                r["cpu_ms_per_rollout"],
                r["idle_ms_per_rollout"],
                ", ".join(f"{k} {v}" for k, v in sorted(r["cpu_ms_by_kind"].items())),
            ]
            for r in rows
        ],
    )
    by = {r["way"]: r for r in rows}
    ours, fl, nop = by["ours"], by["Ray floor"], by.get("Ray no-op")
    nop_s = f"a Ray no-op call {nop['cpu_ms_per_rollout']:.2f} ms; " if nop else ""
    result.extra["headline"] = (
        f"1 per actor: {ours['per_s']:.0f} rollouts/s = {ours['ratio']:.2f}x direct, "
        f"{ours['cpu_ms_per_rollout']:.2f} ms CPU/rollout; Ray's floor {fl['ratio']:.2f}x, "
        f"{fl['cpu_ms_per_rollout']:.2f} ms; {nop_s}"
        f"direct {by['direct']['cpu_ms_per_rollout']:.2f} ms"
    )


if __name__ == "__main__":
    bench_main("one_per_actor", "One rollout per actor: ours, Ray's floor, the direct loop", body)
