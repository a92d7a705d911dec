"""The run's host at the end of training (verl's ``fit()`` returning): it takes no more rows, lets
the ones under way end, and commits one more part that records and releases their results, so
the run leaves nothing un-ACKed on Gym. Real Gym server, real Ray, the host actor (no verl)."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray

from rl_gym_actors import TryPolicy
from rl_gym_actors.checkpoint_part import read_part
from rl_gym_actors.errors import PoolClosed
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.integrations.verl.host import (
    HostSpec,
    close_host,
    ensure_host,
    find_host,
    finish_host,
)
from rl_gym_actors.testing.polling import wait_for

pytestmark = pytest.mark.slow  # Ray end to end: `make test` runs it

POLICY = TryPolicy(rollout_s=60.0, receipt_s=5.0, max_tries=2, control_s=10.0)
RUN = "hostfin"


def _gym_counts(gym) -> tuple[int, int]:
    async def go() -> tuple[int, int]:
        async with GymClient(gym.endpoint) as client:
            report = await client.status("probe", deadline_ts=time.time() + 10)
            return report.completed_unacknowledged, report.running

    return asyncio.run(go())


@pytest.mark.ray
def test_a_finished_runs_host_waits_for_its_sessions_then_records_and_releases_them(
    ray_session, gym, agent, tmp_path
):
    spec = HostSpec(
        endpoints=(gym.endpoint,), run_id=RUN, pool_size=1, rollouts_per_actor=8, policy=POLICY
    )
    host = ensure_host(spec)
    try:
        # two sessions done and handed before the end; two still running on Gym (held)
        done = [{"_ng_rollout_id": f"{RUN}-done-{i}", "reward": 0.25} for i in range(2)]
        assert [o.status for o in ray.get(host.run_batch.remote(done), timeout=60)] == [
            "sealed"
        ] * 2
        late = [
            {"_ng_rollout_id": f"{RUN}-late-{i}", "reward": 0.5, "hold": True} for i in range(2)
        ]
        calls = [host.run.remote(row) for row in late]
        wait_for(
            lambda: all(agent.runs_of(r["_ng_rollout_id"]) == 1 for r in late),
            timeout_s=60,
            what="the late sessions to start on Gym",
        )
        end_dir = tmp_path / "end"
        finishing = host.finish.remote(f"{RUN}-end", str(end_dir), 60.0, None)
        # it waits for the two under way
        ready, _ = ray.wait([finishing], timeout=1.0)
        assert ready == [], "finish returned while two sessions were still running"
        assert not (end_dir / "rl_gym_actors" / "part.json").exists()
        for row in late:
            agent.release(row["_ng_rollout_id"])
        report = ray.get(finishing, timeout=90)
        assert [o.status for o in ray.get(calls, timeout=30)] == ["sealed"] * 2
        assert report.sealed_acked == 4
        assert _gym_counts(gym) == (0, 0)  # nothing left held or running on Gym
        part, _ = read_part(end_dir)
        assert (part.run_id, part.checkpoint_id) == (RUN, f"{RUN}-end")
        # every released result is in the part (a run extended later gets them back from it)
        assert {o.rollout_id for o in part.handed} == {r["_ng_rollout_id"] for r in done + late}
        assert (end_dir / "rl_gym_actors" / "report.json").exists()
        assert all(agent.runs_of(r["_ng_rollout_id"]) == 1 for r in done + late)
        # a finished run's host takes no more rows: a typed refusal, nothing run
        with pytest.raises(PoolClosed):
            ray.get(host.run.remote({"_ng_rollout_id": f"{RUN}-after"}), timeout=30)
        assert agent.runs_of(f"{RUN}-after") == 0
        # finishing again (a resumed run that had already ended): the committed report
        again = finish_host(RUN, f"{RUN}-end", str(end_dir), 30.0)
        assert again is not None and again.sealed_acked == report.sealed_acked
    finally:
        close_host(RUN)
    assert find_host(RUN) is None
