"""The hot-path figures of issue 10, before (e581378) and after, from the benchmark results.

``run_all.py --quick --before e581378`` (what ``make bench`` runs) measures the "before" column
in the same run: it checks e581378 out in a temporary worktree, copies the current benchmark
scripts into it, and runs throughput, concurrency, the Gym server benchmark and the py-spy profile
there, writing ``results/<name>_before.json``. The table below is built from those and the
current ``results/<name>.json``; goals are the issue's.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from common import RESULTS_DIR, fmt, md_table

BEFORE_REV = "e581378"
BEFORE_BENCHMARKS = ["throughput", "concurrency", "gym_server", "hotpath_profile"]


def load(stem: str) -> dict | None:
    path = RESULTS_DIR / f"{stem}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _tp(res: dict | None, config: str, agent_ms: int) -> dict | None:
    for r in (res or {}).get("rows", []):
        if r["config"] == config and r["agent_ms"] == agent_ms:
            return r
    return None


def _cc(res: dict | None, in_flight: int) -> dict | None:
    rows = [r for r in (res or {}).get("rows", []) if r["in_flight"] == in_flight]
    return rows[0] if rows else None


def _gym(res: dict | None, server: str, concurrency: int) -> dict | None:
    for r in (res or {}).get("rows", []):
        if r["server"] == server and r["concurrency"] == concurrency:
            return r
    return None


Figure = tuple[str, Callable[[dict], str | None], Callable[[dict], bool | None], str]


def _ratio_line(config: str, agent_ms: int) -> Callable[[dict], str | None]:
    def get(runs: dict) -> str | None:
        r = _tp(runs["throughput"], config, agent_ms)
        if r is None:
            return None
        return f"{r['ours_per_s']:,.0f} vs {r['direct_per_s']:,.0f} ({r['ratio']:.2f}x)"

    return get


def _ratio_ok(config: str, agent_ms: int, goal: float) -> Callable[[dict], bool | None]:
    def ok(runs: dict) -> bool | None:
        r = _tp(runs["throughput"], config, agent_ms)
        return None if r is None else r["ratio"] >= goal

    return ok


def _cpu(config: str) -> Callable[[dict], str | None]:
    def get(runs: dict) -> str | None:
        r = _tp(runs["throughput"], config, 0)
        if r is None:
            return None
        return (
            f"{r['cpu_ms_per_rollout']:.2f} ms (direct loop "
            f"{r['direct_cpu_ms_per_rollout']:.2f} ms)"
        )

    return get


def _cpu_ok(config: str, goal: float) -> Callable[[dict], bool | None]:
    def ok(runs: dict) -> bool | None:
        r = _tp(runs["throughput"], config, 0)
        return None if r is None else r["cpu_ms_per_rollout"] <= goal

    return ok


def _latency(runs: dict) -> str | None:
    a, b = (_tp(runs["throughput"], c, 0) for c in ("8 per actor", "1 per actor"))
    if a is None or b is None:
        return None
    return f"{a['added_p50_ms']:.1f} ms (8/actor), {b['added_p50_ms']:.1f} ms (1/actor)"


def _latency_ok(runs: dict) -> bool | None:
    rows = [_tp(runs["throughput"], c, 0) for c in ("8 per actor", "1 per actor")]
    if None in rows:
        return None
    return all(r["added_p50_ms"] <= 3.0 for r in rows)


def _slow(runs: dict) -> str | None:
    rows = [_tp(runs["throughput"], c, 100) for c in ("8 per actor", "1 per actor")]
    if None in rows:
        return None
    lo, hi = sorted(r["ratio"] for r in rows)
    return f"{lo:.2f}-{hi:.2f}x"


def _slow_ok(runs: dict) -> bool | None:
    rows = [_tp(runs["throughput"], c, 100) for c in ("8 per actor", "1 per actor")]
    return None if None in rows else all(r["ratio"] >= 0.97 for r in rows)


def _scale(runs: dict) -> str | None:
    r = _cc(runs["concurrency"], 4096)
    if r is None:
        return None
    return f"{r['batch_s']:.2f} s vs {r['direct_s']:.2f} s ({r['vs_direct']:.2f}x)"


def _scale_ok(runs: dict) -> bool | None:
    r = _cc(runs["concurrency"], 4096)
    return None if r is None else r["vs_direct"] <= 1.1


def _gym_line(runs: dict) -> str | None:
    s, c = _gym(runs["gym_server"], "state-dir", 16), _gym(runs["gym_server"], "ceiling", 16)
    if s is None or c is None:
        return None
    return f"{s['cycles_per_s']:,.0f} vs {c['cycles_per_s']:,.0f} ({s['ratio_to_ceiling']:.2f}x)"


def _gym_ok(runs: dict) -> bool | None:
    s = _gym(runs["gym_server"], "state-dir", 16)
    return None if s is None else s["ratio_to_ceiling"] >= 0.5


FIGURES: list[Figure] = [
    (
        "rollouts/s vs the direct asyncio loop, instant agents, 8 per actor",
        _ratio_line("8 per actor", 0),
        _ratio_ok("8 per actor", 0, 0.6),
        ">= 0.6x",
    ),
    (
        "the same, 1 per actor",
        _ratio_line("1 per actor", 0),
        _ratio_ok("1 per actor", 0, 0.4),
        ">= 0.4x",
    ),
    (
        "CPU per rollout over the driver, rollout actors and ledger (Gym apart), 8 per actor",
        _cpu("8 per actor"),
        _cpu_ok("8 per actor", 1.2),
        "<= 1.2 ms",
    ),
    ("the same (CPU), 1 per actor", _cpu("1 per actor"), _cpu_ok("1 per actor", 2.5), "<= 2.5 ms"),
    ("added latency per rollout, p50, concurrency 16", _latency, _latency_ok, "<= 3 ms"),
    ("100 ms agents, ours / direct", _slow, _slow_ok, ">= 0.97x"),
    (
        "4,096 rollouts in flight, 1 s agents, batch time ours / direct",
        _scale,
        _scale_ok,
        "<= 1.1x",
    ),
    (
        "Gym server /run+receipt+ACK cycles/s with --state-dir, concurrency 16, vs an aiohttp "
        "hello world",
        _gym_line,
        _gym_ok,
        ">= 0.5x",
    ),
]


def runs(suffix: str) -> dict[str, dict | None]:
    return {name: load(name + suffix) for name in ("throughput", "concurrency", "gym_server")}


def _load_avg(res: dict | None) -> str:
    if not res:
        return "-"
    start = (res.get("machine", {}).get("load_avg") or [None])[0]
    end = (res.get("load_end") or [None])[0]
    return f"{fmt(start)} -> {fmt(end)}"


LOADED = 4.0  # a 1-minute load average above this (2 cores) makes wall-clock ratios moot


def _loaded(res: dict | None) -> bool:
    if not res:
        return False
    loads = [(res.get("machine", {}).get("load_avg") or [0])[0], (res.get("load_end") or [0])[0]]
    return max(loads) > LOADED


def section() -> list[str]:
    """The markdown section: the figures, then each run's command and load."""
    before, after = runs("_before"), runs("")
    if not any(after.values()):
        return []
    rows = []
    busy = False
    for label, get, ok, goal in FIGURES:
        b = get(before) if any(before.values()) else None
        a = get(after)
        met = ok(after)
        verdict = "-" if met is None else ("met" if met else "not met")
        source = after[
            "gym_server"
            if "Gym server" in label
            else "concurrency"
            if "4,096" in label
            else "throughput"
        ]
        if met is not None and "CPU" not in label and _loaded(source):
            verdict += " (*)"
            busy = True
        rows.append([label, b or "-", a or "-", goal, verdict])
    out = [
        "## Hot path (issue 10): before and after",
        "",
        f"Before = commit {BEFORE_REV}, measured by `make bench-compare` from a temporary "
        f"worktree of it with the same benchmark scripts (see benchmarks/hotpath_table.py; "
        f"when each ran is below, '-' where the script cannot run against it); "
        f"after = this tree. Quick mode, 2 shared cores: compare the ratios, each measured "
        f"against its own baseline in its own run.",
        "",
        md_table(["figure", f"before ({BEFORE_REV})", "after", "goal", "after vs goal"], rows),
        "",
    ]
    if busy:
        out += [
            f"(*) a wall-clock figure measured while the machine's load average was above "
            f"{LOADED:g} (other work on its 2 cores): the direct loop, one process, and ours, "
            f"several, are slowed unequally, so the ratio says little either way; CPU per "
            f"rollout is the figure that holds under load.",
            "",
        ]
    loads = []
    for name in ("throughput", "concurrency", "gym_server"):
        loads.append(
            [
                name,
                (before[name] or {}).get("started_at", "-"),
                _load_avg(before[name]),
                (after[name] or {}).get("started_at", "-"),
                _load_avg(after[name]),
            ]
        )
    out += [
        "Runs behind it (load average, 1 min, at start -> end):",
        "",
        md_table(
            ["benchmark", "before: started", "before: load", "after: started", "after: load"], loads
        ),
        "",
    ]
    out += profile_section()
    return out


