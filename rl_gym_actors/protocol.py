"""Wire models of the Gym checkpoint participant protocol (docs/PROTOCOL.md) and the canonical
digest.

Requests are strict (unknown fields refused); answers are lenient (unknown fields kept), so the
client copes with a real Gym server that adds fields, and our server answers with these same
models. Every integer on the wire is bounded to what a signed 64-bit store column holds
(:data:`WIRE_INT_MAX`). Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from enum import Enum
from typing import Annotated, Any, Literal, TypeGuard

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

CONTROL_PREFIX = "/ng-control/v1/agent-checkpoint"
CAPABILITIES_PATH = "/ng-control/v1/capabilities"
REPLAYED_HEADER = "x-gym-replayed"
RECEIPT_HEADER = "x-gym-completion-receipt"  # (ext) the receipt beside a /run answer
ROLLOUT_ID_FIELD = "_ng_rollout_id"
ATTEMPT_INDEX_FIELD = "_ng_attempt_index"

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_ID_RE = re.compile(ID_PATTERN)
ROLLOUT_ID_MAX = 256
CHECKPOINT_ID_MAX = 128

RolloutId = Annotated[
    str, StringConstraints(pattern=ID_PATTERN, min_length=1, max_length=ROLLOUT_ID_MAX)
]
CheckpointId = Annotated[
    str, StringConstraints(pattern=ID_PATTERN, min_length=1, max_length=CHECKPOINT_ID_MAX)
]
WIRE_INT_MAX = 2**63 - 1  # what SQLite's INTEGER (a signed 64-bit int) holds
AttemptIndex = Annotated[int, Field(ge=0, le=WIRE_INT_MAX)]
Generation = Annotated[int, Field(ge=1, le=WIRE_INT_MAX)]
Count = Annotated[int, Field(ge=0, le=WIRE_INT_MAX)]
#: the latest ``deadline_ts`` a request may carry (2100-01-01T00:00:00Z): a deadline is a point in
#: time, and one past this is a mistake (or 1e308, a lease that never lapses), refused with 422
DEADLINE_TS_MAX = 4_102_444_800.0
DeadlineTs = Annotated[float, Field(ge=0, le=DEADLINE_TS_MAX, allow_inf_nan=False)]
Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
ExecutionKey = tuple[str, int]  # (rollout_id, attempt_index): one execution on a Gym server


MAX_JSON_DEPTH = 64  # nesting of a body or row: deeper is refused (422 / ConfigError)


def is_valid_rollout_id(value: object) -> TypeGuard[str]:
    # fullmatch: Python's ``$`` also matches before a final newline ("x\n" is not an id)
    return (
        isinstance(value, str)
        and 0 < len(value) <= ROLLOUT_ID_MAX
        and _ID_RE.fullmatch(value) is not None
    )


def is_valid_checkpoint_id(value: object) -> TypeGuard[str]:
    return (
        isinstance(value, str)
        and 0 < len(value) <= CHECKPOINT_ID_MAX
        and _ID_RE.fullmatch(value) is not None
    )


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def json_depth(text: str | bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (0 for a scalar, 1 for ``{}``);
    strings are skipped. Linear, no recursion: safe on any input, well formed or not."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    depth = deepest = 0
    for char in brackets:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def too_deep(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether a JSON text nests deeper than ``limit`` (a cheap count first)."""
    if isinstance(text, bytes):
        opened = text.count(b"[") + text.count(b"{")
    else:
        opened = text.count("[") + text.count("{")
    return opened > limit and json_depth(text) > limit


def is_valid_attempt_index(value: object) -> TypeGuard[int]:
    """An int (not a bool) in ``0 .. WIRE_INT_MAX``."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= WIRE_INT_MAX


# ---------------------------------------------------------------- digest and identity


def canonical_json(obj: Any) -> bytes:
    """Keys sorted, separators ``,`` and ``:`` with no spaces, non-ASCII escaped."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def result_digest(reply: Any) -> str:
    """SHA-256 (lowercase hex) of the reply's canonical JSON."""
    return hashlib.sha256(canonical_json(reply)).hexdigest()


def result_identity(reply: Any, digest: str | None = None) -> str:
    """``reply["id"]``, else ``reply["response"]["id"]``, else the digest."""
    if isinstance(reply, dict):
        rid = reply.get("id")
        if isinstance(rid, str) and rid:
            return rid
        resp = reply.get("response")
        inner = resp.get("id") if isinstance(resp, dict) else None
        if isinstance(inner, str) and inner:
            return inner
    return digest or result_digest(reply)


# ---------------------------------------------------------------- models


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class ExecutionState(str, Enum):
    RUNNING = "running"
    PARKED = "parked"
    COMPLETED = "completed"  # finished, reply stored, not ACKed
    ACKNOWLEDGED = "acknowledged"
    TOMBSTONED = "tombstoned"


