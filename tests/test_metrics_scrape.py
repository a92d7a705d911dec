"""GET /metrics on the real Gym server: the counters move as runs happen."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rl_gym_actors.errors import ConnectionLost
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.polling import soon, until

Samples = dict[tuple[str, frozenset], float]
RUN_200 = (
    "gym_request_duration_seconds_count",
    frozenset({"route": "/run", "method": "POST", "status": "200"}.items()),
)


async def scrape(url: str) -> Samples:
    """Every sample of the exposition, keyed by (name, labels); an unlabelled one also by name."""
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as answer:
        assert answer.status == 200
        assert answer.headers["content-type"].startswith("text/plain")
        text = await answer.text()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
            if not s.labels:
                samples[s.name] = s.value
    return samples


async def test_counters_move_as_runs_happen(gym):
    before = await scrape(gym.url)
    deadline = soon(10)
    async with GymClient(gym.endpoint) as client:
        for i in range(3):
            await client.run(
                {"reward": 0.5}, rollout_id=f"m{i}", attempt_index=0, deadline_ts=deadline
            )
        with pytest.raises(ConnectionLost):  # completed on Gym, reply lost
            await client.run(
                {"reward": 0.5, "drop_reply": True},
                rollout_id="mD",
                attempt_index=0,
                deadline_ts=deadline,
            )
        mid = await scrape(gym.url)
        replay = await client.run(
            {"reward": 0.5}, rollout_id="mD", attempt_index=0, deadline_ts=deadline
        )
        assert replay.replayed
        for i in range(2):
            answer = await client.receipt(f"m{i}", 0, deadline_ts=deadline)
            await client.acknowledge(answer.completion_receipt, deadline_ts=deadline)
        await client.retire("mT", 0, checkpoint_id="metrics-test", deadline_ts=deadline)
    after = await scrape(gym.url)

    def moved(name, a=before, b=after) -> float:
        return b.get(name, 0.0) - a.get(name, 0.0)

    assert moved("gym_runs_started_total") == 4  # the replay started nothing
    assert moved("gym_runs_completed_total") == 4
    assert moved("gym_completed_unacknowledged", before, mid) == 4
    assert moved("gym_runs_replayed_total") == 1
    assert moved("gym_attempts_acked_total") == 2
    assert moved("gym_attempts_retired_total") == 1
    assert after["gym_completed_unacknowledged"] == mid["gym_completed_unacknowledged"] - 2
    assert after["gym_running"] == 0
    # the dropped reply went out as a 200 whose body was cut short
    assert moved(RUN_200) == 5 and moved(RUN_200, before, mid) == 4


async def test_running_gauge_sees_a_run_in_flight(gym):
    async with GymClient(gym.endpoint) as client:
        task = asyncio.create_task(
            client.run({"sleep_s": 0.5}, rollout_id="mS", attempt_index=0, deadline_ts=soon(10))
        )

        async def running() -> bool:
            return (await scrape(gym.url))["gym_running"] >= 1

        await until(running, timeout_s=5, what="the run to show as running")
        await task
    assert (await scrape(gym.url))["gym_running"] == 0


async def test_counters_stay_consistent_across_a_restart_on_a_durable_state_dir(tmp_path):
    """A restarted server counts from 0 again, all of its counters together: a reply completed
    (and ACKed) before the restart is in the store, not in this process's counts."""
    from rl_gym_actors.testing.gym_process import GymServerThread

    with GymServerThread(token="t", state_dir=tmp_path / "state") as server:
        async with GymClient(server.endpoint) as client:
            await client.run({"reward": 1.0}, rollout_id="mR", attempt_index=0, deadline_ts=soon())
            receipt = (await client.receipt("mR", 0, deadline_ts=soon())).completion_receipt
            await client.acknowledge(receipt, deadline_ts=soon())
            await client.run({"reward": 1.0}, rollout_id="mU", attempt_index=0, deadline_ts=soon())
        first = await scrape(server.url)
        assert (first["gym_runs_started_total"], first["gym_runs_completed_total"]) == (2, 2)
        server.restart()
        after = await scrape(server.url)
    assert after["gym_runs_started_total"] == 0
    assert after["gym_runs_completed_total"] <= after["gym_runs_started_total"]
    assert after["gym_attempts_acked_total"] == 0
    assert after["gym_completed_unacknowledged"] == 1  # the store still holds mU
    for name in ("gym_runs_started", "gym_runs_completed", "gym_attempts_acked"):
        assert after[f"{name}_created"] > first[f"{name}_created"]
