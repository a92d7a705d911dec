"""``GymRayPPOTrainer``: SkyRL's sync trainer, resuming from an epoch boundary into the next epoch.

SkyRL 0.4's ``load_checkpoints()`` restores the dataloader's state; a checkpoint taken at the
end of an epoch holds an exhausted iterator, so the first epoch after the resume iterates
nothing: no step of that epoch runs and, when it was the last one, the run ends early (then its
final save writes ``global_step_N`` again with the same N). This subclass spends that empty
resumed iteration right after the load, so the next epoch's ``for`` starts a fresh pass: what
an uninterrupted run does at an epoch's end. Only at an epoch boundary, and only if the resumed
iteration is really empty (else it raises rather than skip data). The loader it goes on with is
built afresh and run through the epochs done, so the next epoch's order is the one the dead run
drew (the restored loader's is another).
"""

from __future__ import annotations

from typing import Any

from skyrl.train.trainer import RayPPOTrainer


class ResumedEpochNotEmpty(RuntimeError):
    """The dataloader resumed at an epoch boundary still had batches (an unknown SkyRL state)."""


class GymRayPPOTrainer(RayPPOTrainer):
    """SkyRL's ``RayPPOTrainer`` with the epoch-boundary resume fixed (module docstring)."""

    train_dataloader: Any  # SkyRL's StatefulDataLoader

    def load_checkpoints(self) -> Any:
        loaded = super().load_checkpoints()
        step = loaded[0] if isinstance(loaded, tuple) else loaded
        per_epoch = len(self.train_dataloader)
        if step and per_epoch and step % per_epoch == 0:
            for _ in self.train_dataloader:  # the resumed pass: empty at an epoch's end
                raise ResumedEpochNotEmpty(
                    f"the dataloader resumed at global_step_{step} (an epoch's end) has batches"
                )
            self.train_dataloader = self._loader_after(step // per_epoch)
        return loaded

    def _loader_after(self, epochs: int) -> Any:
        """SkyRL's train loader built afresh and run through ``epochs`` whole passes, so its next
        pass draws the order an uninterrupted run draws for the next epoch. The restored loader
        draws another order, so a prompt the dead run had started in the epoch's first step comes
        in a later step; by then the commit after that first step has released its results on
        Gym (not in any part), and the layer answers it ``forgotten_rollout``."""
        from skyrl.train.utils.trainer_utils import build_dataloader

        loader = build_dataloader(self.cfg, self.train_dataset, is_train=True)
        for _ in range(epochs):
            for _ in loader:
                pass
        return loader
