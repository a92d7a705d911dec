"""Shared benchmark harness: machine facts, trials with warm-up, percentiles, process sampling
(RSS and CPU of the driver, the Ray workers and the Ray system processes, via psutil), local Ray
start-up on loopback, and writing results as JSON plus a short markdown table.

Every benchmark script imports this first; importing it puts the repository on ``sys.path`` (and
on ``PYTHONPATH`` for Ray workers) and sets the loopback environment Ray needs on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
# where a benchmark run alone writes (ignored by git): only ``--write`` (which run_all.py, i.e.
# ``make bench``, passes) writes the tracked files in RESULTS_DIR
SCRATCH_DIR = REPO / "build" / "bench-results"
_out_dir = SCRATCH_DIR


def out_dir() -> Path:
    """Where this run's result files go: RESULTS_DIR with ``--write``, else SCRATCH_DIR."""
    return _out_dir


if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
)

MB = 1024 * 1024


# ---------------------------------------------------------------- machine and command


def machine_info() -> dict[str, Any]:
    """Cores, memory, CPU model, Python and Ray versions, and the git commit measured."""
    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    info["memory_gb"] = round(psutil.virtual_memory().total / 1024**3, 1)
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
        info["cpu_model"] = next(
            line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")
        )
    except (OSError, StopIteration):
        info["cpu_model"] = platform.processor() or None
    info["load_avg"] = list(os.getloadavg())
    try:
        import ray

        info["ray"] = ray.__version__
    except ImportError:
        info["ray"] = None
    try:
        info["git_commit"] = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        info["git_commit"] = None
    return info


def machine_line(info: dict[str, Any]) -> str:
    return (
        f"{info['cores']} cores, {info['memory_gb']} GB, {info.get('cpu_model')}, "
        f"Python {info['python']}, Ray {info['ray']}, commit {info.get('git_commit')}"
    )


def load_line(start: Sequence[float] | None, end: Sequence[float] | None) -> str:
    """The 1-minute load average at start and end: other work on the machine skews results."""
    if not start or not end:
        return ""
    return f"load average (1 min) {start[0]:.1f} at start, {end[0]:.1f} at end"


