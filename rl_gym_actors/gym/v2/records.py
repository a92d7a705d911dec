"""A v2 participant's checkpoint files: ``<checkpoint_dir>/gym/<kind>/<instance>/``.

- ``records-<sha256>.jsonl``: one JSON record per line, written to a temporary file, fsynced,
  then renamed after its digest;
- ``manifest.json`` last: ``{"schema_version": 1, "kind", "instance", "checkpoint_id",
  "records_file", "records_sha256", "record_count"}``, created with a hard link so it is only ever
  created, never replaced. The same commit again finds the same manifest and succeeds; a
  different one in the same directory is refused (422 ``invalid_checkpoint_state``).

Readers check the schema, kind, instance, digest and count, and keep only the records a
``select`` function accepts. Blocking: callers run these in a thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rl_gym_actors.errors import CheckpointStateInvalid
from rl_gym_actors.gym.checkpoint_files import fsync_dir
from rl_gym_actors.gym.v2.wire import EpisodeId

SCHEMA_VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _bad(detail: str) -> CheckpointStateInvalid:
    return CheckpointStateInvalid(detail, status=422)


def participant_dir(checkpoint_dir: str | Path, kind: str, instance: str) -> Path:
    for name in (kind, instance):
        if not _NAME.match(name):
            raise _bad(f"invalid participant name {name!r}")
    return Path(checkpoint_dir) / "gym" / kind / instance


def write_state(
    checkpoint_dir: str | Path,
    *,
    kind: str,
    instance: str,
    checkpoint_id: str,
    records: Iterable[dict[str, Any]],
) -> dict[str, Any]:
    """Write the records, then the manifest; return the manifest."""
    where = participant_dir(checkpoint_dir, kind, instance)
    try:
        where.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        count = 0
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".records-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                for record in records:
                    line = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
                    out.write(line + b"\n")
                    digest.update(line + b"\n")
                    count += 1
                out.flush()
                os.fsync(out.fileno())
            records_file = f"records-{digest.hexdigest()}.jsonl"
            os.replace(tmp, where / records_file)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "kind": kind,
            "instance": instance,
            "checkpoint_id": checkpoint_id,
            "records_file": records_file,
            "records_sha256": digest.hexdigest(),
            "record_count": count,
        }
        body = json.dumps(manifest, sort_keys=True, indent=2).encode() + b"\n"
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".manifest-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(body)
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(tmp, where / "manifest.json")  # created, never replaced
            except FileExistsError:
                if (where / "manifest.json").read_bytes() != body:
                    raise _bad(f"{where} already holds a different commit") from None
        finally:
            Path(tmp).unlink(missing_ok=True)
        fsync_dir(where)
    except OSError as exc:
        raise _bad(f"cannot write {where}: {exc}") from exc
    return manifest


def read_state(
    checkpoint_dir: str | Path,
    *,
    kind: str,
    instance: str,
    select: Callable[[dict[str, Any]], bool],
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The manifest and the selected records; ``invalid_checkpoint_state`` on anything wrong."""
    where = participant_dir(checkpoint_dir, kind, instance)
    try:
        manifest = json.loads((where / "manifest.json").read_bytes())
        if not isinstance(manifest, dict) or manifest.get("schema_version") != SCHEMA_VERSION:
            raise _bad(f"{where}: unknown manifest schema")
        if (manifest.get("kind"), manifest.get("instance")) != (kind, instance):
            raise _bad(f"{where}: the manifest is another participant's")
        name = manifest.get("records_file")
        if not isinstance(name, str) or "/" in name or name.startswith("."):
            raise _bad(f"{where}: bad records_file")
        digest = hashlib.sha256()
        selected: list[dict[str, Any]] = []
        count = 0
        with open(where / name, "rb") as lines:
            for line in lines:
                digest.update(line)
                count += 1
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise _bad(f"{where}: record {count} is no object")
                if select(record):
                    selected.append(record)
    except CheckpointStateInvalid:
        raise
    except (OSError, ValueError) as exc:
        raise _bad(f"cannot read {where}: {exc}") from exc
    if digest.hexdigest() != manifest.get("records_sha256") or count != manifest.get(
        "record_count"
    ):
        raise _bad(f"{where}: records do not match the manifest's digest or count")
    return manifest, selected


def record_episode(record: dict[str, Any]) -> EpisodeId:
    """The episode a checkpoint record names; CheckpointStateInvalid (422) when it names none."""
    try:
        return EpisodeId.model_validate(record["episode_id"])
    except (KeyError, TypeError, ValidationError) as exc:
        raise CheckpointStateInvalid(
            f"checkpoint record has no valid episode_id: {exc}", status=422
        ) from exc


def record_key(record: dict[str, Any]) -> str:
    """The capture key of the episode a checkpoint record names."""
    return record_episode(record).capture_key
