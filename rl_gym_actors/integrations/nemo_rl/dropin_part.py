"""The drop-in's own part of a checkpoint: what it needs to mint the same rollout ids again.

NeMo RL's rows carry no rollout id (its row building sets ``_rowidx`` and sampling settings
only), so the drop-in derives one from the run id, its call counter and the row
(:class:`~.rows.RolloutBook`). A trainer restored to a checkpoint replays the calls made after
it; with the run id and counter of that checkpoint they get the same ids, and the results its
dead instance left on Gym are this run's: adopted for re-sent rows, ACKed at the next
checkpoint. The part is one small JSON file in the checkpoint directory, written durably (temp
file, fsync, rename) before the checkpoint releases anything.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rl_gym_actors.errors import ConfigError

PART_NAME = "rl_gym_actors-dropin.json"
PART_SCHEMA = 1


def write_part(checkpoint_dir: str | os.PathLike[str], book_state: Mapping[str, Any]) -> Path:
    """Write ``{"schema_version", "prefix", "calls"}`` into ``checkpoint_dir`` durably."""
    directory = Path(checkpoint_dir)
    directory.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"schema_version": PART_SCHEMA, **book_state}, sort_keys=True).encode()
    target = directory / PART_NAME
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".dropin-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return target


def read_part(checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The part a checkpoint holds, or ``None`` when it has none (made before parts existed).
    Raises ``ConfigError`` for a part that is not one."""
    path = Path(checkpoint_dir) / PART_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        part = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{path}: not JSON: {exc}") from None
    if not isinstance(part, dict) or part.get("schema_version") != PART_SCHEMA:
        raise ConfigError(f"{path}: not a drop-in checkpoint part of schema {PART_SCHEMA}")
    return part
