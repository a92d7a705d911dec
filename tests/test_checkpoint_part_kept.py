"""The checkpoint gate adds the handed-over tries it adopts to the part already written, before
it ACKs anything (issue 16): ``add_undelivered`` rewrites ``part.json`` durably, leaves a rollout
the part already holds as it is, and refuses (ConfigError) a dir with no part."""

from __future__ import annotations

import pytest

from rl_gym_actors.checkpoint_part import add_undelivered, read_part, write_part
from rl_gym_actors.core.sealed_ids import SealedIds
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.outcome import Outcome


def _outcome(rid: str, status: str = "sealed") -> Outcome:
    return Outcome(rollout_id=rid, status=status, attempt_index=1, reply={"reward": 0.5})


def test_adopted_results_join_the_parts_undelivered(tmp_path):
    write_part(
        tmp_path,
        run_id="run-1",
        checkpoint_id="ck-1",
        handed=[_outcome("a")],
        undelivered=[_outcome("b", "abandoned")],
        sealed=SealedIds(),
    )
    kept = [_outcome("a", "abandoned"), _outcome("b", "abandoned"), _outcome("c", "abandoned")]
    assert add_undelivered(tmp_path, kept) == 1
    part, _ = read_part(tmp_path)
    assert [o.rollout_id for o in part.undelivered] == ["b", "c"]
    assert [o.rollout_id for o in part.handed] == ["a"] and part.run_id == "run-1"
    assert add_undelivered(tmp_path, kept) == 0  # idempotent
    assert not list((tmp_path / "rl_gym_actors").glob("*.tmp"))


def test_no_part_to_add_to_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no checkpoint part"):
        add_undelivered(tmp_path, [_outcome("a", "abandoned")])