class CompletionReceipt(BaseModel):
    """What proves one execution's result. Byte-identical across replays.

    The model-lineage pair ``manifest_capture_key`` / ``terminal_model_call_id`` (NeMo RL's
    checkpoint work) is optional: both or neither. Absent fields are left out of the JSON.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_id: RolloutId
    attempt_index: AttemptIndex
    execution_generation: Generation
    result_identity: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    result_digest: Digest
    manifest_capture_key: (
        Annotated[
            str, StringConstraints(pattern=ID_PATTERN, min_length=1, max_length=ROLLOUT_ID_MAX + 24)
        ]
        | None
    ) = None
    terminal_model_call_id: (
        Annotated[str, StringConstraints(min_length=1, max_length=1024)] | None
    ) = None

    @model_validator(mode="after")
    def _lineage_pair(self) -> CompletionReceipt:
        if (self.manifest_capture_key is None) != (self.terminal_model_call_id is None):
            raise ValueError(
                "manifest_capture_key and terminal_model_call_id come together or not at all"
            )
        return self

    @property
    def key(self) -> tuple[str, int]:
        return (self.rollout_id, self.attempt_index)

    def wire(self) -> dict[str, Any]:
        """The receipt as JSON data, absent lineage fields left out."""
        return self.model_dump(mode="json", exclude_none=True)

    def canonical(self) -> bytes:
        """The receipt's canonical JSON (what a server keeps and compares)."""
        return canonical_json(self.wire())

    @classmethod
    def for_reply(
        cls,
        rollout_id: str,
        attempt_index: int,
        generation: int,
        reply: Any,
        lineage: ModelLineage | None = None,
    ) -> CompletionReceipt:
        digest = result_digest(reply)
        extra = (
            {}
            if lineage is None
            else {
                "manifest_capture_key": lineage.manifest_capture_key,
                "terminal_model_call_id": lineage.terminal_model_call_id,
            }
        )
        return cls(
            rollout_id=rollout_id,
            attempt_index=attempt_index,
            execution_generation=generation,
            result_identity=result_identity(reply, digest),
            result_digest=digest,
            **extra,
        )


class ModelLineage(BaseModel):
    """Where a result's model calls are recorded (NeMo RL's checkpoint work): the capture key
    (the rollout id for attempt 0, ``<id>-a<k>`` for attempt k) and the last model call's id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    manifest_capture_key: Annotated[str, StringConstraints(pattern=ID_PATTERN, min_length=1)]
    terminal_model_call_id: Annotated[str, StringConstraints(min_length=1, max_length=1024)]


def capture_key(rollout_id: str, attempt_index: int) -> str:
    """NeMo Gym's attempt-qualified capture key of an execution."""
    return rollout_id if attempt_index == 0 else f"{rollout_id}-a{attempt_index}"


class PhaseRequest(_Strict):
    """Body of prepare and resume (and, with more fields, of retire and commit). Carries
    ``schema_version`` 1, as a real Gym's and NeMo RL's checkpoint requests do."""

    schema_version: Literal[1] = 1
    checkpoint_id: CheckpointId
    deadline_ts: DeadlineTs


class RetireRequest(PhaseRequest):
    rollout_id: RolloutId
    attempt_index: AttemptIndex


class RetireKey(_Strict):
    rollout_id: RolloutId
    attempt_index: AttemptIndex


MAX_RETIRE_BATCH = 10_000  # keys per (ext) retire-batch request


class RetireBatchRequest(PhaseRequest):
    """(ext) Body of ``retire-batch``: many keys, each retired as ``retire`` would."""

    executions: Annotated[list[RetireKey], Field(min_length=1, max_length=MAX_RETIRE_BATCH)]

    @model_validator(mode="after")
    def _unique_keys(self) -> RetireBatchRequest:
        keys = {(k.rollout_id, k.attempt_index) for k in self.executions}
        if len(keys) != len(self.executions):
            raise ValueError("executions: keys must be unique")
        return self


class CommitRequest(PhaseRequest):
    checkpoint_dir: Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class AckBatchRequest(_Strict):
    schema_version: Count = 1
    executions: Annotated[list[CompletionReceipt], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique_keys(self) -> AckBatchRequest:
        keys = [r.key for r in self.executions]
        if len(set(keys)) != len(keys):
            raise ValueError("executions: keys must be unique")
        if self.schema_version != 1:
            raise ValueError("schema_version: only 1 is supported")
        return self


class AckAnswer(_Lenient):
    acknowledged: bool
    idempotent: bool


class AckBatchAnswer(_Lenient):
    acknowledged: list[CompletionReceipt]


class RetireAnswer(_Lenient):
    retired: bool
    tombstoned: bool
    completed_unacknowledged: bool = False
    acknowledged: bool | None = None  # (ext) true when the key was already released


class RetireKeyAnswer(RetireAnswer):
    """(ext) One key's answer in a ``retire-batch`` answer: ``retire``'s answer and its key."""

    rollout_id: str
    attempt_index: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.rollout_id, self.attempt_index)


class RetireBatchAnswer(_Lenient):
    """(ext) ``retire-batch``'s answer: one per key sent, in the order sent."""

    retired: list[RetireKeyAnswer]


