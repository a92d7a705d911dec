"""Two runs on one Gym v2 server: run B's checkpoint and restore never touch run A's episodes.

A real NeMo Gym agent participant exports every live session at a commit, whatever the commit's
scope names (its ``export``: the scope only limits restored sessions), so B's commit answer lists
A's parked episodes as exported. B's part records only what B had in flight there; B's restore
(``restore_from=``) then retires and installs nothing of A's, and A's rows all seal. Run on our
``gym serve --protocol v2`` as it is (it exports within the scope) and with
``--export-every-session`` (exports as the real participant does)."""

from __future__ import annotations

import asyncio

import pytest

from rl_gym_actors.checkpoint_part import read_part
from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.testing.polling import until
from rl_gym_actors.testing.v2_server import V2ServerThread

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = TryPolicy(rollout_s=60.0, receipt_s=5.0, max_tries=2, control_s=5.0)
A_ROWS = 4
STEPS = 80  # A's episodes: 80 steps of 0.1 s, under way through B's checkpoint and restore


def a_rows() -> list[dict]:
    return [
        {"_ng_rollout_id": f"run-a-{i}", "steps": STEPS, "step_s": 0.1, "reward": 0.25}
        for i in range(A_ROWS)
    ]


@pytest.mark.parametrize("export", ["scoped", "every-session"])
async def test_b_restore_leaves_a_rows_sealed(ray_session, tmp_path, export):
    from rl_gym_actors.orchestrator import Orchestrator

    args = ["--export-every-session"] if export == "every-session" else []
    with V2ServerThread(args=args) as server:
        endpoint = GymEndpoint(url=server.url, token=server.token)
        part = server.participant
        async with Orchestrator(
            [endpoint], policy=POLICY, pool_size=4, run_id="run-a", progress=False, start=False
        ) as a:
            await a.astart()
            b_dir = str(tmp_path / "b-1")
            async with Orchestrator(
                [endpoint], policy=POLICY, pool_size=1, run_id="run-b", progress=False
            ) as b:
                b_out = await b.arun_batch([{"_ng_rollout_id": "run-b-0", "reward": 0.5}])
                assert [o.status for o in b_out] == ["sealed"]
                a_batch = asyncio.ensure_future(a.arun_batch(a_rows()))
                await until(lambda: part.steps_run >= 2 * A_ROWS, what="A's episodes under way")
                report = await b.acheckpoint("b-1", b_dir, deadline_s=30.0)
            exported = report.endpoints[0].commit.model_extra["episode_ids"]
            if export == "every-session":  # the real participant's answer names A's episodes
                assert any(k.startswith("run-a-") for k in exported), exported
            async with Orchestrator(
                [endpoint],
                policy=POLICY,
                pool_size=1,
                run_id="run-b",
                progress=False,
                restore_from=b_dir,
                start=False,
            ) as b2:
                await b2.astart()
                restored = b2.restore_report
                assert restored is not None
                assert restored.endpoints[0].retired == 0, restored
                assert not restored.placed and not restored.next_attempts, restored
                again = await b2.arun_batch([{"_ng_rollout_id": "run-b-0", "reward": 0.5}])
                assert [o.repeated for o in again] == [True]  # B's own sealed row, not rerun
            a_out = await asyncio.wait_for(a_batch, 120)
            assert [o.status for o in a_out] == ["sealed"] * A_ROWS, [
                (o.status, o.reason) for o in a_out
            ]
            assert [o.attempt_index for o in a_out] == [0] * A_ROWS  # never retired nor rerun
            b_part, _ = read_part(b_dir)
            assert [s.exported for s in b_part.gym_v2] == [[]]  # nothing of A's in B's part
            assert [s.start_over for s in b_part.gym_v2] == [[]]
            await a.acheckpoint("a-1", str(tmp_path / "a-1"), deadline_s=30.0)
        status = part.status()
        assert status["phase"] == "idle" and status["restored_pending"] == []
