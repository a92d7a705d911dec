"""Awaiting Ray call results through Completions (one loop wake-up for results that end
together) on a real local Ray: values, a task's error as its cause's class, a dead actor's
error, and a waiter cancelled before its result."""

from __future__ import annotations

import asyncio

import pytest
from ray.exceptions import RayActorError, RayTaskError

from rl_gym_actors.actors.completions import Completions
from rl_gym_actors.testing.polling import until

pytestmark = pytest.mark.ray


def test_results_errors_and_a_dead_actor_come_back_as_await_gives_them(ray_session):
    @ray_session.remote(num_cpus=0)
    class Echo:
        async def echo(self, x: int, delay_s: float = 0.0) -> int:
            await asyncio.sleep(delay_s)
            return x

        async def fail(self) -> None:
            raise ValueError("bad row")

    actor = Echo.remote()

    async def go() -> None:
        done = Completions()
        values = await asyncio.gather(*(done.wait(actor.echo.remote(i)) for i in range(50)))
        assert values == list(range(50))
        with pytest.raises(ValueError, match="bad row") as caught:
            await done.wait(actor.fail.remote())
        assert isinstance(caught.value, RayTaskError)  # as `await ref` raises it
        waiter = done.wait(actor.echo.remote(7, 0.2))
        waiter.cancel()  # its result, when it comes, is dropped
        assert await done.wait(actor.echo.remote(8, 0.3)) == 8
        ray_session.kill(actor)

        async def refused() -> bool:  # a kill lands asynchronously: a call may still be served
            try:
                await done.wait(actor.echo.remote(9))
            except RayActorError:  # as `await ref` raises it for a dead actor
                return True
            return False

        await until(refused, what="a call to the killed actor to fail")

    asyncio.run(go())
