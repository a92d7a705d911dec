"""verl's v1 trainers with deterministic prompt uids, registered as ``rlga_<mode>``.

``trainer.v1.trainer_mode=rlga_sync`` (or ``rlga_colocate_async``, ``rlga_separate_async``)
picks verl's own trainer of that mode (:func:`verl.trainer.ppo.v1.get_trainer_cls`) with one
change: a fetched prompt's ``uid`` is ``e<epoch>-b<batch>-p<position>``
(:func:`~rl_gym_actors.integrations.verl.ids.prompt_uid`) instead of a ``uuid4``, so a prompt
that a resumed run fetches again carries the uid it had, and its sessions the rollout ids the
layer knows. The epoch and batch counters are saved beside verl's ``data.pt`` (in
``global_step_N/rl_gym_actors_uids.json``, before verl's own files, in the same call) and read
back after verl's ``_load_checkpoint``. Everything else is verl's, including ``trainer_mode``
as verl's code reads it (``sync``, ...).

The classes register in processes that import this module: verl's ``TaskRunnerV1`` looks the
mode up, so run verl through :mod:`rl_gym_actors.integrations.verl.main` (which imports it there).
:meth:`GymUids.rlga_untrained_rollout_ids` tells the checkpoint callback which rollouts the
trainer still holds untrained (the async modes' TransferQueue).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from verl.trainer.ppo.v1 import (
    PPOTrainer,
    PPOTrainerColocateAsync,
    PPOTrainerSeparateAsync,
    PPOTrainerSync,
    register_trainer,
)
from verl.utils import tensordict_utils as tu

from rl_gym_actors.integrations.verl.checkpoints import checkpoint_id
from rl_gym_actors.integrations.verl.host import close_host, finish_host
from rl_gym_actors.integrations.verl.ids import prompt_uid, rollout_id
from rl_gym_actors.integrations.verl.settings import base_mode, resume_step_dir, settings_from

UIDS_FILE = "rl_gym_actors_uids.json"
# the layer's part written when fit() returns (beside verl's global_step_N folders, named so that
# neither verl nor the layer's restore_dir takes it for a step; a later restore of the run reads it
# as one of the run's newer parts)
END_DIR_PREFIX = "rl_gym_actors_end_gs"


class GymUids:
    """The mixin (put it before verl's trainer class)."""

    _rlga_epoch = 0  # epochs the dataloader ended
    _rlga_batch = 0  # batches fetched in the current epoch
    _rlga_trained: frozenset[str] = frozenset()  # TransferQueue keys of the last trained batch

    @property
    def trainer_mode(self) -> str:
        return self._rlga_mode

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:  # verl's code compares it with "sync"
        self._rlga_mode = base_mode(str(value))

    def _fetch_one_gen_batch(self) -> Any:
        me: Any = self
        loader = me.train_dataloader
        if me.train_dataloader_it is None:
            me.train_dataloader_it = iter(loader)
        try:
            batch_dict = next(me.train_dataloader_it)
            new_epoch = False
        except StopIteration:
            me.train_dataloader_it = iter(loader)
            batch_dict = next(me.train_dataloader_it)
            new_epoch = True
        # a new epoch: the loader ran out, or it was restored at an epoch's end (once, not twice)
        if new_epoch or self._rlga_batch >= len(loader):
            self._rlga_epoch, self._rlga_batch = self._rlga_epoch + 1, 0
        count = len(batch_dict["raw_prompt"])
        uids = [prompt_uid(self._rlga_epoch, self._rlga_batch, i) for i in range(count)]
        self._rlga_batch += 1
        batch_dict["uid"] = np.array(uids, dtype=object)
        return tu.get_tensordict(batch_dict)

    def _save_checkpoint(self) -> Any:
        me: Any = self
        folder = Path(me.config.trainer.default_local_dir) / f"global_step_{me.global_steps}"
        folder.mkdir(parents=True, exist_ok=True)
        state = {"epoch": self._rlga_epoch, "batch": self._rlga_batch}
        tmp = folder / f"{UIDS_FILE}.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, folder / UIDS_FILE)
        return super()._save_checkpoint()  # type: ignore[misc]

    def _load_checkpoint(self) -> Any:
        result = super()._load_checkpoint()  # type: ignore[misc]
        me: Any = self
        folder = resume_step_dir(me.config)
        if folder is not None and (folder / UIDS_FILE).is_file():
            state = json.loads((folder / UIDS_FILE).read_text())
            self._rlga_epoch, self._rlga_batch = int(state["epoch"]), int(state["batch"])
        return result

    def step(self, metrics: dict, timing_raw: dict) -> Any:
        batch = super().step(metrics, timing_raw)  # type: ignore[misc]
        self._rlga_trained = frozenset(batch.keys)
        return batch

    def rlga_untrained_rollout_ids(self) -> list[str]:
        """Rollouts the trainer may hold but has not trained (the async modes' TransferQueue:
        finished sessions not in the batch just trained, and every session of a prompt still
        pending or running, whose result may be on its way: the callback passes them as
        ``keep_if_handed``)."""
        import transfer_queue as tq

        me: Any = self
        run_id = settings_from(me.config).run_id
        n = int(me.config.actor_rollout_ref.rollout.n)
        items = (tq.kv_list("train") or {}).get("train", {})
        keep: set[str] = set()
        for key, tag in items.items():
            if tag.get("is_prompt", False):
                if tag.get("status") in ("pending", "running"):
                    keep.update(rollout_id(run_id, key, s) for s in range(n))
            elif key not in self._rlga_trained:
                uid, session, _ = str(key).rsplit("_", 2)
                keep.add(rollout_id(run_id, uid, int(session)))
        return sorted(keep)

    def fit(self, agent_loop_manager: Any) -> Any:
        result = super().fit(agent_loop_manager)  # type: ignore[misc]
        me: Any = self
        settings = settings_from(me.config)
        # the run ended: the sessions of the batch fetched last (the async modes run a batch
        # ahead) end, their results go into one more part and are released, then the host goes
        root = Path(me.config.trainer.default_local_dir)
        try:
            held = self.rlga_untrained_rollout_ids() if settings.is_async else None
            finish_host(
                settings.run_id,
                f"{checkpoint_id(settings.run_id, me.global_steps)}-end",
                str(root / f"{END_DIR_PREFIX}{int(me.global_steps)}"),
                settings.checkpoint_deadline_s,
                held,
            )
        finally:  # a failed end checkpoint (raised to the caller) leaves its results held
            close_host(settings.run_id)
        return result


@register_trainer("rlga_sync")
class GymPPOTrainerSync(GymUids, PPOTrainerSync):
    """verl's sync trainer with deterministic uids."""


@register_trainer("rlga_colocate_async")
class GymPPOTrainerColocateAsync(GymUids, PPOTrainerColocateAsync):
    """verl's colocate_async trainer with deterministic uids."""


@register_trainer("rlga_separate_async")
class GymPPOTrainerSeparateAsync(GymUids, PPOTrainerSeparateAsync):
    """verl's separate_async trainer with deterministic uids."""


__all__ = [
    "GymPPOTrainerColocateAsync",
    "GymPPOTrainerSeparateAsync",
    "GymPPOTrainerSync",
    "GymUids",
    "PPOTrainer",
]
