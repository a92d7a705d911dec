"""Wire models of the Gym checkpoint participant protocol (see PROTOCOL.md) and the canonical digest.

Requests are strict (unknown fields refused); answers are lenient (unknown fields kept), so the
client copes with a real Gym server that adds fields. Nothing here does I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

CONTROL_PREFIX = "/ng-control/v1/agent-checkpoint"
CAPABILITIES_PATH = "/ng-control/v1/capabilities"
REPLAYED_HEADER = "x-gym-replayed"
RECEIPT_HEADER = "x-gym-completion-receipt"      # (ext) the receipt beside a /run answer
ROLLOUT_ID_FIELD = "_ng_rollout_id"
ATTEMPT_INDEX_FIELD = "_ng_attempt_index"

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
_ID_RE = re.compile(ID_PATTERN)
ROLLOUT_ID_MAX = 256
CHECKPOINT_ID_MAX = 128

RolloutId = Annotated[str, StringConstraints(pattern=ID_PATTERN, min_length=1,
                                             max_length=ROLLOUT_ID_MAX)]
CheckpointId = Annotated[str, StringConstraints(pattern=ID_PATTERN, min_length=1,
                                                max_length=CHECKPOINT_ID_MAX)]
AttemptIndex = Annotated[int, Field(ge=0)]
Digest = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
ExecutionKey = tuple[str, int]     # (rollout_id, attempt_index): one execution on a Gym server


def is_valid_rollout_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= ROLLOUT_ID_MAX and bool(_ID_RE.match(value))


def is_valid_checkpoint_id(value: object) -> bool:
    return (isinstance(value, str) and 0 < len(value) <= CHECKPOINT_ID_MAX
            and bool(_ID_RE.match(value)))


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
        if isinstance(resp, dict) and isinstance(resp.get("id"), str) and resp["id"]:
            return resp["id"]
    return digest or result_digest(reply)


# ---------------------------------------------------------------- models

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class ExecutionState(str, Enum):
    RUNNING = "running"
    PARKED = "parked"
    COMPLETED = "completed"          # finished, reply stored, not ACKed
    ACKNOWLEDGED = "acknowledged"
    TOMBSTONED = "tombstoned"


class CompletionReceipt(BaseModel):
    """What proves one execution's result. Byte-identical across replays."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rollout_id: RolloutId
    attempt_index: AttemptIndex
    execution_generation: Annotated[int, Field(ge=1)]
    result_identity: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    result_digest: Digest

    @property
    def key(self) -> tuple[str, int]:
        return (self.rollout_id, self.attempt_index)

    @classmethod
    def for_reply(cls, rollout_id: str, attempt_index: int, generation: int,
                  reply: Any) -> "CompletionReceipt":
        digest = result_digest(reply)
        return cls(rollout_id=rollout_id, attempt_index=attempt_index,
                   execution_generation=generation,
                   result_identity=result_identity(reply, digest), result_digest=digest)


class PhaseRequest(_Strict):
    """Body of prepare and resume."""

    checkpoint_id: CheckpointId
    deadline_ts: float


class RetireRequest(PhaseRequest):
    rollout_id: RolloutId
    attempt_index: AttemptIndex


class CommitRequest(PhaseRequest):
    checkpoint_dir: Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class AckBatchRequest(_Strict):
    schema_version: int = 1
    executions: Annotated[list[CompletionReceipt], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique_keys(self) -> "AckBatchRequest":
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


class AttemptInfo(_Lenient):
    rollout_id: str
    attempt_index: int
    state: str
    completion_receipt: CompletionReceipt | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.rollout_id, self.attempt_index)


class StatusReport(_Lenient):
    state: str = "accepting"                 # "accepting" or "preparing"
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
    executions: list[AttemptInfo] = Field(default_factory=list)

    def summary(self) -> str:
        return (f"ready_to_commit={self.ready_to_commit} running={self.running} "
                f"parked={self.parked} completed_unacknowledged={self.completed_unacknowledged}")


class CommitAnswer(_Lenient):
    records: int
    manifest_digest: str


class ResumeAnswer(_Lenient):
    state: str
    released: int = 0


class ReceiptAnswer(_Lenient):
    state: str                                # "completed" or "acknowledged"
    completion_receipt: CompletionReceipt


class ErrorDetail(_Lenient):
    code: str
    detail: str = ""


class ErrorBody(_Lenient):
    error: ErrorDetail
    report: StatusReport | None = None        # (ext) on a prepare 409


class Capabilities(_Lenient):
    protocol: str = "agent-checkpoint/v1"
    features: list[str] = Field(default_factory=list)
    phase: str = "idle"


def prepare_incomplete_detail(report: StatusReport) -> str:
    return (f"agent prepare is incomplete: running={report.running}, "
            f"parked_without_boundary={report.parked_without_boundary}, "
            f"completed_unacknowledged={report.completed_unacknowledged}")
