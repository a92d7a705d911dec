"""The checkpoint gate end to end: a real local Ray, the real Gym server on loopback.

Orphans get ACKed, forgotten runs retired, an owner's current completed try adopted, a killed
owner's attempts count as forgotten, two endpoints commit together, and the deadline path fails
with blockers and leaves every endpoint accepting again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time

import pytest

from rl_gym_actors.config import GymEndpoint, LedgerConfig, TryPolicy
from rl_gym_actors.errors import CheckpointConflict, CheckpointFailed, StaleAttempt
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.inspect_gym import key_state
from rl_gym_actors.testing.polling import scaled, until
from rl_gym_actors.testing.ray_kill import kill_for_good

pytestmark = [pytest.mark.ray, pytest.mark.slow]

_ids = itertools.count()
LONG_S = 30.0  # an agent run that no test waits for


def soon(seconds: float = 10.0) -> float:
    return time.time() + scaled(seconds)  # stretched by the machine's load


@contextlib.asynccontextmanager
async def gym(name: str | None = None):
    with GymServerThread(token="test-token", allow_faults=True) as server:
        endpoint = GymEndpoint(url=server.url, token=server.token, name=name)
        async with GymClient(endpoint) as client:
            yield endpoint, client


def make_ledger(ray, endpoints: list[GymEndpoint], **config):
    from rl_gym_actors.actors.ledger_actor import LedgerActor, ledger_name
    from rl_gym_actors.actors.runtime import RAY_NAMESPACE

    return LedgerActor.options(
        name=ledger_name(f"gate-{next(_ids)}"), namespace=RAY_NAMESPACE
    ).remote(endpoints, TryPolicy(control_s=5.0), LedgerConfig(**config))


def make_owner(ray, name: str, endpoint: GymEndpoint, ledger):
    from rl_gym_actors.testing.stand_in_owner import StandInOwner

    owner = StandInOwner.options(name=name, namespace="rl_gym_actors").remote(
        name, endpoint, ledger
    )
    assert ray.get(owner.ping.remote()) == name
    ray.get(ledger.register_owners.remote({name: owner}))
    return owner


async def receipt_state(client: GymClient, rid: str, att: int = 0) -> str:
    return await key_state(client, rid, att)


async def completed(client: GymClient, rid: str, att: int = 0) -> None:
    async def check() -> bool:
        return await receipt_state(client, rid, att) == "completed"

    await until(check, what=f"({rid}, {att}) to complete")


def manifest(path: str) -> dict:
    with open(os.path.join(path, "manifest.json")) as fh:
        return json.load(fh)


async def test_orphan_completed_attempts_get_acked_and_the_checkpoint_commits(
    ray_session, tmp_path
):
    async with gym() as (endpoint, client):
        rids = [f"orphan-{i}" for i in range(5)]
        for rid in rids:  # posted directly: no owner, no report, never ACKed
            result = await client.run(
                {"reward": 0.5}, rollout_id=rid, attempt_index=0, deadline_ts=soon()
            )
            assert result.reply == {"id": f"r-{rid}", "reward": 0.5}
        before = await client.status("probe-orphans", deadline_ts=soon())
        assert before.completed_unacknowledged == 5 and not before.ready_to_commit

        ledger = make_ledger(ray_session, [endpoint])
        report = await ledger.checkpoint.remote("ckpt-orphans", str(tmp_path), 20.0)

        assert report.orphans_acked == 5 and report.retired == 0 and report.adopted == 0
        assert report.endpoints[0].commit.records >= 5
        assert manifest(str(tmp_path))
        assert {await receipt_state(client, rid) for rid in rids} == {"acknowledged"}
        snap = await ledger.snapshot.remote()
        assert snap.orphans_acked == 5 and snap.checkpoints_committed == 1
        assert snap.endpoints[endpoint.url].acked == 5 and snap.invariant_ok
        # admission reopened: a new run goes through
        await client.run(
            {"reward": 1.0}, rollout_id="after-orphans", attempt_index=0, deadline_ts=soon()
        )
        # a spent checkpoint id fails by name, and admission stays open
        with pytest.raises(CheckpointFailed, match="stale_checkpoint"):
            await ledger.checkpoint.remote("ckpt-orphans", str(tmp_path / "again"), 5.0)
        assert (await client.status("probe-orphans-2", deadline_ts=soon())).state == "accepting"
        ray_session.kill(ledger)


async def test_forgotten_running_attempts_are_retired_and_the_checkpoint_commits_fast(
    ray_session, tmp_path
):
    async with gym() as (endpoint, client):
        runs = [
            asyncio.ensure_future(
                client.run(
                    {"sleep_s": LONG_S},
                    rollout_id=f"slow-{i}",
                    attempt_index=0,
                    deadline_ts=soon(60),
                )
            )
            for i in range(3)
        ]

        async def all_running() -> bool:
            return (await client.status("probe-slow", deadline_ts=soon())).running == 3

        await until(all_running, what="every run to start")

        ledger = make_ledger(ray_session, [endpoint])
        await ledger.snapshot.remote()  # the actor is up: the clock below times the checkpoint
        start = time.monotonic()
        report = await ledger.checkpoint.remote("ckpt-slow", str(tmp_path), 20.0)
        elapsed = time.monotonic() - start

        assert report.retired == 3 and report.orphans_acked == 0
        # prepare never waited on the agent: it committed well before any run could finish (how
        # fast it commits on a quiet machine is benchmarks/checkpoint.py's figure, not a test's)
        assert elapsed < LONG_S / 2, elapsed
        assert manifest(str(tmp_path))
        for run in runs:  # their callers learn they were retired
            with pytest.raises(StaleAttempt):
                await asyncio.wait_for(run, scaled(5.0))
        assert (await ledger.snapshot.remote()).endpoints[endpoint.url].tombstoned == 3
        ray_session.kill(ledger)


async def test_an_owner_adopts_its_current_completed_try_and_a_stale_try_is_acked(
    ray_session, tmp_path
):
    async with gym() as (endpoint, client):
        ledger = make_ledger(ray_session, [endpoint])
        owner = make_owner(ray_session, "rlga-rollout-gate-adopt-0", endpoint, ledger)
        # rA/0: the run finishes on Gym, its reply is lost: still the owner's current try
        await owner.start.remote({"reward": 0.5, "drop_reply": True}, "rA", 0)
        # rB/0 finished with a lost reply too, but the owner moved on to rB/1
        await owner.start.remote({"reward": 0.25, "drop_reply": True}, "rB", 0)
        await completed(client, "rA")
        await completed(client, "rB")
        await owner.start.remote({"reward": 0.75}, "rB", 1)

        async def rb1_acked() -> bool:  # the owner's own flow seals and ACKs rB/1
            return (await owner.states.remote()).get("rB/1") == "acked"

        await until(rb1_acked, what="rb1 to be ACKed")
        assert (await owner.states.remote())["rA/0"] == "running"

        report = await ledger.checkpoint.remote("ckpt-adopt", str(tmp_path), 20.0)

        assert report.adopted == 1 and report.orphans_acked == 1 and report.retired == 0
        assert await receipt_state(client, "rA") == "acknowledged"
        assert await receipt_state(client, "rB") == "acknowledged"
        states = await owner.states.remote()
        assert states["rA/0"] == "acked" and states["rB/1"] == "acked"
        assert states["rB/0"] == "running"  # the owner never sealed its stale try
        # the agent ran rA/0 once: the adopted receipt is the first execution's
        receipt = (await client.receipt("rA", 0, deadline_ts=soon())).completion_receipt
        assert receipt.execution_generation == 1
        await owner.flush_reports.remote()
        snap = await ledger.snapshot.remote()
        assert snap.endpoints[endpoint.url].adopted == 1 and snap.adoptions == 1
        assert snap.orphans_acked == 1 and snap.invariant_ok
        ray_session.kill(owner)
        ray_session.kill(ledger)


async def test_a_killed_owners_attempts_count_as_forgotten(ray_session, tmp_path):
    async with gym() as (endpoint, client):
        ledger = make_ledger(ray_session, [endpoint])
        name = "rlga-rollout-gate-killed-0"
        owner = make_owner(ray_session, name, endpoint, ledger)
        await owner.start.remote({"sleep_s": LONG_S}, "rK", 0)
        await owner.start.remote({"reward": 0.5, "drop_reply": True}, "rJ", 0)
        await completed(client, "rJ")
        assert await owner.flush_reports.remote() >= 2
        assert (await ledger.snapshot.remote()).owners == {name: 2}
        await kill_for_good(owner)

        report = await ledger.checkpoint.remote("ckpt-killed", str(tmp_path), 20.0)

        assert report.retired == 1 and report.orphans_acked == 1 and report.adopted == 0
        assert await receipt_state(client, "rK") == "tombstoned"
        assert await receipt_state(client, "rJ") == "acknowledged"
        snap = await ledger.snapshot.remote()
        assert name not in snap.live_owners and snap.invariant_ok
        ray_session.kill(ledger)


async def test_two_endpoints_commit_in_one_checkpoint(ray_session, tmp_path):
    async with gym("east") as (east, east_client), gym("west") as (west, west_client):
        for client, rid in ((east_client, "e-orphan"), (west_client, "w-orphan")):
            await client.run({"reward": 0.5}, rollout_id=rid, attempt_index=0, deadline_ts=soon())
        slow = asyncio.ensure_future(
            west_client.run(
                {"sleep_s": LONG_S}, rollout_id="w-slow", attempt_index=0, deadline_ts=soon(60)
            )
        )
        ledger = make_ledger(ray_session, [east, west])

        report = await ledger.checkpoint.remote("ckpt-two", str(tmp_path), 20.0)

        by_label = {e.label: e for e in report.endpoints}
        assert set(by_label) == {"east", "west"}
        assert by_label["east"].orphans_acked == 1 and by_label["west"].orphans_acked == 1
        assert by_label["west"].retired == 1
        for label in ("east", "west"):
            assert by_label[label].checkpoint_dir == str(tmp_path / label)
            assert manifest(str(tmp_path / label))
        with pytest.raises(StaleAttempt):
            await asyncio.wait_for(slow, 5.0)
        ray_session.kill(ledger)


async def test_the_deadline_path_fails_with_blockers_and_reopens_admission(ray_session, tmp_path):
    async with gym() as (endpoint, client):
        ledger = make_ledger(ray_session, [endpoint], prepare_slice_s=0.5)
        owner = make_owner(ray_session, "rlga-rollout-gate-deadline-0", endpoint, ledger)
        # a live owner's current try that runs past the deadline: the gate must wait, not retire
        await owner.start.remote({"sleep_s": LONG_S}, "rL", 0)

        async def running() -> bool:
            return await receipt_state(client, "rL") == "running"

        await until(running, what="the run to start")

        deadline_s = scaled(1.5)  # a loaded machine still answers the prepare in time
        start = time.monotonic()
        with pytest.raises(CheckpointFailed) as info:
            await ledger.checkpoint.remote("ckpt-late", str(tmp_path / "late"), deadline_s)
        elapsed = time.monotonic() - start

        # it waited, then gave up in time
        assert deadline_s * 2 / 3 <= elapsed < deadline_s + scaled(2.5), elapsed
        err = info.value
        assert err.checkpoint_id == "ckpt-late"
        blocked = err.blockers[endpoint.label]
        running = {"rollout_id": "rL", "attempt_index": 0, "state": "running"}
        assert running in blocked.get("attempts", []), blocked
        assert await receipt_state(client, "rL") == "running"  # not retired: it is owned

        async def accepting() -> bool:  # resumed at once, or by the ledger's healer if that
            try:  # resume was late
                status = await client.status("probe-late", deadline_ts=soon())
            except CheckpointConflict:  # still held by ckpt-late
                return False
            return status.state == "accepting"

        await until(accepting, what="admission to reopen")
        result = await client.run(
            {"reward": 0.1}, rollout_id="after-late", attempt_index=0, deadline_ts=soon()
        )
        assert result.reply["reward"] == 0.1
        snap = await ledger.snapshot.remote()
        assert snap.checkpoints_failed == 1 and snap.checkpoints_committed == 0
        assert not os.path.exists(tmp_path / "late" / "manifest.json")
        await client.retire("rL", 0, checkpoint_id="cleanup-late", deadline_ts=soon())
        ray_session.kill(owner)
        ray_session.kill(ledger)


async def test_a_real_gym_without_receipt_route_or_prepare_report(ray_session, tmp_path):
    """A real Gym's prepare 409 carries counts only and it has no receipt route: the orphans'
    receipts come from its status, and the forgotten run is still retired."""
    from rl_gym_actors.errors import StaleAttempt
    from rl_gym_actors.testing.real_gym import RealGymStandIn

    with (
        GymServerThread(token="test-token", allow_faults=True) as server,
        RealGymStandIn(server.endpoint) as real,
    ):
        async with GymClient(real.endpoint) as client:
            await client.run(
                {"reward": 0.5}, rollout_id="real-orphan", attempt_index=0, deadline_ts=soon()
            )
            slow = asyncio.ensure_future(
                client.run(
                    {"sleep_s": LONG_S},
                    rollout_id="real-slow",
                    attempt_index=0,
                    deadline_ts=soon(60),
                )
            )

            async def running() -> bool:
                return (await client.status("probe-real", deadline_ts=soon())).running == 1

            await until(running, what="the run to start")
            ledger = make_ledger(ray_session, [real.endpoint])

            report = await ledger.checkpoint.remote("ckpt-real", str(tmp_path), 20.0)

            assert report.orphans_acked == 1 and report.retired == 1
            assert manifest(str(tmp_path))
            # a real Gym's 500 "No response returned." to a retired run: the retire's outcome
            with pytest.raises(StaleAttempt) as failed:
                await asyncio.wait_for(slow, 5.0)
            assert failed.value.status == 500
            status = await client.status("probe-real-after", deadline_ts=soon())
            assert status.state == "accepting" and status.completed_unacknowledged == 0
            assert status.running == 0
            ray_session.kill(ledger)


async def test_a_live_owners_try_dispatched_after_the_flush_is_not_retired(ray_session, tmp_path):
    """The gate's first flush misses a try its owner dispatched just after it: the try is
    unknown to the book while admission is open, so the gate closes admission, flushes again,
    learns the owner holds it, and waits for it instead of retiring it."""
    async with gym() as (endpoint, client):
        ledger = make_ledger(ray_session, [endpoint])
        owner = make_owner(ray_session, "rlga-rollout-gate-late-0", endpoint, ledger)
        await owner.start.remote({"sleep_s": 1.0, "reward": 0.5}, "rLate", 0, report_late=True)

        async def running() -> bool:
            return await receipt_state(client, "rLate") == "running"

        await until(running, what="the run to start")

        report = await ledger.checkpoint.remote("ckpt-late-report", str(tmp_path), 20.0)

        assert report.retired == 0 and report.orphans_acked == 0
        assert report.endpoints[0].prepare_rounds >= 2
        assert (await owner.states.remote())["rLate/0"] == "acked"
        assert await receipt_state(client, "rLate") == "acknowledged"
        ray_session.kill(owner)
        ray_session.kill(ledger)
