"""Outcomes as they end: ``stream`` / ``astream`` on a real local Ray and a real Gym server.

Completion order with mixed agent times; an early close abandons the rest as ``fail_fast`` does
(running tries retired, a finished one adopted and kept) and a later checkpoint commits; rows fed
from an async iterable while the stream runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools

import pytest

from rl_gym_actors import GymEndpoint, IndexedOutcome, Orchestrator, TryPolicy
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.testing.inspect_gym import key_state_sync as key_state
from rl_gym_actors.testing.polling import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = TryPolicy(rollout_s=60.0, receipt_s=1.0, max_tries=2, control_s=5.0, admission_wait_s=10.0)
_n = itertools.count()


@pytest.fixture(scope="module")
def orch(ray_session, gym):
    with Orchestrator(
        [GymEndpoint(url=gym.url, token=gym.token)],
        policy=POLICY,
        pool_size=2,
        rollouts_per_actor=2,
        progress=False,
    ) as o:
        yield o


def settled(orch, gym, tmp_path):
    """A checkpoint commits and Gym holds nothing running and nothing completed-un-ACKed."""
    n = next(_n)
    report = orch.checkpoint(f"st-{n}", str(tmp_path / f"st-{n}"), deadline_s=30.0)
    assert report.endpoints[0].commit.manifest_digest
    snap = gym.participant.snapshot()
    assert snap["running"] == 0 and snap["completed_unacknowledged"] == 0, snap
    assert orch.snapshot().ledger.invariant_ok and orch.snapshot().in_flight == 0


def test_stream_yields_in_completion_order_with_row_indices(orch, gym, tmp_path):
    sleeps = [1.6, 0.0, 0.8]
    rows = [
        {"_ng_rollout_id": f"order-{i}", "sleep_s": s, "reward": float(i)}
        for i, s in enumerate(sleeps)
    ]
    got = list(orch.stream(rows))
    assert all(isinstance(e, IndexedOutcome) for e in got)
    assert [e.index for e in got] == [1, 2, 0]
    assert [e.outcome.rollout_id for e in got] == ["order-1", "order-2", "order-0"]
    assert all(e.outcome.status == "sealed" and e.outcome.reward == e.index for e in got)
    # run_batch is the collected stream: row order
    outs = orch.run_batch(
        [{"_ng_rollout_id": f"order-b{i}", "sleep_s": s} for i, s in enumerate(sleeps)]
    )
    assert [o.rollout_id for o in outs] == [f"order-b{i}" for i in range(3)]
    settled(orch, gym, tmp_path)


def test_early_close_abandons_the_rest_and_a_checkpoint_commits(orch, gym, agent, tmp_path):
    rows = [
        {"_ng_rollout_id": "close-fast", "reward": 0.5},
        {"_ng_rollout_id": "close-slow", "sleep_s": 30},
        {"_ng_rollout_id": "close-done", "receipt_delay_s": 30, "reward": 0.25},
    ]
    it = orch.stream(rows)
    first = next(it)
    assert (first.index, first.outcome.status) == (0, "sealed")
    # close-done finished on Gym (its receipt fetch is held); close-slow still runs
    wait_for(lambda: ("close-done", 0) in agent.finished, what="close-done to finish on Gym")
    # and close-slow runs on Gym (on a loaded machine its /run can still be on its way)
    wait_for(lambda: agent.starts[("close-slow", 0)] == 1, what="close-slow to start on Gym")
    it.close()
    wait_for(lambda: ("close-slow", 0) in agent.cancelled, what="the running try's retire")
    assert key_state(gym.endpoint, "close-slow", 0) == "tombstoned"
    assert orch.snapshot().in_flight == 0
    settled(orch, gym, tmp_path)
    # the finished try was adopted and kept: its next row gets it without running the agent
    (kept,) = orch.run_batch([{"_ng_rollout_id": "close-done", "reward": 0.25}])
    assert (kept.status, kept.adopted, kept.reward, kept.attempt_index) == ("sealed", True, 0.25, 0)
    assert agent.runs_of("close-done") == 1
    # the retired one continues with its next try
    (again,) = orch.run_batch([{"_ng_rollout_id": "close-slow", "reward": 1.0}])
    assert (again.status, again.attempt_index) == ("sealed", 1)
    settled(orch, gym, tmp_path)


async def test_astream_takes_rows_while_it_runs_keeping_n_in_flight(orch, gym, tmp_path):
    total, in_flight = 10, 3
    queue: asyncio.Queue = asyncio.Queue()

    async def rows():
        for _ in range(total):
            yield await queue.get()

    for i in range(in_flight):
        queue.put_nowait({"_ng_rollout_id": f"feed-{i}", "sleep_s": 0.05})
    fed, got = in_flight, []
    async with contextlib.aclosing(orch.astream(rows())) as stream:
        async for index, outcome in stream:
            got.append((index, outcome))
            snap = await orch.asnapshot()
            assert snap.in_flight <= in_flight
            if fed < total:  # one ended: feed the next, so `in_flight` keep running
                queue.put_nowait({"_ng_rollout_id": f"feed-{fed}", "sleep_s": 0.05})
                fed += 1
    assert sorted(i for i, _ in got) == list(range(total))
    assert all(o.status == "sealed" and o.rollout_id == f"feed-{i}" for i, o in got)
    await asyncio.to_thread(settled, orch, gym, tmp_path)


@pytest.mark.slow
async def test_astream_bad_row_raises_config_error_and_abandons_the_rest(
    orch, gym, agent, tmp_path
):
    async def rows():
        yield {"_ng_rollout_id": "bad-feed-slow", "sleep_s": 30}
        await asyncio.to_thread(
            wait_for,
            lambda: agent.starts[("bad-feed-slow", 0)] == 1,
            what="the first row's agent to start",
        )
        yield {"_ng_rollout_id": "not a valid id!"}

    with pytest.raises(ConfigError):
        async with contextlib.aclosing(orch.astream(rows())) as stream:
            async for _ in stream:
                pass
    await asyncio.to_thread(
        wait_for, lambda: ("bad-feed-slow", 0) in agent.cancelled, what="the running try's retire"
    )
    await asyncio.to_thread(settled, orch, gym, tmp_path)


def test_stream_of_bad_rows_raises_before_dispatch(orch, agent):
    with pytest.raises(ConfigError):
        orch.stream({"_ng_rollout_id": "a-mapping"})
    with pytest.raises(ConfigError):
        list(orch.stream([{"_ng_rollout_id": "ok-row"}, {"_ng_rollout_id": "bad row!"}]))
    assert agent.runs_of("ok-row") == 0
    assert list(orch.stream([])) == []


def test_rows_leased_together_travel_in_one_ray_call_per_actor(orch, gym, tmp_path):
    chunks = orch._chunks
    calls, rows = chunks.calls, chunks.rows
    outs = orch.run_batch([{"_ng_rollout_id": f"chunk-{i}", "sleep_s": 0.2} for i in range(4)])
    assert all(o.status == "sealed" for o in outs)
    # 4 slots on 2 actors, all leased in one turn of the loop: one streaming call per actor
    assert (chunks.calls - calls, chunks.rows - rows) == (2, 4)
    settled(orch, gym, tmp_path)