def _top(proc: dict, n: int) -> list[str]:
    return [f"{f} {p}%" for f, p in proc.get("self", [])[:n]]


def profile_section() -> list[str]:
    """py-spy, before and after: CPU per rollout per process and the top functions."""
    before, after = load("hotpath_profile_before"), load("hotpath_profile_after")
    if after is None and before is None:
        return []
    out = [
        "### Where a rollout's CPU goes (py-spy), before and after",
        "",
        "Command: `.venv/bin/python benchmarks/hotpath_profile.py --quick --label after` "
        "(needs `pip install py-spy`; `run_all.py` runs it with `--label before` in the "
        f"{BEFORE_REV} worktree too). Instant agents, 2 actors x 8 rollouts, batches of 200 "
        "back to back; py-spy samples each process for the same window; CPU from psutil. "
        "Top functions by own time, as a share of that process's busy samples. The rollout "
        "actor row is one of the two actors; its CPU is divided by every rollout, so the "
        "actors together cost twice its figure.",
        "",
    ]
    for label, res in (("before", before), ("after", after)):
        if res is None:
            continue
        ex = res["extra"]
        out += [
            f"{label} ({res['machine'].get('git_commit')}): {ex['rollouts']} rollouts in "
            f"{ex['wall_s']} s ({ex['rollouts_per_s']}/s); load "
            f"{_load_avg(res)}",
            "",
        ]
        rows = []
        for kind, proc in ex["processes"].items():
            threads = ", ".join(
                f"{k} {v}" for k, v in list(proc["threads_cpu_ms_per_rollout"].items())[:3]
            )
            rows.append([kind, proc["cpu_ms_per_rollout"], threads, *_top(proc, 5)])
        out += [
            md_table(
                [
                    "process",
                    "CPU ms / rollout",
                    "busiest threads (ms / rollout)",
                    "#1",
                    "#2",
                    "#3",
                    "#4",
                    "#5",
                ],
                rows,
            ),
            "",
        ]
        cats = [
            [kind, ", ".join(f"{c} {v}%" for c, v in proc["categories"].items())]
            for kind, proc in ex["processes"].items()
            if proc.get("categories")
        ]
        if cats:
            out += [
                f"{label}: own time by where it is spent (innermost frame's module):",
                "",
                md_table(["process", "share of busy samples"], cats),
                "",
            ]
    return out
