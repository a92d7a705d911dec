"""The layer's part of SkyRL's checkpoints, for both of SkyRL's trainers.

- Sync ``RayPPOTrainer``: :class:`GymCheckpointCallback`. SkyRL's ``save_checkpoints()`` writes
  ``global_step_N/`` and ``latest_ckpt_global_step.txt``, then fires ``on_save`` with the folder:
  the layer's checkpoint commits there, after SkyRL's state is durable. ``on_train_start`` and
  ``on_epoch_start`` give the generator its epoch (part of every rollout id). ``on_train_end``
  commits once more into the newest folder: SkyRL evaluates after a step's save, so the last
  evaluation's results were handed out after the last commit, and would stay un-ACKed on Gym.
- ``FullyAsyncRayPPOTrainer`` refuses callbacks; :class:`FullyAsyncGymTrainer` overrides
  ``save_checkpoints()`` (SkyRL runs it in a thread while generation goes on) to commit the
  layer's checkpoint after SkyRL's, handing it the rollout ids of groups generated but not yet
  trained (``keep=``, when the installed layer takes it), gives the generator the trainer's
  epoch, and puts the generator's ``rlga/*`` counts into each step's metrics.

Every commit has its own checkpoint id (``<global_step_N>-<8 hex>``): SkyRL saves the same
``global_step_N`` again after a resume from an epoch boundary (and the fully async trainer's
final save), and a Gym checkpoint id is spent once committed. A commit that fails
(``CheckpointFailed``: a Gym server not ready by the deadline) is logged and the run goes on:
SkyRL's state is saved, nothing was released, and a restore takes the newest part there is.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skyrl.train.fully_async_trainer import FullyAsyncRayPPOTrainer
from skyrl.train.utils.callbacks import TrainingCallback

from rl_gym_actors.core.checkpoint_report import CheckpointReport
from rl_gym_actors.errors import CheckpointFailed
from rl_gym_actors.integrations.skyrl.generator import GymGenerator
from rl_gym_actors.integrations.skyrl.replies import MASKED_FRACTION, METRIC_PREFIX

log = logging.getLogger(__name__)


def checkpoint_id_for(checkpoint_dir: str) -> str:
    return f"{Path(checkpoint_dir).name}-{uuid.uuid4().hex[:8]}"


def commit_layer(
    generator: GymGenerator,
    checkpoint_dir: str,
    *,
    deadline_s: float,
    keep: Sequence[str] | None = None,
) -> CheckpointReport | None:
    """Commit the layer's checkpoint into ``checkpoint_dir`` (SkyRL's ``global_step_N``).
    ``keep``: rollout ids handed out but not trained yet, passed when the layer takes them.
    None when the commit failed (logged)."""
    orch = generator.orchestrator
    kwargs: dict[str, Any] = {}
    if keep is not None and "keep" in inspect.signature(orch.checkpoint).parameters:
        kwargs["keep"] = list(keep)
    try:
        report = orch.checkpoint(
            checkpoint_id_for(checkpoint_dir), str(checkpoint_dir), deadline_s=deadline_s, **kwargs
        )
    except CheckpointFailed as exc:
        log.warning("the layer's checkpoint in %s failed: %s", checkpoint_dir, exc)
        return None
    generator.last_report = report
    return report


class GymCheckpointCallback(TrainingCallback):
    """The sync trainer's hooks (see the module docstring)."""

    def __init__(self, generator: GymGenerator, *, deadline_s: float = 120.0) -> None:
        self.generator = generator
        self.deadline_s = deadline_s
        self.last_dir: str | None = None  # the folder of the last commit

    def on_train_start(self, trainer: Any, callback_input: Any, control: Any) -> None:
        self.generator.epoch = int(callback_input.epoch)

    def on_epoch_start(self, trainer: Any, callback_input: Any, control: Any) -> None:
        self.generator.epoch = int(callback_input.epoch)

    def on_save(self, trainer: Any, callback_input: Any, control: Any) -> None:
        if callback_input.ckpt_path:
            commit_layer(self.generator, callback_input.ckpt_path, deadline_s=self.deadline_s)
            self.last_dir = str(callback_input.ckpt_path)

    def on_train_end(self, trainer: Any, callback_input: Any, control: Any) -> None:
        if self.last_dir is not None:  # releases what came after it (the last evaluation)
            commit_layer(self.generator, self.last_dir, deadline_s=self.deadline_s)


class FullyAsyncGymTrainer(FullyAsyncRayPPOTrainer):
    """SkyRL's fully async trainer whose checkpoints hold the layer's part (module docstring).
    ``deadline_s``: how long the layer's gate may take."""

    def __init__(self, *args: Any, deadline_s: float = 120.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.layer_deadline_s = deadline_s
        if not isinstance(self.generator, GymGenerator):
            raise TypeError("FullyAsyncGymTrainer needs a GymGenerator")
        self.generator.epoch_source = lambda: int(getattr(self, "epoch", 0))

    def convert_generation_group_mini_batch_to_training_input(
        self, groups: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """SkyRL's, plus the step's ``rlga/*`` counts: SkyRL rebuilds a mini-batch's rollout
        metrics from responses and rewards only, which drops the generator's."""
        batch = super().convert_generation_group_mini_batch_to_training_input(
            groups, *args, **kwargs
        )
        sums: dict[str, float] = {}
        for group in groups:
            for key, value in (group.generator_output.get("rollout_metrics") or {}).items():
                if key.startswith(METRIC_PREFIX + "/") and key != MASKED_FRACTION:
                    sums[key] = sums.get(key, 0.0) + float(value)
        self.all_metrics.update(sums)
        return batch

    def save_checkpoints(self) -> str:
        folder = super().save_checkpoints()
        trained = self.async_train_dataloader.get_consumed_uids_list()
        keep = self.generator.untrained(int(getattr(self, "epoch", 0)), trained)
        commit_layer(self.generator, folder, deadline_s=self.layer_deadline_s, keep=keep)
        return folder
