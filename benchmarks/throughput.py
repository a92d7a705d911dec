"""Throughput and added latency: N rollouts through the orchestrator vs a direct asyncio loop.

The same Gym server (a subprocess, simulated agent at 0, 10 and 100 ms) serves both. Each
configuration runs at one concurrency C: the orchestrator with C actors of one rollout each, and
with few actors of many rollouts each (``rollouts_per_actor``); the direct loop (``/run``, receipt,
ACK per rollout, no Ray) with C in flight. Trials alternate direct and orchestrator batches.

- rollouts/s: one ``run_batch`` of N rows (median of the trials), and the ratio to the direct loop;
- added latency per rollout: C lanes each submitting one-row batches back to back
  (``arun_batch([row])``), against the direct loop's per-rollout latency at the same C;
- peak memory of the driver plus every Ray process (RSS summed via psutil; the Gym server is
  measured apart), the rollout actors' PSS per rollout in flight, CPU ms per rollout;
- the warm pool's start-up time.

    .venv/bin/python benchmarks/throughput.py [--quick]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

import common
from common import Result, bench_main, percentile, progress, ratio
from direct import direct_batch, make_clients
from fleet import Fleet

# quick (`make bench`): instant and 100 ms agents, the hot-path table's figures; full mode also
# runs 10 ms agents (the last quick run that had them: 0.54x / 0.90x the direct loop with one /
# eight per actor, where instant agents read 0.54x / 1.01x)
QUICK = dict(
    sizes=[200],
    agent_ms=[0, 100],
    concurrency=16,
    many=(2, 8),
    trials=3,
    # 100 ms agents: the batch waits on the agents (both ways within a few % of the ideal), two
    # trials tell that apart as well as three
    wait_trials=2,
    big_trials=3,
    big_from=10**9,
    lane_rollouts=8,
    # one_per_actor.py's three ways, measured here: its 1 per actor pool at instant agents is
    # this run's, so the Ray floor joins those trials and results/one_per_actor.json is written
    # from them (one_per_actor.py alone: 400 rows; its full mode: 2,000, 5 trials)
    floor=True,
)
FULL = dict(
    sizes=[1000, 10_000],
    agent_ms=[0, 10, 100],
    concurrency=64,
    many=(8, 8),
    trials=3,
    big_trials=1,
    big_from=10_000,
    lane_rollouts=20,
)


def _rows(prefix: str, n: int, agent_ms: int) -> list[dict[str, Any]]:
    return [
        {"_ng_rollout_id": f"{prefix}-{i}", "sleep_s": agent_ms / 1000.0, "reward": 0.5}
        for i in range(n)
    ]


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def next(self, tag: str) -> str:
        self.n += 1
        return f"{tag}{self.n}"


def _orch_batch(orch: Any, rows: list[dict[str, Any]]) -> float:
    t0 = time.perf_counter()
    outcomes = orch.run_batch(rows)
    dt = time.perf_counter() - t0
    bad = [o for o in outcomes if o.status != "sealed"]
    if bad:
        raise RuntimeError(f"{len(bad)} rollouts not sealed, e.g. {bad[0]!r}")
    return dt


def _settle(orch: Any, ids: Counter) -> None:
    """A checkpoint between trials, not timed: with ``ack="at_checkpoint"`` (the default) it
    ACKs the batch's sealed results in acknowledge-completed batches (the checkpoint
    benchmark's 'sealed' kind measures that); with ACK-on-seal it finds nothing to do."""
    report = orch.checkpoint(
        ids.next("tp-ck"), f"/tmp/rlga-bench-tp/{ids.next('d')}", deadline_s=120.0
    )
    if not all(e.commit.manifest_digest for e in report.endpoints):
        raise RuntimeError("a throughput checkpoint did not commit")


def _direct(endpoints: Any, rows: list[dict[str, Any]], concurrency: int) -> Any:
    async def go() -> Any:
        clients = make_clients(endpoints, concurrency)
        try:
            return await direct_batch(clients, rows, concurrency=concurrency)
        finally:
            for c in clients:
                await c.close()

    out = asyncio.run(go())
    if out.errors or out.ok != len(rows):
        raise RuntimeError(f"direct loop failed: {out.errors}")
    return out


