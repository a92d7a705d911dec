"""A ledger that comes back: Ray restarts a killed ledger actor, the rollout actors report again,
and the batch, the next batch, ``snapshot()`` and ``checkpoint()`` carry on. A ledger gone for good
is a typed ``LedgerLost``.

A restarted ledger rebuilds its book (issue 16): killed mid-run while 600 rows run with
``ack="at_checkpoint"``, once the batch is in the book has no phantom running attempt, and the next
checkpoint ACKs every sealed result as sealed, none as an orphan (before: 95 of 600 counted as
orphans, one attempt left running)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.errors import LedgerLost
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.orchestrator import Orchestrator
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.phase_hold import PhaseHold
from rl_gym_actors.testing.polling import scaled, until
from rl_gym_actors.testing.ray_kill import kill_for_good

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=2, control_s=3.0)
REBUILD_POLICY = TryPolicy(rollout_s=20.0, receipt_s=2.0, max_tries=2, control_s=3.0)
REBUILD_ROWS = 600


def soon(seconds: float = 10.0) -> float:
    return time.time() + scaled(seconds)  # stretched by the machine's load


@contextlib.asynccontextmanager
async def served(
    policy: TryPolicy, pool_size: int = 2, rollouts_per_actor: int = 1, extensions=()
) -> AsyncIterator[tuple[GymServerThread, GymClient, Orchestrator]]:
    """A Gym server on loopback, a client of it, and an orchestrator on it (its ledger to kill)."""
    with GymServerThread(token="test-token", extensions=list(extensions)) as server:
        endpoint = GymEndpoint(url=server.url, token=server.token)
        async with (
            GymClient(endpoint) as client,
            Orchestrator(
                [endpoint],
                policy=policy,
                pool_size=pool_size,
                rollouts_per_actor=rollouts_per_actor,
                progress=False,
                start=False,
            ) as orch,
        ):
            yield server, client, orch


async def until_running(client: GymClient, n: int) -> None:
    async def started() -> bool:
        return (await client.status("probe", deadline_ts=soon())).running >= n

    await until(started, timeout_s=15, what="the batch to start")


async def settled(orch, url: str, dispatched: int):
    """The snapshot once every report is in (reports travel in batches), with a deadline."""

    async def all_in():
        snap = await orch.asnapshot()
        ep = snap.ledger.endpoints[url]
        assert snap.ledger.invariant_ok and ep.invariant_ok
        return snap if ep.dispatched >= dispatched and ep.running == 0 else None

    return await until(all_in, timeout_s=10, what="every report to reach the ledger")


@pytest.mark.slow
@pytest.mark.parametrize("when", ["mid-batch", "mid-checkpoint"])
async def test_a_killed_ledger_comes_back_and_the_next_checkpoint_commits(
    ray_session, tmp_path, when
):
    async with served(POLICY, rollouts_per_actor=2) as (server, client, orch):
        rows = [{"sleep_s": 1.0, "reward": 0.5} for _ in range(4)]
        batch = asyncio.ensure_future(orch.arun_batch(rows))
        await until_running(client, 4)
        if when == "mid-batch":
            ray_session.kill(orch.ledger, no_restart=False)
            outcomes = await asyncio.wait_for(batch, 30)
        else:
            ckpt = asyncio.ensure_future(
                orch.acheckpoint("during", str(tmp_path / "d"), deadline_s=20.0)
            )

            async def preparing() -> bool:  # the gate has prepared: admission closed
                return (await client.status("probe", deadline_ts=soon())).state == "preparing"

            await until(preparing, what="the gate to prepare")
            ray_session.kill(orch.ledger, no_restart=False)
            outcomes = await asyncio.wait_for(batch, 30)
            report = await asyncio.wait_for(ckpt, 40)  # Ray sent the call again
            assert report.endpoints[0].commit.records >= 1
        assert [o.status for o in outcomes] == ["sealed"] * 4
        assert await orch.ledger.restarted.remote()

        again = await orch.arun_batch([{"reward": 0.25} for _ in range(3)])
        assert [o.status for o in again] == ["sealed"] * 3
        report = await orch.acheckpoint("after", str(tmp_path / "a"), deadline_s=20.0)
        assert report.endpoints[0].commit.records >= 3
        snap = await settled(orch, server.url, 3)
        assert snap.ledger.checkpoints_committed >= 1
        status = await client.status("probe-end", deadline_ts=soon())
        assert status.running == 0 and status.completed_unacknowledged == 0
        assert server.participant.snapshot()["agent_starts"] == 7  # nothing ran twice


async def test_a_ledger_gone_for_good_is_ledger_lost(ray_session, tmp_path):
    async with served(POLICY, pool_size=1) as (_, _, orch):
        assert [o.status for o in await orch.arun_batch([{}])] == ["sealed"]
        await kill_for_good(orch.ledger)
        with pytest.raises(LedgerLost):
            await orch.asnapshot()
        with pytest.raises(LedgerLost):
            await orch.acheckpoint("lost", str(tmp_path), deadline_s=5.0)
        # rollouts do not need the ledger to run
        assert [o.status for o in await orch.arun_batch([{}])] == ["sealed"]
        # nor does freeing Gym: abort goes to the servers from the orchestrator itself
        assert (await orch.aabort_checkpoint("never-held")).aborted


async def test_a_restarted_ledger_counts_no_sealed_result_as_an_orphan(ray_session, tmp_path):
    async with served(REBUILD_POLICY, rollouts_per_actor=32) as (server, client, orch):
        rows = [{"sleep_s": 0.05, "reward": 0.5} for _ in range(REBUILD_ROWS)]
        batch = asyncio.ensure_future(orch.arun_batch(rows))

        async def sealed_on_gym() -> bool:
            st = await client.status("probe", deadline_ts=soon(5))
            return st.completed_unacknowledged >= REBUILD_ROWS // 6

        await until(sealed_on_gym, timeout_s=60, what="a sixth of the batch sealed")
        ray_session.kill(orch.ledger, no_restart=False)
        outcomes = await asyncio.wait_for(batch, scaled(120))
        assert [o.status for o in outcomes] == ["sealed"] * REBUILD_ROWS
        assert await orch.ledger.restarted.remote()

        async def nothing_running():
            snap = await orch.asnapshot()
            return snap if snap.ledger.endpoints[server.url].running == 0 else None

        # no phantom: every attempt the book has as running ends (reports come in batches)
        await until(nothing_running, timeout_s=20, what="the book to show nothing running")
        report = await orch.acheckpoint("rebuilt", str(tmp_path / "ck"), deadline_s=60.0)
        assert report.orphans_acked == 0
        assert report.sealed_acked == REBUILD_ROWS
        snap = await orch.asnapshot()
        assert snap.ledger.orphans_acked == 0
        assert snap.ledger.endpoints[server.url].running == 0
        assert server.participant.snapshot()["agent_starts"] == REBUILD_ROWS  # none ran twice


RELEASE_ROWS = 2000


async def test_a_ledger_killed_while_the_gate_releases_counts_what_it_released(
    ray_session, tmp_path
):
    """Killed mid-release (ACKs under way): Ray sends the checkpoint again, the restarted
    ledger's gate finds the results released by the gate before it, and its report counts
    them (before: sealed_acked 0 for 2,000 released; each flush of the one checkpoint turned the
    rollout actors' sealed finals over, so the restarted ledger never heard of them)."""
    async with served(REBUILD_POLICY, rollouts_per_actor=64) as (server, client, orch):
        outcomes = await orch.arun_batch([{"reward": 0.5} for _ in range(RELEASE_ROWS)])
        assert [o.status for o in outcomes] == ["sealed"] * RELEASE_ROWS
        # under load a few rows take a second try: their first is a tombstoned record
        before = server.participant.snapshot()
        ckpt = asyncio.ensure_future(
            orch.acheckpoint("released", str(tmp_path / "ck"), deadline_s=60.0)
        )

        async def releasing() -> bool:  # the gate's ACKs are under way
            st = await client.status("probe", deadline_ts=soon(5))
            return st.completed_unacknowledged < RELEASE_ROWS

        await until(releasing, timeout_s=60, interval_s=0.002, what="the release to start")
        ray_session.kill(orch.ledger, no_restart=False)
        report = await asyncio.wait_for(ckpt, scaled(120))  # Ray sent the call again
        assert await orch.ledger.restarted.remote()
        assert (report.sealed_acked, report.orphans_acked) == (RELEASE_ROWS, 0)
        assert report.endpoints[0].commit.records == RELEASE_ROWS + before["tombstoned"]
        status = await client.status("probe-end", deadline_ts=soon())
        assert status.completed_unacknowledged == 0
        after = server.participant.snapshot()  # nothing ran again, none completed twice
        assert (after["agent_starts"], after["completions"]) == (
            before["agent_starts"],
            RELEASE_ROWS,
        )


SPENT_ROWS = 200


async def test_a_ledger_killed_after_gym_resumed_answers_the_committed_report(
    ray_session, tmp_path
):
    """Killed after Gym performed the resume (the id is spent there) and before its answer came
    back: Ray sends the checkpoint again and the restarted ledger answers the committed report,
    and the next checkpoint commits with nothing counted lost (before: CheckpointFailed with
    Gym's stale_checkpoint, the book rebuilt holding as sealed the 200 results that commit
    released, so the next checkpoint counted them lost)."""
    hold = PhaseHold()
    async with served(REBUILD_POLICY, rollouts_per_actor=64, extensions=[hold.extension()]) as (
        server,
        client,
        orch,
    ):
        outcomes = await orch.arun_batch([{"reward": 0.5} for _ in range(SPENT_ROWS)])
        assert [o.status for o in outcomes] == ["sealed"] * SPENT_ROWS
        before = server.participant.snapshot()  # (a second try's first: a tombstoned record)
        hold.arm("/resume", "spent", "after")  # Gym resumes; its answer is never sent
        ckpt = asyncio.ensure_future(
            orch.acheckpoint("spent", str(tmp_path / "ck"), deadline_s=60.0)
        )
        await until(hold.reached.is_set, timeout_s=60, what="the gate's resume to reach Gym")
        ray_session.kill(orch.ledger, no_restart=False)
        hold.release()
        report = await asyncio.wait_for(ckpt, scaled(120))  # Ray sent the call again
        assert await orch.ledger.restarted.remote()
        assert (report.checkpoint_id, report.sealed_acked, report.orphans_acked) == (
            "spent",
            SPENT_ROWS,
            0,
        )
        assert report.endpoints[0].commit.records == SPENT_ROWS + before["tombstoned"]
        status = await client.status("probe-spent", deadline_ts=soon())
        assert (status.state, status.completed_unacknowledged) == ("accepting", 0)
        book = (await orch.asnapshot()).ledger.endpoints[server.url]
        assert book.completed_unacked == 0  # the book follows: what the commit released
        more = await orch.arun_batch([{"reward": 0.25} for _ in range(5)])
        assert [o.status for o in more] == ["sealed"] * 5
        after = await orch.acheckpoint("after-spent", str(tmp_path / "ck2"), deadline_s=60.0)
        assert (after.sealed_acked, after.orphans_acked) == (5, 0)
        after = server.participant.snapshot()  # nothing ran again, none completed twice
        assert after["agent_starts"] == before["agent_starts"] + 5
        assert after["completions"] == SPENT_ROWS + 5
