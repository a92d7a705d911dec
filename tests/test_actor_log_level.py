"""The rollout actors' log level is a knob (issue 31, item 9): ``PoolConfig(log_level=...)``,
WARNING by default, any case, a bad one refused in one line; the actors' ``rl_gym_actors``
loggers take it (read from the real actor process)."""

from __future__ import annotations

import logging

import pytest
import ray

from rl_gym_actors import Orchestrator, PoolConfig, TryPolicy
from rl_gym_actors.actors.runtime import RAY_NAMESPACE
from rl_gym_actors.errors import ConfigError


def test_the_level_defaults_to_warning_takes_any_case_and_refuses_a_bad_one():
    assert PoolConfig().log_level == "WARNING"
    assert PoolConfig(log_level="info").log_level == "INFO"
    with pytest.raises(ConfigError) as info:
        PoolConfig(log_level="loud")
    assert "\n" not in str(info.value) and "log_level" in str(info.value)


@pytest.mark.ray
@pytest.mark.slow
def test_the_actors_loggers_take_the_level(ray_session, gym):
    pool = PoolConfig(size=1, rollouts_per_actor=1, log_level="debug")
    with Orchestrator(
        [gym.endpoint], policy=TryPolicy(rollout_s=20.0), pool=pool, progress=False
    ) as orch:
        (name,) = orch.snapshot().pool.actors
        actor = ray.get_actor(name, namespace=RAY_NAMESPACE)
        level = ray.get(
            actor.__ray_call__.remote(lambda _: logging.getLogger("rl_gym_actors").level)
        )
        assert level == logging.DEBUG
