"""The layer's own part of a checkpoint: what it is about to release, made durable first.

``Orchestrator.checkpoint(id, dir)`` writes it under ``<dir>/rl_gym_actors/`` before the ledger
is asked to ACK anything (docs: README "When Gym lets go of a result"):

- ``sealed.u64``: the compact record of sealed rollout ids (:class:`SealedIds`);
- ``part.json``, written last (it names the other file and its SHA-256): the run id, the
  checkpoint id, the sealed results handed to the trainer that this checkpoint counts as
  consumed (``handed``: each outcome with its reply; without it with ``keep_results=False``;
  restored, a row sent again is answered ``repeated``), and the results the trainer's state
  at this checkpoint has not seen (``undelivered``, in full: not handed yet, or handed and
  kept untrained, ``checkpoint(keep=...)``; restored, they are the rows' results).

Before the gate releases a result it did not hold when the part was written (a run that was in
flight when ``checkpoint()`` started and finished while the gate waited), the gate adds it to
``undelivered`` (:func:`add_undelivered`). Once the checkpoint committed, its
:class:`CheckpointReport` goes beside the part as ``report.json`` (:func:`add_report`): the same
checkpoint id asked again with the same dir answers it.

Once the checkpoint committed on Gym v2 servers, ``part.json`` is rewritten (as it was written)
with ``gym_v2``: per v2 server, the attempts the commit exported and those in flight it did not
(:func:`add_gym_v2`), which ``Orchestrator.arestore`` restores (see ``actors/v2_restore.py``).

Each file is written as ``name.tmp`` in the same directory, flushed, fsynced and renamed over
``name``; the directory is fsynced after. A part with no ``part.json``, or whose file digest does
not match, is refused with ConfigError: never half used. ``Orchestrator(..., restore_from=dir)``
reads it back (:func:`read_part`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
import uuid
from collections.abc import Set
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, ValidationError

from rl_gym_actors.config import checkpoint_id_arg, restore_prefix
from rl_gym_actors.core.checkpoint_report import CheckpointReport, RestoreReport, V2EndpointScope
from rl_gym_actors.core.rollout_memory import RolloutMemory
from rl_gym_actors.core.sealed_ids import DEFAULT_RETENTION, SealedIds
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.gym.checkpoint_files import fsync_dir, write_file_atomically
from rl_gym_actors.outcome import Outcome

if TYPE_CHECKING:  # the orchestrator's client of its ledger actor (Ray's)
    from rl_gym_actors.actors.ledger_client import LedgerClient

PART_DIR = "rl_gym_actors"
PART_FILE = "part.json"
SEALED_FILE = "sealed.u64"
SEALED_ALT = "sealed-b.u64"  # a rewrite of a part alternates between the two names
REPORT_FILE = "report.json"  # the committed report, written once the checkpoint committed
GATE_FILE = "gate.json"  # the agent-checkpoint gate's report, kept before its resumes
SCHEMA = 1


class SealedFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    ids: int
    sha256: str


class CheckpointPart(BaseModel):
    """``part.json``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA
    run_id: str
    checkpoint_id: str
    created_ts: float
    keep_results: bool = True
    handed: list[Outcome] = []
    undelivered: list[Outcome] = []
    sealed: SealedFile
    gym_v2: list[V2EndpointScope] = []  # added once the checkpoint committed on v2 servers
    # the id Gym knows this checkpoint by, when not ``checkpoint_id``: the id asked again by a
    # restored trainer after its dead predecessor had spent it on Gym (run_checkpoints.py)
    gym_id: str | None = None

    @property
    def gym_checkpoint_id(self) -> str:
        return self.gym_id or self.checkpoint_id

    def holds(self) -> set[tuple[str, int | None]]:
        """The (rollout id, try) of every result the part holds."""
        return {(o.rollout_id, o.attempt_index) for o in (*self.handed, *self.undelivered)}


def part_dir(checkpoint_dir: str | os.PathLike[str]) -> Path:
    return Path(checkpoint_dir) / PART_DIR


