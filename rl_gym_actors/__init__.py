"""rl_gym_actors: keep RL training on Ray from losing track of Gym environment work.

Retire, then adopt or cancel: a rollout that gives up on a try first retires it on Gym; a try that
was still running is cancelled, a try that had finished is adopted (its stored reply replayed,
sealed and ACKed) instead of rerun. A ledger gates every checkpoint on all Gym servers.

From the bottom up (docs/ARCHITECTURE.md draws the floors and follows a row and a checkpoint):
``errors``, ``protocol``, ``failures``, ``config``, ``outcome`` and ``metrics`` are the shared
vocabulary; ``core/`` holds the pure state machines and tables; ``gym/`` both sides of the Gym
wire; ``actors/`` the Ray actors; ``orchestrator`` (with ``rows``, ``stream``, ``dispatch`` and
``checkpoint_part``) the trainer's API, ``observe`` and ``progress`` what it shows; ``cli`` (with
``cli_support``, ``cli_observe``, ``ray_attach``) and ``local_gym`` the command line and a local
server; ``integrations/`` the trainers' adapters; ``testing/`` the fakes and faults that tests,
examples and benchmarks share.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from rl_gym_actors.config import GymEndpoint, LedgerConfig, PoolConfig, RetryPolicy, TryPolicy
from rl_gym_actors.errors import *  # noqa: F403  (the error tree is public API)
from rl_gym_actors.failures import FailureKind

if TYPE_CHECKING:  # the lazy names, as the type checker sees them (no __getattr__ for it)
    from rl_gym_actors.actors.runtime import start_local_ray
    from rl_gym_actors.checkpoint_part import latest_checkpoint_dir
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient
    from rl_gym_actors.local_gym import LocalGym, local_gym_server
    from rl_gym_actors.orchestrator import IndexedOutcome, Orchestrator
    from rl_gym_actors.outcome import Outcome

__version__ = "0.2.0"

# Heavier pieces load on first use so that `import rl_gym_actors` stays cheap (no Ray import).
_LAZY = {
    "Orchestrator": "rl_gym_actors.orchestrator",
    "IndexedOutcome": "rl_gym_actors.orchestrator",
    "Outcome": "rl_gym_actors.outcome",
    "GymClient": "rl_gym_actors.gym.agent_checkpoint.client",
    "local_gym_server": "rl_gym_actors.local_gym",
    "LocalGym": "rl_gym_actors.local_gym",
    "start_local_ray": "rl_gym_actors.actors.runtime",
    "latest_checkpoint_dir": "rl_gym_actors.checkpoint_part",
}


if not TYPE_CHECKING:  # hidden from mypy, which would otherwise accept any name as Any

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'rl_gym_actors' has no attribute {name!r}")
        return getattr(import_module(module), name)


__all__ = [
    "FailureKind",
    "GymClient",
    "GymEndpoint",
    "IndexedOutcome",
    "LedgerConfig",
    "LocalGym",
    "Orchestrator",
    "Outcome",
    "PoolConfig",
    "RetryPolicy",
    "TryPolicy",
    "latest_checkpoint_dir",
    "local_gym_server",
    "start_local_ray",
]
