"""Results in flight at a checkpoint are recorded before they are released (issue 27, item 1), on
both protocols, with a real Gym server and a real local Ray.

Three rows run when ``acheckpoint`` starts (plain agents: no step boundary, so the gate waits
for them to finish, on v2 as on the agent-checkpoint protocol); they finish once the gate's
prepare closed admission. Before, the part was written
before the gate and named only the 3 results handed out earlier; the gate then released the 3
that finished while it waited (ACKed, or on v2 forgotten with the rest), and a trainer restored
from that checkpoint sending those rows again got ``forgotten_rollout`` or a rerun. Now every
result the gate releases is in the part first: restored, the 3 drained rows come back with
their replies, and no agent ran twice."""

from __future__ import annotations

import asyncio
import json

import pytest

from rl_gym_actors import Orchestrator, TryPolicy
from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import wait_for
from rl_gym_actors.testing.v2_server import V2ServerThread

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = TryPolicy(rollout_s=30.0, receipt_s=5.0, max_tries=2, control_s=5.0)


def _orch(server, run: str, **kwargs) -> Orchestrator:
    return Orchestrator(
        [server.endpoint],
        policy=POLICY,
        pool_size=1,
        rollouts_per_actor=8,
        run_id=run,
        progress=False,
        **kwargs,
    )


def _closed(server) -> bool:
    """Whether a checkpoint closed the server's admission (a prepare reached it)."""
    if isinstance(server, V2ServerThread):
        return not server.participant.status()["accepting"]
    return server.participant.core.report(listed=False).state != "accepting"


def _running(agent: CountingAgent, ids: list[str]) -> bool:
    started = {rid for (rid, _) in agent.starts}
    return set(ids) <= started and not any((rid, 0) in agent.finished for rid in ids)


@pytest.mark.parametrize("protocol", ["agent", "v2"])
def test_rows_running_when_the_checkpoint_starts_are_in_its_part(ray_session, tmp_path, protocol):
    agent = CountingAgent()
    run = f"if{protocol}"
    server = GymServerThread(agent=agent) if protocol == "agent" else V2ServerThread(agent=agent)
    done_rows = [{"_ng_rollout_id": f"{run}-done-{i}", "reward": 0.5 + i} for i in range(3)]
    live_rows = [
        {"_ng_rollout_id": f"{run}-live-{i}", "reward": 0.25 * i, "hold": True} for i in range(3)
    ]
    live_ids = [r["_ng_rollout_id"] for r in live_rows]
    directory = tmp_path / "global_step_1"
    with server:
        with _orch(server, run) as orch:
            assert [o.status for o in orch.run_batch(done_rows)] == ["sealed"] * 3

            async def step() -> tuple[list, object]:
                batch = asyncio.ensure_future(orch.arun_batch(live_rows))
                await asyncio.to_thread(
                    wait_for, lambda: _running(agent, live_ids), what="3 rows running"
                )
                ckpt = asyncio.ensure_future(
                    orch.acheckpoint(f"{run}-ck-1", str(directory), deadline_s=60)
                )
                # the gate closed admission and waits for them: now they finish
                await asyncio.to_thread(wait_for, lambda: _closed(server), what="prepare")
                for rid in live_ids:
                    agent.release(rid)
                return await batch, await ckpt

            outcomes, report = asyncio.run(step())
            assert [o.status for o in outcomes] == ["sealed"] * 3
            if protocol == "agent":
                assert report.sealed_acked == 6  # the 3 drained rows: released by this commit
        part = json.loads((directory / "rl_gym_actors" / "part.json").read_text())
        held = {o["rollout_id"]: o for o in (*part["handed"], *part["undelivered"])}
        assert set(live_ids) <= set(held)
        assert all(held[rid]["reply"] is not None for rid in live_ids)

        # the trainer is gone; a new one restores from the checkpoint, sends the same rows
        with _orch(server, run, restore_from=directory) as again:
            back = again.run_batch(live_rows)
    assert [(o.status, o.failure) for o in back] == [("sealed", None)] * 3
    assert [o.reward for o in back] == [r["reward"] for r in live_rows]
    assert all(o.reply is not None for o in back)
    assert all(agent.runs_of(rid) == 1 for rid in live_ids)  # none ran again