def _orch_lanes(orch: Any, prefix: str, lanes: int, per_lane: int, agent_ms: int) -> list[float]:
    """Per-rollout latency: ``lanes`` concurrent lanes of one-row batches back to back."""

    async def lane(k: int) -> list[float]:
        out = []
        for i in range(per_lane):
            row = {"_ng_rollout_id": f"{prefix}-{k}-{i}", "sleep_s": agent_ms / 1000.0}
            t0 = time.perf_counter()
            [o] = await orch.arun_batch([row])
            out.append(time.perf_counter() - t0)
            if o.status != "sealed":
                raise RuntimeError(f"lane rollout not sealed: {o!r}")
        return out

    async def go() -> list[float]:
        parts = await asyncio.gather(*(lane(k) for k in range(lanes)))
        return [x for p in parts for x in p]

    return asyncio.run(go())


class Floor:
    """one_per_actor.py's Ray floor inside this run: ``c`` bare async actors, each playing the
    direct loop's rollout for one row per call; their trials, and the one_per_actor result
    built from them with this run's direct and ours trials of the same rows."""

    def __init__(self, endpoint: Any, c: int) -> None:
        import ray
        from one_per_actor import _floor_actor

        self.actors = [_floor_actor().remote(endpoint) for _ in range(c)]
        self.pids: list[int] = ray.get([a.pid.remote() for a in self.actors])
        self.result = Result(
            name="one_per_actor",
            title="One rollout per actor: ours, Ray's floor, the direct loop",
            mode="quick",
        )
        self.t0 = time.perf_counter()
        self.seconds: list[float] = []
        self.stats: list[Any] = []

    def batch(self, rows: list[dict[str, Any]]) -> float:
        from one_per_actor import _floor_batch

        return _floor_batch(self.actors, rows)

    def trial(self, rows: list[dict[str, Any]], exclude: list[int]) -> None:
        with common.ProcessSampler(exclude=exclude) as s:
            self.seconds.append(self.batch(rows))
        self.stats.append(s.stats)

    def write(
        self,
        n: int,
        c: int,
        trials: int,
        d_s: list[float],
        d_stats: list[Any],
        o_s: list[float],
        o_stats: list[Any],
    ) -> None:
        import one_per_actor

        res = self.result
        res.params.update(rows=n, trials=trials, concurrency=c, measured_in="throughput.py")
        one_per_actor.report(
            res,
            n,
            c,
            trials,
            {"direct": d_s, "Ray floor": self.seconds, "ours": o_s},
            {"direct": d_stats, "Ray floor": self.stats, "ours": o_stats},
        )
        res.notes.append(
            "Measured inside `throughput.py --quick` (`make bench`): its 1 per actor pool at "
            "instant agents, trials interleaved direct, Ray floor, ours, each way's CPU read as "
            "one_per_actor.py reads it. Alone: `benchmarks/one_per_actor.py --quick` (400 "
            "rows), full mode 2,000 rows and 5 trials."
        )
        res.elapsed_s = round(time.perf_counter() - self.t0, 1)
        res.load_end = list(os.getloadavg())
        res.write()
        progress(f"one_per_actor: {res.extra['headline']}")

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []


