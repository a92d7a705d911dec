"""A trainer's driver process for fault tests: one Orchestrator in a process of its own, so that a
test can SIGKILL it (with its local Ray) or run two of them against one Gym server.

    python -m rl_gym_actors.testing.driver --url URL --token T --run-id R --rows 8 \\
        --checkpoint-id C [--slow-row-s 30] [--ray-address ADDR] [--ack on_seal] [--go-file F]
        [--restore-from DIR] [--hold-after-s S]

It prints JSON lines on stdout: ``{"event": "started", "pid": ...}``, then
``{"event": "batch", ...}`` with counts of the outcomes, then ``{"event": "checkpointing"}`` right
before ``checkpoint()``, then ``{"event": "checkpoint", "committed": bool, ...}``. With
``--slow-row-s`` one more row sleeps that long and the checkpoint is taken while it runs (the batch
is awaited after), so the driver sits between prepare and resume: the moment a test kills it.
Without ``--ray-address`` it starts a local Ray of its own (loopback), in its own session so
that a kill of the process group takes Ray with it. :class:`DriverProcess` starts one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import rl_gym_actors

_PACKAGE_ROOT = str(Path(rl_gym_actors.__file__).resolve().parents[1])


def _say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _rows(run_id: str, n: int, sleep_s: float) -> list[dict[str, Any]]:
    return [
        {"_ng_rollout_id": f"{run_id}-row-{i}", "reward": 0.5, "sleep_s": sleep_s} for i in range(n)
    ]


async def _main(args: argparse.Namespace) -> int:
    from rl_gym_actors.config import GymEndpoint, TryPolicy
    from rl_gym_actors.errors import RlGymError
    from rl_gym_actors.orchestrator import Orchestrator

    policy_fields: dict[str, Any] = dict(
        rollout_s=args.rollout_s, receipt_s=5.0, max_tries=2, control_s=5.0
    )
    if args.ack is not None:
        policy_fields["ack"] = args.ack
    endpoint = GymEndpoint(url=args.url, token=args.token)
    async with Orchestrator(
        [endpoint],
        policy=TryPolicy(**policy_fields),
        pool_size=args.pool,
        rollouts_per_actor=2,
        run_id=args.run_id,
        progress=False,
        start=False,
        restore_from=args.restore_from,
    ) as orch:
        await orch.astart()
        _say(event="started", pid=os.getpid(), orchestrator_id=orch.id)
        while args.go_file and not os.path.exists(args.go_file):
            await asyncio.sleep(0.02)  # several drivers start their batches together
        rows = _rows(args.run_id, args.rows, args.sleep_s)
        slow = None
        if args.slow_row_s:
            slow = asyncio.ensure_future(
                orch.arun_batch(
                    [{"_ng_rollout_id": f"{args.run_id}-slow", "sleep_s": args.slow_row_s}]
                )
            )
        outcomes = await orch.arun_batch(rows)
        _say(
            event="batch",
            rows=len(rows),
            sealed=sum(o.status == "sealed" for o in outcomes),
            failed=sum(o.status == "failed" for o in outcomes),
            repeated=sum(o.repeated for o in outcomes),
            rewards=[o.reward for o in outcomes],
            reasons=sorted({o.reason or "" for o in outcomes if o.status == "failed"}),
        )
        _say(event="checkpointing", checkpoint_id=args.checkpoint_id)
        t0 = time.monotonic()
        try:
            report = await orch.acheckpoint(
                args.checkpoint_id, args.checkpoint_dir, deadline_s=args.deadline_s
            )
            _say(
                event="checkpoint",
                committed=True,
                seconds=time.monotonic() - t0,
                retired=report.retired,
                orphans_acked=report.orphans_acked,
            )
        except RlGymError as exc:
            _say(
                event="checkpoint",
                committed=False,
                seconds=time.monotonic() - t0,
                error=f"{type(exc).__name__}: {exc}"[:2000],
                blockers=getattr(exc, "blockers", None),
            )
        if slow is not None:
            await slow
        if args.hold_after_s:  # alive after the checkpoint: the moment a test kills it
            _say(event="holding")
            await asyncio.sleep(args.hold_after_s)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--token", default=None)
    p.add_argument("--run-id", required=True)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--sleep-s", type=float, default=0.0)
    p.add_argument("--slow-row-s", type=float, default=0.0)
    p.add_argument("--rollout-s", type=float, default=60.0)
    p.add_argument("--pool", type=int, default=2)
    p.add_argument("--checkpoint-id", required=True)
    p.add_argument("--checkpoint-dir", default="/tmp/rlga-driver-ckpt")
    p.add_argument("--deadline-s", type=float, default=30.0)
    p.add_argument("--ack", default=None)
    p.add_argument("--ray-address", default=None)
    p.add_argument("--go-file", default=None, help="start the batch once this file exists")
    p.add_argument("--restore-from", default=None, help="a checkpoint dir with the layer's part")
    p.add_argument("--hold-after-s", type=float, default=0.0)
    args = p.parse_args(argv)
    from rl_gym_actors.actors.runtime import ensure_ray

    ensure_ray(address=args.ray_address, num_cpus=None if args.ray_address else 2)
    return asyncio.run(_main(args))


# ---------------------------------------------------------------- for tests and benchmarks


class DriverProcess:
    """``python -m rl_gym_actors.testing.driver ARGS`` (or another ``module`` speaking JSON
    lines, such as :mod:`rl_gym_actors.testing.v2_trainer`) in a session of its own; read its
    lines with :meth:`wait_for`, kill it and everything it started with :meth:`kill`."""

    def __init__(
        self,
        args: list[str],
        *,
        ray_address: str | None = None,
        module: str = "rl_gym_actors.testing.driver",
        stderr: Any = subprocess.DEVNULL,
    ) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        env.pop("RAY_ADDRESS", None)
        cmd = [sys.executable, "-m", module, *args]
        if ray_address:
            cmd += ["--ray-address", ray_address]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            text=True,
            start_new_session=True,
        )
        self.events: list[dict[str, Any]] = []
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self._lines.put(json.loads(line))
            except ValueError:
                continue
        self._lines.put(None)

    def wait_for(self, event: str, timeout_s: float = 120.0) -> dict[str, Any]:
        """The first JSON line with this ``event`` (raises TimeoutError, or RuntimeError when
        the process ended without it)."""
        for seen in self.events:
            if seen.get("event") == event:
                return seen
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                raise TimeoutError(f"driver: no {event!r} within {timeout_s}s") from None
            if line is None:
                raise RuntimeError(f"driver exited ({self.proc.wait()}) before {event!r}")
            self.events.append(line)
            if line.get("event") == event:
                return line

    def kill(self) -> list[int]:
        """SIGKILL the driver and every process it started (its local Ray). The pids killed."""
        pids = [self.proc.pid, *descendants(self.proc.pid)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        return pids

    def wait(self, timeout_s: float = 120.0) -> int:
        return self.proc.wait(timeout_s)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (psutil; none when ``pid`` is gone)."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its parent does not)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
