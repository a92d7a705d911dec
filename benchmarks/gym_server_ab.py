"""Before and after in one run: the durable Gym server (``gym serve --state-dir``) of two or more
commits against the aiohttp hello world, trials interleaved, at one concurrency (16 unless
``--concurrency``). Each commit's package is taken with ``git archive`` into a temp folder and
served from there; the load is benchmarks/gym_server.py's (POST /run + GET receipt + POST ACK,
and the same with the receipt from the /run header). Server CPU per cycle is the figure that
load on the machine moves least; the ratios are to the hello world of the same run.

    .venv/bin/python benchmarks/gym_server_ab.py 84d47e1 HEAD [--cycles 600] [--trials 3]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import common
from gym_server import TOKEN, HelloProcess, measure

import rl_gym_actors.testing.gym_process as gym_process

REPO = Path(common.__file__).resolve().parents[1]


def package_of(rev: str, into: Path) -> Path:
    """``rev``'s rl_gym_actors/ unpacked under ``into``; the folder to put on PYTHONPATH."""
    tar = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "rl_gym_actors"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")
    return into


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revs", nargs="+", help="commits to compare (e.g. 84d47e1 HEAD)")
    ap.add_argument("--cycles", type=int, default=600)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gym-ab-"))
    servers: dict[str, Any] = {"hello world": HelloProcess()}
    load0 = os.getloadavg()[0]
    try:
        for i, rev in enumerate(args.revs):
            root = package_of(rev, tmp / f"tree{i}")
            gym_process._PACKAGE_ROOT = str(root)  # the server process imports this tree
            server = gym_process.GymServerProcess(
                token=TOKEN, allow_faults=False, state_dir=str(tmp / f"state{i}")
            ).start()
            servers[rev] = servers[f"{rev} (receipt header)"] = server
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
        c, n = args.concurrency, args.cycles
        for trial in range(-1, args.trials):  # -1: warm-up, untimed
            for name, server in servers.items():
                kind = "state-dir-header" if name.endswith("(receipt header)") else "ab"
                got = measure(server, kind, c, n if trial >= 0 else max(c, n // 5), trial)
                if trial >= 0:
                    rows[name].append(got)
    finally:
        for name, server in servers.items():
            if not name.endswith("(receipt header)"):
                server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    mid = args.trials // 2
    ceiling = sorted(r["rate"] for r in rows["hello world"])[mid]
    print(
        f"concurrency {c}, {n} cycles x {args.trials} trials; load (1 min) {load0:.1f} at start, "
    )
    print(f"{os.getloadavg()[0]:.1f} at end\n")
    print(
        "| server | cycles/s | x hello world | server CPU ms/cycle | client CPU ms/cycle | errors |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name, got in rows.items():
        rate = sorted(r["rate"] for r in got)[mid]
        server_ms = 1000 * sum(r["server_cpu_s"] for r in got) / (n * len(got))
        client_ms = 1000 * sum(r["client_cpu_s"] for r in got) / (n * len(got))
        errors = sum(r["errors"] for r in got)
        print(
            f"| {name} | {rate:.0f} | {rate / ceiling:.2f} | {server_ms:.2f} | {client_ms:.2f} "
            f"| {errors} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
