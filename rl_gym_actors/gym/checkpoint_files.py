"""A participant's checkpoint files: its records (one canonical JSON line per execution), then
``manifest.json`` last, each written to a temporary name, fsynced and renamed, and the directory
fsynced; and :func:`confine`, which keeps commit's ``checkpoint_dir`` inside a root.

The durable-file steps every protocol's files share: :func:`write_file_atomically` (temporary
name, fsync, rename) and :func:`fsync_dir` (the directory entry made durable)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from rl_gym_actors.gym.store import Execution
from rl_gym_actors.protocol import canonical_json

RECORDS_NAME = "gym-participant-records.jsonl"
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "rl_gym_actors/gym-participant-checkpoint/1"


def write_file_atomically(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` or what it held before, never a part (call :func:`fsync_dir` to
    make the new name durable)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _checkpoint_line(e: Execution) -> bytes:
    """One execution as a line of the checkpoint's records file."""
    receipt = json.loads(e.receipt) if e.receipt is not None else None
    return canonical_json(
        {
            "rollout_id": e.rollout_id,
            "attempt_index": e.attempt_index,
            "state": e.state.value,
            "execution_generation": e.generation,
            "completion_receipt": receipt,
        }
    )


def write_checkpoint(
    checkpoint_dir: str | os.PathLike[str], checkpoint_id: str, executions: Iterable[Execution]
) -> dict[str, object]:
    """Write the records, then ``manifest.json`` last. Returns the commit answer
    ``{"records": n, "manifest_digest": sha256 of manifest.json}``. Raises OSError."""
    directory = Path(checkpoint_dir)
    directory.mkdir(parents=True, exist_ok=True)
    lines = [_checkpoint_line(e) for e in sorted(executions, key=lambda e: e.key)]
    records = b"".join(line + b"\n" for line in lines)
    write_file_atomically(directory / RECORDS_NAME, records)
    manifest = canonical_json(
        {
            "format": MANIFEST_FORMAT,
            "checkpoint_id": checkpoint_id,
            "records": len(lines),
            "records_file": RECORDS_NAME,
            "records_sha256": hashlib.sha256(records).hexdigest(),
        }
    )
    write_file_atomically(directory / MANIFEST_NAME, manifest)
    fsync_dir(directory)
    return {"records": len(lines), "manifest_digest": hashlib.sha256(manifest).hexdigest()}


def confine(root: str | os.PathLike[str] | None, checkpoint_dir: str) -> Path:
    """``checkpoint_dir`` resolved inside ``root`` (a relative one resolves under it); raises
    ValueError when it escapes ``root`` (``..``, an absolute path elsewhere, a symlink out).
    Without a root, the path as given."""
    if root is None:
        return Path(checkpoint_dir)
    base = Path(os.path.realpath(root))
    target = Path(os.path.realpath(base / checkpoint_dir))  # an absolute dir replaces base
    if target != base and base not in target.parents:
        raise ValueError(f"checkpoint_dir {checkpoint_dir!r} is outside the checkpoint root")
    return target
