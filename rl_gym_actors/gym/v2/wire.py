"""Wire models of NeMo Gym's v2 checkpoint protocol (docs/PROTOCOL.md, the v2 chapter).

One route set per participant under ``/ng-control/v1/checkpoint`` (``GET /status``; ``POST
/prepare``, ``/renew``, ``/retire``, ``/forget``, ``/commit``, ``/restore``, ``/resume``), every
route behind ``Authorization: Bearer <token>``. Episodes are named :class:`EpisodeId`
``(rollout_id, attempt)``; their capture key is the rollout id for attempt 0 and
``<rollout_id>-a<attempt>`` otherwise, which is why a rollout id may not end in ``-a<N>``.

Requests are strict (unknown fields refused, as Gym's are); answers are lenient (a participant adds
fields of its own kind, such as an agent's ``accepting``), so the client reads what it needs and
keeps the rest.
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from rl_gym_actors.protocol import (
    CHECKPOINT_ID_MAX,
    DEADLINE_TS_MAX,
    ID_PATTERN,
    ROLLOUT_ID_MAX,
    WIRE_INT_MAX,
)

ROUTE_PREFIX = "/ng-control/v1/checkpoint"
STATUS_PATH = ROUTE_PREFIX + "/status"
OPERATIONS = ("prepare", "renew", "retire", "forget", "commit", "restore", "resume")
RESTART_HEADER = "x-ng-checkpoint-restart"  # "1" on a seed reply: the episode is a restart
#: (ext) ``POST /run?replay_only=1``: answer the attempt's kept reply (``x-gym-replayed: 1``),
#: or 409 ``not_completed`` when it has none (running, or never started), or ``stale_attempt``
#: when it was retired; never start or join a run: a trainer adopts a lost reply, not reruns it.
REPLAY_ONLY_PARAM = "replay_only"
#: (ext) ``GET /ng-control/v1/checkpoint/kept?limit=N``: the kept replies' capture keys.
KEPT_ROUTE = "/kept"
MAX_KEPT_LISTED = 100_000
MAX_REPORTED_BLOCKERS = 100  # a prepare report lists at most this many; blocker_count is full
KINDS = ("environment", "model", "agent", "resources")  # also the order prepare runs in
ParticipantKind = Literal["environment", "model", "agent", "resources"]

# error codes (status in brackets); every error body is {"error": {"code", "detail"}}
CHECKPOINT_ERROR = "checkpoint_error"  # (409) the base code
STALE_CHECKPOINT = "stale_checkpoint"  # (409) the id was resumed already
CHECKPOINT_CONFLICT = "checkpoint_conflict"  # (409) another id is active, or another dir/scope
INVALID_PHASE = "invalid_phase"  # (409) not allowed in this phase
DEADLINE_PASSED = "deadline_exceeded"  # (409) the request's deadline_ts passed on the server
STALE_ATTEMPT = "stale_attempt"  # (409) the attempt was retired (until forget)
ADMISSION_CLOSED = "admission_closed"  # (409) a checkpoint is open: wait for resume
RESTART_IN_SCOPE = "restart_in_scope"  # (409) a commit scope names a restart episode
ROLLOUT_ID_REQUIRED = "rollout_id_required"  # (400) agent work without a rollout id
UNAUTHORIZED = "unauthorized"  # (401)
INVALID_CHECKPOINT_STATE = "invalid_checkpoint_state"  # (422) files missing, corrupt, foreign
ERROR_STATUS = {
    CHECKPOINT_ERROR: 409,
    STALE_CHECKPOINT: 409,
    CHECKPOINT_CONFLICT: 409,
    INVALID_PHASE: 409,
    DEADLINE_PASSED: 409,
    STALE_ATTEMPT: 409,
    ADMISSION_CLOSED: 409,
    RESTART_IN_SCOPE: 409,
    ROLLOUT_ID_REQUIRED: 400,
    UNAUTHORIZED: 401,
    INVALID_CHECKPOINT_STATE: 422,
}

_ATTEMPT_SUFFIX = re.compile(r"-a([1-9][0-9]*)$")


class Phase(StrEnum):
    IDLE = "idle"
    PREPARING = "preparing"
    PREPARED = "prepared"
    COMMITTED = "committed"
    RESTORED = "restored"


class EpisodeId(BaseModel):
    """One attempt of a rollout. Hashable; ``capture_key`` names it in reports and replies."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # the agent-checkpoint side's bounds: what a store holds (a signed 64-bit attempt)
    rollout_id: str = Field(min_length=1, max_length=ROLLOUT_ID_MAX, pattern=ID_PATTERN)
    attempt: int = Field(default=0, ge=0, le=WIRE_INT_MAX)

    @field_validator("attempt", mode="before")
    @classmethod
    def _no_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("attempt must be an integer, not a boolean")
        return value

    @field_validator("rollout_id")
    @classmethod
    def _no_attempt_suffix(cls, value: str) -> str:
        if _ATTEMPT_SUFFIX.search(value):
            raise ValueError("rollout_id must not end with the reserved attempt suffix '-a<N>'")
        return value

    @property
    def capture_key(self) -> str:
        return self.rollout_id if self.attempt == 0 else f"{self.rollout_id}-a{self.attempt}"

    @classmethod
    def from_capture_key(cls, key: str) -> EpisodeId:
        match = _ATTEMPT_SUFFIX.search(key)
        if match is None:
            return cls(rollout_id=key)
        digits = match.group(1)  # more than 19 digits: past 64 bits (and never int() of 5,000)
        attempt = int(digits) if len(digits) <= 19 else WIRE_INT_MAX + 1
        return cls(rollout_id=key[: match.start()], attempt=attempt)

    def next_attempt(self) -> EpisodeId:
        return EpisodeId(rollout_id=self.rollout_id, attempt=self.attempt + 1)

    def __str__(self) -> str:
        return self.capture_key


