"""Where a rollout's CPU goes: py-spy on each process of a quick throughput run.

One Gym server (subprocess, instant simulated agent), an orchestrator of 2 rollout actors x 8
rollouts each (concurrency 16, the throughput benchmark's "8 per actor"), batches of 200 rows back
to back. While they run, py-spy samples the driver, one rollout actor, the ledger actor and the Gym
server for the same window; psutil gives each process's CPU over the window and per thread. The
result is, per process, CPU ms per rollout and its top Python functions by own time ("self") and
by time including callees ("total"), as a share of the process's busy samples.

    .venv/bin/pip install py-spy                                  # not a project dependency
    .venv/bin/python benchmarks/hotpath_profile.py --quick --label after

``--label before`` is how the "before" column was made: the same script run from a checkout of
e581378 (``git worktree add --detach /tmp/base e581378``, copy this file into its benchmarks/, run
it there with this venv's python). ``run_all.py`` shows the two side by side.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import common
import psutil
from common import Result, bench_main, out_dir, progress
from fleet import Fleet

PROCESSES = ("driver", "worker:RolloutActor", "worker:LedgerActor", "gym")
TOP = 8


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(os.sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: .venv/bin/pip install py-spy")
    return found


def _thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread name of ``pid`` (threads of the same name summed). psutil gives
    each thread's times; the name is the thread's ``comm`` (Linux), which psutil does not read."""
    out: dict[str, float] = {}
    try:
        threads = psutil.Process(pid).threads()
    except psutil.Error:
        return out
    for t in threads:
        try:
            name = Path(f"/proc/{pid}/task/{t.id}/comm").read_text().strip()
        except OSError:
            name = "?"
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    return out


def _own_cpu(pid: int) -> float:
    """CPU seconds of ``pid``'s own threads: not its reaped children (py-spy runs as the
    driver's children, and its CPU must not count as the driver's)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def _frame(raw: str) -> str:
    """``func (path/to/module.py:12)`` -> ``func (to/module.py)``."""
    if " (" not in raw:
        return raw
    func, where = raw.split(" (", 1)
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else path
    for marker in ("site-packages/", "python3.11/", "python3.13/"):
        if marker in path:
            short = path.split(marker, 1)[1]
            break
    return f"{func} ({short})"


# where a sample's own time is spent, by the file of its innermost frame (first match wins)
CATEGORIES = [
    (
        "Ray (calls, streams, serialization, its worker loop)",
        ("/ray/", "ray/_private", "_private/", "_raylet", "cloudpickle", "msgpack"),
    ),
    ("HTTP client (aiohttp)", ("aiohttp/", "yarl/", "multidict/")),
    (
        "web server (uvicorn, h11, starlette, fastapi)",
        ("uvicorn/", "h11/", "starlette/", "fastapi/", "anyio/"),
    ),
    ("retry (tenacity)", ("tenacity/", "gym/retry.py")),
    ("this library", ("rl_gym_actors/",)),
    ("pydantic", ("pydantic",)),
    ("threads and executors", ("threading.py", "concurrent/futures")),
    ("event loop and sockets (asyncio)", ("asyncio/", "selectors.py", "socket.py")),
]


def _category(raw_leaf: str) -> str:
    where = raw_leaf.split(" (", 1)[1] if " (" in raw_leaf else raw_leaf
    for name, marks in CATEGORIES:
        if any(m in where for m in marks):
            return name
    return "other"


def parse_collapsed(path: Path) -> dict[str, Any]:
    """Self and total shares per function from py-spy's collapsed (``raw``) output, and the
    self shares summed per category (:data:`CATEGORIES`)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    n = 0
    if not path.exists():
        return {"samples": 0, "self": [], "total": [], "categories": {}}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        raw = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))] or [stack]
        if any("subprocess.py" in f or "_timed_sample" in f for f in raw):
            continue  # this script's own wait on py-spy or CPU sampler, not the library
        frames = [_frame(f) for f in raw]
        n += k
        own[frames[-1]] += k
        kinds[_category(raw[-1])] += k
        for f in set(frames):
            total[f] += k
    pct = (
        (lambda c: [[f, round(100.0 * v / n, 1)] for f, v in c.most_common(40)])
        if n
        else (lambda c: [])
    )
    return {
        "samples": n,
        "self": pct(own),
        "total": pct(total),
        "categories": {c: round(100.0 * v / n, 1) for c, v in kinds.most_common()} if n else {},
    }


def _find(kind: str, exclude: list[int]) -> int | None:
    procs = [p for p in common.process_tree(exclude=exclude) if p.kind == kind]
    return procs[0].pid if procs else None


