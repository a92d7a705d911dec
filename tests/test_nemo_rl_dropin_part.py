"""The drop-in's part of a checkpoint: written durably, read back, refused when it is not one."""

from __future__ import annotations

import json

import pytest

from rl_gym_actors.errors import ConfigError
from rl_gym_actors.integrations.nemo_rl.dropin_part import PART_NAME, read_part, write_part


def test_the_part_round_trips_and_leaves_no_temp_file(tmp_path):
    write_part(tmp_path / "ck", {"prefix": "nrl-1a2b3c4d", "calls": 7})
    assert read_part(tmp_path / "ck") == {"schema_version": 1, "prefix": "nrl-1a2b3c4d", "calls": 7}
    assert [p.name for p in (tmp_path / "ck").iterdir()] == [PART_NAME]


def test_a_checkpoint_without_a_part_reads_none_and_a_foreign_file_is_refused(tmp_path):
    assert read_part(tmp_path) is None
    (tmp_path / PART_NAME).write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(ConfigError):
        read_part(tmp_path)
    (tmp_path / PART_NAME).write_text("{not json")
    with pytest.raises(ConfigError):
        read_part(tmp_path)
