"""A trainer SIGKILLed mid-step on Gym v2 restores and continues each in-flight episode from its
last boundary (issue 18).

Two ``gym serve --protocol v2 --state-dir`` subprocesses: A runs multi-step episodes (the
simulated agent's ``steps``), B is ``--restart-only``. A trainer process
(:mod:`rl_gym_actors.testing.v2_trainer`, on this session's Ray) runs step 1 (4 rows on A, 2 on
B), checkpoints with A's episodes parked mid-way (exported with their boundary; B's are
restarts, left out of the commit), starts step 2 and is SIGKILLed while both steps run on.
A new trainer process restores the checkpoint (``Orchestrator.arestore``) and sends both steps
again: each of A's step-1 episodes continues from its exported boundary as attempt 1 (the
reply's ``steps_run`` and A's step counter: only the steps after the boundary ran again), the
restarts and step 2 start over from their inputs as attempt 1, every row is sealed once, and
the next checkpoint commits and forgets every rollout (no retired mark, kept reply or episode
left on either server).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.wire import EpisodeId
from rl_gym_actors.testing.driver import DriverProcess, alive
from rl_gym_actors.testing.gym_process import GymServerProcess
from rl_gym_actors.testing.polling import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RUN = "v2rs"
# STEPS x 0.3 s: after the checkpoint, step 1's episodes run on for about 4 s (14 steps); step
# 2's rows must reach Gym inside that window for the kill to find both steps running. At 8
# steps the window was under 2 s, and one suite of two at once (load ~5) missed it.
ROWS, RESTARTS, STEPS = 4, 2, 16


def _status(server: GymServerProcess) -> dict:
    async def read() -> dict:
        async with GymClient(server.endpoint) as gym:
            answer = await V2Client(gym).status(deadline_ts=time.time() + 10.0)
        return answer.model_dump(mode="json")

    return asyncio.run(read())


def _boundaries(checkpoint_dir: str) -> dict[str, int]:
    """rollout id -> the step its exported record continues after (read from Gym's files)."""
    found: dict[str, int] = {}
    for manifest in Path(checkpoint_dir).rglob("manifest.json"):
        meta = json.loads(manifest.read_text())
        for line in (manifest.parent / meta["records_file"]).read_text().splitlines():
            record = json.loads(line)
            e = EpisodeId.model_validate(record["episode_id"])
            found[e.rollout_id] = (record.get("boundary") or {}).get("step", 0)
    return found


def test_a_trainer_killed_mid_step_continues_each_v2_episode_from_its_boundary(
    ray_session, tmp_path
):
    address = ray_session.get_runtime_context().gcs_address
    a = GymServerProcess(args=["--protocol", "v2"], state_dir=tmp_path / "a", allow_faults=False)
    b = GymServerProcess(
        args=["--protocol", "v2", "--restart-only"], state_dir=tmp_path / "b", allow_faults=False
    )
    with contextlib.ExitStack() as stack:
        for server in (a, b):
            stack.callback(server.stop)
        with ThreadPoolExecutor(2) as starting:  # both at once
            list(starting.map(lambda s: s.start(), (a, b)))
        common = [
            *("--url", str(a.url), "--url", str(b.url), "--token", str(a.token)),
            *("--run-id", RUN, "--rows", str(ROWS), "--restart-rows", str(RESTARTS)),
            *("--steps", str(STEPS), "--step-s", "0.3", "--dir", str(tmp_path / "ck-1")),
            *("--dir2", str(tmp_path / "ck-2")),
        ]
        go = tmp_path / "go"
        first, second = (
            DriverProcess(
                [f"--phase={phase}", *common, *extra],
                ray_address=address,
                module="rl_gym_actors.testing.v2_trainer",
            )
            for phase, extra in (("first", []), ("second", ["--go-file", str(go)]))
        )  # the second starts (Ray, its actors) while the first runs; it waits for ``go``
        try:
            ck = first.wait_for("checkpoint", 90)
            first.wait_for("going", 30)
            at_checkpoint = _status(a)["steps_run"]

            seen: dict = {}  # A's last status, for the failure's message

            def mid_step() -> bool:  # parked episodes ran on past their boundary; all still run
                st = _status(a)
                seen.update(steps_run=st["steps_run"], **st["report"]["counts"])
                return st["steps_run"] >= at_checkpoint + ROWS and seen["episodes"] == 2 * ROWS

            try:
                wait_for(mid_step, timeout_s=30, what="step 1 and 2 running past the checkpoint")
            except TimeoutError as e:
                raise AssertionError(f"A past the checkpoint ({at_checkpoint}): {seen}") from e
        except BaseException:
            second.kill()
            raise
        finally:
            pids = first.kill()
        wait_for(lambda: not any(alive(p) for p in pids), timeout_s=30, what="trainer gone")

        step1 = [f"{RUN}-s1-{i}" for i in range(ROWS)]
        restarts = [f"{RUN}-s1-r{j}" for j in range(RESTARTS)]
        step2 = [f"{RUN}-s2-{i}" for i in range(ROWS)]
        at_a, at_b = ck["endpoints"]
        assert sorted(at_a["exported"]) == step1  # parked mid-way, attempt 0
        assert at_b["exported"] == [] and sorted(at_b["restarts"]) == restarts
        assert sorted(at_b["in_flight"]) == restarts  # left out of the commit's scope
        boundary = _boundaries(at_a["checkpoint_dir"])
        assert sorted(boundary) == step1 and sum(boundary.values()) > 0

        try:
            second.wait_for("started", 90)
            go.touch()  # the first trainer is dead: the second restores
            line = second.wait_for("restored", 90)
            restored, (steps_a, steps_b) = line["report"], line["steps_run"]
            line = second.wait_for("batch", 90)
            batch, (after_a, after_b) = line["outcomes"], line["steps_run"]
            done = second.wait_for("checkpoint2", 60)
            second.wait_for("done", 30)
        finally:
            second.kill()

        assert restored["restored"] is True and restored["error"] is None, restored
        assert restored["placed"] == dict.fromkeys(step1, a.url)
        # step 2's rows: those the dead trainer left running were retired and start over;
        # one that finished meanwhile (our server keeps its reply, (ext)) is adopted, not rerun
        started_over = [rid for rid in step2 if rid in restored["next_attempts"]]
        assert restored["next_attempts"] == dict.fromkeys(step1 + restarts + started_over, 1)
        by_id = {o["rollout_id"]: o for o in batch}
        assert len(batch) == len(by_id) == 2 * ROWS + RESTARTS  # every row once
        assert {o["status"] for o in batch} == {"sealed"}, batch
        assert not any(o["repeated"] for o in batch)
        for rid in step1:  # continued from the boundary: only the steps after it ran again
            got = by_id[rid]
            assert (got["attempt"], got["steps_run"], got["adopted"]) == (
                1,
                STEPS - boundary[rid],
                False,
            )
        for rid in restarts + started_over:  # started over from their inputs
            assert (by_id[rid]["attempt"], by_id[rid]["steps_run"]) == (1, STEPS)
        for rid in set(step2) - set(started_over):  # finished after the kill: adopted
            assert (by_id[rid]["attempt"], by_id[rid]["adopted"]) == (0, True)
        assert [by_id[rid]["reward"] for rid in step1] == [1.1, 1.2, 1.3, 1.4]
        # the servers' step counters: nothing else ran while the new trainer worked
        rerun = len(step1 + started_over) * STEPS - sum(boundary.values())
        assert after_a - steps_a == rerun
        assert after_b - steps_b == RESTARTS * STEPS
        assert done["committed"] is True
        for server in (a, b):  # forgotten after the commit: nothing left on Gym
            st = _status(server)
            assert st["phase"] == "idle" and st["retired_rollouts"] == 0, st
            assert st["kept_replies"] == 0 and st["report"]["counts"]["episodes"] == 0, st
            assert st["restored_pending"] == []
