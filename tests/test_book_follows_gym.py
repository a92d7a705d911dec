"""The book follows Gym: an attempt the book has as running that Gym tombstoned or no longer knows
leaves ``running`` at the next checkpoint; a live owner's current try and what Gym still lists
stay as they are. Foreign attempts (another run's) are waited for, never acted on."""

from __future__ import annotations

import asyncio

import pytest

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.core.attempt_book import AttemptBook
from rl_gym_actors.core.attempt_reports import AttemptReport, AttemptState
from rl_gym_actors.core.prepare_plan import PrepareAction, plan_endpoint
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.protocol import AttemptInfo, StatusReport
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import soon, until

EP = "http://gym"
RUNNING = AttemptState.RUNNING


def test_settle_unlisted_tombstones_only_what_nobody_holds_and_gym_does_not_list():
    book = AttemptBook([EP])
    book.apply(AttemptReport("held", 0, EP, RUNNING, "live"))  # a live current try
    book.apply(AttemptReport("gone", 0, EP, RUNNING, "dead"))  # its owner died
    book.apply(AttemptReport("handed", 0, EP, RUNNING, "live", released=True))
    book.apply(AttemptReport("listed", 0, EP, RUNNING, "dead"))  # Gym still runs it
    book.apply(AttemptReport("sealed", 0, EP, AttemptState.SEALED, "dead"))
    assert book.settle_unlisted(EP, {("listed", 0)}, {"live"}) == 2
    states = {
        rid: book.attempt(rid, 0).state for rid in ("held", "gone", "handed", "listed", "sealed")
    }
    assert states == {
        "held": RUNNING,
        "gone": AttemptState.TOMBSTONED,
        "handed": AttemptState.TOMBSTONED,
        "listed": RUNNING,
        "sealed": AttemptState.SEALED,
    }
    snap = book.snapshot({"live"})
    assert snap.invariant_ok and snap.endpoints[EP].running == 2


def test_the_plan_waits_for_foreign_attempts_and_acts_on_its_own():
    book = AttemptBook([EP])
    infos = [
        AttemptInfo(rollout_id=rid, attempt_index=0, state="running")
        for rid in ("run-a-1", "run-b-1", "run-a")
    ]
    status = StatusReport(running=3, executions=infos)
    steps = {
        s.rollout_id: s
        for s in plan_endpoint(
            status, book, EP, frozenset(), own=lambda rid: rid.startswith("run-a-")
        )
    }
    assert steps["run-a-1"].action is PrepareAction.RETIRE and not steps["run-a-1"].foreign
    for rid in ("run-b-1", "run-a"):  # another run's; "run-a" lacks the dash
        assert steps[rid].action is PrepareAction.WAIT and steps[rid].foreign
    # an attempt in the book is the run's own whatever its id
    book.apply(AttemptReport("run-b-1", 0, EP, RUNNING, "gone"))
    step = next(
        s
        for s in plan_endpoint(
            status, book, EP, frozenset(), own=lambda rid: rid.startswith("run-a-")
        )
        if s.rollout_id == "run-b-1"
    )
    assert step.action is PrepareAction.RETIRE


@pytest.mark.ray
@pytest.mark.slow
async def test_attempts_a_gym_restart_tombstoned_leave_running_at_the_next_checkpoint(
    ray_session, tmp_path
):
    from rl_gym_actors.orchestrator import Orchestrator

    policy = TryPolicy(rollout_s=20.0, receipt_s=1.0, max_tries=1, control_s=2.5)
    server = GymServerThread(token="test-token", state_dir=tmp_path / "state").start()
    endpoint = GymEndpoint(url=server.url, token=server.token)
    try:
        async with Orchestrator(
            [endpoint],
            policy=policy,
            pool_size=1,
            rollouts_per_actor=2,
            progress=False,
            start=False,
        ) as orch:
            batch = asyncio.ensure_future(orch.arun_batch([{"sleep_s": 30.0}] * 2))
            async with GymClient(endpoint) as client:

                async def both_running() -> bool:
                    status = await client.status("probe", deadline_ts=soon(5))
                    return status.running >= 2

                await until(both_running, timeout_s=15, what="both runs to start")
            server.kill()  # the runs' connections drop; retires cannot land
            outcomes = await asyncio.wait_for(batch, 30)
            assert [o.status for o in outcomes] == ["failed", "failed"]
            server.restart()  # the restart tombstones what was running

            async def ledger_counts_both() -> bool:
                snap = await orch.asnapshot()
                return snap.ledger.endpoints[server.url].running >= 2

            await until(ledger_counts_both, interval_s=0.05, what="the ledger to see both runs")
            await orch.acheckpoint("after-restart", str(tmp_path / "ckpt"), deadline_s=20.0)
            ledger = (await orch.asnapshot()).ledger
            assert ledger.endpoints[server.url].running == 0
            assert ledger.endpoints[server.url].tombstoned == 2 and ledger.invariant_ok
    finally:
        server.stop()
