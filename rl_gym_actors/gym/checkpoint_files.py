"""A participant's checkpoint files: its records (one canonical JSON line per execution), then
``manifest.json`` last, each written to a temporary name, fsynced and renamed, and the directory
fsynced; and :func:`confine`, which keeps commit's ``checkpoint_dir`` inside a root.

The durable-file steps every protocol's files share: :func:`write_file_atomically` (temporary
name, fsync, rename) and :func:`fsync_dir` (the directory entry made durable)."""

from __future__ import annotations

import hashlib
import json
import operator
import os
from collections.abc import Iterable
from pathlib import Path

from rl_gym_actors.gym.store import Execution
from rl_gym_actors.protocol import canonical_json

RECORDS_NAME = "gym-participant-records.jsonl"
CONTINUATIONS_NAME = "continuations.jsonl"  # the continuation roots (real Gym's file name)
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "rl_gym_actors/gym-participant-checkpoint/1"
_KEY = operator.attrgetter("rollout_id", "attempt_index")


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
    """One execution as a line of the checkpoint's records file: the canonical JSON of
    ``{rollout_id, attempt_index, state, execution_generation, completion_receipt}``, written
    with its keys in canonical order and the stored receipt (canonical JSON itself) spliced in."""
    receipt = b"null" if e.receipt is None else e.receipt
    return b'{"attempt_index":%d,"completion_receipt":%s,"execution_generation":%d,' % (
        e.attempt_index,
        receipt,
        e.generation,
    ) + b'"rollout_id":%s,"state":"%s"}' % (
        _json_string(e.rollout_id).encode("ascii"),
        e.state.value.encode("ascii"),  # (lowercase letters and underscores)
    )


# json.dumps of a str, without its per-call set-up (C, where the interpreter has it)
_json_string = json.encoder.encode_basestring_ascii


def instance_dir(checkpoint_dir: Path, name: str | None) -> Path:
    """Where a participant's files go: ``checkpoint_dir`` itself for an unnamed one, else
    ``agent/instance-<sha256(name)>`` below it, the directory a real Gym agent participant
    with an instance name uses and NeMo RL's checkpoint client (PR #4093) reads."""
    if name is None:
        return checkpoint_dir
    return checkpoint_dir / "agent" / f"instance-{hashlib.sha256(name.encode()).hexdigest()}"


def write_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    checkpoint_id: str,
    executions: Iterable[Execution],
    *,
    name: str | None = None,
) -> dict[str, object]:
    """Write the records, the continuation index (no roots: nothing of ours parks at a
    boundary), then ``manifest.json`` last, into :func:`instance_dir`. Returns the commit
    answer ``{"records", "manifest_digest", "continuation_index"}`` (the index's path relative
    to ``checkpoint_dir``). Raises OSError."""
    root = Path(checkpoint_dir)
    directory = instance_dir(root, name)
    directory.mkdir(parents=True, exist_ok=True)
    lines = [_checkpoint_line(e) for e in sorted(executions, key=_KEY)]
    records = b"".join(line + b"\n" for line in lines)
    write_file_atomically(directory / RECORDS_NAME, records)
    continuations = b""
    write_file_atomically(directory / CONTINUATIONS_NAME, continuations)
    index = {
        "schema_version": 1,
        "relative_path": str((directory / CONTINUATIONS_NAME).relative_to(root)),
        "sha256": hashlib.sha256(continuations).hexdigest(),
        "records": 0,
        "bytes": len(continuations),
    }
    manifest = canonical_json(
        {
            "format": MANIFEST_FORMAT,
            "checkpoint_id": checkpoint_id,
            "instance_name": name,
            "records": len(lines),
            "records_file": RECORDS_NAME,
            "records_sha256": hashlib.sha256(records).hexdigest(),
            "continuation_index": index,
        }
    )
    write_file_atomically(directory / MANIFEST_NAME, manifest)
    fsync_dir(directory)
    return {
        "records": len(lines),
        "manifest_digest": hashlib.sha256(manifest).hexdigest(),
        "continuation_index": index,
    }


class CheckpointUnreadable(ValueError):
    """A checkpoint's files are missing, belong to another instance, or fail their digests."""


def read_checkpoint(checkpoint_dir: str | os.PathLike[str], name: str | None) -> dict[str, object]:
    """Check what :func:`write_checkpoint` left in ``checkpoint_dir`` (the instance's
    manifest, its records' and continuation index's digests) and answer restore's
    ``{"records", "source_checkpoint_id", "continuation_index"}``. Raises
    :class:`CheckpointUnreadable`."""
    root = Path(checkpoint_dir)
    directory = instance_dir(root, name)
    try:
        manifest = json.loads((directory / MANIFEST_NAME).read_bytes())
        records = (directory / str(manifest["records_file"])).read_bytes()
        index = manifest["continuation_index"]
        continuations = (root / str(index["relative_path"])).read_bytes()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointUnreadable(f"no readable checkpoint in {directory}: {exc}") from None
    if manifest.get("instance_name") != name:
        raise CheckpointUnreadable(
            f"{directory} belongs to instance {manifest.get('instance_name')!r}, not {name!r}"
        )
    if hashlib.sha256(records).hexdigest() != manifest.get("records_sha256"):
        raise CheckpointUnreadable(f"{directory}: the records fail their digest")
    if hashlib.sha256(continuations).hexdigest() != index.get("sha256"):
        raise CheckpointUnreadable(f"{directory}: the continuation index fails its digest")
    # the counts, against what was read (a digest covers the files, not the manifest's numbers)
    for what, count, raw in (
        ("records", manifest.get("records"), records),
        ("continuation index records", index.get("records"), continuations),
    ):
        if type(count) is not int or count != _lines(raw):
            raise CheckpointUnreadable(
                f"{directory}: the manifest says {count!r} {what}, the file holds {_lines(raw)}"
            )
    return {
        "records": manifest["records"],
        "source_checkpoint_id": manifest["checkpoint_id"],
        "continuation_index": index,
    }


def _lines(raw: bytes) -> int:
    """Lines of a JSON-lines file (each ends with a newline)."""
    return raw.count(b"\n")


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
