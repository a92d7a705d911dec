"""The answers of the drop-in's v2 checkpoint calls (:mod:`.v2_checkpoint_calls`): NeMo RL's
own types when NeMo RL is installed (``nemo_rl.environments.gym_checkpoint_adapter``; its
coordinator checks ``isinstance``), else twins with the same fields, and the admission refusal
``run_rollouts`` yields (``nemo_rl.experience.failures.GymAdmissionClosed(message, row_idx)``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ADAPTER_MODULE = "nemo_rl.environments.gym_checkpoint_adapter"
FAILURES_MODULE = "nemo_rl.experience.failures"
DEFAULT_SHARD = "nemo_gym"  # NeMo RL's shard name of an unsharded job


@dataclass(frozen=True)
class GymCheckpointEpisode:
    rollout_id: str
    attempt: int

    def next_attempt(self) -> GymCheckpointEpisode:
        return GymCheckpointEpisode(self.rollout_id, self.attempt + 1)


@dataclass(frozen=True)
class GymCheckpointParticipantSummary:
    instance_id: str
    members: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class GymCheckpointPrepareSummary:
    prepared: bool
    blockers: dict[str, tuple[str, ...]]


@dataclass(frozen=True)
class GymCheckpointParticipantManifest:
    schema_version: int
    kind: str
    instance: str
    checkpoint_id: str
    records_file: str
    records_sha256: str
    record_count: int


@dataclass(frozen=True)
class GymCheckpointParticipantCommitSummary:
    server_name: str
    kind: str
    phase: str
    capture_keys: tuple[str, ...]
    manifest: GymCheckpointParticipantManifest
    staging_keys: tuple[str, ...]


@dataclass(frozen=True)
class GymCheckpointCommitSummary:
    exported_episodes: tuple[GymCheckpointEpisode, ...]
    staging_keys: tuple[str, ...]
    participants: tuple[GymCheckpointParticipantCommitSummary, ...]
    staging_keys_by_episode: Mapping[GymCheckpointEpisode, tuple[str, ...]] = field(
        default_factory=dict
    )
    unowned_live_episodes: tuple[GymCheckpointEpisode, ...] = ()


class GymAdmissionClosed(Exception):
    """A row Gym refused while a checkpoint had admission closed (yielded, not raised)."""

    def __init__(self, message: str, row_idx: int) -> None:
        super().__init__(message, row_idx)
        self.row_idx = row_idx


def _theirs(module: str, name: str, ours: Any) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return ours


def types() -> dict[str, Any]:
    """NeMo RL's answer types when installed, else ours (same fields)."""
    return {
        cls.__name__: _theirs(ADAPTER_MODULE, cls.__name__, cls)
        for cls in (
            GymCheckpointEpisode,
            GymCheckpointParticipantSummary,
            GymCheckpointPrepareSummary,
            GymCheckpointParticipantManifest,
            GymCheckpointParticipantCommitSummary,
            GymCheckpointCommitSummary,
        )
    }


def instance_id(instance: Any) -> str:
    """``<shard>/replica-<i>`` of NeMo RL's ``checkpoint_instance`` (an object or a mapping),
    ``nemo_gym/replica-0`` without one."""
    if instance is None:
        return f"{DEFAULT_SHARD}/replica-0"
    if isinstance(instance, Mapping):
        return f"{instance['shard_name']}/replica-{int(instance['replica_index'])}"
    return str(instance.instance_id)


def participant_summary(instance: str, members: tuple[tuple[str, str], ...]) -> Any:
    return types()["GymCheckpointParticipantSummary"](instance_id=instance, members=members)


def prepare_summary(prepared: bool, blockers: dict[str, tuple[str, ...]]) -> Any:
    return types()["GymCheckpointPrepareSummary"](prepared=prepared, blockers=blockers)


def participant_commit(
    server: str, kind: str, keys: tuple[str, ...], manifest: Mapping[str, Any]
) -> Any:
    t = types()
    fields = GymCheckpointParticipantManifest.__dataclass_fields__
    return t["GymCheckpointParticipantCommitSummary"](
        server_name=server,
        kind=kind,
        phase="committed",
        capture_keys=keys,
        manifest=t["GymCheckpointParticipantManifest"](
            **{k: v for k, v in manifest.items() if k in fields}
        ),
        staging_keys=(),
    )


def _episode(key: str) -> Any:
    from rl_gym_actors.gym.v2.wire import EpisodeId

    e = EpisodeId.from_capture_key(key)
    return types()["GymCheckpointEpisode"](e.rollout_id, e.attempt)


def commit_summary(
    *, exported: Sequence[str], participants: Sequence[Any], unowned: Sequence[str]
) -> Any:
    return types()["GymCheckpointCommitSummary"](
        exported_episodes=tuple(_episode(k) for k in exported),
        staging_keys=(),
        participants=tuple(participants),
        staging_keys_by_episode={},
        unowned_live_episodes=tuple(_episode(k) for k in unowned),
    )


def admission_closed(message: str, row_idx: int) -> Exception:
    """The refusal ``run_rollouts`` yields for a row Gym refused with 409 ``admission_closed``:
    NeMo RL's ``GymAdmissionClosed(message, row_idx)`` when installed, else ours."""
    return _theirs(FAILURES_MODULE, "GymAdmissionClosed", GymAdmissionClosed)(message, row_idx)
