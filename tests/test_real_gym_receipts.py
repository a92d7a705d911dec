"""Receipts from a real Gym that gives none per key (the first real participant version: no
receipt beside ``/run``, no per-key receipt route), against the real-Gym stand-in in front of our
server: with ``ack="at_checkpoint"`` rollouts seal on their replies' digests without a status
listing each, a lost reply is adopted (not rerun), and the checkpoint ACKs every result with the
receipt its one listing carries, checked against the sealed digest."""

from __future__ import annotations

import pytest

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.protocol import CONTROL_PREFIX, result_digest
from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.real_gym import RealGymStandIn

pytestmark = [pytest.mark.slow, pytest.mark.ray]  # Ray end to end: `make test` runs it

STATUS = CONTROL_PREFIX + "/status"


def test_receipts_are_read_once_per_checkpoint_and_acked_with_it(ray_session, tmp_path):
    from rl_gym_actors.orchestrator import Orchestrator

    agent = CountingAgent()
    policy = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=2, control_s=5.0)
    assert policy.ack == "at_checkpoint"
    rows = [{"_ng_rollout_id": f"rr-{i}", "reward": i / 10} for i in range(8)]
    rows[3]["drop_reply"] = True  # its reply is lost: adopted from Gym, not rerun
    with (
        GymServerThread(agent=agent, token="test-token", allow_faults=True) as server,
        RealGymStandIn(server.endpoint) as real,
        Orchestrator(
            [real.endpoint], policy=policy, pool_size=1, run_id="rr", progress=False
        ) as orch,
    ):
        outs = orch.run_batch(rows)
        listings_in_batch = real.calls[STATUS]
        assert [o.status for o in outs] == ["sealed"] * 8
        assert outs[3].adopted and agent.runs_of("rr-3") == 1 and outs[3].reward == 0.3
        assert all(o.receipt is None and o.result_digest == result_digest(o.reply) for o in outs)
        actors = orch.snapshot().actors
        assert (actors.receipts_deferred, actors.receipts_from_status) == (8, 0)
        assert listings_in_batch <= 1  # none per rollout (at most the protocol probe)
        assert server.participant.snapshot()["completed_unacknowledged"] == 8

        report = orch.checkpoint("rr-ck", str(tmp_path / "ck"), deadline_s=30)

        assert report.sealed_acked == 8 and report.orphans_acked == 0
        assert report.endpoints[0].prepare_rounds <= 3
        assert server.participant.snapshot()["completed_unacknowledged"] == 0
        assert agent.runs_of("rr-3") == 1
