"""The layer's settings in SkyRL's config (``generator.rl_gym_actors``) and the pool they size.

A plain dataclass, so that SkyRL's config parser builds it from ``generator.rl_gym_actors.*``
overrides and YAML alike (:mod:`.config` nests it into SkyRL's ``GeneratorConfig``). It is kept
free of SkyRL so the main test suite checks it without SkyRL installed. The annotations stay
``Optional``/``List`` (no ``from __future__ import annotations``): SkyRL's config builder and
OmegaConf read them at run time.

The pool: SkyRL's sync trainer hands the generator ``train_batch_size * n_samples_per_prompt``
trajectories per ``generate()`` call, the fully async trainer ``n_samples_per_prompt`` per call
from each of ``num_parallel_generation_workers`` workers at once; a pool with fewer slots than
that runs the batch in waves (measured: half the slots, 2.2-4.3x the time). So unless
``pool_size`` is set, the pool gets ``ceil(in_flight / rollouts_per_actor)`` actors.
"""

import math
import os
from dataclasses import dataclass, field
from typing import List, Optional  # noqa: UP035  (SkyRL's config builder reads these at run time)

from rl_gym_actors.config import TOKEN_ENV, GymEndpoint, TryPolicy
from rl_gym_actors.errors import ConfigError


@dataclass
class RlGymActorsSettings:
    """``generator.rl_gym_actors``.

    ``endpoints``: the Gym servers' URLs; ``token``: their control-plane bearer token (default:
    the ``RL_GYM_CONTROL_TOKEN`` environment variable); ``run_id``: default ``trainer.run_name``
    (keep it stable across restarts and unique among runs sharing a Gym server);
    ``pool_size``: actors in the pool (default: sized from the batch), each running
    ``rollouts_per_actor`` rollouts at once; ``rollout_s`` and ``max_tries``: each rollout's
    tries; ``checkpoint_deadline_s``: how long a checkpoint's gate may take. The Gym protocol
    (agent-checkpoint or v2) is each server's own, read when the run starts."""

    endpoints: List[str] = field(default_factory=list)  # noqa: UP006
    token: Optional[str] = None  # noqa: UP045
    run_id: Optional[str] = None  # noqa: UP045
    pool_size: Optional[int] = None  # noqa: UP045
    rollouts_per_actor: int = 32
    rollout_s: float = 600.0
    max_tries: int = 3
    checkpoint_deadline_s: float = 120.0


def endpoints_of(settings: RlGymActorsSettings) -> list[GymEndpoint]:
    """The Gym endpoints named by the settings; ConfigError when there is none."""
    urls = settings.endpoints
    if isinstance(urls, str):
        urls = [urls]
    if not urls:
        raise ConfigError(
            "generator.rl_gym_actors.endpoints is empty: name the Gym servers' URLs, e.g. "
            "generator.rl_gym_actors.endpoints=[http://127.0.0.1:8000]"
        )
    token = settings.token if settings.token is not None else os.environ.get(TOKEN_ENV)
    return [GymEndpoint(url=str(u), token=token) for u in urls]


def policy_of(settings: RlGymActorsSettings) -> TryPolicy:
    try:
        return TryPolicy(rollout_s=settings.rollout_s, max_tries=settings.max_tries)
    except ValueError as exc:
        raise ConfigError(f"invalid generator.rl_gym_actors policy: {exc}") from None


def in_flight(
    *,
    train_batch_size: int,
    n_samples_per_prompt: int,
    fully_async: bool = False,
    num_parallel_generation_workers: int = 0,
) -> int:
    """How many trajectories SkyRL's trainer asks for at once."""
    prompts = num_parallel_generation_workers if fully_async else train_batch_size
    return max(1, int(prompts) * max(1, int(n_samples_per_prompt)))


def pool_size_for(settings: RlGymActorsSettings, trajectories_in_flight: int) -> int:
    """The pool's actor count: ``pool_size`` when set, else enough actors of
    ``rollouts_per_actor`` slots for every trajectory in flight."""
    if settings.rollouts_per_actor < 1:
        raise ConfigError("generator.rl_gym_actors.rollouts_per_actor must be at least 1")
    if settings.pool_size is not None:
        if settings.pool_size < 1:
            raise ConfigError("generator.rl_gym_actors.pool_size must be at least 1")
        return int(settings.pool_size)
    return max(1, math.ceil(trajectories_in_flight / settings.rollouts_per_actor))
