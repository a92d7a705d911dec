"""The layer's checkpoint inside verl's: ``trainer.checkpoint_callback_class`` =
``rl_gym_actors.integrations.verl.GymCheckpointCallback``.

verl's v1 trainer builds the callback in ``PPOTrainer.__init__`` and calls ``on_save`` at the end
of ``_save_checkpoint``, after the actor, critic, ``data.pt``, the TransferQueue checkpoint (async
modes) and ``latest_checkpointed_iteration.txt`` are written: verl's state is durable, so the
layer's checkpoint gate runs then and writes its part into the same ``global_step_N`` directory
(ACKing on Gym only what that part holds).

- The constructor starts the run's host (or finds it running): one orchestrator for every
  process, restored once, from the newest ``global_step_M`` with a part at or below the step verl
  resumes from (:func:`~rl_gym_actors.integrations.verl.settings.restore_dir`).
- ``async_save=True`` (Megatron's asynchronous save): verl has not made the save durable (it
  writes no marker), so the layer's checkpoint is skipped: Gym keeps holding those results
  un-ACKed until a later synchronous save covers them.
- In the async trainer modes the layer keeps the rollouts verl still holds untrained
  (``keep_if_handed=``, from the trainer's TransferQueue: the finished sessions not trained and
  every session of a prompt still pending or running, of which the layer keeps those whose
  result it handed out, so a result on its way into TransferQueue is kept too, and a session
  not handed out yet is no error): the in-flight API of issue 27.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from verl.trainer.ppo.checkpoint_callback import CheckpointCallback

from rl_gym_actors.integrations.verl.agent_loop import host_spec
from rl_gym_actors.integrations.verl.host import ensure_host
from rl_gym_actors.integrations.verl.settings import settings_from

logger = logging.getLogger(__name__)
CALL_SLACK_S = 30.0


def checkpoint_id(run_id: str, global_step: int) -> str:
    return f"{run_id[:100]}-gs{int(global_step)}"


class GymCheckpointCallback(CheckpointCallback):
    """See the module docstring."""

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self.settings = settings_from(config)
        self.spec = host_spec(config)
        self.host = ensure_host(self.spec)
        self.reports: list[Any] = []  # the layer's checkpoint reports, in order
        self.skipped: list[int] = []  # steps saved with async_save (not checkpointed)

    def on_save(
        self,
        trainer: Any,
        global_step: int,
        checkpoint_dir: str,
        async_save: bool = False,
        **kwargs: Any,
    ) -> None:
        if async_save:
            if not self.skipped:
                logger.warning(
                    "rl_gym_actors: verl saved step %s with async_save; the layer checkpoints "
                    "only synchronous saves (Gym holds these results until one)",
                    global_step,
                )
            self.skipped.append(int(global_step))
            return
        held = None
        if self.settings.is_async and hasattr(trainer, "rlga_untrained_rollout_ids"):
            held = trainer.rlga_untrained_rollout_ids()
        deadline_s = self.settings.checkpoint_deadline_s
        call = self.host.checkpoint.remote(
            checkpoint_id(self.settings.run_id, global_step),
            str(checkpoint_dir),
            deadline_s,
            keep_if_handed=held,
        )
        self.reports.append(ray.get(call, timeout=deadline_s + CALL_SLACK_S))
