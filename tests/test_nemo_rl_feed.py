"""The drop-in's rollouts share one orchestrator stream (RolloutFeed); a row that ends that
stream costs the rollouts waiting on it a re-dispatch (infrastructure), never a hang, and the
next row opens a new stream. Real orchestrator, real Gym server on loopback."""

from __future__ import annotations

import asyncio

import pytest

from rl_gym_actors import GymEndpoint, Orchestrator
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.failures import failure_kind
from rl_gym_actors.integrations.nemo_rl.feed import FeedClosed, RolloutFeed, check_json
from rl_gym_actors.testing.gym_process import GymServerThread

pytestmark = [pytest.mark.ray, pytest.mark.slow]


async def test_rows_fed_one_by_one_share_a_stream_and_a_refused_row_reopens_it(ray_session):
    with GymServerThread(token="t") as gym:
        orch = Orchestrator(
            [GymEndpoint(url=gym.url, token=gym.token)],
            pool_size=1,
            rollouts_per_actor=4,
            progress=False,
            start=False,
        )
        await orch.astart()
        feed = RolloutFeed(orch)
        try:
            outcomes = await asyncio.gather(
                *(
                    feed.run({"reward": r, "sleep_s": 0.05 * i})
                    for i, r in enumerate((0.25, 0.5, 0.75))
                )
            )
            assert [o.reward for o in outcomes] == [0.25, 0.5, 0.75] and feed.streams == 1
            slow = asyncio.ensure_future(feed.run({"reward": 1.0, "sleep_s": 2.0}))
            await asyncio.sleep(0.2)
            with pytest.raises(ConfigError):
                check_json({"x": float("nan")})
            bad = asyncio.ensure_future(feed.run({"x": float("nan")}))  # not checked first
            results = await asyncio.wait_for(asyncio.gather(slow, bad, return_exceptions=True), 30)
            assert all(isinstance(r, FeedClosed) for r in results)
            assert failure_kind(results[0]).is_transport  # RL re-dispatches
            again = await feed.run({"reward": 0.125})
            assert again.reward == 0.125 and feed.streams == 2
        finally:
            await feed.aclose()
            await orch.aclose()
