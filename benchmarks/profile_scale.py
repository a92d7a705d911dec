"""Where the CPU goes when N raylets run 100 ms rollouts (issue 20's many-node goal).

The cluster of ``scale.py`` (N raylets on 127.0.0.1, each with 2 rollout actors x
``--per-actor``, 16 durable Gym servers, 100 ms agents); streams of rows back to back while
py-spy samples the driver, the ledger actor, one rollout actor and one Gym host for the same
window. Per process: CPU ms per rollout (the rollout actor's: one actor's CPU times the actors;
the Gym host's: one host's times the hosts) and its top functions by own time; for the whole
cluster: CPU by part and cores busy (CPU seconds / wall / cores).

    .venv/bin/python benchmarks/profile_scale.py --quick [--nodes 4] [--per-actor 16]

Writes results/profile_scale.json and .md.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import Result, bench_main, out_dir, progress
from hotpath_profile import _find, _own_cpu, _py_spy, parse_collapsed
from scale import (
    SERVERS,
    DurableFleet,
    _add_node,
    _checkpoint,
    _orchestrator,
    _rows,
    _sampled,
    start_head,
    stop_all,
)

ACTORS_PER_NODE = 2
BATCH = 320  # rows a batch, at least (8 x the slots)


def _spy(spy: str, pid: int, out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            *(spy, "record", "--pid", str(pid), "--rate", "100", "--format", "raw"),
            *("--nonblocking", "--output", str(out)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def body(result: Result, args: Any) -> None:

    spy = _py_spy()
    window_s = 10.0 if args.quick else 30.0
    cores = os.cpu_count() or 1
    result.params.update(
        nodes=args.nodes,
        actors_per_node=ACTORS_PER_NODE,
        per_actor=args.per_actor,
        servers=SERVERS,
        window_s=window_s,
    )
    p = {"actors_per_node": ACTORS_PER_NODE}
    tmp = Path(tempfile.mkdtemp(prefix="rlga-prof-scale-"))
    cluster, nodes_up = start_head(ACTORS_PER_NODE)
    fleet = DurableFleet(SERVERS, tmp / "gym").start()
    orch = None
    hosts = len(fleet.pids)
    try:
        while len(nodes_up) < args.nodes:
            nodes_up.append(_add_node(cluster, p, len(nodes_up)))
        cluster.wait_for_nodes()
        actors = args.nodes * ACTORS_PER_NODE
        orch = _orchestrator(fleet, actors, args.per_actor, "prof")
        seq = iter(range(10**9))
        batch = max(BATCH, 8 * actors * args.per_actor)  # batches' tails a small share
        orch.run_batch(_rows(f"{orch.run_id}-w", actors * args.per_actor))  # warm-up
        _checkpoint(orch, "warm", tmp)
        pids = {
            "driver": os.getpid(),
            "ledger": _find("worker:LedgerActor", fleet.pids),
            "rollout actor": _find("worker:RolloutActor", fleet.pids),
            "Gym host": fleet.pids[0],
        }
        outs = {k: out_dir() / f"profile_scale_{k.replace(' ', '_')}.txt" for k in pids}
        stop = threading.Event()
        done = [0]

        def run() -> None:
            while not stop.is_set():
                for _, outcome in orch.stream(_rows(f"{orch.run_id}-{next(seq)}", batch)):
                    done[0] += outcome.status == "sealed"  # counted as each ends
                    if stop.is_set():
                        break  # the rest are abandoned: the window is over

        worker = threading.Thread(target=run, name="load", daemon=True)
        worker.start()
        time.sleep(1.0)
        spies = {k: _spy(spy, pid, outs[k]) for k, pid in pids.items() if pid is not None}
        time.sleep(1.0)  # py-spy attached
        cpu0 = {k: _own_cpu(pid) for k, pid in pids.items() if pid is not None}
        n0, load = done[0], os.getloadavg()[0]
        spied = [proc.pid for proc in spies.values()]  # py-spy's own CPU is not the cluster's
        _, wall, parts = _sampled(fleet, functools.partial(time.sleep, window_s), spied)
        n = done[0] - n0
        cpu1 = {k: _own_cpu(pid) for k, pid in pids.items() if pid is not None}
        for proc in spies.values():
            proc.send_signal(signal.SIGINT)
        for proc in spies.values():
            proc.wait(timeout=60)
        stop.set()
        worker.join(timeout=300)
    finally:
        stop_all(orch, fleet, cluster, tmp)
    n = max(1, n)
    share = {"rollout actor": actors, "Gym host": hosts}
    procs = {}
    for k, out in outs.items():
        prof = parse_collapsed(out)
        out.unlink(missing_ok=True)
        if k in cpu0:
            used = (cpu1[k] - cpu0[k]) * share.get(k, 1)
            if k == "driver":  # less the CPU sampler's scans of the process table
                used = parts["driver"]
            procs[k] = {"cpu_ms_per_rollout": round(used / n * 1e3, 3), **prof}
    cpu_s = sum(parts.values())
    summary = {
        "rollouts": n,
        "wall_s": round(wall, 2),
        "per_s": round(n / wall, 1),
        "cpu_ms_per_rollout": round(cpu_s / n * 1e3, 3),
        "cpu_ms_by_part": {k: round(v / n * 1e3, 3) for k, v in parts.items()},
        "cores_busy": round(cpu_s / wall / cores, 3),
        "load_1min": load,
    }
    progress(f"{summary}")
    result.extra.update(summary, processes=procs)
    result.rows = [
        {"process": k, **{x: v[x] for x in ("cpu_ms_per_rollout", "samples")}}
        for k, v in procs.items()
    ]
    result.add_table(
        f"{args.nodes} raylets x {ACTORS_PER_NODE} actors x {args.per_actor}, 100 ms agents, "
        f"{SERVERS} durable Gym servers: {n} rollouts in {wall:.1f} s ({n / wall:.0f}/s), "
        f"cores busy {summary['cores_busy']:.2f} (CPU seconds / wall / {cores} cores; load "
        f"{load:.1f}); CPU ms per rollout by part:",
        ["total", *summary["cpu_ms_by_part"]],
        [[summary["cpu_ms_per_rollout"], *summary["cpu_ms_by_part"].values()]],
    )
    result.add_table(
        "Per profiled process: CPU ms per rollout (one rollout actor times the actors, one Gym "
        "host times the hosts), own time by category and the top functions by own time (% of "
        "the process's busy samples; py-spy sees Python frames, a native thread's time shows "
        "as the frame that started it):",
        ["process", "CPU ms / rollout", "by category", "#1", "#2", "#3", "#4"],
        [
            [
                k,
                v["cpu_ms_per_rollout"],
                ", ".join(f"{c} {x}%" for c, x in list(v["categories"].items())[:4]),
                *[f"{f} {x}%" for f, x in v["self"][:4]],
            ]
            for k, v in procs.items()
        ],
    )


def _args(parser: Any) -> None:
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--per-actor", type=int, default=16)


if __name__ == "__main__":
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    bench_main("profile_scale", "Where the CPU goes with N raylets", body, extra_args=_args)
