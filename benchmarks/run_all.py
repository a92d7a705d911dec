"""Run every benchmark, each in a process of its own, and regenerate benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/run_all.py --quick          # what `make bench` runs
    .venv/bin/python benchmarks/run_all.py --quick --before e581378   # `make bench-compare`
    .venv/bin/python benchmarks/run_all.py                  # full mode (long)
    .venv/bin/python benchmarks/run_all.py --quick --report-only  # RESULTS.md from results/
                                                   # (without --quick: the full-mode report)
    .venv/bin/python benchmarks/run_all.py --quick --only scale   # `make bench-scale`

RESULTS.md gets, per benchmark, the command behind it, a few sentences on what it shows (drawn
from the numbers just measured), its tables, and a PNG plot when matplotlib (the ``bench`` extra)
is importable. Full-mode results (``results/<name>_full.json``), when present, are shown too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common
import glance
import hotpath_table
import psutil
from common import BENCH_DIR, REPO, RESULTS_DIR, fmt, load_line, machine_info, machine_line
from hotpath_table import BEFORE_BENCHMARKS, BEFORE_REV

BENCHMARKS = [
    "throughput",
    "one_per_actor",
    "concurrency",
    "fault_storm",
    "fault_storm_v2",
    "retired_marks_v2",
    "checkpoint",
    "cluster",
    "ledger",
    "soak",
    "gym_server_memory",
    "gym_server",
    "gym_server_limits",
    "chaos",
    "admission",
    "fault_campaign",
    "scale",
    "store_commit",
    "receipts_real_gym",
    "hotpath_profile",
    "skyrl_generate",
    "verl_overhead",
]
# run only when named (`--only scale`, `make bench-scale`; `--only chaos`, `make bench-chaos`):
# scale's quick mode alone takes ~3 of the 8 minutes `make bench` has, chaos's sixteen faults (two
# of them a killed driver waiting out its lease, one a node lost) 5-10; their last results still
# get their sections in RESULTS.md
STANDALONE = {"scale", "chaos", "admission", "fault_campaign", "skyrl_generate", "verl_overhead"}
# run by another interpreter: an adapter's venv (`make test-skyrl`, `make test-verl` build them)
INTERPRETER = {
    "skyrl_generate": REPO / ".venv-skyrl" / "bin" / "python",
    "verl_overhead": REPO / ".venv-verl" / "bin" / "python",
}
# written by another benchmark's quick run, which measures the same thing (one_per_actor: the
# 1 per actor pool and trials of throughput's quick run, with the Ray floor joined to them); a
# whole quick run does not run it again (`--only one_per_actor` and full mode still do)
QUICK_INSIDE = {"one_per_actor": "throughput"}
EXTRA_ARGS = {"hotpath_profile": ["--label", "after"]}
# results of a benchmark's part run alone, shown in its section when present
PART_RESULTS = {
    "fault_campaign": [
        (
            "fault_campaign_after",
            "State written after checkpoint() returns (`fault_campaign.py --variants "
            "keep-after,sync-after --instants 8`)",
        ),
    ],
    "scale": [
        ("scale_throughput", "Rollouts/s by raylets alone (`scale.py --quick --phases`)"),
        ("profile_scale", "Where the CPU goes with 4 raylets (`profile_scale.py --quick`)"),
    ],
}
TIMEOUT_S = {"quick": 600, "full": 4 * 3600}
# chaos quick (16 faults, more with v2's) ran past 600 s at load 30: its own, longer bound
QUICK_TIMEOUT_S = {"chaos": 2400, "fault_campaign": 1200}
# `make bench` (every quick benchmark but STANDALONE's) on a quiet machine; run_all warns past it
BUDGET_S = 8 * 60


# ---------------------------------------------------------------- running


def run_one(
    name: str, quick: bool, *, tree: Path = REPO, args: list[str] | None = None
) -> dict[str, Any]:
    """Run one benchmark in a process of its own: its wall time, and the CPU time of it and
    every process it started (Ray's included: see _adopt_orphans), with the load around it."""
    if name == "hotpath_profile" and not _has_py_spy():
        common.progress("run_all: hotpath_profile skipped: py-spy is not installed")
        return {"name": name, "rc": 0, "seconds": 0.0, "tail": "", "skipped": True}
    cmd = (
        [
            str(INTERPRETER.get(name, sys.executable)),
            str(tree / "benchmarks" / f"{name}.py"),
            "--write",
        ]
        + (["--quick"] if quick else [])
        + (EXTRA_ARGS.get(name, []) if args is None else args)
    )
    log = RESULTS_DIR / f"{name}{'' if quick else '_full'}.log.tmp"
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    load_start = os.getloadavg()[0]
    cpu0 = _children_cpu_s()
    before = _descendants()
    t0 = time.perf_counter()
    common.progress(f"run_all: {name} ({tree.name}) ...")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, cwd=tree, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            bound = QUICK_TIMEOUT_S.get(name, TIMEOUT_S["quick"]) if quick else TIMEOUT_S["full"]
            rc = proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            common.progress(f"run_all: {name} timed out: its process group killed")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = -1
    took = time.perf_counter() - t0
    lingering = _reap_descendants(before)
    cpu = _children_cpu_s() - cpu0
    load_end = os.getloadavg()[0]
    common.progress(
        f"run_all: {name} {'ok' if rc == 0 else f'FAILED ({rc})'} in {took:.0f}s wall, "
        f"{cpu:.0f}s CPU (all its processes); load {load_start:.1f} -> {load_end:.1f}"
        + (f"; {lingering} of its processes left running, killed" if lingering else "")
    )
    tail = "" if rc == 0 else log.read_text()[-3000:]
    if rc == 0:
        log.unlink(missing_ok=True)
    return {
        "name": name,
        "rc": rc,
        "seconds": took,
        "cpu_s": cpu,
        "started_at": started,
        "load": [load_start, load_end],
        "lingering": lingering,
        "tail": tail,
    }


# ---------------------------------------------------------------- CPU of a benchmark's processes


def _adopt_orphans() -> None:
    """Make this process the reaper of its orphaned descendants (Linux): a benchmark's Ray
    workers outlive their raylet by a moment and would otherwise be re-parented to init, their
    CPU time lost to RUSAGE_CHILDREN."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        PR_SET_CHILD_SUBREAPER = 36
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the CPU figure then misses what was re-parented; the wall time stands


def _descendants() -> set[int]:
    with contextlib.suppress(psutil.Error):
        return {c.pid for c in psutil.Process().children(recursive=True)}
    return set()


def _reap_descendants(before: set[int], wait_s: float = 15.0) -> int:
    """Wait (up to ``wait_s``) for what the last benchmark left running to exit, reap each of
    those that is our child so that its CPU time is counted; kill what still runs after that and
    return how many were left. Only processes that were not there before it started (``before``)
    count: a caller's own (a test's Ray session, when a test calls run_one) are never touched."""
    deadline = time.monotonic() + wait_s
    me = os.getpid()
    while True:
        alive = []
        for c in psutil.Process().children(recursive=True):
            if c.pid in before:
                continue
            with contextlib.suppress(psutil.Error, ChildProcessError):
                if c.ppid() == me:
                    os.waitpid(c.pid, os.WNOHANG)
                if c.status() != psutil.STATUS_ZOMBIE:
                    alive.append(c)
        if not alive:
            return 0
        if time.monotonic() >= deadline:
            # what a benchmark leaves running (e.g. a Ray agent of a failed start) is ours
            for c in alive:
                with contextlib.suppress(psutil.Error):
                    c.kill()
            psutil.wait_procs(alive, timeout=5)
            for c in alive:
                with contextlib.suppress(ChildProcessError, psutil.Error):
                    if c.ppid() == me:
                        os.waitpid(c.pid, os.WNOHANG)
            return len(alive)
        time.sleep(0.2)


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _has_py_spy() -> bool:
    return Path(sys.executable).with_name("py-spy").exists() or shutil.which("py-spy") is not None


def run_before(rev: str, quick: bool) -> list[dict[str, Any]]:
    """The "before" column (``make bench-compare``): ``rev`` checked out in a temporary
    worktree, the current benchmark scripts copied in (same harness, old library), each of
    BEFORE_BENCHMARKS run there; results land in results/<name>_before.json.

    A benchmark that cannot run against the old library (a script that needs what ``rev`` lacks)
    is reported as such, its old _before result removed so that no stale figure stands in the
    before column, and does not fail the run."""
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="rlga-before-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), rev],
            cwd=REPO,
            check=True,
            capture_output=True,
        )
        try:
            for script in BENCH_DIR.glob("*.py"):
                shutil.copy2(script, tree / "benchmarks" / script.name)
            for name in BEFORE_BENCHMARKS:
                args = ["--label", "before"] if name == "hotpath_profile" else []
                run = run_one(name, quick, tree=tree, args=args)
                run["name"] = f"{name} (before, {rev})"
                runs.append(run)
                stem = "hotpath_profile_before" if name == "hotpath_profile" else name
                produced = tree / "benchmarks" / "results" / f"{stem}.json"
                target = RESULTS_DIR / f"{name}_before.json"
                if name == "hotpath_profile":
                    target = RESULTS_DIR / "hotpath_profile_before.json"
                if run["rc"] == 0 and produced.exists():
                    shutil.copy2(produced, target)
                    continue
                target.unlink(missing_ok=True)  # never a stale figure in its place
                if run["rc"] > 0 or (run["rc"] == 0 and not run.get("skipped")):
                    last = [line for line in run["tail"].strip().splitlines() if line.strip()]
                    run.update(
                        rc=0,
                        skipped=True,
                        note=f"cannot run against {rev} ("
                        + (last[-1][:200] if last else f"exit {run['rc']}")
                        + "): no before figure",
                    )
                    common.progress(f"run_all: {run['name']}: {run['note']}")
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True
            )
    return runs


# ---------------------------------------------------------------- the runs' record


def _runs_path(quick: bool) -> Path:
    return RESULTS_DIR / f"run_all{'' if quick else '_full'}.json"


def record_runs(quick: bool, runs: list[dict[str, Any]], whole: bool) -> list[dict[str, Any]]:
    """Keep each benchmark's last wall and CPU time in results/run_all.json (run_all_full.json):
    a whole run replaces the record (but the STANDALONE benchmarks' last times); ``--only``
    replaces only the benchmarks it ran. Returns the record, in BENCHMARKS' order."""
    path = _runs_path(quick)
    old: list[dict[str, Any]] = []
    if path.exists():
        with contextlib.suppress(ValueError, OSError):
            old = json.loads(path.read_text()).get("runs", [])
    if whole:
        old = [r for r in old if r["name"] in STANDALONE]
    ran = {r["name"] for r in runs}
    kept = [r for r in old if r["name"] not in ran]
    new = [{k: v for k, v in r.items() if k != "tail"} for r in runs]
    order = {name: i for i, name in enumerate(BENCHMARKS)}
    merged = sorted(kept + new, key=lambda r: order.get(r["name"], -1))
    path.write_text(json.dumps({"runs": merged}, indent=1) + "\n")
    return merged


def load_runs(quick: bool) -> list[dict[str, Any]]:
    path = _runs_path(quick)
    if not path.exists():
        return []
    try:
        return list(json.loads(path.read_text()).get("runs", []))
    except (ValueError, OSError):
        return []


def bench_total_s(record: list[dict[str, Any]]) -> float:
    """What `make bench` takes: every benchmark of BENCHMARKS but the STANDALONE ones (and those
    measured inside another's quick run)."""
    return sum(
        r.get("seconds", 0.0)
        for r in record
        if r["name"] in BENCHMARKS and r["name"] not in STANDALONE and r["name"] not in QUICK_INSIDE
    )


def runs_section(quick: bool, record: list[dict[str, Any]]) -> list[str]:
    if not record:
        return []
    mode = "quick" if quick else "full"
    out = [
        f"## Runs behind this report ({mode} mode)",
        "",
        "Wall time of each benchmark's process and CPU time of every process it started (Ray's "
        "and the Gym servers' included), with the load average (1 min) at its start and end: "
        "under load the wall time stretches, the CPU time much less.",
        "",
        "| benchmark | started | wall (s) | CPU (s) | load | result |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in record:
        load = r.get("load") or []
        state = (
            "skipped" + (f": {r['note']}" if r.get("note") else "")
            if r.get("skipped")
            else "ok"
            if r.get("rc") == 0
            else f"failed (exit {r.get('rc')})"
        )
        name = r["name"] + (" (standalone)" if r["name"] in STANDALONE else "")
        out.append(
            f"| {name} | {r.get('started_at', '-')} | {r.get('seconds', 0.0):.0f} "
            f"| {fmt(r.get('cpu_s'))} "
            f"| {' -> '.join(f'{x:.1f}' for x in load) if load else '-'} | {state} |"
        )
    out.append("")
    if quick:
        total = bench_total_s(record)
        over = total > BUDGET_S
        wanted = [b for b in BENCHMARKS if b not in STANDALONE and b not in QUICK_INSIDE]
        missing = [b for b in wanted if b not in {r["name"] for r in record}]
        for name, host in QUICK_INSIDE.items():
            out += [
                f"`make bench` measures {name} inside {host}'s quick run (its time is in "
                f"{host}'s line; a line of its own is from `--only {name}`).",
                "",
            ]
        out += [
            f"`make bench` (all but {', '.join(sorted(STANDALONE))}): {total / 60:.1f} min of "
            f"benchmarks"
            + (f" (not recorded: {', '.join(missing)})" if missing else "")
            + f"; budget {BUDGET_S // 60} min on a quiet machine"
            + (" (over it: see the loads above)" if over else "")
            + ".",
            "",
        ]
    return out


# ---------------------------------------------------------------- commentary


def _rows(res: dict) -> list[dict]:
    return res.get("rows", [])


def say_throughput(res: dict) -> str:
    rows = _rows(res)
    if not rows:
        return ""
    zero = [r for r in rows if r["agent_ms"] == 0]
    slow = [r for r in rows if r["agent_ms"] == max(r["agent_ms"] for r in rows)]
    b0 = max(zero, key=lambda r: r["ours_per_s"])
    bs = max(slow, key=lambda r: r["ours_per_s"])
    cpu = b0["cpu_ms_per_rollout"]  # the best pool's own figure (an average over pools hid it)
    dcpu = b0["direct_cpu_ms_per_rollout"]
    return (
        f"With instant agents the orchestrator reaches {b0['ours_per_s']:.0f} rollouts/s "
        f"({b0['config']}), {b0['ratio']:.2f}x the direct loop's {b0['direct_per_s']:.0f}/s; with "
        f"{bs['agent_ms']} ms agents it is {bs['ratio']:.2f}x. Beyond the direct loop's HTTP, "
        f"every rollout also crosses Ray (rows go to the rollout actors in chunks, outcomes "
        f"stream back bunched), reports to the ledger actor in merged batches, and runs in its "
        f"rollout actor's event loop: "
        f"{cpu:.1f} ms of CPU per rollout over all processes ({b0['config']}) against "
        f"{dcpu:.1f} ms for the direct loop, on 2 cores shared with the Gym server; the added "
        f"latency per rollout is "
        f"{b0['added_p50_ms']:.0f} ms at p50. Many rollouts per actor cost a fraction of the "
        f"memory of one per actor (actor PSS per slot in the second table) and less CPU."
    )


def say_one_per_actor(res: dict) -> str:
    rows = {r["way"]: r for r in _rows(res)}
    if not {"direct", "Ray floor", "ours"} <= rows.keys():
        return ""
    d, f, o = rows["direct"], rows["Ray floor"], rows["ours"]
    return (
        f"With one rollout per actor (16 actors, instant agents) the orchestrator runs "
        f"{o['per_s']:.0f} rollouts/s, {o['ratio']:.2f}x the direct loop's {d['per_s']:.0f}/s, "
        f"at {o['cpu_ms_per_rollout']:.2f} ms of CPU per rollout (direct: "
        f"{d['cpu_ms_per_rollout']:.2f} ms). Ray's floor, bare async actors that do nothing but "
        f"the direct loop's HTTP for one row per call, runs {f['ratio']:.2f}x the direct loop at "
        f"{f['cpu_ms_per_rollout']:.2f} ms: what any one-actor-per-rollout design pays to Ray "
        f"(an actor call per rollout into a process that wakes for it alone).{_noop(rows)} "
        f"Where the rest goes: `hotpath_profile.py --per-actor 1` "
        f"([profile](results/hotpath_profile_one.md))."
    )


def _noop(rows: dict) -> str:
    n = rows.get("Ray no-op")
    if n is None:
        return ""
    return (
        f" A call that does nothing on the same 16 bare actors costs {n['cpu_ms_per_rollout']:.2f}"
        f" ms of CPU ({n['idle_ms_per_rollout']:.2f} ms of it the idle cost of the processes "
        f"being there): Ray's own share of the floor, with no HTTP in it."
    )


def say_concurrency(res: dict) -> str:
    rows = _rows(res)
    if not rows:
        return ""
    big = max(rows, key=lambda r: r["in_flight"])
    one = [r for r in rows if r["rollouts_per_actor"] == 1]
    one_s = (
        f"One rollout per actor costs ~{one[0]['pss_mb_per_rollout']:.0f} MB (PSS) per "
        f"rollout in flight and ~{one[-1]['pool_start_s']:.0f} s to start "
        f"{one[-1]['actors']} actors, so it stops at {max(r['in_flight'] for r in one)} "
        f"here (see the notes); "
        if one
        else ""
    )
    return (
        f"{one_s}many per actor reach {big['in_flight']} in flight at "
        f"{big['pss_mb_per_rollout']:.1f} MB per rollout. At {big['in_flight']} in flight a batch "
        f"of 1 s agents takes {big['batch_s']:.2f} s ({big['vs_ideal']:.1f}x the ideal, "
        f"{big['vs_direct']:.2f}x the direct loop): the excess is CPU per rollout on a 2-core "
        f"machine, not waiting."
    )


def say_fault_storm(res: dict) -> str:
    s = res.get("extra", {}).get("summary")
    if not s:
        return ""
    ours, asis = s
    return (
        f"Ours committed {ours[1]} checkpoints and left {ours[2]} attempts un-ACKed and "
        f"{ours[3]} running, with {ours[7]} rewards counted twice; it adopted {ours[10]} finished "
        f"tries instead of rerunning them. The as-is policy committed {asis[1]}: its first lost "
        f"reply blocks every later prepare, it ended with {asis[2]} un-ACKed attempts on Gym, "
        f"reran {asis[5]} tries and wasted {asis[6]:.0f} agent-seconds (ours {ours[6]:.0f}, spent "
        f"on first tries cancelled at their deadline and on the abandoned rows)."
    )


def say_checkpoint(res: dict) -> str:
    rows = _rows(res)
    if not rows:
        return ""
    fin = max(
        (r for r in rows if r["kind"] == "finished"), key=lambda r: (r["attempts"], r["servers"])
    )
    run = max(
        (r for r in rows if r["kind"] == "running"), key=lambda r: (r["attempts"], r["servers"])
    )
    none = [r for r in rows if r["kind"] == "none"]
    return (
        f"An empty checkpoint costs {none[0]['ours_s'] * 1e3:.0f} ms "
        f"({none[0]['ratio']:.2f}x the bare prepare/commit/resume). {fin['attempts']:,} finished, "
        f"un-ACKed attempts over {fin['servers']} server(s) are ACKed as orphans and committed in "
        f"{fin['ours_s']:.2f} s ({fin['ratio']:.1f}x the hand-written minimum); "
        f"{run['attempts']:,} running attempts whose owners are gone are retired and committed "
        f"in {run['ours_s']:.2f} s ({run['ratio']:.1f}x): the gate first closes admission for "
        f"0.5 s and flushes the owners before it retires what nobody reported, which the minimum "
        f"skips because it knows there are no owners."
    )


def say_cluster(res: dict) -> str:
    rows = _rows(res)
    if not rows:
        return ""
    r = rows[0]
    later = r.get("later_batches", [])
    lost_next = later[0]["failed"] if later else 0
    return (
        f"Killing a node with {r['lost_actors']} rollout actors mid-batch: {r['sealed']} rollouts "
        f"sealed, {r['failed']} failed with a reason, {r['without_reason']} silently. The "
        f"checkpoint right after it ACKed {r['orphans_acked']} orphaned finished attempts and "
        f"retired {r['retired']} still running, and committed {r['checkpoint_s']:.1f} s after it "
        f"was called ({r['committed_after_kill_s']:.1f} s after the kill"
        + (
            f"; a checkpoint on the whole pool takes {r['second_checkpoint_s']:.2f} s"
            if r.get("second_checkpoint_s") is not None
            else ""
        )
        + f"): most of that is Ray "
        f"declaring the node dead, until which the ledger cannot tell the lost owners from slow "
        f"ones. The next batch still lost {lost_next} rows to the dead actors' slots (the pool "
        f"replaces an actor on its next failed call); batch {r['first_clean_batch']} ran clean."
    )


def say_ledger(res: dict) -> str:
    rows = _rows(res)
    snap = res.get("extra", {}).get("snapshot")
    if not rows or not snap:
        return ""
    one = next(r for r in rows if r["batch_size"] == 1)
    dflt = next((r for r in rows if r["batch_size"] == 100), rows[-1])
    return (
        f"One LedgerActor absorbs {dflt['events_per_s']:,.0f} reports/s in batches of "
        f"{dflt['batch_size']} (the default batch size) against {one['events_per_s']:,.0f}/s "
        f"with one call per report: a Ray call costs the same whatever its size, and the fold "
        f"itself runs at {snap['fold_in_process_events_per_s']:,.0f} events/s in-process. "
        f"snapshot() with {snap['attempts']:,} attempts costs {snap['snapshot_remote_ms']:.1f} ms "
        f"through Ray ({snap['snapshot_in_process_ms']:.2f} ms in-process): the book keeps its "
        f"counters incrementally."
    )


def say_chaos(res: dict) -> str:
    rows = _rows(res)
    if not rows:
        return ""
    good = [r for r in rows if r["ok"]]
    by = {r["name"]: r for r in rows}
    dead = by.get("gym_dead", {}).get("extra", {})
    parts = [
        f"{len(good)} of {len(rows)} faults ended as a user expects: no row failed "
        f"without a reason, no reward was counted twice, and wherever a checkpoint can "
        f"commit it did, leaving nothing running or un-ACKed on Gym."
    ]
    if dead:
        parts.append(
            f"With Gym dead, 60 rows ended in {dead['batch_s']:.1f} s (bound "
            f"{dead['bound_s']:.0f} s), every reason naming the refused connection, "
            f"and the checkpoint failed after {dead['checkpoint_s']:.2f} s of its 3 s."
        )
    missing = [r["name"] for r in rows if not r["ok"]]
    if missing:
        parts.append(f"Not as expected: {', '.join(missing)}.")
    return " ".join(parts)


SAY: dict[str, Callable[[dict], str]] = {
    "throughput": say_throughput,
    "one_per_actor": say_one_per_actor,
    "concurrency": say_concurrency,
    "fault_storm": say_fault_storm,
    "checkpoint": say_checkpoint,
    "cluster": say_cluster,
    "ledger": say_ledger,
    "chaos": say_chaos,
    "soak": lambda res: _soak().say(res),
}


def _soak():
    import soak

    return soak


# ---------------------------------------------------------------- plots


def _plot(name: str, res: dict, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _rows(res)
    if not rows:
        return False
    if name == "scale":
        import scale

        return scale.plot(res, path)
    if name == "retired_marks_v2":
        import retired_marks_v2

        return retired_marks_v2.plot(res, path)
    fig, ax = plt.subplots(figsize=(7, 4))
    if name == "throughput":
        configs = sorted({r["config"] for r in rows})
        agents = sorted({r["agent_ms"] for r in rows})
        width = 0.8 / (len(configs) + 1)
        for i, a in enumerate(agents):
            d = [r["direct_per_s"] for r in rows if r["agent_ms"] == a]
            ax.bar(i, sum(d) / len(d), width, color="grey", label="direct loop" if i == 0 else None)
            for j, c in enumerate(configs):
                v = [r["ours_per_s"] for r in rows if r["agent_ms"] == a and r["config"] == c]
                ax.bar(
                    i + (j + 1) * width,
                    v[0] if v else 0,
                    width,
                    color=f"C{j}",
                    label=f"ours, {c}" if i == 0 else None,
                )
        ax.set_xticks(
            [i + width * len(configs) / 2 for i in range(len(agents))],
            [f"agent {a} ms" for a in agents],
        )
        ax.set_ylabel("rollouts / s")
        ax.set_title(f"Throughput at concurrency {rows[0]['concurrency']}")
    elif name == "concurrency":
        for j, layout in enumerate(["1 per actor", "many per actor"]):
            rs = sorted(
                (r for r in rows if (r["rollouts_per_actor"] == 1) == (j == 0)),
                key=lambda r: r["in_flight"],
            )
            if rs:
                ax.plot(
                    [r["in_flight"] for r in rs],
                    [r["batch_s"] for r in rs],
                    "o-",
                    label=f"ours, {layout}",
                )
        rs = sorted(rows, key=lambda r: r["in_flight"])
        ax.plot(
            [r["in_flight"] for r in rs],
            [r["direct_s"] for r in rs],
            "s--",
            color="grey",
            label="direct loop",
        )
        ax.axhline(1.0, color="black", lw=0.8, ls=":", label="ideal")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("rollouts in flight")
        ax.set_ylabel("seconds per batch (1 s agents)")
        ax.set_title("Batch time against the ideal")
    elif name == "fault_storm":
        for j, pol in enumerate(["ours", "as-is"]):
            rs = [r for r in rows if r["policy"] == pol]
            ax.plot(
                range(len(rs)),
                [r["left_unacked"] for r in rs],
                "o-",
                color=f"C{j}",
                label=f"{pol}: un-ACKed on Gym",
            )
            blocked = [i for i, r in enumerate(rs) if not r["committed"]]
            ax.plot(
                blocked,
                [rs[i]["left_unacked"] for i in blocked],
                "x",
                color="red",
                ms=9,
                label="checkpoint blocked" if j == 1 else None,
            )
        labels = [
            f"{r['path']} {r['fraction']:.0%}" if r["fraction"] else r["path"]
            for r in rows
            if r["policy"] == "ours"
        ]
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("attempts finished, never ACKed")
        ax.set_title("Fault storm: what each policy leaves on Gym")
    elif name == "checkpoint":
        for j, (kind, servers) in enumerate(
            sorted({(r["kind"], r["servers"]) for r in rows if r["kind"] != "none"})
        ):
            rs = sorted(
                (r for r in rows if r["kind"] == kind and r["servers"] == servers),
                key=lambda r: r["attempts"],
            )
            ax.plot(
                [r["attempts"] for r in rs],
                [r["ours_s"] for r in rs],
                "o-",
                color=f"C{j}",
                label=f"ours, {kind}, {servers} server(s)",
            )
            ax.plot(
                [r["attempts"] for r in rs],
                [r["direct_s"] for r in rs],
                "s:",
                color=f"C{j}",
                alpha=0.6,
                label=f"minimum, {kind}, {servers} server(s)",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("attempts left behind")
        ax.set_ylabel("seconds to committed")
        ax.set_title("Checkpoint latency")
        ax.legend(fontsize=6)
    elif name == "soak":
        _soak().plot(res, ax)
    elif name == "ledger":
        rs = sorted(rows, key=lambda r: r["batch_size"])
        ax.plot(
            [r["batch_size"] for r in rs],
            [r["events_per_s"] for r in rs],
            "o-",
            label=f"{rs[0]['reporters']} reporter actors, one ledger",
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("reports per call")
        ax.set_ylabel("reports absorbed / s")
        ax.set_title("LedgerActor absorb rate")
    else:
        plt.close(fig)
        return False
    if name != "checkpoint":
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# ---------------------------------------------------------------- RESULTS.md


def _load(stem: str) -> dict | None:
    path = RESULTS_DIR / f"{stem}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def _section(res: dict, stem: str, plots: bool, heading: str) -> list[str]:
    out = [
        heading,
        "",
        f"Command: `{res['command']}` ({res['mode']} mode, "
        f"{fmt(res.get('elapsed_s'))} s, {res['started_at']})",
        "",
    ]
    load = load_line(res["machine"].get("load_avg"), res.get("load_end"))
    out += [f"Machine: {machine_line(res['machine'])}" + (f"; {load}" if load else ""), ""]
    say = SAY.get(res["name"], lambda r: r.get("extra", {}).get("headline", ""))(res)
    if say:
        out += [say, ""]
    for t in res.get("tables", []):
        if t["caption"]:
            out += [t["caption"], ""]
        out += [t["markdown"], ""]
    for note in res.get("notes", []):
        out.append(f"- {note}")
    if res.get("notes"):
        out.append("")
    if plots:
        png = RESULTS_DIR / f"{stem}.png"
        try:
            if _plot(res["name"], res, png):
                out += [f"![{stem}](results/{png.name})", ""]
        except Exception as exc:  # a plot must never cost the report
            out += [f"(plot failed: {type(exc).__name__}: {exc})", ""]
    return out


def write_report(
    quick: bool, runs: list[dict[str, Any]], record: list[dict[str, Any]] | None = None
) -> Path:
    try:
        import matplotlib  # noqa: F401

        plots, plot_note = True, ""
    except ImportError:
        plots = False
        plot_note = (
            "Plots skipped: matplotlib is not installed (it is in the optional `bench` "
            "extra: `pip install -e '.[bench]'`, which `make bench` does)."
        )
    info = machine_info()
    lines = [
        "# Benchmarks",
        "",
        "Regenerated by `.venv/bin/python benchmarks/run_all.py --quick` (`make bench`); every "
        "benchmark also runs alone: `.venv/bin/python benchmarks/<name>.py [--quick]`, writing "
        "`build/bench-results/` (`--write`: these tracked results, as `make bench` does). Each one "
        "measures its baseline in the same run and reports ratios; raw numbers are in "
        "`benchmarks/results/<name>.json` (full mode: `<name>_full.json`).",
        "",
        f"Last regenerated {time.strftime('%Y-%m-%d %H:%M')} on: {machine_line(info)}.",
        "",
        "Read every absolute number with the machine in mind: 2 cores shared by the Gym "
        "server, the driver, every Ray process and, while these ran, other engineers' test "
        "suites (each section gives the load average). The ratios against a baseline measured "
        "in the same run, interleaved trial by trial, are the robust figures.",
        "",
    ]
    try:
        lines += glance.results_section()
    except glance.MissingResult as exc:  # a fresh clone's partial run: say what is missing
        lines += ["## At a glance", "", f"(not yet: {exc})", ""]
    if plot_note:
        lines += [plot_note, ""]
    lines += runs_section(quick, load_runs(quick) if record is None else record)
    lines += hotpath_table.section()
    for r in runs:
        if r.get("note"):
            lines += [f"**{r['name']}** did not run: {r['note']}.", ""]
    failed = [r for r in runs if r["rc"] != 0]
    for r in failed:
        lines += [
            f"**{r['name']} failed in this run** (exit {r['rc']}); its section shows the "
            f"previous result, if any. Last output:",
            "",
            "```",
            r["tail"].strip()[-1500:],
            "```",
            "",
        ]
    titles = {
        "throughput": "Throughput",
        "one_per_actor": "One rollout per actor: ours, Ray's floor, the direct loop (issue 20)",
        "concurrency": "Concurrency",
        "fault_storm": "Fault storm",
        "fault_storm_v2": "Fault storm on Gym v2 (gym serve --protocol v2)",
        "retired_marks_v2": "Retired marks on Gym v2 over a long run (issue 18)",
        "checkpoint": "Checkpoint latency",
        "cluster": "Cluster: a node lost mid-batch",
        "ledger": "Ledger",
        "soak": "Soak: memory over a long run",
        "gym_server_memory": "Gym server memory over a long run (no Ray)",
        "gym_server": "Gym server on its own (written by the server engineer)",
        "gym_server_limits": "Gym server limits under hostile clients (issue 30)",
        "chaos": "Chaos: one fault per row",
        "admission": "Admission closed per checkpoint, episodes in flight (`make bench-chaos`)",
        "fault_campaign": "Fault campaign: a trainer killed at instants of its checkpoints "
        "(issue 27, `make bench-chaos`)",
        "scale": "At scale: raylets, 16 Gym servers, big checkpoints (`make bench-scale`)",
        "store_commit": "The durable server's group commit apart from the web stack",
        "receipts_real_gym": "Receipts from a real Gym without a receipt route: status bytes",
        "skyrl_generate": "SkyRL's generate(): the layer against a SkyRL generator posting /run",
        "verl_overhead": "verl's agent loop through the layer against a direct /run (issue 28; "
        "`.venv-verl/bin/python benchmarks/verl_overhead.py`)",
    }
    for name in BENCHMARKS:
        if name not in titles:
            continue  # shown in the hot-path section
        lines += [f"## {titles[name]}", ""]
        primary = _load(name if quick else f"{name}_full")
        secondary = _load(f"{name}_full" if quick else name)
        if primary is None and secondary is None:
            lines += ["(no result yet)", ""]
            continue
        if primary is not None:
            lines += _section(
                primary,
                name if quick else f"{name}_full",
                plots,
                f"### {'Quick' if quick else 'Full'} mode",
            )
        if secondary is not None:
            lines += _section(
                secondary,
                f"{name}_full" if quick else name,
                plots,
                f"### {'Full' if quick else 'Quick'} mode",
            )
        for stem, heading in PART_RESULTS.get(name, ()):
            part = _load(stem)
            if part is not None:
                lines += _section(part, stem, plots, f"### {heading}")
    path = BENCH_DIR / "RESULTS.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    glance.main(["--readme"])  # the README's cost figures are the same results' (glance.py)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="quick mode of every benchmark")
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS, help="run only these")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="do not run anything; rewrite RESULTS.md from results/ (add --quick for the "
        "report `make bench` writes; without it, the full-mode report)",
    )
    parser.add_argument(
        "--before",
        metavar="REV",
        default=None,
        help=f"also measure the 'before' column at REV (make bench-compare: "
        f"{BEFORE_REV}) in a temporary worktree",
    )
    args = parser.parse_args(argv)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    record: list[dict[str, Any]] | None = None
    if not args.report_only:
        _adopt_orphans()
        if args.before:
            runs += run_before(args.before, args.quick)
        names = args.only or [
            b for b in BENCHMARKS if b not in STANDALONE and not (args.quick and b in QUICK_INSIDE)
        ]
        t0 = time.perf_counter()
        warned = False
        for name in names:
            runs.append(run_one(name, args.quick))
            so_far = time.perf_counter() - t0
            if args.quick and not args.only and not warned and so_far > BUDGET_S:
                warned = True
                common.progress(
                    f"run_all: WARNING: {so_far / 60:.1f} min so far, past the "
                    f"{BUDGET_S // 60}-minute budget of `make bench` (load "
                    f"{os.getloadavg()[0]:.1f})"
                )
        record = record_runs(args.quick, runs, whole=not args.only)
    path = write_report(args.quick, runs, record)
    total = sum(r["seconds"] for r in runs)
    cpu = sum(r.get("cpu_s", 0.0) for r in runs)
    print(f"wrote {path.relative_to(REPO)}")
    for r in runs:
        state = "skipped" if r.get("skipped") else "ok" if r["rc"] == 0 else "FAILED"
        print(
            f"{r['name']:28s} {state:7s} {r['seconds']:6.0f}s wall {r.get('cpu_s', 0.0):6.0f}s CPU"
            f"  load {' -> '.join(f'{x:.1f}' for x in r.get('load', []))}"
        )
    if runs:
        print(f"{'total':28s} {'':7s} {total:6.0f}s wall {cpu:6.0f}s CPU ({total / 60:.1f} min)")
    if args.quick and not args.only and not args.report_only and total > BUDGET_S:
        print(
            f"WARNING: make bench took {total / 60:.1f} min, over its {BUDGET_S // 60}-minute "
            f"budget on a quiet machine (load now {os.getloadavg()[0]:.1f})",
            file=sys.stderr,
        )
    return 1 if any(r["rc"] != 0 for r in runs) else 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    sys.exit(main())
