"""SkyRL's trainers on the layer (the `skyrl` extra: SkyRL 0.4, Python >= 3.12).

``ids``, ``replies``, ``settings``, ``resume``  the framework-free half: rollout ids, a reply as
                                               a trajectory, the settings and pool size, which
                                               part a restart restores (no SkyRL import)
``config``      SkyRL's config plus ``generator.rl_gym_actors``
``generator``   ``GymGenerator``: SkyRL's GeneratorInterface through the layer's Gym endpoints
``checkpoints`` ``GymCheckpointCallback`` (sync trainer), ``FullyAsyncGymTrainer``
``trainer``     ``GymRayPPOTrainer``: SkyRL's sync trainer resuming from an epoch boundary
``experiment``  ``GymPPOExp`` and ``main()`` for ``trainer.override_entrypoint``

The public names below load their module on first use, so the light modules import without
SkyRL.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_gym_actors.integrations.skyrl.checkpoints import (
        FullyAsyncGymTrainer,
        GymCheckpointCallback,
    )
    from rl_gym_actors.integrations.skyrl.experiment import GymPPOExp, main
    from rl_gym_actors.integrations.skyrl.generator import GymGenerator
    from rl_gym_actors.integrations.skyrl.trainer import GymRayPPOTrainer

_HOME = {
    "FullyAsyncGymTrainer": "checkpoints",
    "GymCheckpointCallback": "checkpoints",
    "GymGenerator": "generator",
    "GymPPOExp": "experiment",
    "GymRayPPOTrainer": "trainer",
    "main": "experiment",
}
__all__ = [
    "FullyAsyncGymTrainer",
    "GymCheckpointCallback",
    "GymGenerator",
    "GymPPOExp",
    "GymRayPPOTrainer",
    "main",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
