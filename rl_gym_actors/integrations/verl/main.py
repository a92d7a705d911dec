"""``python -m rl_gym_actors.integrations.verl.main <verl's overrides>``: verl's ``main_ppo``
(its hydra config ``ppo_trainer``, its checks, ``run_ppo``) with the adapter's trainers
registered where verl looks them up.

verl's ``TaskRunnerV1`` actor calls ``get_trainer_cls(trainer.v1.trainer_mode)``, and a
``register_trainer`` fills the registry only in a process that imports the class: this task
runner imports :mod:`rl_gym_actors.integrations.verl.trainer` in that actor, then runs verl's own
``TaskRunnerV1.run``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import hydra
import ray
import verl.trainer
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device

_VERL_RUNNER: Any = TaskRunnerV1.__ray_metadata__.modified_class.__ray_actor_class__
_CONFIG_DIR = Path(verl.trainer.__file__).parent / "config"


@ray.remote
class GymTaskRunner:
    """verl's ``TaskRunnerV1`` with the ``rlga_*`` trainers registered in its process."""

    def run(self, config: Any) -> Any:
        import rl_gym_actors.integrations.verl.trainer  # noqa: F401  (register_trainer here)

        return _VERL_RUNNER().run(config)


@hydra.main(
    config_path=os.path.relpath(_CONFIG_DIR, Path(__file__).parent),
    config_name="ppo_trainer",
    version_base=None,
)
def main(config: Any) -> None:
    auto_set_device(config)
    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )
    run_ppo(config, task_runner_class=GymTaskRunner)


if __name__ == "__main__":
    main()
