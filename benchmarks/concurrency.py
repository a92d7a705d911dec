"""Concurrency: 16, 64, 512 and 4,096 rollouts in flight at once with 1 s agents.

One batch of C rows, every agent sleeping 1 s, so the ideal batch time is C x 1 s / C = 1 s.
Layouts: one rollout per actor (C actors), and many per actor (few actors, ``rollouts_per_actor``
= C / actors). The direct asyncio loop (no Ray) runs the same batch at the same concurrency in
the same run. Reported: time per batch against the ideal and against the direct loop, peak
memory (driver + every Ray process, RSS via psutil), the rollout actors' PSS, CPU seconds.

One rollout per actor stops early on this machine: an actor is a process of about 47-60 MB
(PSS; ~100 MB RSS) that takes about a second of CPU to start, so 512 of them would need ~30 GB
and minutes of start-up on 2 cores. The script says which layouts it ran and which it skipped.

    .venv/bin/python benchmarks/concurrency.py [--quick]
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import common
from common import Result, bench_main, progress, ratio
from direct import direct_batch, make_clients
from fleet import Fleet

AGENT_S = 1.0
# (in flight, actors, rollouts per actor)
# the 4,096 layout is the hot path's scale figure (issue 10): in quick mode too, one trial.
# Quick mode leaves 16 x 1 and 2 x 8 to throughput.py, whose quick run starts those very pools
# (its memory and pool start-up tables); with 1 s agents both read the ideal batch time here
QUICK = dict(
    layouts=[(64, 4, 16), (4096, 16, 256)],
    trials=2,  # 1 s agents: both ways read the ideal batch time (three until session 6)
    big_trials=1,
    skipped=[(16, 16, 1), (16, 2, 8), (64, 64, 1), (512, 512, 1), (4096, 4096, 1), (512, 8, 64)],
    in_throughput=[(16, 16, 1), (16, 2, 8)],
)
FULL = dict(
    layouts=[(16, 16, 1), (64, 64, 1), (16, 2, 8), (64, 4, 16), (512, 8, 64), (4096, 16, 256)],
    trials=3,
    big_trials=3,
    skipped=[(512, 512, 1), (4096, 4096, 1)],
)
BIG = 4096
MEMORY_HEADROOM_MB = 2048


def _rows(prefix: str, n: int) -> list[dict[str, Any]]:
    return [{"_ng_rollout_id": f"{prefix}-{i}", "sleep_s": AGENT_S} for i in range(n)]


def _direct(endpoints: Any, rows: list[dict[str, Any]], c: int) -> float:
    async def go() -> Any:
        clients = make_clients(endpoints, c)
        try:
            return await direct_batch(clients, rows, concurrency=c)
        finally:
            for cl in clients:
                await cl.close()

    out = asyncio.run(go())
    if out.errors:
        raise RuntimeError(f"direct loop failed: {out.errors}")
    return out.seconds


def _fits(actors: int, per_actor_pss_mb: float) -> tuple[bool, str]:
    total_mb = (common.machine_info()["memory_gb"] or 0) * 1024
    need = actors * per_actor_pss_mb + MEMORY_HEADROOM_MB
    if need > total_mb:
        return False, (
            f"needs ~{need / 1024:.0f} GB for {actors} actor processes at "
            f"~{per_actor_pss_mb:.0f} MB PSS each; the machine has "
            f"{total_mb / 1024:.0f} GB"
        )
    return True, ""


def body(result: Result, args: Any) -> None:
    from rl_gym_actors.config import TryPolicy
    from rl_gym_actors.orchestrator import Orchestrator

    p = QUICK if args.quick else FULL
    result.params.update(p)
    common.start_ray(num_cpus=2)
    rows_out: list[dict[str, Any]] = []
    per_actor_pss = 58.0  # refined by the first pool measured
    n = 0
    with Fleet(1) as fleet:
        eps, exclude, gym_pid = fleet.endpoints, fleet.pids, fleet.pids[0]
        try:
            for c, actors, per in p["layouts"]:
                ok, why = _fits(actors, per_actor_pss)
                if not ok:
                    result.notes.append(f"skipped {c} in flight as {actors} x {per}: {why}")
                    continue
                t0 = time.perf_counter()
                orch = Orchestrator(
                    eps,
                    policy=TryPolicy(rollout_s=120.0, receipt_s=30.0),
                    pool_size=actors,
                    rollouts_per_actor=per,
                    progress=False,
                    orchestrator_id=f"bench-cc-{actors}x{per}",
                )
                start_s = time.perf_counter() - t0
                mem = common.worker_memory("worker:RolloutActor", exclude=exclude)
                if mem["pss_per_worker_mb"]:
                    per_actor_pss = mem["pss_per_worker_mb"]
                progress(f"{actors} x {per}: pool up in {start_s:.1f}s")
                try:
                    n += 1
                    orch.run_batch(_rows(f"w{n}", c))  # warm-up
                    if c < BIG or not args.quick:
                        # quick: none at 4,096 (18 s): the direct loop opens fresh connections
                        # for every batch, its code ran at the smaller layouts, and ours' warm-up
                        # has just run 4,096 at once through the same server
                        _direct(eps, _rows(f"wd{n}", c), c)
                    ours, direct, stats, gym_cpu = [], [], [], []
                    for _ in range(p["big_trials"] if c >= BIG else p["trials"]):
                        n += 1
                        direct.append(_direct(eps, _rows(f"d{n}", c), c))
                        g0 = common.process_cpu_s(gym_pid) or 0.0
                        with common.ProcessSampler(exclude=exclude, interval_s=0.5) as s:
                            t1 = time.perf_counter()
                            outs = orch.run_batch(_rows(f"o{n}", c))
                            ours.append(time.perf_counter() - t1)
                        gym_cpu.append((common.process_cpu_s(gym_pid) or 0.0) - g0)
                        stats.append(s.stats)
                        bad = [o for o in outs if o.status != "sealed"]
                        if bad:
                            raise RuntimeError(f"{len(bad)} rollouts not sealed: {bad[0]!r}")
                    after = common.worker_memory("worker:RolloutActor", exclude=exclude)
                finally:
                    orch.close()
                med = sorted(ours)[len(ours) // 2]
                st = stats[ours.index(med)]
                dmed = sorted(direct)[len(direct) // 2]
                ideal = c * AGENT_S / c
                row = {
                    "in_flight": c,
                    "actors": actors,
                    "rollouts_per_actor": per,
                    "layout": "1 per actor" if per == 1 else f"{per} per actor",
                    "batch_s": med,
                    "batch_s_trials": ours,
                    "ideal_s": ideal,
                    "vs_ideal": med / ideal,
                    "direct_s": dmed,
                    "direct_s_trials": direct,
                    "vs_direct": ratio(med, dmed),
                    "pool_start_s": start_s,
                    "peak_rss_mb": st.peak_rss_total_mb,
                    "actors_rss_mb": st.kind("worker:RolloutActor")["peak_rss_mb"],
                    "actors_pss_mb": after["pss_mb"],
                    "pss_mb_per_rollout": after["pss_mb"] / c,
                    "cpu_s": st.cpu_s_total,
                    "cpu_ms_per_rollout": st.cpu_s_total / c * 1e3,
                    "gym_cpu_s": sorted(gym_cpu)[len(gym_cpu) // 2],
                    "stats": st.as_dict(),
                }
                rows_out.append(row)
                progress(
                    f"{c} in flight ({actors} x {per}): {med:.2f}s per batch "
                    f"(ideal {ideal:.2f}s, direct {dmed:.2f}s)"
                )
        finally:
            common.stop_ray()
    for c, actors, per in p["skipped"]:
        ok, why = _fits(actors, per_actor_pss)
        reason = why if not ok else "not run in this mode (time)"
        if (c, actors, per) in p.get("in_throughput", ()):
            reason = (
                "not run in quick mode: throughput.py's quick run starts the same pool (its "
                "memory and pool start-up tables); full mode runs it here"
            )
        if actors >= 256 and per == 1:
            reason = (
                f"{why or 'memory'}; and starting {actors} worker processes takes "
                f"~{actors * 1.1 / 60:.0f} min of CPU on this machine, past the pool's "
                f"120 s start timeout"
            )
        result.notes.append(f"not run: {c} in flight as {actors} x {per}: {reason}")
    result.rows = rows_out
    result.add_table(
        f"One batch of C rollouts with {AGENT_S:.0f} s agents (median of {p['trials']} trials, "
        f"{p['big_trials']} at {BIG:,}; ideal = batch x agent time / concurrency):",
        [
            "in flight",
            "layout",
            "actors",
            "batch s",
            "ideal s",
            "x ideal",
            "direct s",
            "ours / direct",
            "pool start s",
            "peak RSS MB",
            "actors PSS MB",
            "PSS MB / rollout",
            "CPU s / batch",
            "CPU ms / rollout",
            "Gym CPU s",
        ],
        [
            [
                r["in_flight"],
                r["layout"],
                r["actors"],
                r["batch_s"],
                r["ideal_s"],
                r["vs_ideal"],
                r["direct_s"],
                r["vs_direct"],
                r["pool_start_s"],
                r["peak_rss_mb"],
                r["actors_pss_mb"],
                r["pss_mb_per_rollout"],
                r["cpu_s"],
                r["cpu_ms_per_rollout"],
                r["gym_cpu_s"],
            ]
            for r in rows_out
        ],
    )
    if rows_out:
        big = max(rows_out, key=lambda r: r["in_flight"])
        result.extra["headline"] = (
            f"{big['in_flight']} in flight ({big['layout']}): {big['batch_s']:.2f} s per batch "
            f"= {big['vs_ideal']:.1f}x the ideal 1 s (direct loop {big['direct_s']:.2f} s); "
            f"{big['pss_mb_per_rollout']:.1f} MB PSS per rollout in flight"
        )
    if args.quick:
        result.notes.append(
            f"Quick mode warms the direct loop up at the smaller layouts only, not at {BIG:,}: "
            "it opens fresh connections for every batch, and ours' warm-up has just run "
            f"{BIG:,} at once through the same server."
        )
    result.notes.append(
        "Time above the ideal is CPU: every rollout costs CPU in the driver, its rollout actor, "
        "the ledger and the Gym server (see CPU ms / rollout), and this machine has 2 cores; the "
        "direct loop pays only the HTTP part."
    )


if __name__ == "__main__":
    bench_main("concurrency", "Concurrency: rollouts in flight with 1 s agents", body)
