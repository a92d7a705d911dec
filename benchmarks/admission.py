"""How long a checkpoint closes Gym's admission with long episodes in flight, per protocol.

An async trainer checkpoints while rollouts run. This benchmark puts 64 ten-second episodes in
flight through the orchestrator (quick mode: 32), takes a checkpoint two seconds in, and reads
each Gym server's own fence while it runs (its status, every 50 ms):

- on the agent-checkpoint protocol (`gym serve`) Gym itself needs nothing running to commit:
  the simulated agent does not park, so admission stays closed until every run has ended;
- on v2 (`gym serve --protocol v2`, episodes of 10 steps of 1 s) the episodes park at their
  next step boundary, the commit exports them, and they go on after resume.

Reported per protocol: the checkpoint's wall time, how long the server's admission was closed,
how many episodes were still running when it committed, and whether every episode then sealed
(none lost, none rerun from its start: the agent's own step count). The baseline is the
episode length itself: a checkpoint that drains waits up to one episode.

    .venv/bin/python benchmarks/admission.py [--quick]
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import common
from common import Result, bench_main, progress

from rl_gym_actors.gym.v2.wire import ROUTE_PREFIX as V2_PREFIX
from rl_gym_actors.protocol import CONTROL_PREFIX

QUICK = dict(episodes=32, steps=10, step_s=1.0, actors=2, checkpoint_after_s=2.0)
FULL = dict(episodes=64, steps=10, step_s=1.0, actors=4, checkpoint_after_s=2.0)
POLL_S = 0.05


def _get(url: str, token: str) -> dict[str, Any]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def _fence(protocol: str, gym: Any) -> tuple[bool, int, int]:
    """(admission open, episodes in flight, steps run) as the server itself reports them: on
    v2 an episode in flight runs or is parked at a boundary; the agent-checkpoint protocol
    counts its running attempts (and has no steps)."""
    if protocol == "v2":
        s = _get(f"{gym.url}{V2_PREFIX}/status", gym.token)
        return bool(s["accepting"]), int(s["report"]["counts"]["episodes"]), int(s["steps_run"])
    lease = _get(f"{gym.url}{CONTROL_PREFIX}/lease", gym.token)
    status = _get(f"{gym.url}{CONTROL_PREFIX}/status", gym.token)
    return lease["phase"] in ("open", "idle"), int(status.get("running", 0)), 0


async def _watch(protocol: str, gym: Any, stop: asyncio.Event, log: list) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        try:
            log.append((t, *await asyncio.to_thread(_fence, protocol, gym)))
        except OSError:
            pass  # a loaded server answering late: the next poll tells
        await asyncio.sleep(POLL_S)


def _rows(p: dict, protocol: str, prefix: str) -> list[dict[str, Any]]:
    rows = []
    for i in range(p["episodes"]):
        row: dict[str, Any] = {"_ng_rollout_id": f"{prefix}-{i}", "reward": 1.0}
        if protocol == "v2":
            row.update(steps=p["steps"], step_s=p["step_s"])
        else:
            row["sleep_s"] = p["steps"] * p["step_s"]
        rows.append(row)
    return rows


async def _one(p: dict, protocol: str, tmp: Path) -> dict[str, Any]:
    from rl_gym_actors import Orchestrator, TryPolicy
    from rl_gym_actors.testing.gym_process import GymServerProcess

    args = ["--protocol", "v2"] if protocol == "v2" else []
    episode_s = p["steps"] * p["step_s"]
    with GymServerProcess(args=args) as gym:
        orch = Orchestrator(
            [gym.endpoint],
            pool_size=p["actors"],
            rollouts_per_actor=p["episodes"] // p["actors"],
            policy=TryPolicy(rollout_s=episode_s * 4, max_tries=1),
            progress=False,
        )
        await orch.astart()
        try:
            stop, log = asyncio.Event(), []
            watch = asyncio.create_task(_watch(protocol, gym, stop, log))
            rows = _rows(p, protocol, f"adm-{protocol}")
            t0 = time.perf_counter()
            batch = asyncio.create_task(orch.arun_batch(rows))
            while not any(r[2] >= p["episodes"] for r in log):  # all running on Gym
                if time.perf_counter() - t0 > 60 + episode_s:
                    raise TimeoutError(f"{protocol}: the episodes never all ran: {log[-1:]}")
                await asyncio.sleep(POLL_S)
            await asyncio.sleep(p["checkpoint_after_s"])
            c0 = time.perf_counter()
            report = await orch.acheckpoint(f"adm-{protocol}-1", str(tmp / protocol))
            c1 = time.perf_counter()
            # the server's reading nearest the commit's answer
            in_flight_at_commit = min(log, key=lambda r: abs(r[0] - c1))[2] if log else None
            outcomes = await batch
            b1 = time.perf_counter()
            stop.set()
            await watch
            steps_run = (await asyncio.to_thread(_fence, protocol, gym))[2]
        finally:
            await orch.aclose()
    closed = [r for r in log if not r[1] and c0 - POLL_S <= r[0] <= c1 + POLL_S]
    closed_s = (closed[-1][0] - closed[0][0] + POLL_S) if closed else 0.0
    sealed = sum(1 for o in outcomes if o.status == "sealed")
    return {
        "protocol": protocol,
        "episodes": p["episodes"],
        "episode_s": episode_s,
        "checkpoint_s": c1 - c0,
        "admission_closed_s": closed_s,
        "closed_vs_episode": closed_s / episode_s,
        "in_flight_at_commit": in_flight_at_commit,
        "steps_rerun": (steps_run - p["episodes"] * p["steps"]) if protocol == "v2" else None,
        "sealed": sealed,
        "lost": p["episodes"] - sealed,
        "batch_s": b1 - t0,
        "report": {k: getattr(report, k, None) for k in ("sealed_acked", "orphans_acked")},
    }


def body(result: Result, args: Any) -> None:
    p = QUICK if args.quick else FULL
    result.params.update(p)
    with common.ray_and_tmp("rlga-admission-") as tmp:
        rows = []
        for protocol in ("agent-checkpoint", "v2"):
            progress(f"{protocol}: {p['episodes']} episodes of {p['steps']} x {p['step_s']} s")
            rows.append(common.run_async(_one(p, protocol, tmp)))
            r = rows[-1]
            progress(
                f"{protocol}: checkpoint {r['checkpoint_s']:.2f} s, admission closed "
                f"{r['admission_closed_s']:.2f} s, {r['in_flight_at_commit']} in flight at commit"
            )
    result.rows = rows
    result.add_table(
        f"{p['episodes']} episodes of {p['steps'] * p['step_s']:.0f} s in flight, a checkpoint "
        f"{p['checkpoint_after_s']:.0f} s in; the server's own fence read every "
        f"{POLL_S * 1000:.0f} ms:",
        [
            "protocol",
            "checkpoint (s)",
            "admission closed (s)",
            "closed / episode",
            "in flight at commit",
            "sealed",
            "lost",
            "steps run twice",
        ],
        [
            [
                r["protocol"],
                r["checkpoint_s"],
                r["admission_closed_s"],
                r["closed_vs_episode"],
                r["in_flight_at_commit"],
                r["sealed"],
                r["lost"],
                "-" if r["steps_rerun"] is None else r["steps_rerun"],
            ]
            for r in rows
        ],
    )
    by = {r["protocol"]: r for r in rows}
    result.extra["headline"] = (
        f"{p['episodes']} ten-second episodes in flight: agent-checkpoint keeps admission closed "
        f"{by['agent-checkpoint']['admission_closed_s']:.1f} s (it drains), v2 "
        f"{by['v2']['admission_closed_s']:.1f} s (it parks at a boundary) and commits in "
        f"{by['v2']['checkpoint_s']:.1f} s"
    )
    result.notes.append(
        "An async trainer should run Gym v2: its episodes park at the next step boundary and go "
        "on after resume, so a checkpoint closes admission for about one step. The "
        "agent-checkpoint protocol needs nothing running to commit: unless the agent honours "
        "park_requested, a checkpoint waits for every run in flight to end (up to the episode "
        "length, or deadline_s)."
    )


def main(argv: list[str] | None = None) -> int:
    bench_main("admission", "Admission closed per checkpoint, episodes in flight", body, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
