"""A v2 restore killed half-way is finished by the next one (issue 27, item 6).

A trainer process (:mod:`rl_gym_actors.testing.v2_trainer`, on this session's Ray) checkpoints
``ck-1`` with its multi-step episodes parked mid-way and is SIGKILLed mid-step. A restorer
process restores ``ck-1`` and is SIGKILLed before it sends any row: after its restore and resume
(its replacements left installed, pending), or between its restore and its resume (Gym left
``restored``, admission closed, under the restorer's id; the server holds that resume,
:mod:`rl_gym_actors.testing.hold`). A third trainer restored from ``ck-1`` takes the pending
episodes over: Gym takes work within 5 s of its start (no lease waited out), each episode
continues from its exported boundary as attempt 1 (only the steps after it run), and its next
checkpoint commits.

``unlisted``: the server's status does not list ``restored_pending`` (``--hide-restored-pending``,
with ``--export-every-session``), as NeMo Gym's real agent participant's does not (its status has
``accepting`` only; run against control.py/agent.py @011c3386, its install refuses a process with
any live session). The third trainer cannot see the dead restorer's installs, so it clears the
replacement attempts (retire, then forget) and restores them afresh: the same continuation from
the boundary, nothing taken over."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import pytest

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.wire import EpisodeId
from rl_gym_actors.testing.driver import DriverProcess, alive
from rl_gym_actors.testing.hold import HoldCalls
from rl_gym_actors.testing.polling import scaled, until
from rl_gym_actors.testing.v2_server import V2ServerThread

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RUN = "v2rk"
ROWS, STEPS = 4, 16
POLICY = TryPolicy(rollout_s=60.0, max_tries=3, control_s=5.0, admission_wait_s=60.0)


def boundaries(checkpoint_dir: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for manifest in Path(checkpoint_dir).rglob("manifest.json"):
        meta = json.loads(manifest.read_text())
        for line in (manifest.parent / meta["records_file"]).read_text().splitlines():
            record = json.loads(line)
            e = EpisodeId.model_validate(record["episode_id"])
            found[e.rollout_id] = (record["boundary"] or {}).get("step", 0)
    return found


@contextlib.contextmanager
def released(hold: HoldCalls):
    try:
        yield hold
    finally:
        hold.release()  # a held call answers 503 (never performed) before the server stops


async def killed(driver: DriverProcess) -> None:
    for pid in driver.kill():
        await until(lambda pid=pid: not alive(pid), interval_s=0.05, what=f"pid {pid} to die")


@pytest.mark.parametrize("status", ["listed", "unlisted"])
@pytest.mark.parametrize("at", ["after_resume", "before_resume"])
async def test_the_next_restore_finishes_an_interrupted_one(ray_session, tmp_path, at, status):
    from rl_gym_actors.orchestrator import Orchestrator

    address = ray_session.get_runtime_context().gcs_address
    hold = HoldCalls("/resume", armed=False, limit=1)  # the restorer's resume, held for good
    unlisted = status == "unlisted"
    args = ["--hide-restored-pending", "--export-every-session"] if unlisted else []
    with V2ServerThread(args=args, extensions=[hold.extension()]) as server, released(hold):
        endpoint = GymEndpoint(url=server.url, token=server.token)
        part = server.participant
        ck = str(tmp_path / "ck-1")
        common = [
            *("--url", server.url, "--token", server.token, "--run-id", RUN),
            *("--rows", str(ROWS), "--restart-rows", "0", "--steps", str(STEPS)),
            *("--step-s", "0.3", "--dir", ck),
        ]
        module = "rl_gym_actors.testing.v2_trainer"
        first = DriverProcess(["--phase=first", *common], ray_address=address, module=module)
        try:
            line = first.wait_for("checkpoint", 120)
            first.wait_for("going", 30)
        finally:
            await killed(first)
        step1 = [f"{RUN}-s1-{i}" for i in range(ROWS)]
        assert sorted(line["endpoints"][0]["exported"]) == step1
        boundary = boundaries(ck)
        assert sorted(boundary) == step1 and sum(boundary.values()) > 0

        if at == "before_resume":
            hold.arm()  # the restorer's resume after its restore never reaches Gym
        restorer = DriverProcess(["--phase=restore", *common], ray_address=address, module=module)
        try:
            if at == "after_resume":
                restored = restorer.wait_for("restored", 120)["report"]
                assert restored["restored"] is True, restored
            else:
                await until(hold.reached.is_set, timeout_s=120, what="the restorer's resume")
        finally:
            await killed(restorer)
        state = part.status()
        pending = sorted(e.capture_key for e in part.table.restored_pending())
        assert pending == [f"{k}-a1" for k in step1]
        assert ("restored_pending" in state) is not unlisted
        assert state["phase"] == ("idle" if at == "after_resume" else "restored")

        async with GymClient(endpoint) as gym:

            async def opened_since(since: float) -> float | None:
                s = await V2Client(gym).status(deadline_ts=time.time() + scaled(5))
                return max(time.monotonic() - since, 1e-6) if s.phase == "idle" else None

            async with Orchestrator(
                [endpoint],
                policy=POLICY,
                pool_size=ROWS,
                run_id=RUN,
                progress=False,
                start=False,
                restore_from=ck,
            ) as third:
                started = time.monotonic()
                opened = asyncio.ensure_future(
                    until(lambda: opened_since(started), interval_s=0.05, what="Gym to reopen")
                )
                await third.astart()
                assert await opened < scaled(5.0)  # no lease waited out
                report = third.restore_report
                assert report is not None and report.restored, report
                taken = [] if unlisted else [f"{k}-a1" for k in step1]
                assert report.endpoints[0].taken_over == taken, report
                before = part.steps_run
                rows = [
                    {
                        "_ng_rollout_id": rid,
                        "_ng_endpoint": server.url,
                        "steps": STEPS,
                        "step_s": 0.3,
                        "reward": round(0.1 * (i + 1) + 1, 3),
                    }
                    for i, rid in enumerate(step1)
                ]
                outcomes = await third.arun_batch(rows)
                assert [(o.status, o.attempt_index) for o in outcomes] == [("sealed", 1)] * ROWS
                # each continued from its boundary: only the steps after it ran
                assert [o.reply["steps_run"] for o in outcomes] == [
                    STEPS - boundary[rid] for rid in step1
                ]
                assert part.steps_run - before == sum(STEPS - b for b in boundary.values())
                await third.acheckpoint("ck-2", str(tmp_path / "ck-2"), deadline_s=30.0)
        assert part.status()["phase"] == "idle" and part.table.restored_pending() == []