def write_part(
    checkpoint_dir: str | os.PathLike[str],
    *,
    run_id: str,
    checkpoint_id: str,
    handed: list[Outcome],
    undelivered: list[Outcome],
    sealed: SealedIds,
    keep_results: bool = True,
    gym_id: str | None = None,
) -> CheckpointPart:
    """Write the part durably (see the module docstring); return what ``part.json`` holds.

    Over a part of the same run already there (``gym_id``: the same id checkpointed again under
    another id on Gym, since a dead trainer spent it), every result the old part holds that the
    new one lacks is carried over as it was: nothing a part stored is lost by its rewrite. The
    sealed-id record goes to a file the old ``part.json`` does not name, so a kill inside the
    rewrite leaves the old part whole."""
    directory = part_dir(checkpoint_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        old = _old_part(directory)
        if gym_id is not None and old is not None and old.run_id == run_id:
            held = {o.rollout_id for o in (*handed, *undelivered)}
            handed = [*handed, *(o for o in old.handed if o.rollout_id not in held)]
            undelivered = [*undelivered, *(o for o in old.undelivered if o.rollout_id not in held)]
        name = SEALED_ALT if old is not None and old.sealed.name == SEALED_FILE else SEALED_FILE
        data = sealed.to_bytes()
        write_file_atomically(directory / name, data)
        part = CheckpointPart(
            run_id=run_id,
            checkpoint_id=checkpoint_id,
            created_ts=time.time(),
            keep_results=keep_results,
            handed=[o if keep_results else o.model_copy(update={"reply": None}) for o in handed],
            undelivered=list(undelivered),
            sealed=SealedFile(name=name, ids=len(sealed), sha256=hashlib.sha256(data).hexdigest()),
            gym_id=gym_id,
        )
        write_file_atomically(directory / PART_FILE, part.model_dump_json().encode())
        fsync_dir(directory)
        if old is not None and old.sealed.name != name:  # the old record, named by nothing now
            (directory / old.sealed.name).unlink(missing_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot write the checkpoint part under {directory}: {exc}") from exc
    return part


def _old_part(directory: Path) -> CheckpointPart | None:
    """The part already under ``directory`` (None: none, or not readable)."""
    try:
        return CheckpointPart.model_validate_json((directory / PART_FILE).read_bytes())
    except (OSError, ValueError):
        return None


def _read_to_add(directory: Path) -> CheckpointPart:
    try:
        return CheckpointPart.model_validate_json((directory / PART_FILE).read_bytes())
    except (OSError, ValidationError, json.JSONDecodeError) as exc:
        raise ConfigError(f"no checkpoint part to add to under {directory}: {exc}") from exc


def _rewrite(directory: Path, part: CheckpointPart) -> None:
    try:
        write_file_atomically(directory / PART_FILE, part.model_dump_json().encode())
        fsync_dir(directory)
    except OSError as exc:
        raise ConfigError(f"cannot write the checkpoint part under {directory}: {exc}") from exc


def add_undelivered(checkpoint_dir: str | os.PathLike[str], outcomes: list[Outcome]) -> int:
    """Add ``outcomes`` to the ``undelivered`` of the part already under ``checkpoint_dir``
    (rewritten durably, as :func:`write_part` writes it): the checkpoint gate calls it with the
    handed-over tries it adopted, before it ACKs anything. A rollout the part already holds is
    left as it is. How many were added; raises ConfigError when the part cannot be read or
    written."""
    directory = part_dir(checkpoint_dir)
    part = _read_to_add(directory)
    held = {o.rollout_id for o in part.handed} | {o.rollout_id for o in part.undelivered}
    new = [o for o in outcomes if o.rollout_id not in held]
    if new:
        _rewrite(directory, part.model_copy(update={"undelivered": [*part.undelivered, *new]}))
    return len(new)


def add_report(checkpoint_dir: str | os.PathLike[str], report: CheckpointReport) -> None:
    """Write the committed ``report`` beside the part under ``checkpoint_dir`` (``report.json``,
    durably; ``part.json`` is not rewritten): asked for the same checkpoint id and dir again,
    the orchestrator answers it."""
    _write_report(checkpoint_dir, REPORT_FILE, report, "checkpoint report")


def _write_report(
    checkpoint_dir: str | os.PathLike[str], name: str, report: CheckpointReport, what: str
) -> None:
    """``report`` as ``name`` beside the part, durably; ConfigError when it cannot be."""
    directory = part_dir(checkpoint_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        write_file_atomically(directory / name, report.model_dump_json().encode())
        fsync_dir(directory)
    except OSError as exc:
        raise ConfigError(f"cannot write the {what} under {directory}: {exc}") from exc


def committed_report(
    checkpoint_dir: str | os.PathLike[str], checkpoint_id: str
) -> CheckpointReport | None:
    """The committed report of ``checkpoint_id`` beside the part under ``checkpoint_dir``
    (None: none there, another id's, or the checkpoint never committed)."""
    try:
        raw = (part_dir(checkpoint_dir) / REPORT_FILE).read_bytes()
        report = CheckpointReport.model_validate_json(raw)
    except (OSError, ValidationError, json.JSONDecodeError):
        return None
    return report if report.checkpoint_id == checkpoint_id else None


class GateReportFile:
    """The agent-checkpoint gate's report between its commits and its resumes (``gate.json``
    beside the part; see actors/gate_done.py), written durably by the ledger as it writes the
    part's ``undelivered``; raises ConfigError when it cannot be written."""

    def write(self, checkpoint_dir: str, report: CheckpointReport) -> None:
        _write_report(checkpoint_dir, GATE_FILE, report, "gate report")

    def read(self, checkpoint_dir: str, checkpoint_id: str) -> CheckpointReport | None:
        try:
            raw = (part_dir(checkpoint_dir) / GATE_FILE).read_bytes()
            report = CheckpointReport.model_validate_json(raw)
        except FileNotFoundError:
            return None
        except (OSError, ValidationError, json.JSONDecodeError) as exc:
            raise ConfigError(f"unreadable gate report under {checkpoint_dir}: {exc}") from exc
        return report if report.checkpoint_id == checkpoint_id else None


GATE_REPORTS = GateReportFile()


class GateReportBeside(GateReportFile):
    """:class:`GateReportFile` beside the part under ``part_at``, whatever dir Gym commits into
    (a checkpoint gated under a fresh id commits its Gym files into a sub-folder)."""

    def __init__(self, part_at: str) -> None:
        self.part_at = part_at

    def write(self, checkpoint_dir: str, report: CheckpointReport) -> None:
        super().write(self.part_at, report)

    def read(self, checkpoint_dir: str, checkpoint_id: str) -> CheckpointReport | None:
        return super().read(self.part_at, checkpoint_id)


def gate_committed(
    checkpoint_dir: str | os.PathLike[str], part: CheckpointPart
) -> CheckpointReport | None:
    """The report of ``part``'s checkpoint when it committed on every endpoint: its
    ``report.json``, else the gate's report kept before its resumes (``gate.json``; the
    checkpoint's id on Gym); None when neither is there (or readable)."""
    report = committed_report(checkpoint_dir, part.checkpoint_id)
    if report is not None:
        return report
    try:
        kept = GATE_REPORTS.read(str(checkpoint_dir), part.gym_checkpoint_id)
    except ConfigError:
        return None
    if kept is None:
        return None
    return kept.model_copy(
        update={"checkpoint_id": part.checkpoint_id, "checkpoint_dir": str(checkpoint_dir)}
    )


def same_dir(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two checkpoint dirs name the same directory (symlinks and ``..`` resolved)."""
    return os.path.realpath(a) == os.path.realpath(b)


def latest_checkpoint_dir(
    root: str | os.PathLike[str], *, run_id: str | None = None
) -> Path | None:
    """The directory to restore from: the newest checkpoint dir under ``root`` (``root`` itself,
    its sub-directories, or theirs: ``root/global_step_N/`` or ``root/global_step_N/gym/``)
    that holds a complete, valid part of this layer (``part.json`` present and readable, its
    ``sealed.u64`` matching its digest), newest by the time the part was first written; with
    ``run_id``, only that run's parts. A torn part (killed while it was first written) is
    skipped. None when there is none. Pass it as ``Orchestrator(..., restore_from=...)``.

    Every checkpoint dir whose part was written is a valid restore source, also one whose
    checkpoint then failed (``CheckpointFailed.restore_from``): the part holds every result Gym
    released for it. Write the trainer's own state for the step first, then call
    ``checkpoint()`` into a dir under the same root: the newest part then never names work the
    trainer's newest state has not seen."""
    base = Path(root)
    candidates: list[Path] = []
    if not base.is_dir():
        return None
    levels = [base]
    for _ in range(3):  # root, its children, its grandchildren
        nxt: list[Path] = []
        for d in levels:
            if (d / PART_DIR / PART_FILE).is_file():
                candidates.append(d)
            try:
                nxt.extend(sorted(c for c in d.iterdir() if c.is_dir() and c.name != PART_DIR))
            except OSError:
                continue
        levels = nxt
    found: list[tuple[float, str, Path]] = []
    for d in candidates:
        try:
            part = CheckpointPart.model_validate_json((part_dir(d) / PART_FILE).read_bytes())
        except (OSError, ValidationError, json.JSONDecodeError):
            continue
        if part.schema_version == SCHEMA and (run_id is None or part.run_id == run_id):
            found.append((part.created_ts, str(d), d))
    for _, _, d in sorted(found, reverse=True):
        try:
            read_part(d)  # the digest of its sealed-id record, and the record itself
        except ConfigError:
            continue
        return d
    return None


def v2_scopes(report: CheckpointReport) -> list[V2EndpointScope]:
    """What a committed checkpoint left on this run's behalf on each v2 server for a restore:
    the attempts of this run exported and those this run had in flight there that were not
    (from each commit answer). A real Gym exports every live session on its server, another
    run's too (NeMo Gym's agent ``export``): only what this run had in flight there (the
    commit's scope, ``in_flight``) is recorded, so a restore never retires or installs another
    run's episodes."""
    scopes = []
    for entry in report.endpoints:
        if entry.protocol != "v2":
            continue
        extra = entry.commit.model_extra or {}
        in_flight = extra.get("in_flight") or []
        exported = sorted(set(extra.get("episode_ids") or []) & set(in_flight))
        scopes.append(
            V2EndpointScope(
                endpoint=entry.endpoint,
                label=entry.label,
                checkpoint_dir=entry.checkpoint_dir,
                exported=exported,
                start_over=sorted(set(in_flight) - set(exported)),
            )
        )
    return scopes


def add_gym_v2(checkpoint_dir: str | os.PathLike[str], scopes: list[V2EndpointScope]) -> None:
    """Write ``scopes`` into the part under ``checkpoint_dir`` (rewritten durably)."""
    directory = part_dir(checkpoint_dir)
    _rewrite(directory, _read_to_add(directory).model_copy(update={"gym_v2": list(scopes)}))


def read_part(
    checkpoint_dir: str | os.PathLike[str], retention: int = DEFAULT_RETENTION
) -> tuple[CheckpointPart, SealedIds]:
    """The part a checkpoint wrote under ``checkpoint_dir``, and its sealed-id record."""
    directory = part_dir(checkpoint_dir)
    try:
        raw = (directory / PART_FILE).read_bytes()
    except OSError as exc:
        raise ConfigError(f"no checkpoint part under {directory}: {exc}") from exc
    try:
        part = CheckpointPart.model_validate_json(raw)
    except (ValidationError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{directory / PART_FILE} is not a checkpoint part: {exc}") from exc
    if part.schema_version != SCHEMA:
        raise ConfigError(f"{directory / PART_FILE}: unknown schema {part.schema_version}")
    try:
        data = (directory / part.sealed.name).read_bytes()
    except OSError as exc:
        raise ConfigError(f"checkpoint part under {directory}: {exc}") from exc
    if hashlib.sha256(data).hexdigest() != part.sealed.sha256:
        raise ConfigError(f"{directory / part.sealed.name} does not match {PART_FILE}")
    try:
        sealed = SealedIds.from_bytes(data, retention)
    except ValueError as exc:
        raise ConfigError(f"{directory / part.sealed.name}: {exc}") from exc
    return part, sealed


def restore_run(
    restore_from: str | os.PathLike[str] | None, run_id: str | None, retention: int
) -> tuple[str | None, CheckpointPart | None, SealedIds]:
    """The run id to use, the part to load (None without ``restore_from``) and the sealed-id
    record. A ``run_id`` given beside ``restore_from`` must be the part's."""
    if restore_from is None:
        try:
            return run_id, None, SealedIds(retention)
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
    part, sealed = read_part(restore_from, retention)
    if run_id is not None and run_id != part.run_id:
        raise ConfigError(f"run_id {run_id!r} differs from {part.run_id!r} of the part restored")
    return part.run_id, part, sealed


def load_part(memory: RolloutMemory, part: CheckpointPart | None, sealed: SealedIds) -> None:
    """Give ``memory`` the sealed-id record and the part's results: handed ones answer a row
    sent again as ``repeated``, undelivered ones are the next row's result (no agent run)."""
    memory.sealed = sealed
    if part is not None:
        for outcome in part.handed:
            memory.restore(outcome, delivered=True)
        for outcome in part.undelivered:
            memory.restore(outcome, delivered=False)


async def write_memory_part(
    memory: RolloutMemory,
    checkpoint_id: str,
    checkpoint_dir: str | os.PathLike[str],
    run_id: str,
    keep_results: bool,
    kept: Set[str] = frozenset(),
    gym_id: str | None = None,
) -> CheckpointPart:
    """Check the id and dir, then write ``memory``'s part (the files in a thread). ``kept``:
    handed rollouts the trainer keeps untrained (``checkpoint(keep=...)``): into
    ``undelivered``, in full, since the trainer's state at this checkpoint has not seen them
    (restored, the row gets the result as new, not ``repeated``). ``gym_id``: see
    :func:`write_part`."""
    checkpoint_id_arg(checkpoint_id)
    if not isinstance(checkpoint_dir, (str, os.PathLike)) or not str(checkpoint_dir):
        raise ConfigError("checkpoint_dir must be a non-empty path")
    handed, undelivered = memory.results()
    if kept:
        undelivered = [*undelivered, *(o for o in handed if o.rollout_id in kept)]
        handed = [o for o in handed if o.rollout_id not in kept]
    sealed = memory.sealed if memory.sealed is not None else SealedIds()
    sealed.seal_generation()  # on the caller's loop: the thread only reads it
    return await asyncio.to_thread(
        write_part,
        checkpoint_dir,
        run_id=run_id,
        checkpoint_id=checkpoint_id,
        handed=handed,
        undelivered=undelivered,
        sealed=sealed,
        keep_results=keep_results,
        gym_id=gym_id,
    )


RESTORE_S = 60.0  # a v2 restore's own deadline
RESTORE_SLACK_S = 30.0  # the ledger's answer may come this much later


async def restore_gym_v2(
    ledger: LedgerClient,
    memory: RolloutMemory,
    placed: dict[str, int],
    endpoints: list[str],
    part: CheckpointPart,
    claims: list[str],
) -> RestoreReport:
    """The ledger restores the part's v2 episodes (``actors/v2_restore.py``); then each rollout's
    next row runs the attempt the report names, a restored one on the endpoint that holds it
    (``placed``: rollout id -> index in ``endpoints``, the endpoints' URLs)."""
    report = await ledger.restore_v2(
        f"{restore_prefix(part.run_id)}{uuid.uuid4().hex[:16]}",
        part.gym_checkpoint_id,
        part.gym_v2,
        RESTORE_S,
        claims,
        timeout_s=RESTORE_S + RESTORE_SLACK_S,
    )
    for rid, attempt in report.next_attempts.items():
        memory.restart_at(rid, attempt)
    for rid, url in report.placed.items():
        if url in endpoints:
            placed[rid] = endpoints.index(url)
    return report


NEWER_PARTS = 16  # parts beside the restored one read at most (newest first)


def run_dirs(restore_from: str | os.PathLike[str]) -> list[Path]:
    """The checkpoint dirs beside ``restore_from`` where the same run's other parts are: its
    parent's sub-folders (``root/step-N``), and, for a dir one level below its step's
    (``root/global_step_N/gym``), the same name in its parent's siblings
    (``root/global_step_M/gym``). ``restore_from`` itself included; a dir that cannot be read
    is skipped."""
    here = Path(restore_from).resolve()
    out: dict[Path, None] = {}
    try:
        out.update((c, None) for c in here.parent.iterdir() if c.is_dir())
    except OSError:
        pass
    try:
        cousins = [s / here.name for s in here.parent.parent.iterdir() if s.is_dir()]
        out.update((c, None) for c in cousins if c.is_dir())
    except OSError:
        pass
    return list(out)


def own_open_ids(
    restore_from: str | os.PathLike[str], run_id: str, checkpoint_id: str
) -> list[str]:
    """The checkpoint ids of run ``run_id`` that a dead trainer may have left open: the restored
    part's (``checkpoint_id``, under ``restore_from``), and those of the parts of the same run
    beside it (:func:`run_dirs`) written since (a trainer that restores from its last
    committed checkpoint, not from the one it was killed in). Unreadable parts are skipped."""
    ids = [checkpoint_id]
    here = part_dir(restore_from) / PART_FILE
    try:
        since = here.stat().st_mtime
        siblings = [
            p
            for child in run_dirs(restore_from)
            if (p := part_dir(child) / PART_FILE).is_file() and p.stat().st_mtime >= since
        ]
        siblings.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return ids
    for path in siblings[:NEWER_PARTS]:
        try:
            part = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        if not isinstance(part, dict) or part.get("run_id") != run_id:
            continue
        for key in ("checkpoint_id", "gym_id"):  # gym_id: the id Gym knows it by
            cid = part.get(key)
            if isinstance(cid, str) and cid not in ids:
                ids.append(cid)
    return ids
