"""The drop-in's v2 checkpoint calls (NeMo RL's newest coordinator's names) against
``gym serve --protocol v2`` on loopback: discovery, prepare parks a multi-step episode, renew,
commit writes under ``<root>/gym-instances/<instance>/`` and answers the summary NeMo RL's adapter
builds (owned episodes from the agent's session records), resume lets the episode finish, retire
and forget, a restore into a fresh server names the source checkpoint, and a wrong source is
refused; the admission refusal carries its row index."""

from __future__ import annotations

import asyncio
import time

import pytest

from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.integrations.nemo_rl import v2_shapes
from rl_gym_actors.integrations.nemo_rl.v2_checkpoint_calls import V2CheckpointCalls
from rl_gym_actors.testing.counting_agent import HeldAgent
from rl_gym_actors.testing.polling import until
from rl_gym_actors.testing.v2_server import V2ServerThread

aio = pytest.mark.asyncio(loop_scope="session")


class Host(V2CheckpointCalls):
    def __init__(self, endpoints, nemo=None) -> None:
        self.endpoints = list(endpoints)
        self.checkpoint_instance = (nemo or {}).get("checkpoint_instance")
        self._v2_members = None


def soon(s: float = 10.0) -> float:
    return time.time() + s


Episode = v2_shapes.GymCheckpointEpisode


@aio
async def test_v2_checkpoint_calls_round_trip(tmp_path):
    root = tmp_path / "root"
    with V2ServerThread() as server:
        host = Host(
            [server.endpoint], {"checkpoint_instance": {"shard_name": "s", "replica_index": 1}}
        )
        summary = await host.initialize_checkpoint_adapter()
        assert summary.instance_id == "s/replica-1" and summary.members == (("gym-0", "agent"),)
        async with GymClient(server.endpoint) as gym:
            row = {"steps": 3, "step_s": 0.4, "reward": 0.5}
            run = asyncio.ensure_future(
                gym.run(row, rollout_id="r1", attempt_index=0, deadline_ts=soon(30))
            )
            await until(lambda: server.participant.steps_run >= 1, timeout_s=10, what="a step")
            prepared = await host.checkpoint_prepare("c1", deadline_ts=soon())
            assert prepared.prepared and prepared.blockers == {}
            await host.checkpoint_renew("c1", deadline_ts=soon())
            committed = await host.checkpoint_commit(
                "c1", str(root), (Episode("r1", 0),), deadline_ts=soon()
            )
            assert committed.exported_episodes == (Episode("r1", 0),)
            assert committed.unowned_live_episodes == () and committed.staging_keys == ()
            [part] = committed.participants
            assert (part.server_name, part.kind, part.phase) == ("gym-0", "agent", "committed")
            assert part.capture_keys == ("r1",) and part.manifest.checkpoint_id == "c1"
            files = root / "gym-instances" / "s" / "replica-1" / "gym" / "agent" / "agent"
            assert (files / "manifest.json").exists() and (
                files / part.manifest.records_file
            ).exists()
            await host.checkpoint_resume("c1", deadline_ts=soon())
            done = await asyncio.wait_for(run, 30)
            assert done.reply["reward"] == 0.5
            await host.checkpoint_retire("c-retire", (Episode("r2", 0),), deadline_ts=soon())
            assert server.participant.status()["retired_rollouts"] == 1
            await host.checkpoint_forget("c-retire", ("r2",), deadline_ts=soon())
            assert server.participant.status()["retired_rollouts"] == 0
    inst = {"checkpoint_instance": {"shard_name": "s", "replica_index": 1}}
    with V2ServerThread() as fresh:  # the wrong source: refused, and cleaned up as NeMo RL does
        host = Host([fresh.endpoint], inst)
        await host.initialize_checkpoint_adapter()
        with pytest.raises(RuntimeError, match="another checkpoint"):
            await host.checkpoint_restore(
                "x1", str(root), (Episode("r1", 0),), source_checkpoint_id="c0", deadline_ts=soon()
            )
        await host.checkpoint_retire("x1", (Episode("r1", 1),), deadline_ts=soon())
        await host.checkpoint_resume("x1", deadline_ts=soon())
        status = fresh.participant.status()
        assert status["restored_pending"] == [] and status["phase"] == "idle"
    with V2ServerThread() as fresh:
        host = Host([fresh.endpoint], inst)
        await host.initialize_checkpoint_adapter()
        await host.checkpoint_restore(
            "x2", str(root), (Episode("r1", 0),), source_checkpoint_id="c1", deadline_ts=soon()
        )
        assert fresh.participant.status()["restored_pending"] == ["r1-a1"]
        await host.checkpoint_resume("x2", deadline_ts=soon())


@aio
async def test_v2_prepare_not_ready_names_blockers_and_refusals_carry_the_row(tmp_path):
    held = HeldAgent()
    with V2ServerThread(agent=held) as server:
        host = Host([server.endpoint])
        summary = await host.initialize_checkpoint_adapter()
        assert summary.instance_id == "nemo_gym/replica-0"
        async with GymClient(server.endpoint) as gym:
            run = asyncio.ensure_future(
                gym.run({}, rollout_id="busy", attempt_index=0, deadline_ts=soon(30))
            )
            await until(
                lambda: server.participant.status()["report"]["counts"]["episodes"] == 1,
                timeout_s=10,
                what="a run",
            )
            prepared = await host.checkpoint_prepare("c1", deadline_ts=soon(0.5))
            assert not prepared.prepared and prepared.blockers == {"gym-0": ("busy",)}
            await host.checkpoint_resume("c1", deadline_ts=soon())
            held.release()
            assert (await asyncio.wait_for(run, 30)).reply == {"ok": True}
    with pytest.raises(RuntimeError, match="not been initialized"):
        await Host([]).checkpoint_renew("c", deadline_ts=soon())
    refusal = v2_shapes.admission_closed("refused", 7)
    assert refusal.row_idx == 7 and isinstance(refusal, Exception)


def test_the_drop_in_has_the_v2_calls_and_takes_nemo_rls_instance():
    from rl_gym_actors.integrations.nemo_rl.dropin import GymRolloutEnv

    env = GymRolloutEnv(
        {
            "rl_gym_actors": {"endpoints": [{"url": "http://127.0.0.1:9", "token": "t"}]},
            "checkpoint_instance": {"shard_name": "math", "replica_index": 2},
        }
    )
    assert isinstance(env, V2CheckpointCalls)
    assert env._v2_instance_id() == "math/replica-2"
