"""verl's own trainer on the layer, by config (``pip install 'rl-gym-actors[verl]'``; verl 0.9.1).

``agent_loop``   ``GymAgentLoop`` (registered ``rl_gym_actors``) and its packaged loop config
``checkpoints``  ``GymCheckpointCallback`` for ``trainer.checkpoint_callback_class``
``trainer``      verl's v1 trainers with deterministic uids (``rlga_sync``, ``rlga_*_async``)
``main``         verl's ``main_ppo`` with the adapter's trainers registered where verl looks
``host``         the run's one orchestrator, a named detached Ray actor
``ids``, ``outputs``, ``settings``
                 the pure parts: rollout ids, reply -> ``AgentLoopOutput`` fields, config

The public names load their module on first use: ``ids``, ``outputs`` and ``settings`` import
neither verl nor Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_gym_actors.integrations.verl.agent_loop import LOOP_CONFIG, GymAgentLoop
    from rl_gym_actors.integrations.verl.checkpoints import GymCheckpointCallback

_HOME = {
    "GymAgentLoop": "agent_loop",
    "LOOP_CONFIG": "agent_loop",
    "GymCheckpointCallback": "checkpoints",
}
__all__ = ["LOOP_CONFIG", "GymAgentLoop", "GymCheckpointCallback"]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
