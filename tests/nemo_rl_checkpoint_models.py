"""Strict models of what NeMo RL's checkpoint client (PR #4093) validates, from Gym servers and
from its own Gym actor, written here constraint for constraint from the facts of that work:
unknown fields refused everywhere; integers strict; identities match the identity pattern;
phases, modes and roles are closed sets (``restart_only`` included); a receipt's model-lineage
pair comes both or neither; an artifact path is safely relative; a continuation root's capture
key belongs to its rollout and names no future attempt; a commit's manifest names the same
participant as its result; agent prepare / status / commit / restore / resume payloads carry
exactly their fields. :func:`continuations` reads a commit's continuation indexes as that
client does (manifest digests, then each index's bytes, digest and row count)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, model_validator

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
Name = Annotated[str, Field(min_length=1, pattern=ID_PATTERN)]
Count = Annotated[int, Field(strict=True, ge=0)]
Positive = Annotated[int, Field(strict=True, ge=1)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Text = Annotated[str, Field(min_length=1)]
Component = Literal["responses_api_models", "responses_api_agents", "resources_servers"]
Admission = Literal["accepting", "draining", "paused"]
Mode = Literal["stateless", "restart_only", "export_restore"]
Concurrency = Literal["stateless", "serialized_per_session", "transactional_parallel"]
Phase = Literal[
    "idle",
    "preparing",
    "prepared",
    "committing",
    "committed_paused",
    "restoring",
    "restore_failed_paused",
    "restored_paused",
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Execution(Strict):
    rollout_id: Name
    attempt_index: Count


class Receipt(Execution):
    execution_generation: Positive
    result_identity: Annotated[str, Field(min_length=1, max_length=512)]
    result_digest: Sha256
    manifest_capture_key: Name | None = None
    terminal_model_call_id: Text | None = None

    @model_validator(mode="after")
    def _pair(self) -> Receipt:
        if (self.manifest_capture_key is None) != (self.terminal_model_call_id is None):
            raise ValueError("manifest_capture_key and terminal_model_call_id: both or neither")
        return self


class MultiProcess(Strict):
    mode: Literal["single_worker", "coordinator", "unmanaged"]
    num_workers: Positive


class Identity(Strict):
    server_name: Name
    component: Component
    participant_name: Text


class Capabilities(Strict):
    component: Component
    name: Text
    schema_version: Literal[1]
    admission_states: list[Admission]
    checkpoint_mode: Mode
    concurrency_contract: Concurrency
    multi_process: MultiProcess
    instance_role: Literal["policy", "auxiliary"] | None = None
    phase: Phase
    active_checkpoint_id: str | None = None
    deadline_ts: FiniteFloat | None = None
    features: list[str] = Field(default_factory=list)


class Contract(Strict):
    participant: Identity
    schema_version: Literal[1]
    admission_states: list[Admission]
    checkpoint_mode: Mode
    concurrency_contract: Concurrency
    multi_process: MultiProcess
    instance_role: Literal["policy", "auxiliary"] | None = None
    features: list[str] = Field(default_factory=list)


class Topology(Strict):
    schema_version: Literal[1]
    participants: list[Contract]


# ---------------------------------------------------------------- an agent's answers


class ExecutionStatus(Execution):
    generation: Positive
    state: Literal[
        "running",
        "park_requested",
        "parked",
        "external_wait_frozen",
        "model_wait_frozen",
        "completed",
        "retired",
    ]
    # required (no default), null allowed
    parked_boundary_state: (
        Literal[
            "parked_with_boundary",
            "parked_without_boundary",
            "external_wait_frozen",
            "model_wait_frozen",
        ]
        | None
    )
    boundary_index: Count | None = None
    turn_index: Count | None = None
    boundary_kind: Literal["pending_model", "turn_complete"] | None = None
    resource_state_revisions: dict[str, Count] = Field(default_factory=dict)
    completion_receipt: Receipt | None = None
    age_seconds: Annotated[float, Field(ge=0)]


class SelectedBoundary(Execution):
    boundary_index: Count
    turn_index: Count
    boundary_kind: Literal["pending_model", "turn_complete"]
    resource_state_revisions: dict[str, Count]


class AgentPrepare(Strict):
    state: Literal["accepting", "preparing"]
    ready_to_commit: bool
    running: Count
    parked: Count
    parked_with_boundary: Count
    parked_without_boundary: Count
    completed_unacknowledged: Count
    acknowledged_completed: Count
    active: Count
    blocking_attempts: list[ExecutionStatus]
    completed_unacknowledged_attempts: list[ExecutionStatus]
    selected_boundaries: list[SelectedBoundary]
    executions: list[ExecutionStatus]


class AgentStatus(AgentPrepare):
    checkpoint_id: Name


class ArtifactReference(Strict):
    schema_version: Literal[1] = 1
    relative_path: Text
    sha256: Sha256
    records: Count
    bytes: Count

    @model_validator(mode="after")
    def _safe(self) -> ArtifactReference:
        path = Path(self.relative_path)
        if path.is_absolute() or not path.parts or ".." in path.parts:
            raise ValueError("relative_path must stay inside the checkpoint directory")
        return self


class AgentCommit(Strict):
    records: Count
    manifest_digest: Sha256
    continuation_index: ArtifactReference


class AgentRestore(Strict):
    records: Count
    source_checkpoint_id: Text
    continuation_index: ArtifactReference


class AgentResume(Strict):
    state: Literal["accepting"]
    released: Count


class ContinuationRoot(Strict):
    schema_version: Literal[1] = 1
    rollout_id: Name
    attempt_index: Count
    capture_key: Name
    last_committed_model_call_id: Text
    resource_state_revisions: dict[str, Count] | None = None

    @model_validator(mode="after")
    def _belongs(self) -> ContinuationRoot:
        if self.capture_key == self.rollout_id:
            source = 0
        else:
            suffix = self.capture_key.removeprefix(f"{self.rollout_id}-a")
            if suffix == self.capture_key or not suffix.isdigit():
                raise ValueError("capture_key does not belong to rollout_id")
            source = int(suffix)
        if source > self.attempt_index:
            raise ValueError("capture_key names a later attempt than attempt_index")
        return self


# ---------------------------------------------------------------- the actor's answers


class PrepareParticipant(Strict):
    participant: Identity
    ready: bool
    payload: AgentPrepare


class PrepareResult(Strict):
    checkpoint_id: str
    ready: bool
    participants: list[PrepareParticipant]


class ManifestReference(Strict):
    participant: Identity
    relative_path: Text
    manifest_digest: Sha256


class CommitParticipant(Strict):
    participant: Identity
    payload: AgentCommit
    manifest: ManifestReference


class CommitResult(Strict):
    checkpoint_id: str
    participants: list[CommitParticipant]

    @model_validator(mode="after")
    def _identities(self) -> CommitResult:
        keys = []
        for p in self.participants:
            if p.manifest.participant != p.participant:
                raise ValueError("a manifest names another participant than its result")
            keys.append((p.participant.server_name, p.participant.component))
        if len(keys) != len(set(keys)):
            raise ValueError("duplicate participants")
        return self


class RestoreParticipant(Strict):
    participant: Identity
    payload: AgentRestore


class RestoreResult(Strict):
    checkpoint_id: str
    participants: list[RestoreParticipant]


class ResumeParticipant(Strict):
    participant: Identity
    payload: AgentResume


class ResumeResult(Strict):  # resume and abort
    checkpoint_id: str
    participants: list[ResumeParticipant]


class Completed(Strict):
    receipt: Receipt
    agent_name: Text


class Acknowledged(Strict):
    acknowledged: list[Completed]


def read_index(root: Path, reference: ArtifactReference) -> list[ContinuationRoot]:
    """One continuation index, checked as NeMo RL checks it: inside ``root``, its bytes,
    digest and row count as referenced; each row a :class:`ContinuationRoot`."""
    path = (root / reference.relative_path).resolve()
    path.relative_to(root.resolve())  # ValueError when it escapes
    raw = path.read_bytes()
    if len(raw) != reference.bytes or hashlib.sha256(raw).hexdigest() != reference.sha256:
        raise ValueError(f"{reference.relative_path}: size or digest differs from its reference")
    rows = [ContinuationRoot.model_validate_json(line) for line in raw.splitlines() if line.strip()]
    if len(rows) != reference.records:
        raise ValueError(f"{reference.relative_path}: {len(rows)} rows, not {reference.records}")
    return rows


def continuations(root: Path, commit: CommitResult) -> list[ContinuationRoot]:
    """Every agent's continuation roots of a commit: each manifest's digest checked first, no
    capture key twice."""
    found: dict[str, ContinuationRoot] = {}
    for p in commit.participants:
        manifest = (root / p.manifest.relative_path).read_bytes()
        if hashlib.sha256(manifest).hexdigest() != p.manifest.manifest_digest:
            raise ValueError(f"{p.manifest.relative_path}: digest differs from its reference")
        for row in read_index(root, p.payload.continuation_index):
            if row.capture_key in found:
                raise ValueError(f"capture key {row.capture_key} twice")
            found[row.capture_key] = row
    return list(found.values())