def body(result: Result, args: Any) -> None:
    import rl_gym_actors
    from rl_gym_actors.config import TryPolicy
    from rl_gym_actors.orchestrator import Orchestrator

    spy = _py_spy()
    window_s = 8.0 if args.quick else 30.0
    per_actor = args.per_actor
    actors = max(1, 16 // per_actor)
    result.params.update(
        window_s=window_s,
        actors=actors,
        rollouts_per_actor=per_actor,
        batch=200,
        code=str(Path(rl_gym_actors.__file__).parent),
    )
    common.start_ray(num_cpus=2)
    with Fleet(1) as fleet:
        gym_pid = fleet.pids[0]
        orch = Orchestrator(
            fleet.endpoints,
            policy=TryPolicy(rollout_s=60.0, receipt_s=10.0),
            pool_size=actors,
            rollouts_per_actor=per_actor,
            progress=False,
            orchestrator_id="bench-profile",
        )
        try:
            seq = iter(range(10**9))

            def batch() -> int:
                rows = [
                    {"_ng_rollout_id": f"pf-{next(seq)}", "sleep_s": 0.0, "reward": 0.5}
                    for _ in range(200)
                ]
                outs = orch.run_batch(rows)
                assert all(o.status == "sealed" for o in outs), outs[0]
                return len(outs)

            batch()
            batch()  # warm: connections, code paths
            pids = {"driver": os.getpid(), "gym": gym_pid}
            for kind in PROCESSES[1:3]:
                pids[kind] = _find(kind, fleet.pids)
            progress(f"profiling {pids} for {window_s:.0f}s")
            stop = threading.Event()
            done = [0]

            def load() -> None:
                streams = hasattr(orch, "stream")  # e581378 (the "before") has no stream
                while not stop.is_set():  # counted as each rollout ends
                    if not streams:
                        done[0] += batch()
                        continue
                    rows = [
                        {"_ng_rollout_id": f"pf-{next(seq)}", "sleep_s": 0.0, "reward": 0.5}
                        for _ in range(200)
                    ]
                    for _, outcome in orch.stream(rows):
                        assert outcome.status == "sealed", outcome
                        done[0] += 1

            worker = threading.Thread(target=load, daemon=True)
            worker.start()
            time.sleep(0.5)
            n0, t0 = done[0], time.perf_counter()
            cpu0 = {k: _own_cpu(p) for k, p in pids.items()}
            thr0 = {k: _thread_cpu(p) for k, p in pids.items()}
            spies = {}
            for kind, pid in pids.items():
                out = out_dir() / f"hotpath_{args.label}_{kind.split(':')[-1]}.txt"
                spies[kind] = (
                    out,
                    subprocess.Popen(
                        [
                            spy,
                            "record",
                            "--pid",
                            str(pid),
                            "--rate",
                            "200",
                            "--duration",
                            str(int(window_s)),
                            "--format",
                            "raw",
                            "--nonblocking",
                            "--output",
                            str(out),
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    ),
                )
            for _, proc in spies.values():
                proc.wait(timeout=window_s + 60)
            wall = time.perf_counter() - t0
            cpu1 = {k: _own_cpu(p) for k, p in pids.items()}
            thr1 = {k: _thread_cpu(p) for k, p in pids.items()}
            n1 = done[0]
            stop.set()
            worker.join(timeout=120)
        finally:
            orch.close()
            common.stop_ray()
    rollouts = max(1, n1 - n0)
    procs: dict[str, Any] = {}
    for kind, (out, _) in spies.items():
        prof = parse_collapsed(out)
        out.unlink(missing_ok=True)
        threads = {
            name: round((thr1[kind].get(name, 0.0) - v) * 1e3 / rollouts, 3)
            for name, v in thr0[kind].items()
            if thr1[kind].get(name, 0.0) - v > 0.01
        }
        # one rollout actor is profiled; the pool's share is that actor's times the actors
        share = actors if kind == "worker:RolloutActor" else 1
        procs[kind] = {
            "pid": pids[kind],
            "cpu_ms_per_rollout": round((cpu1[kind] - cpu0[kind]) * 1e3 * share / rollouts, 3),
            "threads_cpu_ms_per_rollout": dict(sorted(threads.items(), key=lambda kv: -kv[1])),
            **prof,
        }
    result.extra.update(
        label=args.label,
        rollouts=rollouts,
        wall_s=round(wall, 2),
        rollouts_per_s=round(rollouts / wall, 1),
        processes=procs,
    )
    result.rows = [
        {"process": k, "cpu_ms_per_rollout": v["cpu_ms_per_rollout"], "samples": v["samples"]}
        for k, v in procs.items()
    ]
    result.add_table(
        f"{args.label}: {rollouts} rollouts in {wall:.1f} s ({rollouts / wall:.0f}/s), instant "
        f"agents, {actors} actors x {per_actor}; CPU ms per rollout per process (the rollout "
        "actor's: one actor's CPU times the actors) and its top functions by own time "
        "(% of the process's busy samples):",
        ["process", "CPU ms / rollout", *[f"#{i + 1}" for i in range(4)]],
        [
            [k, v["cpu_ms_per_rollout"], *[f"{f} {p}%" for f, p in v["self"][:4]]]
            for k, v in procs.items()
        ],
    )


def _args(parser: Any) -> None:
    parser.add_argument("--label", default="after", help="before | after (the file it writes)")
    parser.add_argument(
        "--per-actor",
        type=int,
        default=8,
        help="rollouts per actor (16 in flight: 16 // this many actors); 1 profiles the "
        "one-rollout-per-actor layout, where the rollout actor's figure is one of 16 actors",
    )


if __name__ == "__main__":
    import sys

    label = "after"
    if "--label" in sys.argv:
        label = sys.argv[sys.argv.index("--label") + 1]
    bench_main(
        f"hotpath_profile_{label}", "Where a rollout's CPU goes (py-spy)", body, extra_args=_args
    )
