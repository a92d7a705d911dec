"""Strict models of the answers NeMo RL's checkpoint-participant work (PRs #4093 / #4117)
expects from its Gym actor, written here from the field lists of that work (unknown fields
refused, as there). The drop-in's answers must validate against them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Name = Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Count = Annotated[int, Field(strict=True, ge=0)]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Identity(Strict):
    server_name: Name
    component: Literal["responses_api_models", "responses_api_agents", "resources_servers"]
    participant_name: Annotated[str, Field(min_length=1)]


class MultiProcess(Strict):
    mode: Literal["single_worker", "coordinator", "unmanaged"]
    num_workers: Annotated[int, Field(strict=True, ge=1)]


class Contract(Strict):
    participant: Identity
    schema_version: Literal[1]
    admission_states: list[Literal["accepting", "draining", "paused"]]
    checkpoint_mode: Literal["stateless", "export_restore"]
    concurrency_contract: Literal["stateless", "serialized_per_session", "transactional_parallel"]
    multi_process: MultiProcess
    instance_role: Literal["policy", "auxiliary"] | None = None
    features: list[str] = []


class Topology(Strict):
    schema_version: Literal[1]
    participants: list[Contract]


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
    blocking_attempts: list[dict]
    completed_unacknowledged_attempts: list[dict]
    selected_boundaries: list[dict]
    executions: list[dict]


class PrepareParticipant(Strict):
    participant: Identity
    ready: bool
    payload: AgentPrepare


class PrepareResult(Strict):
    checkpoint_id: str
    ready: bool
    participants: list[PrepareParticipant]


class ArtifactReference(Strict):
    schema_version: Literal[1]
    relative_path: Annotated[str, Field(min_length=1)]
    sha256: Sha256
    records: Count
    bytes: Count


class AgentCommit(Strict):
    records: Count
    manifest_digest: Sha256
    continuation_index: ArtifactReference


class ManifestReference(Strict):
    participant: Identity
    relative_path: Annotated[str, Field(min_length=1)]
    manifest_digest: Sha256


class CommitParticipant(Strict):
    participant: Identity
    payload: AgentCommit
    manifest: ManifestReference


class CommitResult(Strict):
    checkpoint_id: str
    participants: list[CommitParticipant]


class PayloadParticipant(Strict):
    participant: Identity
    payload: dict


class ParticipantsResult(Strict):  # resume, abort and restore
    checkpoint_id: str
    participants: list[PayloadParticipant]


class Receipt(Strict):
    rollout_id: Name
    attempt_index: Count
    execution_generation: Annotated[int, Field(strict=True, ge=1)]
    result_identity: Annotated[str, Field(min_length=1, max_length=512)]
    result_digest: Sha256
    manifest_capture_key: Name | None = None
    terminal_model_call_id: str | None = None


class Completed(Strict):
    receipt: Receipt
    agent_name: Annotated[str, Field(min_length=1)]


class Acknowledged(Strict):
    acknowledged: list[Completed]
