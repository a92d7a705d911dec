"""A rollout actor dies (ray.kill) while a later try of its rollout had finished on Gym: the
re-dispatch asks the ledger which try was current, retires it, finds it finished and adopts it.
The same on ``gym serve --protocol v2`` (the actor dies while its try runs; our server keeps the
reply). Real Ray, a real Gym server on loopback."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import ray

from rl_gym_actors import GymEndpoint, Orchestrator, TryPolicy
from rl_gym_actors.actors.runtime import RAY_NAMESPACE
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.testing.inspect_gym import key_state_sync as key_state
from rl_gym_actors.testing.polling import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = TryPolicy(rollout_s=1.0, receipt_s=30.0, max_tries=3, control_s=5.0, admission_wait_s=10.0)
V2_POLICY = TryPolicy(rollout_s=20.0, max_tries=3, control_s=5.0, admission_wait_s=10.0)


def test_a_redispatch_after_actor_death_adopts_the_later_try_that_finished(
    ray_session, gym, agent, tmp_path
):
    ep = GymEndpoint(url=gym.url, token=gym.token)
    rid = "death-adopts-1"
    # try 0 outlives rollout_s and is retired; try 1 finishes at once, but its receipt fetch
    # hangs, so the actor holds try 1 completed on Gym and unsealed when it is killed
    row = {"_ng_rollout_id": rid, "reward": 0.5, "first_try_sleep_s": 5.0, "receipt_delay_s": 15.0}
    with (
        Orchestrator(
            [ep], policy=POLICY, pool_size=1, rollouts_per_actor=1, progress=False
        ) as orch,
        ThreadPoolExecutor(1) as pool,
    ):
        first = pool.submit(orch.run_batch, [row])
        # (read Gym through its participant: a receipt request would take the planned delay)
        wait_for(
            lambda: gym.faults.delayed == 1, timeout_s=20, what="the actor waits on try 1's receipt"
        )
        wait_for(
            lambda: ray.get(orch.ledger.current_attempt.remote(rid)) == 1,
            timeout_s=10,
            what="the ledger hears of try 1",
        )
        assert (rid, 0) in agent.cancelled and (rid, 1) in agent.finished
        assert gym.participant.snapshot()["completed_unacknowledged"] == 1
        assert agent.runs_of(rid) == 2
        victim = orch.snapshot().pool.leases[rid]  # the actor holding the rollout
        ray.kill(ray.get_actor(victim, namespace=RAY_NAMESPACE), no_restart=True)
        (lost,) = first.result(timeout=30)
        assert lost.status == "failed" and lost.failure is FailureKind.ACTOR_DIED

        (out,) = orch.run_batch([row])
        assert (out.status, out.attempt_index, out.adopted) == ("sealed", 1, True)
        assert out.reward == 0.5 and not out.acked  # ack="at_checkpoint": Gym keeps it
        assert agent.runs_of(rid) == 2  # adopted, not rerun
        assert key_state(ep, rid, 1) == "completed"
        orch.checkpoint("after-death", str(tmp_path / "ck"), deadline_s=30.0)
        assert key_state(ep, rid, 1) == "acknowledged"
        snap = gym.participant.snapshot()
        assert snap["running"] == 0 and snap["completed_unacknowledged"] == 0, snap


def test_v2_a_redispatch_after_actor_death_adopts_the_kept_reply(ray_session, agent, tmp_path):
    """On ``gym serve --protocol v2``: the actor dies while its try runs on Gym; the try finishes
    there (our server keeps its reply, (ext)); the re-dispatch retires the current try, finds
    the kept reply and adopts it (no rerun); the checkpoint commits and forgets it."""
    from rl_gym_actors.testing.v2_server import V2ServerThread

    rid = "v2-death-adopts-1"
    row = {"_ng_rollout_id": rid, "reward": 0.5, "sleep_s": 3.0}
    with (
        V2ServerThread(agent=agent) as gym,
        Orchestrator(
            [gym.endpoint], policy=V2_POLICY, pool_size=1, rollouts_per_actor=1, progress=False
        ) as orch,
        ThreadPoolExecutor(1) as pool,
    ):
        first = pool.submit(orch.run_batch, [row])
        wait_for(lambda: agent.runs_of(rid) == 1, timeout_s=20, what="try 0 to run on Gym")
        wait_for(
            lambda: ray.get(orch.ledger.current_attempt.remote(rid)) == 0,
            timeout_s=10,
            what="the ledger hears of try 0",
        )
        victim = orch.snapshot().pool.leases[rid]
        ray.kill(ray.get_actor(victim, namespace=RAY_NAMESPACE), no_restart=True)
        (lost,) = first.result(timeout=30)
        assert lost.status == "failed" and lost.failure is FailureKind.ACTOR_DIED
        wait_for(lambda: (rid, 0) in agent.finished, timeout_s=20, what="try 0 to finish")
        assert gym.participant.status()["kept_replies"] == 1

        (out,) = orch.run_batch([row])
        assert (out.status, out.attempt_index, out.adopted) == ("sealed", 0, True)
        assert out.reward == 0.5 and agent.runs_of(rid) == 1  # adopted, not rerun
        report = orch.checkpoint("v2-after-death", str(tmp_path / "ck"), deadline_s=30.0)
        assert report.endpoints[0].protocol == "v2" and report.endpoints[0].commit is not None
        status = gym.participant.status()
        assert status["report"]["counts"]["episodes"] == 0, status
        assert status["kept_replies"] == 0 and status["retired_rollouts"] == 0, status
