"""The rollout actor's body (RolloutWorker) in-process against the real Gym server on loopback.

Each way a reply gets lost and its repair, with the agent counting its own runs. No Ray here:
tests/test_orchestrator.py drives the same code as Ray actors.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import pytest_asyncio

from rl_gym_actors.actors.rollout_actor import RolloutWorker
from rl_gym_actors.config import LedgerConfig, TryPolicy
from rl_gym_actors.core.attempt_reports import AttemptState
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.protocol import CONTROL_PREFIX, result_digest
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.inspect_gym import key_state
from rl_gym_actors.testing.polling import soon, until

QUICK = TryPolicy(
    rollout_s=0.5, receipt_s=0.5, max_tries=3, control_s=3.0, admission_wait_s=5.0, ack="on_seal"
)
PATIENT = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=3, control_s=3.0, ack="on_seal")

# one event loop for the module, so that its Gym client (bound to a loop) serves every test
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def ctl(gym):
    async with GymClient(gym.endpoint) as client:
        yield client


class Sink:
    """Stands in for the ledger: keeps every report batch."""

    def __init__(self) -> None:
        self.reports = []

    async def __call__(self, batch) -> None:
        self.reports.extend(batch)


def worker(gym, policy=QUICK, sink=None, slots=4) -> RolloutWorker:
    return RolloutWorker(
        "w-test",
        [gym.endpoint],
        policy,
        LedgerConfig(flush_interval_s=0.01),
        send=sink,
        slots=slots,
    )


async def assert_nothing_left(ctl: GymClient) -> None:
    status = await ctl.status("rlga-test-probe", deadline_ts=soon(5))
    assert status.running == 0 and status.completed_unacknowledged == 0, status.summary()


async def test_reply_dropped_after_gym_finished_is_adopted_at_attempt_0(gym, ctl, agent):
    w = worker(gym)
    out = await w.run_rollout({"reward": 0.25, "drop_reply": True}, "rD-w")
    assert (out.status, out.attempt_index, out.adopted, out.acked, out.tries) == (
        "sealed",
        0,
        True,
        True,
        1,
    )
    assert out.reward == 0.25 and out.reply == {"id": "r-rD-w", "reward": 0.25}
    assert out.receipt.execution_generation == 1
    assert agent.starts[("rD-w", 0)] == 1 and agent.runs_of("rD-w") == 1
    assert await key_state(ctl, "rD-w", 0) == "acknowledged"
    await assert_nothing_left(ctl)
    await w.close()


async def test_deadline_while_the_agent_works_cancels_the_try_and_runs_the_next(gym, ctl, agent):
    w = worker(gym)
    out = await w.run_rollout({"reward": 0.5, "first_try_sleep_s": 30}, "rT-w")
    assert (out.status, out.attempt_index, out.tries, out.adopted) == ("sealed", 1, 2, False)
    assert ("rT-w", 0) in agent.cancelled and ("rT-w", 0) not in agent.finished
    assert await key_state(ctl, "rT-w", 0) == "tombstoned"
    assert await key_state(ctl, "rT-w", 1) == "acknowledged"
    await assert_nothing_left(ctl)
    await w.close()


async def test_receipt_fetch_timeout_gives_up_then_adopts(gym, ctl, agent):
    sink = Sink()
    w = worker(gym, sink=sink)
    out = await w.run_rollout({"reward": 0.75, "receipt_delay_s": 2.0}, "rR-w")
    assert (out.status, out.attempt_index, out.tries, out.adopted) == ("sealed", 0, 1, True)
    assert out.reward == 0.75 and agent.runs_of("rR-w") == 1
    await w.flush_reports()
    # the seal's report (it may be merged with the ACK's that followed it before a flush)
    sealed = [r for r in sink.reports if r.result_digest is not None]
    assert len(sealed) == 1 and sealed[0].adopted and sealed[0].attempt_index == 0
    assert sealed[0].state in (AttemptState.SEALED, AttemptState.ACKED)
    await assert_nothing_left(ctl)
    await w.close()


async def test_abandon_while_the_agent_works_cancels_and_keeps_no_result(gym, ctl, agent):
    w = worker(gym, PATIENT)
    task = asyncio.ensure_future(w.run_rollout({"sleep_s": 30}, "rA-w"))
    await until(lambda: agent.starts[("rA-w", 0)] == 1, what="the agent to start")
    await w.abandon("rA-w")
    out = await asyncio.wait_for(task, 5)
    assert (out.status, out.tries, out.has_result) == ("abandoned", 1, False)
    await until(lambda: ("rA-w", 0) in agent.cancelled, what="the run to be cancelled")
    assert await key_state(ctl, "rA-w", 0) == "tombstoned"
    await w.close()


async def test_abandon_after_gym_finished_adopts_and_keeps_the_result(gym, ctl, agent):
    w = worker(gym, PATIENT)
    row = {"reward": 0.125, "receipt_delay_s": 30}
    delayed = gym.faults.delayed
    task = asyncio.ensure_future(w.run_rollout(row, "rF-w"))
    # Gym finished and the rollout waits on its (slow) receipt
    await until(lambda: gym.faults.delayed > delayed, what="the receipt fetch")
    await w.abandon("rF-w")
    out = await asyncio.wait_for(task, 5)
    assert (out.status, out.adopted, out.reward, out.attempt_index) == ("abandoned", True, 0.125, 0)
    assert agent.runs_of("rF-w") == 1
    assert await key_state(ctl, "rF-w", 0) == "acknowledged"
    await w.close()


async def test_an_abandon_that_overtakes_its_dispatch_still_applies(gym, agent):
    w = worker(gym, PATIENT)
    await w.abandon("rE-w", 0)  # arrives before run_rollout
    out = await w.run_rollout({"sleep_s": 30}, "rE-w", 0, 0)
    assert out.status == "abandoned" and out.tries == 0
    assert agent.runs_of("rE-w") == 0
    # a late abandon for a dispatch that already ended does not touch the next dispatch
    await w.abandon("rE-w", 0)
    out = await w.run_rollout({"reward": 1.0}, "rE-w", 0, 1)
    assert out.status == "sealed" and out.attempt_index == 1
    await w.close()


async def test_admission_closed_waits_for_resume_and_sends_the_same_key(gym, ctl, agent):
    # PATIENT: the wait for resume is the subject, not rollout_s (QUICK's 0.5 s could pass on
    # a loaded machine between the 0.3 s look and the resume, retiring try 0)
    w = worker(gym, PATIENT)
    task = None
    try:
        status = await ctl.prepare("ck-admission-w", deadline_ts=time.time() + 2)
        assert status.state == "preparing"
        task = asyncio.ensure_future(w.run_rollout({"reward": 0.5}, "rC-w"))
        # a checkpoint holds admission closed: no agent run, the rollout waits
        await asyncio.sleep(0.3)
        assert not task.done() and agent.runs_of("rC-w") == 0
    finally:
        await ctl.resume("ck-admission-w", deadline_ts=soon(5))
    out = await asyncio.wait_for(task, 5)
    assert (out.status, out.attempt_index, out.tries) == ("sealed", 0, 1)
    await w.close()


async def test_a_try_retired_by_someone_else_moves_to_the_next(gym, ctl, agent):
    answer = await ctl.retire("rS-w", 0, checkpoint_id="rlga-test-probe", deadline_ts=soon(5))
    assert answer.tombstoned
    w = worker(gym)
    out = await w.run_rollout({"reward": 0.5}, "rS-w")
    assert (out.status, out.attempt_index, out.tries) == ("sealed", 1, 2)
    assert agent.starts[("rS-w", 0)] == 0
    await w.close()


async def test_agent_failing_every_try_transiently_fails_with_the_reason(gym, ctl, agent):
    w = worker(gym)
    out = await w.run_rollout({"transient": True}, "rX-w")
    assert out.status == "failed" and out.tries == 3 and "agent_failed" in out.reason
    assert out.failure is FailureKind.AGENT_FAILED and out.failure.is_transport
    for att in range(3):
        assert await key_state(ctl, "rX-w", att) == "tombstoned"
    await assert_nothing_left(ctl)
    await w.close()


async def test_agent_failing_the_row_as_data_fails_it_after_one_try(gym, ctl, agent):
    w = worker(gym)
    out = await w.run_rollout({"fail": True}, "rXd-w")
    assert out.status == "failed" and out.tries == 1 and "agent_data_failed" in out.reason
    assert out.failure is FailureKind.AGENT_DATA and out.failure.is_data
    assert await key_state(ctl, "rXd-w", 0) == "tombstoned"
    assert agent.runs_of("rXd-w") == 1
    await assert_nothing_left(ctl)
    await w.close()


async def test_redispatch_adopts_a_finished_previous_attempt(gym, ctl, agent):
    # an earlier owner ran (rP, 0) and lost it: completed, never ACKed
    await ctl.run({"reward": 0.5}, rollout_id="rP-w", attempt_index=0, deadline_ts=soon(5))
    w = worker(gym)
    out = await w.run_rollout({"reward": 0.5}, "rP-w", 0, 1, 0)
    assert (out.status, out.attempt_index, out.adopted, out.tries) == ("sealed", 0, True, 0)
    assert agent.runs_of("rP-w") == 1
    assert await w.adopt("rP-w", 0) is True
    assert await w.adopt("rP-w", 1) is False
    assert await w.adopt("nobody", 0) is False
    await assert_nothing_left(ctl)
    await w.close()


async def test_reports_move_up_and_the_last_releases_the_rollout(gym):
    sink = Sink()
    w = worker(gym, sink=sink)
    await asyncio.gather(
        w.run_rollout({"drop_reply": True}, "rM1-w"),
        w.run_rollout({"first_try_sleep_s": 30}, "rM2-w"),
        w.run_rollout({"fail": True}, "rM3-w"),
    )
    await w.flush_reports()
    assert (await w.snapshot()).reports_pending == 0
    for rid in ("rM1-w", "rM2-w", "rM3-w"):
        mine = [r for r in sink.reports if r.rollout_id == rid]
        assert mine[-1].released and all(r.owner == "w-test" for r in mine)
        ranks: dict[int, int] = {}
        for r in mine:
            assert r.state.rank >= ranks.get(r.attempt_index, 0)
            ranks[r.attempt_index] = r.state.rank
    snap = await w.snapshot()
    assert (snap.sealed, snap.failed, snap.adoptions, snap.in_flight) == (2, 1, 1, 0)
    await w.close()


async def test_bad_arguments_raise_config_error(gym):
    w = worker(gym)
    with pytest.raises(ConfigError):
        await w.run_rollout({}, "bad id!")
    with pytest.raises(ConfigError):
        await w.run_rollout({}, "ok", endpoint_index=3)
    with pytest.raises(ConfigError):
        await w.run_rollout([], "ok")
    with pytest.raises(ConfigError):
        await w.run_rollout({}, "ok", 0, -1)
    await w.close()


async def test_the_ledger_asking_to_adopt_a_finished_try_gets_it_sealed_and_acked(gym, ctl, agent):
    w = worker(gym)
    delayed = gym.faults.delayed
    task = asyncio.ensure_future(w.run_rollout({"reward": 0.5, "receipt_delay_s": 30}, "rL-w"))
    await until(lambda: gym.faults.delayed > delayed, what="the receipt fetch")
    # what the checkpoint gate does for a completed, un-ACKed current try of a live owner
    assert await asyncio.wait_for(w.adopt("rL-w", 0), 10) is True
    assert await key_state(ctl, "rL-w", 0) == "acknowledged"
    assert await w.adopt("rL-w", 1) is False  # not its current try
    out = await asyncio.wait_for(task, 5)
    assert (out.status, out.adopted, out.attempt_index) == ("sealed", True, 0)
    assert (await w.snapshot()).adopt_requests == 2
    await w.close()


async def test_a_real_gym_without_the_receipt_route_still_seals_and_adopts(agent, caplog):
    from rl_gym_actors.testing.real_gym import RealGymStandIn

    caplog.set_level(logging.INFO, logger="rl_gym_actors.actors.gym_calls")

    with GymServerThread(agent=agent) as server, RealGymStandIn(server.endpoint) as real:
        w = RolloutWorker("w-real", [real.endpoint], QUICK, slots=4)
        ok, lost, slow = await asyncio.gather(
            w.run_rollout({"reward": 0.5}, "rG-ok"),
            w.run_rollout({"reward": 0.25, "drop_reply": True}, "rG-lost"),
            w.run_rollout({"reward": 0.75, "first_try_sleep_s": 30}, "rG-slow"),
        )
        await w.close()
        assert (ok.status, ok.adopted, ok.attempt_index) == ("sealed", False, 0)
        assert (lost.status, lost.adopted, lost.attempt_index, lost.reward) == (
            "sealed",
            True,
            0,
            0.25,
        )
        assert (slow.status, slow.attempt_index, slow.tries) == ("sealed", 1, 2)
        assert agent.runs_of("rG-lost") == 1
        snap = server.participant.snapshot()
        assert snap["running"] == 0 and snap["completed_unacknowledged"] == 0
        assert "receipts come from its status" in caplog.text
        assert (await w.snapshot()).receipts_with_run == 0


async def test_a_real_gym_without_receipt_route_defers_receipts_to_the_checkpoint(agent):
    """ack at_checkpoint on a server with neither a receipt beside /run nor a per-key route:
    the rollouts seal (the lost reply adopted, not rerun) on their replies' own digests, with no
    status listing per rollout; Gym holds each result completed, its listed receipt proving the
    sealed digest (the checkpoint gate ACKs it from that listing)."""
    from rl_gym_actors.testing.real_gym import RealGymStandIn

    policy = QUICK.model_copy(update={"ack": "at_checkpoint"})
    with GymServerThread(agent=agent) as server, RealGymStandIn(server.endpoint) as real:
        w = RolloutWorker("w-defer", [real.endpoint], policy, slots=4)
        outs = await asyncio.gather(
            w.run_rollout({"reward": 0.5}, "rD-ok"),
            w.run_rollout({"reward": 0.25, "drop_reply": True}, "rD-lost"),
            w.run_rollout({"reward": 0.75}, "rD-two"),
        )
        snap = await w.snapshot()
        await w.close()
        assert [(o.status, o.adopted, o.attempt_index) for o in outs] == [
            ("sealed", False, 0),
            ("sealed", True, 0),
            ("sealed", False, 0),
        ]
        assert agent.runs_of("rD-lost") == 1 and outs[1].reward == 0.25
        assert all(o.receipt is None and o.has_result for o in outs)
        assert (snap.receipts_deferred, snap.receipts_from_status) == (3, 0)
        assert real.calls[CONTROL_PREFIX + "/status"] == 0  # no listing per rollout
        async with GymClient(real.endpoint) as client:
            status = await client.status("probe-defer", deadline_ts=time.time() + 10)
        listed = {
            a.rollout_id: a.completion_receipt for a in status.completed_unacknowledged_attempts
        }
        assert {rid: r.result_digest for rid, r in listed.items()} == {
            o.rollout_id: o.result_digest for o in outs
        }
        assert all(o.result_digest == result_digest(o.reply) for o in outs)


async def test_the_receipt_sent_with_the_run_answer_saves_the_fetch(gym, ctl, agent):
    """Our server sends the receipt beside the /run answer (and beside a replay's): no receipt
    fetch for a fresh seal nor for an adoption; the digest is still checked against the reply."""
    w = worker(gym)
    fresh, lost = await asyncio.gather(
        w.run_rollout({"reward": 0.5}, "rH-fresh"),
        w.run_rollout({"reward": 0.25, "drop_reply": True}, "rH-lost"),
    )
    assert (fresh.status, fresh.adopted, lost.status, lost.adopted) == (
        "sealed",
        False,
        "sealed",
        True,
    )
    assert fresh.receipt.result_digest and lost.reward == 0.25
    snap = await w.snapshot()
    assert (snap.receipts_with_run, snap.receipts_fetched) == (2, 0)
    await assert_nothing_left(ctl)
    await w.close()