def _measure_config(
    result: Result, p: dict, fleet: Fleet, label: str, pool_size: int, per_actor: int, ids: Counter
) -> list[dict[str, Any]]:
    from rl_gym_actors.config import TryPolicy
    from rl_gym_actors.orchestrator import Orchestrator

    c = pool_size * per_actor
    eps = fleet.endpoints
    exclude = fleet.pids
    gym_pid = fleet.pids[0]
    t0 = time.perf_counter()
    orch = Orchestrator(
        eps,
        policy=TryPolicy(rollout_s=60.0, receipt_s=10.0),
        pool_size=pool_size,
        rollouts_per_actor=per_actor,
        progress=False,
        orchestrator_id=f"bench-tp-{pool_size}x{per_actor}",
    )
    start_s = time.perf_counter() - t0
    pool_start_s = orch.snapshot().pool.startup_s
    mem = common.worker_memory("worker:RolloutActor", exclude=exclude)
    progress(f"{label}: pool of {pool_size} x {per_actor} up in {start_s:.1f}s")
    rows_out = []
    floor: Floor | None = None
    try:
        for agent_ms in p["agent_ms"]:
            if p.get("floor") and per_actor == 1 and agent_ms == 0 and len(p["sizes"]) == 1:
                floor = Floor(eps[0], c)
                exclude = fleet.pids + floor.pids  # idle floor actors: not in ours' figures
            # warm-up of both paths (connections, code paths), not timed
            _direct(eps, _rows(ids.next("wd"), c * 2, agent_ms), c)
            if floor is not None:
                floor.batch(_rows(ids.next("wf"), c * 2, agent_ms))
            _orch_batch(orch, _rows(ids.next("wo"), c * 2, agent_ms))
            for n in p["sizes"]:
                trials = p["big_trials"] if n >= p["big_from"] else p["trials"]
                if agent_ms and "wait_trials" in p:
                    trials = p["wait_trials"]
                d_s, o_s, d_stats, o_stats, d_gym, o_gym = [], [], [], [], [], []
                for _ in range(trials):
                    g0 = common.process_cpu_s(gym_pid) or 0.0
                    with common.ProcessSampler(exclude=exclude) as s:
                        d = _direct(eps, _rows(ids.next("d"), n, agent_ms), c)
                    d_s.append(d.seconds)
                    d_stats.append(s.stats)
                    g1 = common.process_cpu_s(gym_pid) or 0.0
                    if floor is not None:  # between direct and ours, as one_per_actor.py runs
                        floor.trial(_rows(ids.next("f"), n, agent_ms), fleet.pids)
                    g1f = common.process_cpu_s(gym_pid) or 0.0
                    with common.ProcessSampler(exclude=exclude) as s:
                        o_s.append(_orch_batch(orch, _rows(ids.next("o"), n, agent_ms)))
                    o_stats.append(s.stats)
                    g2 = common.process_cpu_s(gym_pid) or 0.0
                    d_gym.append(g1 - g0)
                    o_gym.append(g2 - g1f)
                    _settle(orch, ids)
                if floor is not None:
                    floor.write(n, c, trials, d_s, d_stats, o_s, o_stats)
                # latency lanes (one-row batches back to back) vs the direct loop's latencies
                lat_o = _orch_lanes(orch, ids.next("l"), c, p["lane_rollouts"], agent_ms)
                lat_d = _direct(
                    eps, _rows(ids.next("ld"), c * p["lane_rollouts"], agent_ms), c
                ).latencies
                _settle(orch, ids)
                d_med, o_med = statistics.median(d_s), statistics.median(o_s)
                o_st = o_stats[o_s.index(sorted(o_s)[len(o_s) // 2])]
                d_st = d_stats[d_s.index(sorted(d_s)[len(d_s) // 2])]
                ideal = n * agent_ms / 1000.0 / c
                row = {
                    "config": label,
                    "actors": pool_size,
                    "rollouts_per_actor": per_actor,
                    "concurrency": c,
                    "agent_ms": agent_ms,
                    "rollouts": n,
                    "trials": trials,
                    "direct_per_s": n / d_med,
                    "ours_per_s": n / o_med,
                    "ratio": ratio(n / o_med, n / d_med),
                    "ideal_per_s": (n / ideal) if ideal else None,
                    "direct_s_trials": d_s,
                    "ours_s_trials": o_s,
                    "lat_direct_p50_ms": percentile(lat_d, 50) * 1e3,
                    "lat_direct_p99_ms": percentile(lat_d, 99) * 1e3,
                    "lat_ours_p50_ms": percentile(lat_o, 50) * 1e3,
                    "lat_ours_p99_ms": percentile(lat_o, 99) * 1e3,
                    "peak_rss_mb": o_st.peak_rss_total_mb,
                    "peak_rss_driver_mb": o_st.peak_rss_driver_mb,
                    "peak_rss_actors_mb": o_st.kind("worker:RolloutActor")["peak_rss_mb"],
                    "direct_peak_rss_mb": d_st.peak_rss_driver_mb,
                    "cpu_ms_per_rollout": o_st.cpu_s_total / n * 1e3,
                    "direct_cpu_ms_per_rollout": d_st.cpu_s_driver / n * 1e3,
                    "gym_cpu_ms_per_rollout": statistics.median(o_gym) / n * 1e3,
                    "direct_gym_cpu_ms_per_rollout": statistics.median(d_gym) / n * 1e3,
                    "cores_busy": o_st.cpu_s_total / o_med,
                    "actor_pss_mb_per_slot": (mem["pss_mb"] / c) if mem["workers"] else None,
                    "pool_start_s": pool_start_s,
                    "orchestrator_start_s": start_s,
                    "ours_stats": o_st.as_dict(),
                    "direct_stats": d_st.as_dict(),
                }
                row["added_p50_ms"] = row["lat_ours_p50_ms"] - row["lat_direct_p50_ms"]
                row["added_p99_ms"] = row["lat_ours_p99_ms"] - row["lat_direct_p99_ms"]
                rows_out.append(row)
                progress(
                    f"{label} agent={agent_ms}ms n={n}: ours {row['ours_per_s']:.0f}/s "
                    f"direct {row['direct_per_s']:.0f}/s (x{row['ratio']:.2f}), added p50 "
                    f"{row['added_p50_ms']:.1f} ms"
                )
            if floor is not None:  # its block done: the floor actors go
                floor.close()
                floor = None
    finally:
        if floor is not None:
            floor.close()
        orch.close()
    result.extra.setdefault("pools", {})[label] = {
        "actors": pool_size,
        "rollouts_per_actor": per_actor,
        "orchestrator_start_s": start_s,
        "pool_start_s": pool_start_s,
        "actor_memory": mem,
    }
    return rows_out


def body(result: Result, args: Any) -> None:
    p = QUICK if args.quick else FULL
    result.params.update(p)
    common.start_ray(num_cpus=2)
    c = p["concurrency"]
    many_actors, many_per = p["many"]
    ids = Counter()
    rows: list[dict[str, Any]] = []
    with Fleet(1) as fleet:
        try:
            rows += _measure_config(result, p, fleet, "1 per actor", c, 1, ids)
            rows += _measure_config(
                result, p, fleet, f"{many_per} per actor", many_actors, many_per, ids
            )
        finally:
            common.stop_ray()
    result.rows = rows
    result.add_table(
        f"Rollouts per second at concurrency {c} (median of the trials; ideal = C / agent time). "
        "Latency: per rollout, p50 / p99, ours in one-row batches vs the direct loop:",
        [
            "config",
            "agent ms",
            "N",
            "direct /s",
            "ours /s",
            "ours / direct",
            "ideal /s",
            "added p50 ms",
            "added p99 ms",
            "ours p50 ms",
            "direct p50 ms",
        ],
        [
            [
                r["config"],
                r["agent_ms"],
                r["rollouts"],
                r["direct_per_s"],
                r["ours_per_s"],
                r["ratio"],
                r["ideal_per_s"],
                r["added_p50_ms"],
                r["added_p99_ms"],
                r["lat_ours_p50_ms"],
                r["lat_direct_p50_ms"],
            ]
            for r in rows
        ],
    )
    result.add_table(
        "Memory and CPU (orchestrator runs; the Gym server is measured apart). Peak RSS sums the "
        "driver, the rollout actors, the ledger and Ray's own processes; actor PSS per slot is the "
        "rollout actors' proportional memory divided by the rollouts they can hold:",
        [
            "config",
            "agent ms",
            "N",
            "peak RSS MB (all)",
            "actors RSS MB",
            "actor PSS MB / slot",
            "CPU ms / rollout (ours)",
            "CPU ms / rollout (direct)",
            "Gym CPU ms / rollout",
            "cores busy",
        ],
        [
            [
                r["config"],
                r["agent_ms"],
                r["rollouts"],
                r["peak_rss_mb"],
                r["peak_rss_actors_mb"],
                r["actor_pss_mb_per_slot"],
                r["cpu_ms_per_rollout"],
                r["direct_cpu_ms_per_rollout"],
                r["gym_cpu_ms_per_rollout"],
                r["cores_busy"],
            ]
            for r in rows
        ],
    )
    pools = result.extra["pools"]
    result.add_table(
        "Warm pool start-up (created once per orchestrator, then kept):",
        [
            "config",
            "actors",
            "pool start-up s",
            "orchestrator start s",
            "PSS MB per actor",
            "RSS MB per actor",
        ],
        [
            [
                k,
                v["actors"],
                v["pool_start_s"],
                v["orchestrator_start_s"],
                v["actor_memory"]["pss_per_worker_mb"],
                v["actor_memory"]["rss_per_worker_mb"],
            ]
            for k, v in pools.items()
        ],
    )
    if args.quick:
        result.notes.append(
            "Quick mode runs instant and 100 ms agents; full mode adds 10 ms agents "
            "(`throughput_full.md`)."
        )
    zero = [r for r in rows if r["agent_ms"] == 0]
    slow = [r for r in rows if r["agent_ms"] == max(p["agent_ms"])]
    best0 = max(zero, key=lambda r: r["ours_per_s"])
    bests = max(slow, key=lambda r: r["ours_per_s"])
    result.extra["headline"] = (
        f"agent 0 ms: {best0['ours_per_s']:.0f} rollouts/s ({best0['config']}) = "
        f"{best0['ratio']:.2f}x the direct loop's {best0['direct_per_s']:.0f}/s; agent "
        f"{bests['agent_ms']} ms: {bests['ours_per_s']:.0f}/s = {bests['ratio']:.2f}x direct; "
        f"added latency p50 {best0['added_p50_ms']:.1f} ms at 0 ms agents"
    )


if __name__ == "__main__":
    bench_main("throughput", "Throughput: the orchestrator vs a direct asyncio loop", body)