def command_line(argv: Sequence[str] | None = None) -> str:
    """The exact command that produced a result, relative to the repository root."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    try:
        script_s = str(script.relative_to(REPO))
    except ValueError:
        script_s = str(script)
    return " ".join([".venv/bin/python", script_s, *map(shlex.quote, argv[1:])])


# ---------------------------------------------------------------- statistics and trials


def percentile(values: Sequence[float], p: float) -> float | None:
    """Linear-interpolated percentile (p in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(values: Sequence[float]) -> dict[str, float | None]:
    """median, min, max, p50, p90, p99 and the count of a sample."""
    if not values:
        return {
            "n": 0,
            "median": None,
            "min": None,
            "max": None,
            "p50": None,
            "p90": None,
            "p99": None,
        }
    return {
        "n": len(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
    }


@dataclass
class Trials:
    """Wall times of the measured trials (the warm-up runs are not in them) and their values."""

    seconds: list[float] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best_s(self) -> float:
        return min(self.seconds)

    def median_value(self) -> Any:
        """The value of the trial whose time is the median (an odd count gives a real trial)."""
        order = sorted(range(len(self.seconds)), key=self.seconds.__getitem__)
        return self.values[order[len(order) // 2]]


def run_trials(fn: Callable[[], Any], *, warmup: int = 1, trials: int = 3) -> Trials:
    """Call ``fn`` ``warmup`` times untimed, then ``trials`` times timed."""
    for _ in range(warmup):
        fn()
    out = Trials()
    for _ in range(trials):
        t0 = time.perf_counter()
        value = fn()
        out.seconds.append(time.perf_counter() - t0)
        out.values.append(value)
    return out


async def run_trials_async(
    fn: Callable[[], Awaitable[Any]], *, warmup: int = 1, trials: int = 3
) -> Trials:
    """The async twin of :func:`run_trials`."""
    for _ in range(warmup):
        await fn()
    out = Trials()
    for _ in range(trials):
        t0 = time.perf_counter()
        value = await fn()
        out.seconds.append(time.perf_counter() - t0)
        out.values.append(value)
    return out


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b in (None, 0):
        return None
    return a / b


# ---------------------------------------------------------------- processes (psutil)


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    start: float  # creation time: with the pid, identifies the process
    cpu_s: float  # user + system seconds, reaped children included
    rss: int  # bytes
    kind: str  # "driver", "worker", "ray_system" or "other"


_ATTRS = ["pid", "ppid", "create_time", "cpu_times", "memory_info", "cmdline"]


def _row(info: dict[str, Any]) -> tuple[int, float, float, int, str] | None:
    """(ppid, start, cpu_s, rss, command line) from ``process_iter``'s info, or None when the
    process went away or hid its figures while it was read."""
    times, memory = info.get("cpu_times"), info.get("memory_info")
    if times is None or memory is None or info.get("create_time") is None:
        return None
    cpu = (
        times.user
        + times.system
        + getattr(times, "children_user", 0.0)
        + getattr(times, "children_system", 0.0)
    )
    return info["ppid"], info["create_time"], cpu, memory.rss, " ".join(info.get("cmdline") or ())


def _kind(pid: int, root: int, cmd: str) -> str:
    """``driver``, ``worker:<ActorClass>`` (``worker:IDLE`` for a pooled idle worker),
    ``ray_system`` (raylet, GCS, agents) or ``other`` (e.g. a Gym server subprocess)."""
    if pid == root:
        return "driver"
    if cmd.startswith("ray::"):
        name = (cmd[5:].split() or [""])[0].split(".")[0]
        if name in ("RuntimeEnvAgent", "DashboardAgent"):
            return "ray_system"
        return "worker:" + (name or "?")
    if "default_worker.py" in cmd:
        return "worker:?"
    exe = os.path.basename(cmd.split(" ", 1)[0])
    if exe in ("raylet", "gcs_server") or any(
        s in cmd
        for s in (
            "/raylet ",
            "gcs_server",
            "ray/dashboard",
            "log_monitor",
            "runtime_env",
            "monitor.py",
            "ray/_private",
            "ray/autoscaler",
        )
    ):
        return "ray_system"
    return "other"


def group(kind: str) -> str:
    """The coarse group of a kind: driver, worker, ray_system or other."""
    return kind.split(":", 1)[0]


def process_tree(root: int | None = None, exclude: Iterable[int] = ()) -> list[ProcInfo]:
    """The process ``root`` (default: this one) and all its descendants, minus ``exclude``
    subtrees. A local Ray started by this process hangs below it, so other users' Ray sessions
    on the same machine are never counted."""
    root = os.getpid() if root is None else root
    excluded = set(exclude)
    table: dict[int, tuple[int, float, float, int, str]] = {}
    for proc in psutil.process_iter(_ATTRS, ad_value=None):
        row = _row(proc.info)
        if row is not None:
            table[proc.info["pid"]] = row
    children: dict[int, list[int]] = {}
    for pid, row in table.items():
        children.setdefault(row[0], []).append(pid)
    out: list[ProcInfo] = []
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid in excluded or pid not in table:
            continue
        ppid, start, cpu, rss, cmd = table[pid]
        out.append(ProcInfo(pid, ppid, start, cpu, rss, _kind(pid, root, cmd)))
        stack.extend(children.get(pid, ()))
    return out


def pss_bytes(pid: int) -> int | None:
    """Proportional set size (shared pages split between their users), or None."""
    try:
        return getattr(psutil.Process(pid).memory_full_info(), "pss", None)
    except (psutil.Error, OSError):
        return None


def process_cpu_s(pid: int) -> float | None:
    try:
        row = _row(psutil.Process(pid).as_dict(_ATTRS, ad_value=None))
    except psutil.Error:
        return None
    return None if row is None else row[2]


@dataclass
class ProcStats:
    """What a :class:`ProcessSampler` saw between start and stop. Memory in MB, CPU in seconds.
    ``by_kind``: per kind (see :func:`process_tree`) the peak RSS, the peak process count and
    the CPU seconds used in the window."""

    wall_s: float = 0.0
    peak_rss_total_mb: float = 0.0
    peak_rss_driver_mb: float = 0.0
    peak_rss_workers_mb: float = 0.0
    peak_rss_ray_system_mb: float = 0.0
    peak_workers: int = 0
    cpu_s_total: float = 0.0
    cpu_s_driver: float = 0.0
    cpu_s_workers: float = 0.0
    cpu_s_ray_system: float = 0.0
    samples: int = 0
    sampler_cpu_s: float = 0.0  # the sampler thread's own CPU (left out of the driver's)
    by_kind: dict[str, dict[str, float]] = field(default_factory=dict)

    def kind(self, prefix: str) -> dict[str, float]:
        """Totals over the kinds starting with ``prefix`` (peaks summed: an upper bound)."""
        out = {"peak_rss_mb": 0.0, "peak_count": 0, "cpu_s": 0.0}
        for k, v in self.by_kind.items():
            if k.startswith(prefix):
                for name in out:
                    out[name] += v.get(name, 0.0)
        return out

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in asdict(self).items():
            out[k] = round(v, 3) if isinstance(v, float) else v
        out["by_kind"] = {
            k: {n: round(x, 3) for n, x in v.items()} for k, v in self.by_kind.items()
        }
        return out


class ProcessSampler:
    """Samples RSS and CPU of this process tree in a thread (``with`` block or start/stop).

    CPU is the growth of user+system time of every process seen (processes that start during
    the window count from zero; one that ends loses at most one interval). ``exclude`` drops
    whole subtrees (e.g. Gym server subprocesses, measured on their own).
    """

    def __init__(self, *, exclude: Iterable[int] = (), interval_s: float = 0.25) -> None:
        self.exclude = set(exclude)
        self.interval_s = interval_s
        self.stats = ProcStats()
        self._base: dict[tuple[int, int], float] = {}
        self._last: dict[tuple[int, int], tuple[str, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def _sample(self) -> None:
        procs = process_tree(exclude=self.exclude)
        s = self.stats
        s.samples += 1
        rss: dict[str, int] = {}
        count: dict[str, int] = {}
        for p in procs:
            rss[p.kind] = rss.get(p.kind, 0) + p.rss
            count[p.kind] = count.get(p.kind, 0) + 1
            self._last[(p.pid, p.start)] = (p.kind, p.cpu_s)
        for kind in rss:
            k = s.by_kind.setdefault(kind, {"peak_rss_mb": 0.0, "peak_count": 0, "cpu_s": 0.0})
            k["peak_rss_mb"] = max(k["peak_rss_mb"], rss[kind] / MB)
            k["peak_count"] = max(k["peak_count"], count[kind])

        def grp(name: str) -> int:
            return sum(v for k, v in rss.items() if group(k) == name)

        s.peak_rss_total_mb = max(s.peak_rss_total_mb, sum(rss.values()) / MB)
        s.peak_rss_driver_mb = max(s.peak_rss_driver_mb, grp("driver") / MB)
        s.peak_rss_workers_mb = max(s.peak_rss_workers_mb, grp("worker") / MB)
        s.peak_rss_ray_system_mb = max(s.peak_rss_ray_system_mb, grp("ray_system") / MB)
        s.peak_workers = max(
            s.peak_workers, sum(v for k, v in count.items() if group(k) == "worker")
        )

    def _timed_sample(self) -> None:
        t0 = time.thread_time()
        self._sample()
        self.stats.sampler_cpu_s += time.thread_time() - t0

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._timed_sample()

    def start(self) -> ProcessSampler:
        for p in process_tree(exclude=self.exclude):
            self._base[(p.pid, p.start)] = p.cpu_s
        self._t0 = time.perf_counter()
        self._timed_sample()
        self._thread = threading.Thread(target=self._loop, name="proc-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> ProcStats:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._timed_sample()
        s = self.stats
        s.wall_s = time.perf_counter() - self._t0
        cpu: dict[str, float] = {}
        for key, (kind, last) in self._last.items():
            cpu[kind] = cpu.get(kind, 0.0) + max(0.0, last - self._base.get(key, 0.0))
        if "driver" in cpu:  # the sampler's own scans of the process table are not the driver's
            cpu["driver"] = max(0.0, cpu["driver"] - s.sampler_cpu_s)
        for kind, v in cpu.items():
            s.by_kind.setdefault(kind, {"peak_rss_mb": 0.0, "peak_count": 0, "cpu_s": 0.0})
            s.by_kind[kind]["cpu_s"] = v

        def grp(name: str) -> float:
            return sum(v for k, v in cpu.items() if group(k) == name)

        s.cpu_s_driver, s.cpu_s_workers = grp("driver"), grp("worker")
        s.cpu_s_ray_system = grp("ray_system")
        s.cpu_s_total = sum(cpu.values())
        return s

    def __enter__(self) -> ProcessSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def worker_memory(kind: str = "worker", *, exclude: Iterable[int] = ()) -> dict[str, float]:
    """Current RSS and PSS (MB) of the processes below this one whose kind starts with
    ``kind`` (default: every Ray worker; ``worker:RolloutActor`` for the rollout actors)."""
    workers = [p for p in process_tree(exclude=exclude) if p.kind.startswith(kind)]
    pss = [pss_bytes(p.pid) for p in workers]
    return {
        "workers": len(workers),
        "rss_mb": round(sum(p.rss for p in workers) / MB, 1),
        "pss_mb": round(sum(x for x in pss if x) / MB, 1),
        "rss_per_worker_mb": round(sum(p.rss for p in workers) / MB / len(workers), 1)
        if workers
        else None,
        "pss_per_worker_mb": round(sum(x for x in pss if x) / MB / len(workers), 1)
        if workers
        else None,
    }


# ---------------------------------------------------------------- Ray on loopback


def start_ray(num_cpus: int = 4, **kwargs: Any) -> Any:
    """A local Ray bound to loopback, quiet, without the dashboard. Returns the ray module."""
    import ray

    from rl_gym_actors import start_local_ray

    if not ray.is_initialized():
        # address="local": a Ray of our own, never another process's cluster found in /tmp/ray
        opts = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        if kwargs.get("address", "local") == "local":
            kwargs.pop("address", None)
            start_local_ray(num_cpus=num_cpus, **opts, **kwargs)  # retried if Ray misses its 30 s
        else:
            ray.init(num_cpus=num_cpus, _node_ip_address="127.0.0.1", **opts, **kwargs)
    return ray


def stop_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


@contextlib.contextmanager
def ray_and_tmp(prefix: str, num_cpus: int = 2) -> Iterator[Path]:
    """A local Ray (:func:`start_ray`) and a temporary directory for one benchmark body; both
    gone when it ends, however it ends."""
    start_ray(num_cpus=num_cpus)
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        stop_ray()


def storm_plan(
    result: Result, args: Any, quick: dict[str, Any], full: dict[str, Any], policy: Any
) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    """A fault storm's parameters (``quick`` or ``full``, recorded with its ``policy``) and its
    scenarios: one batch without faults, then each fault path at each fraction of the rows."""
    p = quick if args.quick else full
    result.params.update(p)
    result.params["policy"] = policy.model_dump()
    return p, [("none", 0.0)] + [(path, f) for path in p["paths"] for f in p["fractions"]]


def run_async(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


# ---------------------------------------------------------------- results


def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v:
            return "-"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 100:
            return f"{v:.1f}"
        return f"{v:.{digits}g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(v) for v in row) + " |")
    return "\n".join(lines)


@dataclass
class Result:
    """One benchmark's output: what it ran, on what, the rows, and a markdown table."""

    name: str
    title: str
    mode: str  # "quick" or "full"
    command: str = field(default_factory=command_line)
    machine: dict[str, Any] = field(default_factory=machine_info)
    started_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    params: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    tables: list[tuple[str, str]] = field(default_factory=list)  # (caption, markdown)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float | None = None
    load_end: list[float] | None = None

    def add_table(
        self, caption: str, headers: Sequence[str], rows: Iterable[Sequence[Any]]
    ) -> None:
        self.tables.append((caption, md_table(headers, rows)))

    def markdown(self) -> str:
        parts = [
            f"### {self.title}",
            "",
            f"`{self.command}` ({self.mode} mode, {fmt(self.elapsed_s)} s)",
            "",
            f"Machine: {machine_line(self.machine)}; "
            f"{load_line(self.machine.get('load_avg'), self.load_end)}",
            "",
        ]
        for caption, table in self.tables:
            if caption:
                parts += [caption, ""]
            parts += [table, ""]
        for note in self.notes:
            parts += [f"- {note}"]
        return "\n".join(parts).rstrip() + "\n"

    @property
    def stem(self) -> str:
        """``<name>`` for quick mode (what ``make bench`` regenerates), ``<name>_full`` else."""
        return self.name if self.mode == "quick" else f"{self.name}_full"

    def write(self) -> tuple[Path, Path]:
        """``<stem>.json`` and ``<stem>.md`` in :func:`out_dir` (the tracked results only with
        ``--write``)."""
        out = out_dir()
        out.mkdir(parents=True, exist_ok=True)
        jpath = out / f"{self.stem}.json"
        mpath = out / f"{self.stem}.md"
        payload = asdict(self)
        payload["tables"] = [{"caption": c, "markdown": t} for c, t in self.tables]
        tmp = jpath.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        os.replace(tmp, jpath)
        mpath.write_text(self.markdown())
        return jpath, mpath


def bench_main(
    name: str,
    title: str,
    body: Callable[[Result, Any], None],
    argv: Sequence[str] | None = None,
    *,
    extra_args: Callable[[Any], None] | None = None,
) -> Result:
    """Parse ``--quick``, ``--write`` (and ``extra_args``), run ``body(result, args)``, time
    it, write the result files: into benchmarks/results/ (tracked) with ``--write``, else into
    build/bench-results/, so that a benchmark run alone changes nothing git tracks."""
    import argparse
    import logging

    global _out_dir
    parser = argparse.ArgumentParser(description=title)
    parser.add_argument("--quick", action="store_true", help="small sizes, under two minutes")
    parser.add_argument(
        "--write",
        action="store_true",
        help="write the tracked benchmarks/results/ files (run_all.py, i.e. make bench, passes "
        "it; default: build/bench-results/, which git ignores)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    if extra_args is not None:
        extra_args(parser)
    args = parser.parse_args(argv)
    _out_dir = RESULTS_DIR if args.write else SCRATCH_DIR
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(message)s",
    )
    result = Result(name=name, title=title, mode="quick" if args.quick else "full")
    result.params["args"] = vars(args)
    t0 = time.perf_counter()
    body(result, args)
    result.elapsed_s = round(time.perf_counter() - t0, 1)
    result.load_end = list(os.getloadavg())
    j, m = result.write()
    print(result.markdown())
    print(f"wrote {j.relative_to(REPO)} and {m.relative_to(REPO)}")
    return result


def progress(msg: str) -> None:
    """One progress line on stderr (benchmarks run for minutes; say what is happening)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