class AttemptInfo(_Lenient):
    rollout_id: str
    attempt_index: int
    state: str  # a real Gym also says "park_requested"
    completion_receipt: CompletionReceipt | None = None
    generation: int | None = None
    # a real Gym sends it for every attempt (null unless parked); nothing of ours parks
    parked_boundary_state: str | None = None
    age_seconds: float | None = None  # since the run began (or since this server knew the key)

    @property
    def key(self) -> tuple[str, int]:
        return (self.rollout_id, self.attempt_index)


class ExpiredCheckpoint(_Lenient):
    """(ext) The last checkpoint id that its lease aborted."""

    checkpoint_id: str
    phase: str  # the phase it was left in
    lease_until: float
    expired_at: float


class LeaseInfo(_Lenient):
    """(ext) The checkpoint lease of a server that has one."""

    lease_s: float
    lease_until: float | None = None  # when the active checkpoint id lapses
    last_expired: ExpiredCheckpoint | None = None


class StatusReport(_Lenient):
    state: str = "accepting"  # "accepting" or "preparing"
    ready_to_commit: bool = False
    running: int = 0
    parked: int = 0
    parked_with_boundary: int = 0
    parked_without_boundary: int = 0
    completed_unacknowledged: int = 0
    acknowledged_completed: int = 0
    active: int = 0
    blocking_attempts: list[AttemptInfo] = Field(default_factory=list)
    completed_unacknowledged_attempts: list[AttemptInfo] = Field(default_factory=list)
    # executions parked at a boundary that a commit would keep: none here (nothing parks)
    selected_boundaries: list[dict[str, Any]] = Field(default_factory=list)
    executions: list[AttemptInfo] = Field(default_factory=list)
    # the three below travel only on the (ext) lease route; status and prepare leave them off
    phase: str | None = None  # (ext) the fence's phase
    checkpoint_id: str | None = None  # (ext) the active checkpoint id
    checkpoint_lease: LeaseInfo | None = None  # (ext)

    def summary(self) -> str:
        return (
            f"ready_to_commit={self.ready_to_commit} running={self.running} "
            f"parked={self.parked} completed_unacknowledged={self.completed_unacknowledged}"
        )


CONTINUATION_INDEX_FEATURE = "agent_continuation_index_v1"  # real Gym's and NeMo RL's name


class ArtifactReference(_Lenient):
    """A checkpoint file as NeMo RL's checkpoint client (PR #4093) references one: its path
    relative to the commit's ``checkpoint_dir``, digest, row count and size."""

    schema_version: int = 1
    relative_path: str
    sha256: str
    records: int
    bytes: int


class CommitAnswer(_Lenient):
    records: int
    manifest_digest: str
    # the participant's continuation roots (none here: nothing parks at a boundary)
    continuation_index: ArtifactReference | None = None


class RestoreAnswer(_Lenient):
    """``POST .../restore``: what the checkpoint held (its files checked)."""

    records: int
    source_checkpoint_id: str
    continuation_index: ArtifactReference


class ResumeAnswer(_Lenient):
    state: str
    released: int = 0


class ReceiptAnswer(_Lenient):
    state: str  # "completed" or "acknowledged"
    # None only for an ACKed key whose receipt a server without a state dir no longer keeps
    completion_receipt: CompletionReceipt | None = None


class ErrorDetail(_Lenient):
    code: str
    detail: str = ""
    active_checkpoint_id: str | None = None  # (ext) on checkpoint_conflict: the id in the way
    phase: str | None = None  # (ext) on checkpoint_conflict: its phase


class ErrorBody(_Lenient):
    error: ErrorDetail
    report: StatusReport | None = None  # (ext) on a prepare 409


class MultiProcess(_Lenient):
    mode: str = "single_worker"  # "single_worker", "coordinator" or "unmanaged"
    num_workers: int = 1


class Capabilities(_Lenient):
    """``GET /ng-control/v1/capabilities``, in the shape NeMo RL's checkpoint client validates
    strictly (so a server sends these fields and no others). ``features`` lists what the server
    supports beyond the base contract; our client needs only ``features`` and ``phase``."""

    component: str = "responses_api_agents"
    name: str = "rl_gym_actors"
    schema_version: int = 1
    admission_states: list[str] = Field(default_factory=lambda: ["accepting", "paused"])
    checkpoint_mode: str = "export_restore"
    concurrency_contract: str = "transactional_parallel"
    multi_process: MultiProcess = Field(default_factory=MultiProcess)
    instance_role: str | None = None
    phase: str = "idle"
    active_checkpoint_id: str | None = None
    deadline_ts: float | None = None
    features: list[str] = Field(default_factory=list)


class LeaseAnswer(_Lenient):
    """(ext) ``GET /ng-control/v1/lease`` on our server: the fence, and the server's memory:
    ``instance_id`` (a uuid per process start) and ``store_epoch`` (a uuid written once into a
    fresh state dir; without one, the instance id). A real Gym has no such route."""

    phase: str | None = None
    checkpoint_id: str | None = None
    instance_id: str | None = None
    store_epoch: str | None = None


def prepare_incomplete_detail(report: StatusReport) -> str:
    return (
        f"agent prepare is incomplete: running={report.running}, "
        f"parked_without_boundary={report.parked_without_boundary}, "
        f"completed_unacknowledged={report.completed_unacknowledged}"
    )
