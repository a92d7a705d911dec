"""A restore from a checkpoint dir also reads the same run's newer parts beside it.

A trainer that writes its own state once ``checkpoint()`` returned (the order many frameworks
use) and dies between the gate's release and that write restarts from its state of the
checkpoint before, and passes that checkpoint's dir as ``restore_from=``. The checkpoint it died
in already let Gym go of that step's results: its part (written before anything was released,
:mod:`rl_gym_actors.checkpoint_part`) holds them, in a sibling dir. So a restore reads, beside
the part it restores (its parent's sub-folders, or ``root/*/gym`` for ``root/step-N/gym``;
at most :data:`NEWER_PARTS`), the complete
parts of the same run first written after it (:func:`newer_parts`), and:

- every result one of them holds that the restored part does not is the rollout's next row's
  result, with its reply, not ``repeated`` (:func:`load_newer`): the restored trainer's state has
  not seen it, and its row sent again gets it back without an agent run;
- a newer part whose checkpoint committed (its ``report.json``) answers its id asked again with
  the same dir (``RunCheckpoints.note_committed``);
- Gym v2's exported episodes are continued from the newest of those parts (:func:`v2_source`),
  as a restore from that part would: Gym's newest cut of the run is that checkpoint's.

The restored part's sealed-id record is the one used: a newer part's record names ids the
restored trainer's state never consumed.
"""

from __future__ import annotations

import os
from pathlib import Path

from rl_gym_actors import checkpoint_part as parts
from rl_gym_actors.checkpoint_part import CheckpointPart
from rl_gym_actors.core.rollout_memory import RolloutMemory
from rl_gym_actors.core.sealed_ids import SealedIds

NEWER_PARTS = parts.NEWER_PARTS  # sibling parts read at most


def newer_parts(
    restore_from: str | os.PathLike[str], part: CheckpointPart
) -> list[tuple[Path, CheckpointPart]]:
    """The complete parts of ``part``'s run beside ``restore_from`` (:func:`run_dirs
    <rl_gym_actors.checkpoint_part.run_dirs>`: its parent's sub-folders, or for
    ``root/step-N/gym`` the ``gym`` of its parent's siblings) first written after it, oldest
    first (at most :data:`NEWER_PARTS`, the newest ones). A torn or unreadable part, another
    run's, or the restored dir itself is skipped."""
    here = Path(restore_from).resolve()
    found: list[tuple[float, str, Path, CheckpointPart]] = []
    try:
        since = (parts.part_dir(here) / parts.PART_FILE).stat().st_mtime
        children = [c for c in parts.run_dirs(here) if c.resolve() != here]
    except OSError:
        return []
    for child in children:
        try:  # a part written since the restored one was last: only those are read
            if (parts.part_dir(child) / parts.PART_FILE).stat().st_mtime < since:
                continue
        except OSError:
            continue
        try:  # part.json is written last: present and valid, the part is complete
            other = CheckpointPart.model_validate_json(
                (parts.part_dir(child) / parts.PART_FILE).read_bytes()
            )
        except (OSError, ValueError):
            continue
        same_run = other.schema_version == parts.SCHEMA and other.run_id == part.run_id
        if same_run and other.created_ts > part.created_ts:
            found.append((other.created_ts, str(child), child, other))
    found.sort()
    return [(d, p) for _, _, d, p in found[-NEWER_PARTS:]]


def load_newer(
    memory: RolloutMemory, newer: list[tuple[Path, CheckpointPart]], sealed: SealedIds
) -> int:
    """Give ``memory`` (already loaded with the restored part) the results the newer parts hold
    that it does not: undelivered, so a row sent again gets each as its result (newest part
    first). A sealed id of the restored part's record is left alone. How many were loaded."""
    loaded = 0
    for _, part in reversed(newer):
        for outcome in (*part.handed, *part.undelivered):
            rid = outcome.rollout_id
            if memory.record(rid) is not None or rid in sealed:
                continue
            memory.restore(outcome, delivered=False)
            loaded += memory.record(rid) is not None
    return loaded


def v2_source(
    part: CheckpointPart, newer: list[tuple[Path, CheckpointPart]]
) -> CheckpointPart | None:
    """The part whose Gym v2 episodes a restore continues: the newest of ``part`` and the newer
    ones (Gym's latest cut of the run), when it names any (None: none to restore), with the
    checkpoint id Gym committed it under."""
    newest = newer[-1][1] if newer else part
    if not newest.gym_v2:
        return None
    return newest.model_copy(update={"checkpoint_id": newest.gym_checkpoint_id})
