"""The rollout id of one SkyRL trajectory: stable across a restart of either trainer.

SkyRL's ``TrajectoryID(instance_id, repetition_id)`` names a prompt by its dataset index, so it
repeats every epoch; ``batch_metadata.global_step`` is, in the fully async trainer, the step at
which a worker pulled the prompt, and differs after a resume. What stays the same when a trainer
restored from a checkpoint asks for a trajectory again is (run, phase, epoch, instance,
repetition): training ids are ``<run>-train-e<epoch>-i<instance>-r<repetition>``. An evaluation
pass has no epoch of its own; its ids carry the step it evaluates at instead
(``<run>-eval-s<step>-i<instance>-r<repetition>``). An instance id that is not made of the
characters a rollout id allows (SkyRL's are ``str(dataset index)``, which always are) is replaced
by a digest of it. Nothing here imports SkyRL or Ray.
"""

from __future__ import annotations

import hashlib

from rl_gym_actors.errors import ConfigError
from rl_gym_actors.protocol import ROLLOUT_ID_MAX, is_valid_rollout_id

RUN_ID_MAX = 96  # leaves room for "-train-e<epoch>-i<instance>-r<repetition>"
INSTANCE_MAX = 64
DIGEST_CHARS = 16
PHASES = ("train", "eval")


def check_run_id(run_id: str) -> str:
    if not (is_valid_rollout_id(run_id) and len(run_id) <= RUN_ID_MAX):
        raise ConfigError(
            f"run id {run_id!r} must be a valid rollout id of at most {RUN_ID_MAX} characters "
            "(a letter or digit, then letters, digits, '.', '_', '-')"
        )
    return run_id


def instance_part(instance_id: object) -> str:
    """The instance id as it goes into a rollout id: itself when it is short and made of allowed
    characters, else ``h`` + the first characters of its SHA-256."""
    text = str(instance_id)
    if is_valid_rollout_id(text) and len(text) <= INSTANCE_MAX:
        return text
    return "h" + hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def trajectory_rollout_id(
    run_id: str,
    phase: str,
    *,
    epoch: int,
    global_step: int,
    instance_id: object,
    repetition_id: int,
) -> str:
    """The rollout id of one trajectory (see the module docstring). ``epoch`` is read for
    training, ``global_step`` for evaluation. ConfigError for an unknown phase or a negative
    number."""
    if phase not in PHASES:
        raise ConfigError(f"training phase {phase!r} is not one of {PHASES}")
    for name, value in (
        ("epoch", epoch),
        ("global_step", global_step),
        ("repetition_id", repetition_id),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name} {value!r} is not a count")
    where = f"e{epoch}" if phase == "train" else f"s{global_step}"
    rid = f"{run_id}-{phase}-{where}-i{instance_part(instance_id)}-r{repetition_id}"
    if not is_valid_rollout_id(rid) or len(rid) > ROLLOUT_ID_MAX:
        raise ConfigError(f"rollout id {rid!r} is not valid (check the run id)")
    return rid
