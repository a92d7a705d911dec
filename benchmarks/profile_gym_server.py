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
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: F401  (puts the repository on sys.path)
from gym_server import TOKEN, cycles

from rl_gym_actors.testing.gym_process import GymServerProcess


def _frame(frame: str) -> str:
    """``func (path/to/module.py:123)`` -> ``module.py:func``."""
    name, _, where = frame.partition(" (")
    path = where.rsplit(":", 1)[0]
    return f"{Path(path).name}:{name}"


def summarize(collapsed: Path, top: int) -> str:
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
    lines = [f"{samples} samples", "", "own time:"]
    lines += [f"  {100 * n / samples:5.1f}%  {f}" for f, n in own.most_common(top)]
    lines += ["", "including callees:"]
    lines += [f"  {100 * n / samples:5.1f}%  {f}" for f, n in total.most_common(top)]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state-dir", action="store_true")
    ap.add_argument("--cycles", type=int, default=3000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=None, help="keep py-spy's collapsed stacks here")
    args = ap.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    state_dir = tempfile.mkdtemp(prefix="gym-profile-") if args.state_dir else None
    raw = Path(args.out or tempfile.mktemp(prefix="gym-profile-", suffix=".txt"))
    server = GymServerProcess(token=TOKEN, allow_faults=False, state_dir=state_dir).start()
    try:
        asyncio.run(cycles(server.url, 200, args.concurrency, "warm"))
        spy = subprocess.Popen([py_spy, "record", "--pid", str(server.pid), "--format", "raw",
                                "--rate", "200", "--output", str(raw), "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)
        out = asyncio.run(cycles(server.url, args.cycles, args.concurrency, "prof"))
        spy.send_signal(subprocess.signal.SIGINT)
        spy.wait(30)
    finally:
        server.stop()
        if state_dir:
            shutil.rmtree(state_dir, ignore_errors=True)
    rate = (args.cycles - out["errors"]) / out["seconds"]
    print(f"gym serve {'--state-dir' if args.state_dir else '(memory)'}, concurrency "
          f"{args.concurrency}: {rate:.0f} cycles/s under py-spy")
    print(summarize(raw, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
