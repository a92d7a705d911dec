"""One restore rule (issue 27, item 5): ``rl_gym_actors.latest_checkpoint_dir(root)`` is the newest
checkpoint dir under ``root`` (one or two levels down) holding a complete, valid part: a dir
whose part was torn while it was first written (no ``part.json``, or a ``sealed.u64`` that does
not match its digest) is skipped, and so is a dir without a part. Newest by when the part was
first written, not by the dir's name or its files' times."""

from __future__ import annotations

import os
import time

import rl_gym_actors
from rl_gym_actors.checkpoint_part import write_part
from rl_gym_actors.core.sealed_ids import SealedIds
from rl_gym_actors.outcome import Outcome


def _write(directory, checkpoint_id: str, run_id: str = "run") -> None:
    write_part(
        directory,
        run_id=run_id,
        checkpoint_id=checkpoint_id,
        handed=[Outcome(rollout_id=f"{checkpoint_id}-r", status="sealed", attempt_index=0)],
        undelivered=[],
        sealed=SealedIds(),
    )


def test_the_newest_complete_part_is_the_restore_source_and_a_torn_one_is_skipped(tmp_path):
    latest = rl_gym_actors.latest_checkpoint_dir  # exported from the package's top level
    assert latest(tmp_path) is None and latest(tmp_path / "missing") is None
    _write(tmp_path / "global_step_9" / "gym", "ck-9")  # oldest, though its name sorts last
    time.sleep(0.01)
    _write(tmp_path / "global_step_10" / "gym", "ck-10")
    time.sleep(0.01)
    (tmp_path / "global_step_11" / "gym").mkdir(parents=True)  # the trainer's state only
    assert latest(tmp_path) == tmp_path / "global_step_10" / "gym"
    os.utime(tmp_path / "global_step_9" / "gym" / "rl_gym_actors" / "part.json")  # touched later
    assert latest(tmp_path) == tmp_path / "global_step_10" / "gym"

    _write(tmp_path / "global_step_12", "ck-12")  # newer, then torn: its record rewritten
    (tmp_path / "global_step_12" / "rl_gym_actors" / "sealed.u64").write_bytes(b"\0" * 16)
    time.sleep(0.01)
    _write(tmp_path / "global_step_13", "ck-13")  # torn before part.json: no part at all
    (tmp_path / "global_step_13" / "rl_gym_actors" / "part.json").unlink()
    _write(tmp_path / "global_step_14", "ck-14")
    (tmp_path / "global_step_14" / "rl_gym_actors" / "part.json").write_text('{"run_id":')
    assert latest(tmp_path) == tmp_path / "global_step_10" / "gym"

    time.sleep(0.01)
    _write(tmp_path / "global_step_15", "ck-15", run_id="other")
    assert latest(tmp_path) == tmp_path / "global_step_15"
    assert latest(tmp_path, run_id="run") == tmp_path / "global_step_10" / "gym"
    assert latest(tmp_path / "global_step_10" / "gym") == tmp_path / "global_step_10" / "gym"
