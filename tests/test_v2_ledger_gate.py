"""The ledger's checkpoint gate against a Gym v2 server (``gym serve --protocol v2``): the gate
picks the protocol per server by asking it, parks in-flight multi-step episodes at a boundary,
commits them (scoped to what live owners hold), renews the lease while the checkpoint is open,
retires what a dead owner left running, and forgets finished rollouts in batches after the commit.
Real parts: a local Ray ledger actor, stand-in owners (Ray actors) and the v2 server on loopback.
"""

from __future__ import annotations

import itertools
import json
import os
import time

import pytest

from rl_gym_actors.config import GymEndpoint, LedgerConfig, TryPolicy
from rl_gym_actors.errors import CheckpointFailed
from rl_gym_actors.testing.polling import until
from rl_gym_actors.testing.ray_kill import kill_for_good
from rl_gym_actors.testing.v2_server import V2ServerThread

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # 10-16 s each: the edit loop skips them

_ids = itertools.count()


def make_ledger(endpoints: list[GymEndpoint], control_s: float = 3.0, **config):
    from rl_gym_actors.actors.ledger_actor import LedgerActor, ledger_name
    from rl_gym_actors.actors.runtime import RAY_NAMESPACE

    return LedgerActor.options(
        name=ledger_name(f"v2gate-{next(_ids)}"), namespace=RAY_NAMESPACE
    ).remote(endpoints, TryPolicy(control_s=control_s), LedgerConfig(**config))


def make_owner(ray, endpoint: GymEndpoint, ledger):
    from rl_gym_actors.testing.stand_in_owner import StandInOwner

    name = f"v2owner-{next(_ids)}"
    owner = StandInOwner.options(name=name, namespace="rl_gym_actors").remote(
        name, endpoint, ledger, v2=True
    )
    assert ray.get(owner.ping.remote()) == name
    ray.get(ledger.register_owners.remote({name: owner}))
    return owner


async def episodes_on(server: V2ServerThread, n: int) -> None:
    async def there() -> bool:
        return server.participant.status()["report"]["counts"]["episodes"] >= n

    await until(there, timeout_s=15.0, what=f"{n} episodes on the v2 server")


async def test_v2_checkpoint_parks_commits_renews_and_runs_continue(ray_session, tmp_path):
    with V2ServerThread() as server:
        ledger = make_ledger([server.endpoint], control_s=3.0)
        owner = make_owner(ray_session, server.endpoint, ledger)
        assert await ledger.protocols.remote() == {server.endpoint.url: "v2"}
        row = {"steps": 2, "step_s": 2.5, "reward": 0.5}
        for rid in ("ep-a", "ep-b"):
            await owner.start.remote(dict(row), rid)
        await episodes_on(server, 2)

        started = time.time()
        report = await ledger.checkpoint.remote("v2-ckpt-1", str(tmp_path), 20.0)
        # prepare waited for both episodes to reach their first boundary (a step of 2.5 s):
        # the lease was renewed meanwhile (every min(3.0 / 3, 10) = 1 s)
        assert time.time() - started >= 1.5
        [entry] = report.endpoints
        assert entry.protocol == "v2" and entry.renewals >= 1
        assert entry.commit.records == 2
        assert entry.commit.episode_ids == ["ep-a", "ep-b"]  # capture keys of attempt 0
        # the participant's manifest, where Gym puts it
        manifest_path = os.path.join(str(tmp_path), "gym", "agent")
        [instance] = os.listdir(manifest_path)
        with open(os.path.join(manifest_path, instance, "manifest.json")) as fh:
            manifest = json.load(fh)
        assert manifest["checkpoint_id"] == "v2-ckpt-1" and manifest["record_count"] == 2
        assert server.participant.status()["phase"] == "idle"  # resumed

        async def both_replied() -> dict | None:
            bodies = await owner.reply_bodies.remote()
            return bodies if len(bodies) == 2 else None

        bodies = await until(both_replied, timeout_s=20.0, what="both runs to finish")
        for body in bodies.values():  # parked and continued, never rerun
            assert body["reply"]["steps_run"] == 2 and not body["replayed"]
        assert server.participant.steps_run == 4

        # the next checkpoint forgets both finished rollouts: the kept replies go away
        assert server.participant.status()["kept_replies"] == 2
        report = await ledger.checkpoint.remote("v2-ckpt-2", str(tmp_path / "2"), 20.0)
        assert report.endpoints[0].forgotten == 2 and report.endpoints[0].commit.records == 0
        status = server.participant.status()
        assert status["kept_replies"] == 0 and status["retired_rollouts"] == 0
        snap = await ledger.snapshot.remote()
        assert snap.checkpoints_committed == 2 and snap.rollouts == 0  # pruned after the forget


async def test_v2_gate_retires_what_a_dead_owner_left_and_forgets_in_batches(ray_session, tmp_path):
    with V2ServerThread() as server:
        ledger = make_ledger([server.endpoint], control_s=5.0, forget_batch=2)
        owner = make_owner(ray_session, server.endpoint, ledger)
        for i in range(5):  # five quick rollouts: finished, sealed, released
            await owner.start.remote({"reward": 0.1}, f"quick-{i}")
        await owner.start.remote({"steps": 1, "step_s": 60.0}, "stuck")  # never ends by itself
        await episodes_on(server, 1)  # "stuck" (the quick ones may be done already)

        async def quick_done() -> bool:
            return len(await owner.reply_bodies.remote()) == 5

        await until(quick_done, timeout_s=15.0, what="the quick rollouts to finish")
        await owner.flush_reports.remote()
        await kill_for_good(owner)  # the owner of "stuck" dies: nobody will ever read its reply

        report = await ledger.checkpoint.remote("v2-dead-1", str(tmp_path), 20.0)
        [entry] = report.endpoints
        assert entry.retired == 1  # "stuck", retired before prepare (it would block it)
        assert entry.commit.records == 0
        # 5 sealed + the retired one, forgotten in batches of 2 (3 calls)
        assert entry.forgotten == 6
        status = server.participant.status()
        assert status["retired_rollouts"] == 0 and status["kept_replies"] == 0
        assert status["report"]["counts"]["episodes"] == 0


async def test_v2_checkpoint_not_ready_names_blockers_and_resumes(ray_session, tmp_path):
    from rl_gym_actors.gym.agents import simulated_agent

    # a plain agent: no boundary but its start, so a running /run blocks prepare
    with V2ServerThread(agent=simulated_agent) as server:
        ledger = make_ledger([server.endpoint], control_s=5.0)
        owner = make_owner(ray_session, server.endpoint, ledger)
        await owner.start.remote({"sleep_s": 8.0}, "long")
        await episodes_on(server, 1)
        with pytest.raises(CheckpointFailed) as info:
            await ledger.checkpoint.remote("v2-blocked", str(tmp_path), 2.0)
        blockers = info.value.blockers[server.endpoint.label]
        assert blockers["blockers"] == ["long"] and blockers["blocker_count"] == 1
        assert server.participant.status()["phase"] == "idle"  # resumed: admission open
        snap = await ledger.snapshot.remote()
        assert snap.checkpoints_failed == 1
