"""Stable ids for verl's prompts and sessions (pure: no verl, no Ray).

verl's v1 trainer mints ``uid = uuid4()`` for each prompt when it fetches a batch, so a prompt
fetched again after a resume comes back under a new uid and nothing can recognise it. The
adapter's trainer classes (:mod:`rl_gym_actors.integrations.verl.trainer`) mint the uid from the
prompt's place in the data instead, which a resumed run reaches again in the same order (verl
restores its ``StatefulDataLoader``): ``e<epoch>-b<batch in the epoch>-p<position in the batch>``.
Each of the ``rollout.n`` sessions of a prompt is then one rollout, ``<run>-<uid>-s<session>``.
"""

from __future__ import annotations

from rl_gym_actors.errors import ConfigError
from rl_gym_actors.protocol import ROLLOUT_ID_MAX, is_valid_rollout_id

RUN_ID_MAX = 128  # leaves room for "-e<epoch>-b<batch>-p<pos>-s<session>" in a rollout id


def prompt_uid(epoch: int, batch_in_epoch: int, position: int) -> str:
    """The uid of the prompt at ``position`` of the ``batch_in_epoch``-th batch of ``epoch``."""
    for name, value in (("epoch", epoch), ("batch", batch_in_epoch), ("position", position)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name} must be an int >= 0, not {value!r}")
    return f"e{epoch}-b{batch_in_epoch}-p{position}"


def check_run_id(run_id: str) -> str:
    if not (is_valid_rollout_id(run_id) and len(run_id) <= RUN_ID_MAX):
        raise ConfigError(
            f"run id {run_id!r} must be a valid rollout id of at most {RUN_ID_MAX} characters"
        )
    return run_id


def rollout_id(run_id: str, uid: object, session_id: object) -> str:
    """The rollout id of one session of one prompt. The uid must be one the adapter minted (or
    any other id-safe string); a uid verl minted as a uuid4 is id-safe too, but not stable
    across a resume."""
    if isinstance(session_id, bool) or not isinstance(session_id, int) or session_id < 0:
        raise ConfigError(f"session_id must be an int >= 0, not {session_id!r}")
    value = f"{check_run_id(run_id)}-{uid}-s{session_id}"
    if not (is_valid_rollout_id(value) and len(value) <= ROLLOUT_ID_MAX):
        raise ConfigError(f"uid {uid!r} does not make a valid rollout id ({value!r})")
    return value
