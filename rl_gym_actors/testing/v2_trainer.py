"""A trainer process on Gym v2 servers for the restore test: one Orchestrator in a process of its
own, so that a test can SIGKILL it mid-step and start another that restores.

    python -m rl_gym_actors.testing.v2_trainer --phase first --url A --url B --token T \\
        --run-id R --rows 4 --restart-rows 2 --steps 8 --step-s 0.3 --dir D1 [--ray-address ADDR]
    python -m rl_gym_actors.testing.v2_trainer --phase second ... --dir D1 --dir2 D2

Step 1's rows are ``--rows`` multi-step rows on the first URL and ``--restart-rows`` on the
second (a ``--restart-only`` server); step 2's are ``--rows`` more on the first.

``first``: runs step 1, checkpoints ``ck-1`` into ``--dir`` once the first server counts
``--rows`` steps per row on average (each episode parked past its start), then starts step 2
and holds (``{"event": "going"}``) until killed. ``second``: restores ``--dir``
(``Orchestrator.arestore``), sends both steps' rows again, checkpoints ``ck-2`` into
``--dir2`` and exits. JSON lines on stdout: ``started``, ``checkpoint`` (what each server
exported and starts over), ``going``; ``restored`` (the restore report and each server's step
counter before any row), ``batch`` (each outcome: rollout id, status, attempt, reward, the
reply's ``steps_run``, repeated, adopted; the step counters after the batch),
``checkpoint2``, ``done``. Without ``--ray-address`` it starts a local Ray of its own. With
``--go-file`` it starts its orchestrator, then waits for that file before it does anything on
Gym (a test starts the second trainer early, while the first one runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any


def _say(**fields: Any) -> None:
    print(json.dumps({**fields, "ts": time.time()}), flush=True)


def rows_of(args: argparse.Namespace, step: int) -> list[dict[str, Any]]:
    """The rows of one step (the same ids and fields in every process)."""
    stepped, restarts = args.url[0], args.url[-1]
    rows = [
        {
            "_ng_rollout_id": f"{args.run_id}-s{step}-{i}",
            "_ng_endpoint": stepped,
            "steps": args.steps,
            "step_s": args.step_s,
            "reward": round(0.1 * (i + 1) + step, 3),
        }
        for i in range(args.rows)
    ]
    if step == 1:
        rows += [
            {
                "_ng_rollout_id": f"{args.run_id}-s1-r{j}",
                "_ng_endpoint": restarts,
                "steps": args.steps,
                "step_s": args.step_s,
                "reward": round(0.5 + 0.1 * j, 3),
            }
            for j in range(args.restart_rows)
        ]
    return rows


async def _steps_run(gym: Any) -> int:
    from rl_gym_actors.gym.v2.client import V2Client

    status = await V2Client(gym).status(deadline_ts=time.time() + 10.0)
    return int((status.model_extra or {}).get("steps_run", 0))


async def _first(args: argparse.Namespace, orch: Any, endpoints: list[Any]) -> None:
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient

    step1 = asyncio.ensure_future(orch.arun_batch(rows_of(args, 1)))
    async with GymClient(endpoints[0]) as gym:
        while await _steps_run(gym) < 2 * args.rows:  # every episode is under way
            await asyncio.sleep(0.05)
    report = await orch.acheckpoint("ck-1", args.dir, deadline_s=30.0)
    _say(
        event="checkpoint",
        endpoints=[
            {
                "endpoint": e.endpoint,
                "exported": (e.commit.model_extra or {}).get("episode_ids"),
                "in_flight": (e.commit.model_extra or {}).get("in_flight"),
                "restarts": (e.commit.model_extra or {}).get("restarts"),
                "checkpoint_dir": e.checkpoint_dir,
            }
            for e in report.endpoints
        ],
    )
    step2 = asyncio.ensure_future(orch.arun_batch(rows_of(args, 2)))
    _say(event="going")
    await asyncio.sleep(3600)  # killed mid-step
    await asyncio.gather(step1, step2)


async def _counters(endpoints: list[Any]) -> list[int]:
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient

    out = []
    for endpoint in endpoints:
        async with GymClient(endpoint) as gym:
            out.append(await _steps_run(gym))
    return out


async def _second(args: argparse.Namespace, orch: Any, endpoints: list[Any]) -> None:
    report = await orch.arestore(args.dir)
    _say(
        event="restored",
        report=None if report is None else report.model_dump(mode="json"),
        steps_run=await _counters(endpoints),  # each server's, before any row is sent
    )
    outcomes = await orch.arun_batch(rows_of(args, 1) + rows_of(args, 2))
    _say(
        event="batch",
        steps_run=await _counters(endpoints),
        outcomes=[
            {
                "rollout_id": o.rollout_id,
                "status": o.status,
                "attempt": o.attempt_index,
                "reward": o.reward,
                "steps_run": o.reply.get("steps_run") if isinstance(o.reply, dict) else None,
                "repeated": o.repeated,
                "adopted": o.adopted,
                "endpoint": o.endpoint,
                "reason": o.reason,
            }
            for o in outcomes
        ],
    )
    done = await orch.acheckpoint("ck-2", args.dir2, deadline_s=30.0)
    _say(
        event="checkpoint2",
        committed=True,
        forgotten=[e.forgotten for e in done.endpoints],
        exported=[(e.commit.model_extra or {}).get("episode_ids") for e in done.endpoints],
    )


async def _restore_only(args: argparse.Namespace, orch: Any) -> None:
    """``--phase restore``: restore ``--dir`` and hold, before any row, until killed."""
    report = await orch.arestore(args.dir)
    _say(event="restored", report=None if report is None else report.model_dump(mode="json"))
    await asyncio.sleep(3600)


async def _main(args: argparse.Namespace) -> int:
    from rl_gym_actors.config import GymEndpoint, TryPolicy
    from rl_gym_actors.orchestrator import Orchestrator

    endpoints = [GymEndpoint(url=u, token=args.token) for u in args.url]
    policy = TryPolicy(rollout_s=60.0, max_tries=3, control_s=5.0, admission_wait_s=60.0)
    async with Orchestrator(
        endpoints,
        policy=policy,
        pool_size=1,
        rollouts_per_actor=4 * (args.rows + args.restart_rows),
        run_id=args.run_id,
        progress=False,
        start=False,
    ) as orch:
        await orch.astart()
        _say(event="started", pid=os.getpid())
        while args.go_file and not os.path.exists(args.go_file):
            await asyncio.sleep(0.02)  # started early (Ray, actors), waits for its turn
        if args.phase == "first":
            await _first(args, orch, endpoints)
        elif args.phase == "restore":
            await _restore_only(args, orch)
        else:
            await _second(args, orch, endpoints)
    _say(event="done")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--phase", choices=["first", "second", "restore"], required=True)
    p.add_argument("--url", action="append", required=True)
    p.add_argument("--token", default=None)
    p.add_argument("--run-id", required=True)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--restart-rows", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--step-s", type=float, default=0.3)
    p.add_argument("--dir", required=True)
    p.add_argument("--dir2", default=None)
    p.add_argument("--ray-address", default=None)
    p.add_argument("--go-file", default=None, help="go on past start once this file exists")
    args = p.parse_args(argv)
    from rl_gym_actors.actors.runtime import ensure_ray

    ensure_ray(address=args.ray_address, num_cpus=None if args.ray_address else 2)
    return asyncio.run(_main(args))


if __name__ == "__main__":
    raise SystemExit(main())