def is_valid_v2_rollout_id(value: object) -> bool:
    """Whether ``value`` can be an :class:`EpisodeId`'s rollout id."""
    return (
        isinstance(value, str)
        and bool(re.match(ID_PATTERN, value))
        and not _ATTEMPT_SUFFIX.search(value)
    )


def _deadline(value: Any) -> Any:
    # requests are parsed lax (strict=False): without this, true and "5" would be deadlines
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("deadline_ts must be a number (Unix seconds)")
    if not math.isfinite(value) or not 0 <= value <= DEADLINE_TS_MAX:
        raise ValueError(f"deadline_ts must be a finite Unix time in 0..{DEADLINE_TS_MAX:.0f}")
    return value


CheckpointIdField = Annotated[
    str, Field(min_length=1, max_length=CHECKPOINT_ID_MAX, pattern=ID_PATTERN)
]
Deadline = Annotated[float, BeforeValidator(_deadline)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CheckpointRequest(_Request):
    """prepare, renew, resume."""

    checkpoint_id: CheckpointIdField
    deadline_ts: Deadline


class CommitRequest(CheckpointRequest):
    checkpoint_dir: str = Field(min_length=1)
    episode_ids: list[EpisodeId] | None = None  # None: everything; else exactly these continue
    stop: bool = False


class RestoreRequest(CheckpointRequest):
    checkpoint_dir: str = Field(min_length=1)
    episode_ids: list[EpisodeId]  # the checkpointed attempts to continue (may be empty)

    @field_validator("episode_ids")
    @classmethod
    def _has_next_attempt(cls, value: list[EpisodeId]) -> list[EpisodeId]:
        if any(e.attempt >= WIRE_INT_MAX for e in value):  # each continues as its next attempt
            raise ValueError(f"an episode to restore has no next attempt past {WIRE_INT_MAX}")
        return value


class RetireRequest(CheckpointRequest):
    episode_ids: list[EpisodeId] = Field(min_length=1)


class ForgetRequest(CheckpointRequest):
    rollout_ids: list[str] = Field(min_length=1)


REQUEST_MODELS: dict[str, type[CheckpointRequest]] = {
    "prepare": CheckpointRequest,
    "renew": CheckpointRequest,
    "retire": RetireRequest,
    "forget": ForgetRequest,
    "commit": CommitRequest,
    "restore": RestoreRequest,
    "resume": CheckpointRequest,
}


class _Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


class PrepareReport(_Answer):
    """Whether a participant can be cut now. ``blockers`` lists at most 100 capture keys;
    ``blocker_count`` is the full count. ``restarts`` (never capped) are in-flight episodes the
    participant cannot capture: they never block and must be left out of a commit's scope."""

    ready: bool
    blockers: list[str] = Field(default_factory=list)
    blocker_count: int = 0
    counts: dict[str, int] = Field(default_factory=dict)
    restarts: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _cap(cls, data: Any) -> Any:
        if isinstance(data, dict) and "blocker_count" not in data:
            blockers = list(data.get("blockers") or [])
            return {
                **data,
                "blockers": blockers[:MAX_REPORTED_BLOCKERS],
                "blocker_count": len(blockers),
            }
        return data


class StatusAnswer(_Answer):
    kind: str
    instance: str
    phase: Phase
    checkpoint_id: str | None = None
    lease_expires_at: float | None = None
    retired_rollouts: int = 0
    report: PrepareReport


class PrepareAnswer(_Answer):
    phase: Phase
    report: PrepareReport

    @property
    def prepared(self) -> bool:
        return self.phase is Phase.PREPARED


class RenewAnswer(_Answer):
    lease_expires_at: float


class RetireAnswer(_Answer):
    retired: list[str]


class ForgetAnswer(_Answer):
    forgotten: list[str]


class Manifest(_Answer):
    """A participant's manifest: ``<dir>/gym/<kind>/<instance>/manifest.json``."""

    schema_version: int
    kind: str
    instance: str
    checkpoint_id: str
    records_file: str
    records_sha256: str
    record_count: int


class CommitAnswer(_Answer):
    phase: Phase
    manifest: Manifest
    episode_ids: list[str]  # sorted capture keys of the exported records


class RestoreAnswer(_Answer):
    phase: Phase
    source_checkpoint_id: str
    restored: list[str]  # sorted capture keys of the next attempts


class ResumeAnswer(_Answer):
    phase: Phase
    idempotent: bool


class KeptAnswer(_Answer):
    """(ext) ``GET /kept`` on our server: the capture keys of the kept replies (sorted, at most
    ``limit``) and their full ``count``."""

    kept: list[str]
    count: int


ANSWER_MODELS: dict[str, type[_Answer]] = {
    "status": StatusAnswer,
    "prepare": PrepareAnswer,
    "renew": RenewAnswer,
    "retire": RetireAnswer,
    "forget": ForgetAnswer,
    "commit": CommitAnswer,
    "restore": RestoreAnswer,
    "resume": ResumeAnswer,
}


def error_body(code: str, detail: str) -> dict[str, Any]:
    return {"error": {"code": code, "detail": detail}}
