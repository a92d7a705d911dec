"""``orch.snapshot()``'s numbers agree with what the driver got (issue 31, item 8): nothing
running once ``run_batch`` returned (the actors' pending reports are delivered first); the
outcomes the driver received, also when a rollout actor died mid-batch and took its counters
with it; ACKs named where they happen (the actors' own vs. an endpoint's, a checkpoint's
included); a v2 endpoint, which has no ACK, said so, with results forgotten at a checkpoint
instead. Real Ray, real Gym servers on loopback, a real ray.kill. A real node loss (a second
raylet on loopback SIGKILLed with rollout actors on it) checks the same counts in
tests/test_chaos.py (test_a_three_node_cluster_losing_a_node): a cluster of its own."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import ray

from rl_gym_actors import Orchestrator, TryPolicy
from rl_gym_actors.actors.runtime import RAY_NAMESPACE
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.testing.polling import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = TryPolicy(rollout_s=20.0, receipt_s=5.0, max_tries=2, control_s=5.0)


def test_after_run_batch_nothing_runs_and_acks_are_named_where_they_happen(
    ray_session, gym, tmp_path
):
    rows = [{"_ng_rollout_id": f"snap-v1-{i}", "reward": 0.5, "sleep_s": 0.05} for i in range(10)]
    with Orchestrator(
        [gym.endpoint], policy=POLICY, pool_size=1, rollouts_per_actor=10, progress=False
    ) as orch:
        assert [o.status for o in orch.run_batch(rows)] == ["sealed"] * 10
        snap = orch.snapshot()  # at once: no reports left in the actors' outboxes
        (ep,) = snap.ledger.endpoints.values()
        assert (ep.running, ep.completed_unacked, ep.acked) == (0, 10, 0)
        assert (snap.received.sealed, snap.received.failed) == (10, 0)
        assert snap.in_flight == 0 and snap.protocols == {gym.url: "agent"}
        orch.checkpoint("snap-ck", str(tmp_path / "ck"), deadline_s=30.0)
        snap = orch.snapshot()
        (ep,) = snap.ledger.endpoints.values()
        assert (ep.running, ep.completed_unacked, ep.acked) == (0, 0, 10)
        assert snap.actors.acks == 0  # the checkpoint ACKed them, not the actors
        text = str(snap)
        assert "received by the driver: 10 sealed, 0 failed" in text
        assert "0 ACKed by the actors themselves" in text
        assert "10 ACKed (by the actors or a checkpoint)" in text


def test_v2_endpoints_say_they_have_no_ack(ray_session, agent, tmp_path):
    from rl_gym_actors.testing.v2_server import V2ServerThread

    rows = [{"_ng_rollout_id": f"snap-v2-{i}", "reward": 0.5} for i in range(6)]
    with (
        V2ServerThread(agent=agent) as gym,
        Orchestrator(
            [gym.endpoint], policy=POLICY, pool_size=1, rollouts_per_actor=6, progress=False
        ) as orch,
    ):
        assert [o.status for o in orch.run_batch(rows)] == ["sealed"] * 6
        snap = orch.snapshot()
        (ep,) = snap.ledger.endpoints.values()
        assert (ep.running, ep.completed_unacked) == (0, 6)
        assert snap.protocols == {gym.url: "v2"}
        assert "(v2, no ACK): 6 dispatched = 0 running + 6 sealed, kept until a checkpoint" in (
            str(snap)
        )
        orch.checkpoint("snap-v2-ck", str(tmp_path / "ck"), deadline_s=30.0)
        text = str(orch.snapshot())
        assert "+ 6 forgotten at a checkpoint" in text
        assert "ACKed (by" not in text


def test_a_dead_actor_leaves_the_counts_of_what_the_driver_received(ray_session, gym, agent):
    """Two actors; one is killed while its rows run: the driver gets those rows failed
    (ACTOR_DIED) and the others sealed, and the snapshot's received counts say exactly that,
    while the live actors' counters (the dead one's gone) are labelled as theirs."""
    rows = [{"_ng_rollout_id": f"snap-kill-{i}", "reward": 0.5, "sleep_s": 3.0} for i in range(8)]
    policy = TryPolicy(rollout_s=30.0, receipt_s=5.0, max_tries=1, control_s=5.0)
    with (
        Orchestrator(
            [gym.endpoint], policy=policy, pool_size=2, rollouts_per_actor=4, progress=False
        ) as orch,
        ThreadPoolExecutor(1) as pool,
    ):
        batch = pool.submit(orch.run_batch, rows)
        wait_for(lambda: len(orch.snapshot().pool.leases) == 8, timeout_s=30, what="8 rows leased")
        leases = orch.snapshot().pool.leases
        victim = leases[rows[0]["_ng_rollout_id"]]
        ray.kill(ray.get_actor(victim, namespace=RAY_NAMESPACE), no_restart=True)
        outcomes = batch.result(timeout=60)
        died = [o for o in outcomes if o.status == "failed"]
        assert died and all(o.failure is FailureKind.ACTOR_DIED for o in died)
        assert all(leases[o.rollout_id] == victim for o in died)
        sealed = sum(o.status == "sealed" for o in outcomes)
        snap = orch.snapshot()
        assert (snap.received.sealed, snap.received.failed) == (sealed, len(died))
        assert f"received by the driver: {sealed} sealed, {len(died)} failed" in str(snap)
        assert snap.actors.sealed + snap.actors.failed < len(outcomes)  # the dead one's are gone
        assert "a dead one's counts go with it" in str(snap)
