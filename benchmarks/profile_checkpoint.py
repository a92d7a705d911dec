"""Where a big checkpoint's time goes: py-spy on the ledger actor (which runs the gate) and on one
Gym host process while ``checkpoint()`` clears N finished, un-ACKed attempts (or N running,
forgotten ones) over 16 durable Gym servers.

    .venv/bin/python benchmarks/profile_checkpoint.py --quick [--kind running] [--attempts N]

Writes results/profile_checkpoint_<kind>.json: the checkpoint's seconds, each profiled process's
CPU over the window and its top functions by own time and by time including callees.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import common
from common import Result, bench_main, out_dir, progress
from fleet import leave_running
from hotpath_profile import _find, _own_cpu, _py_spy, parse_collapsed
from scale import SERVERS, DurableFleet, _checkpoint, _state_lost_seen


def body(result: Result, args: Any) -> None:
    from rl_gym_actors.config import PoolConfig
    from rl_gym_actors.orchestrator import Orchestrator

    spy = _py_spy()
    n = args.attempts or (10_000 if args.quick else 100_000)
    result.params.update(kind=args.kind, attempts=n, servers=SERVERS)
    common.start_ray(num_cpus=2)
    tmp = Path(tempfile.mkdtemp(prefix="rlga-prof-ck-"))
    fleet = DurableFleet(SERVERS, tmp / "gym").start()
    orch = Orchestrator(
        fleet.endpoints,
        pool=PoolConfig(size=1, rollouts_per_actor=1),
        progress=False,
        orchestrator_id="bench-prof-ck",
    )
    try:
        _checkpoint(orch, "warm", tmp)
        prefix = f"{orch.run_id}-p"
        if args.kind == "finished":
            fleet.fresh(prefix, n)
            _state_lost_seen(orch, "lost", tmp)  # new state dirs: the gate says so once
        else:
            asyncio.run(leave_running(fleet.endpoints, n, prefix, concurrency=512))
        pids = {"ledger": _find("worker:LedgerActor", fleet.pids), "gym_host": fleet.pids[0]}
        outs = {k: out_dir() / f"profile_checkpoint_{k}.txt" for k in pids}
        spies = {
            k: subprocess.Popen(
                [
                    *(spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw"),
                    *("--nonblocking", "--output", str(outs[k])),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for k, pid in pids.items()
        }
        time.sleep(1.0)  # py-spy attached
        cpu0 = {k: _own_cpu(p) for k, p in pids.items()}
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        report = _checkpoint(orch, "profiled", tmp)
        seconds = time.perf_counter() - t0
        cpu1 = {k: _own_cpu(p) for k, p in pids.items()}
        for proc in spies.values():
            proc.send_signal(signal.SIGINT)
        for proc in spies.values():
            proc.wait(timeout=60)
    finally:
        orch.close()
        fleet.stop()
        common.stop_ray()
        shutil.rmtree(tmp, ignore_errors=True)
    procs = {}
    for k, out in outs.items():
        prof = parse_collapsed(out)
        out.unlink(missing_ok=True)
        procs[k] = {"cpu_s": round(cpu1[k] - cpu0[k], 3), **prof}
    progress(
        f"{args.kind} {n:,}: checkpoint {seconds:.2f}s; ledger CPU {procs['ledger']['cpu_s']}s"
    )
    result.extra.update(
        seconds=seconds,
        load_1min=load,
        orphans_acked=report.orphans_acked,
        retired=report.retired,
        processes=procs,
    )
    result.rows = [
        {"process": k, "cpu_s": v["cpu_s"], "samples": v["samples"]} for k, v in procs.items()
    ]
    for k, v in procs.items():
        result.add_table(
            f"{k}: {v['cpu_s']} s CPU during a {seconds:.2f} s checkpoint ({args.kind} {n:,} over "
            f"{SERVERS} servers, load {load:.1f}); top functions by own time / including callees:",
            ["#", "own time", "including callees"],
            [
                [i + 1, f"{a[0]} {a[1]}%", f"{b[0]} {b[1]}%"]
                for i, (a, b) in enumerate(zip(v["self"][:12], v["total"][:12], strict=False))
            ],
        )


def _args(parser: Any) -> None:
    parser.add_argument("--kind", choices=("finished", "running"), default="finished")
    parser.add_argument("--attempts", type=int, default=None)


if __name__ == "__main__":
    import sys

    kind = sys.argv[sys.argv.index("--kind") + 1] if "--kind" in sys.argv else "finished"
    bench_main(
        f"profile_checkpoint_{kind}", "Where a big checkpoint's time goes", body, extra_args=_args
    )
