"""Where a Gym server spends its CPU: py-spy samples one ``gym serve`` process (in memory or with
a state dir) while benchmarks/gym_server.py's cycle load (/run + receipt + ACK) runs against it,
and prints the functions with the most samples, by own time and by time including callees.

    .venv/bin/pip install py-spy          # the bench extra, or by hand
    .venv/bin/python benchmarks/profile_gym_server.py [--state-dir] [--cycles 3000] [--top 25]

py-spy's raw output (collapsed stacks) is kept beside the summary when --out is given.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts the repository on sys.path)

from rl_gym_actors.testing.gym_process import GymServerProcess


def _frame(frame: str) -> str:
    """``func (path/to/module.py:123)`` -> ``module.py:func``."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    return f"{Path(path).name}:{name}"


def top_functions(
    collapsed: Path, top: int
) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """Samples, and the ``top`` functions by own time and by time including callees (percent)."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        samples += n
        frames = [_frame(f) for f in stack.split(";") if f]
        own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
    pct = lambda c: [(f, 100 * n / max(samples, 1)) for f, n in c.most_common(top)]  # noqa: E731
    return samples, pct(own), pct(total)


def summarize(collapsed: Path, top: int) -> str:
    samples, own, total = top_functions(collapsed, top)
    lines = [f"{samples} samples", "", "own time:"]
    lines += [f"  {p:5.1f}%  {f}" for f, p in own]
    lines += ["", "including callees:"]
    lines += [f"  {p:5.1f}%  {f}" for f, p in total]
    return "\n".join(lines)


def profile_load(pid: int, load: Callable[[], Any], out: Path, *, gil: bool = False) -> Any:
    """Run ``load()`` while py-spy samples process ``pid`` into ``out`` (collapsed stacks);
    ``gil``: only the thread holding the GIL (the Python work, without threads that wait)."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    spy = subprocess.Popen(
        [
            py_spy,
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--rate",
            "200",
            "--output",
            str(out),
            "--nonblocking",
            *(["--gil"] if gil else []),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(1.0)  # py-spy attaches
        return load()
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(30)


def main() -> int:
    from gym_server import TOKEN, cycles

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-dir", action="store_true")
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=None, help="keep py-spy's collapsed stacks here")
    ap.add_argument(
        "--gil", action="store_true", help="sample only the thread holding the GIL (CPU in Python)"
    )
    args = ap.parse_args()
    state_dir = tempfile.mkdtemp(prefix="gym-profile-") if args.state_dir else None
    raw = Path(args.out or tempfile.mktemp(prefix="gym-profile-", suffix=".txt"))
    server = GymServerProcess(token=TOKEN, allow_faults=False, state_dir=state_dir).start()
    try:
        asyncio.run(cycles(server.url, 200, args.concurrency, "warm"))
        out = profile_load(
            server.pid,
            lambda: asyncio.run(cycles(server.url, args.cycles, args.concurrency, "prof")),
            raw,
            gil=args.gil,
        )
    finally:
        server.stop()
        if state_dir:
            shutil.rmtree(state_dir, ignore_errors=True)
    rate = (args.cycles - out["errors"]) / out["seconds"]
    print(
        f"gym serve {'--state-dir' if args.state_dir else '(memory)'}, concurrency "
        f"{args.concurrency}: {rate:.0f} cycles/s under py-spy"
    )
    print(summarize(raw, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
