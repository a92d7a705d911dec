"""The checkpoint calls of NeMo RL's checkpoint-participant work (PRs #4093 / #4117) on the
drop-in, with their names, argument order and answer shapes, mapped onto the ledger's gate.

- ``discover_checkpoint_capabilities(server_names=None)``: each Gym server's capabilities as a
  participant contract; answers the topology ``{"schema_version": 1, "participants": [...]}``.
- ``prepare_checkpoint(id, deadline_ts)``: closes this actor's admission and drains its
  rollouts in flight (:class:`~.checkpoints.CheckpointSteps`); answers
  ``{"checkpoint_id", "ready": true, "participants": [{participant, ready, payload}]}``, the
  payload being each Gym server's agent status. Not drained by the deadline: admission reopens,
  the id stays usable, and :class:`CheckpointDeadline` (a ``TimeoutError``) is raised.
- ``commit_checkpoint(id, deadline_ts, dir)``: runs the ledger's gate into ``dir`` (adopt, ACK
  orphans, prepare and commit every Gym server); answers ``{"checkpoint_id", "participants":
  [{participant, payload: {records, manifest_digest, continuation_index}, manifest}]}`` where
  ``continuation_index`` references the server's records file and ``manifest`` its
  ``manifest.json``, both relative to ``dir``.
- ``resume_checkpoint(id, deadline_ts)`` / ``abort_checkpoint(id, deadline_ts)``: reopen
  admission (the gate already resumed Gym); answer ``{"checkpoint_id", "participants":
  [{participant, payload: {"state": "accepting"}}]}``.
- ``restore_checkpoint(id, deadline_ts, dir, source_checkpoint_id=None, ...)``: checks each
  server's manifest in ``dir`` (and its source id) and leaves admission closed until
  ``resume_checkpoint``. Gym's state itself is durable on its server (its store), so nothing is
  copied back.
- ``acknowledge_completed_executions([{receipt, agent_name}])``: RL records that it owns these
  results; each must be a receipt this actor handed out (``gym_completion_receipt``). The
  ledger ACKs them on Gym (at seal or at the next checkpoint's gate, per its ``ack`` policy).

Each call is bounded (by its ``deadline_ts``) and answers a repeat with the same id the same.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.errors import CheckpointFailed, ConfigError
from rl_gym_actors.integrations.nemo_rl.rows import RolloutFailure

COMPONENT = "responses_api_agents"
SCHEMA_VERSION = 1
CONTINUATIONS_NAME = "continuations.jsonl"  # the continuation index's file (real Gym's name)
# the policy model NeMo RL serves to Gym: a participant of the topology NeMo RL's checkpoint
# client (PR #4093) requires; stateless here (the drop-in checkpoints no model state)
POLICY_CONTRACT: dict[str, Any] = {
    "participant": {
        "server_name": "policy_model",
        "component": "responses_api_models",
        "participant_name": "policy_model",
    },
    "schema_version": SCHEMA_VERSION,
    "admission_states": ["accepting"],
    "checkpoint_mode": "stateless",
    "concurrency_contract": "stateless",
    "multi_process": {"mode": "single_worker", "num_workers": 1},
    "instance_role": "policy",
    "features": [],
}
#: an agent participant's resume payload: admission reopened; nothing parked to release
RESUMED = {"state": "accepting", "released": 0}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
RECEIPT_FIELDS = (
    "rollout_id",
    "attempt_index",
    "execution_generation",
    "result_identity",
    "result_digest",
    "manifest_capture_key",
    "terminal_model_call_id",
)
CAPABILITY_FIELDS = (
    "admission_states",
    "checkpoint_mode",
    "concurrency_contract",
    "multi_process",
    "instance_role",
    "features",
)
# our server's older feature names, as NeMo RL's checkpoint work names the same feature
FEATURE_NAMES = {"acknowledge-completed": "completed_result_acknowledgement"}
DEFAULT_CONTRACT = {
    "admission_states": ["accepting", "paused"],
    "checkpoint_mode": "export_restore",
    "concurrency_contract": "transactional_parallel",
    "multi_process": {"mode": "single_worker", "num_workers": 1},
    "instance_role": None,
    "features": ["completed_result_acknowledgement"],
}


class CheckpointDeadline(RolloutFailure, TimeoutError):
    """A checkpoint call did not finish by its ``deadline_ts``; admission reopened."""


def server_name(endpoint: GymEndpoint, index: int) -> str:
    name = endpoint.name or ""
    return name if _NAME.fullmatch(name) else f"gym-{index}"


def identities(endpoints: list[GymEndpoint], names: dict[str, str]) -> list[dict[str, str]]:
    """Each endpoint as ``{server_name, component, participant_name}`` (the name Gym gave in
    its capabilities once discovered, else the server name)."""
    out = []
    for i, e in enumerate(endpoints):
        server = server_name(e, i)
        out.append(
            {
                "server_name": server,
                "component": COMPONENT,
                "participant_name": names.get(server, server),
            }
        )
    return out


def contract(identity: dict[str, str], capabilities: dict[str, Any] | None) -> dict[str, Any]:
    """The topology entry of one participant, from its capabilities (defaults where the server
    says nothing: a server of ours before it spoke NeMo RL's schema)."""
    caps = capabilities or {}
    entry: dict[str, Any] = {
        k: caps[k] if caps.get(k) is not None else DEFAULT_CONTRACT[k] for k in CAPABILITY_FIELDS
    }
    entry["admission_states"] = sorted(entry["admission_states"])
    entry["features"] = sorted({FEATURE_NAMES.get(f, f) for f in entry["features"]})
    return {"participant": identity, "schema_version": SCHEMA_VERSION, **entry}


def topology(contracts: list[dict[str, Any]]) -> dict[str, Any]:
    """The agents' contracts and the policy model's (:data:`POLICY_CONTRACT`), ordered by
    component, server name and participant name."""
    ordered = sorted(
        [*contracts, POLICY_CONTRACT],
        key=lambda c: (
            c["participant"]["component"],
            c["participant"]["server_name"],
            c["participant"]["participant_name"],
        ),
    )
    return {"schema_version": SCHEMA_VERSION, "participants": ordered}


def prepare_payload(status: Any) -> dict[str, Any]:
    """An agent's prepare payload from its status report (counts; no per-attempt lists)."""
    counts = status.model_dump() if hasattr(status, "model_dump") else {}
    fields = (
        "running",
        "parked",
        "parked_with_boundary",
        "parked_without_boundary",
        "completed_unacknowledged",
        "acknowledged_completed",
        "active",
    )
    state = (
        counts.get("state") if counts.get("state") in ("accepting", "preparing") else "accepting"
    )
    return {
        "state": state,
        "ready_to_commit": True,
        **{k: int(counts.get(k) or 0) for k in fields},
        "blocking_attempts": [],
        "completed_unacknowledged_attempts": [],
        "selected_boundaries": [],
        "executions": [],
    }


def commit_participant(
    identity: dict[str, str], checkpoint_dir: str, endpoint_dir: str, commit: Any
) -> dict[str, Any]:
    """One participant's commit result, with paths relative to ``checkpoint_dir``. Its
    continuation index is the one the server wrote (``continuation_index`` of its commit
    answer, relative to ``endpoint_dir``; the manifest beside it), in the rows NeMo RL's
    ``gym_checkpoint_continuations`` reads; a server that wrote none gets an empty index
    written here, beside its manifest."""
    root = Path(checkpoint_dir)
    where = Path(endpoint_dir)
    served = getattr(commit, "continuation_index", None)
    if served:
        index_path = where / served["relative_path"]
        where = index_path.parent
    else:
        index_path = where / CONTINUATIONS_NAME
        if not index_path.exists():
            index_path.write_bytes(b"")
    manifest_path = where / "manifest.json"
    digest = (
        getattr(commit, "manifest_digest", None)
        or hashlib.sha256(manifest_path.read_bytes()).hexdigest()
    )
    manifest = json.loads(manifest_path.read_bytes())
    raw = index_path.read_bytes()
    index = {
        "schema_version": SCHEMA_VERSION,
        "relative_path": _relative(index_path, root),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "records": len([line for line in raw.splitlines() if line.strip()]),
        "bytes": len(raw),
    }
    return {
        "participant": identity,
        "payload": {
            "records": int(manifest["records"]),
            "manifest_digest": digest,
            "continuation_index": index,
        },
        "manifest": {
            "participant": identity,
            "relative_path": _relative(manifest_path, root),
            "manifest_digest": digest,
        },
    }


def _relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        raise ConfigError(f"{path} is not inside the checkpoint dir {root}") from None


def endpoint_dirs(checkpoint_dir: str, endpoints: list[GymEndpoint]) -> list[str]:
    """Where the ledger's gate writes each endpoint's part of a checkpoint."""
    from rl_gym_actors.actors.gate_endpoint import dir_labels

    if len(endpoints) <= 1:
        return [checkpoint_dir] * len(endpoints)
    return [str(Path(checkpoint_dir) / label) for label in dir_labels(endpoints)]


def restored_participant(
    identity: dict[str, str],
    checkpoint_dir: str,
    endpoint_dir: str,
    source_checkpoint_id: str | None,
) -> dict[str, Any]:
    """Check the participant's manifest (in ``endpoint_dir``, or the one instance directory
    below it a named server wrote); report what it holds, as an agent's restore answer
    ``{records, source_checkpoint_id, continuation_index}`` (paths relative to
    ``checkpoint_dir``)."""
    path = Path(endpoint_dir) / "manifest.json"
    named = sorted(Path(endpoint_dir).glob("agent/instance-*/manifest.json"))
    if not path.exists() and len(named) == 1:
        path = named[0]
    try:
        manifest = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CheckpointFailed(
            f"{identity['server_name']}: no readable manifest at {path}: {exc}",
            checkpoint_id=source_checkpoint_id or "",
        ) from None
    found = manifest.get("checkpoint_id")
    if source_checkpoint_id is not None and found != source_checkpoint_id:
        raise CheckpointFailed(
            f"{identity['server_name']}: {path} holds checkpoint {found!r}, "
            f"not {source_checkpoint_id!r}",
            checkpoint_id=source_checkpoint_id,
        )
    index_path = path.parent / CONTINUATIONS_NAME
    raw = index_path.read_bytes() if index_path.exists() else b""
    return {
        "participant": identity,
        "payload": {
            "records": int(manifest.get("records", 0)),
            "source_checkpoint_id": found,
            "continuation_index": {
                "schema_version": SCHEMA_VERSION,
                "relative_path": _relative(index_path, Path(checkpoint_dir)),
                "sha256": hashlib.sha256(raw).hexdigest(),
                "records": len([line for line in raw.splitlines() if line.strip()]),
                "bytes": len(raw),
            },
        },
    }


class ReceiptBook:
    """The receipts this actor handed to RL (bounded, oldest forgotten first) and those RL
    acknowledged."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._handed: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
        self.acknowledged: set[tuple[str, int]] = set()

    def handed(self, receipt: dict[str, Any]) -> None:
        key = (receipt["rollout_id"], receipt["attempt_index"])
        self._handed[key] = receipt
        while len(self._handed) > self.max_entries:
            old, _ = self._handed.popitem(last=False)
            self.acknowledged.discard(old)

    def acknowledge(self, executions: list[Any]) -> dict[str, Any]:
        items = [_completed(e) for e in executions]
        keys = [(r["rollout_id"], r["attempt_index"]) for r, _ in items]
        if len(keys) != len(set(keys)):
            raise ValueError("completed Gym execution acknowledgements must be unique")
        for (receipt, _), key in zip(items, keys, strict=True):
            known = self._handed.get(key)
            if known is None or any(known.get(k) != receipt.get(k) for k in RECEIPT_FIELDS):
                raise ValueError(f"no result with receipt {key} was handed out by this actor")
        self.acknowledged.update(keys)
        return {"acknowledged": [{"receipt": r, "agent_name": a} for r, a in items]}


def _completed(item: Any) -> tuple[dict[str, Any], str]:
    if not isinstance(item, dict) or set(item) != {"receipt", "agent_name"}:
        raise ValueError(f"a completed execution is {{receipt, agent_name}}, not {item!r}")
    receipt, agent = item["receipt"], item["agent_name"]
    if not isinstance(receipt, dict) or not isinstance(agent, str) or not agent:
        raise ValueError(f"invalid completed execution {item!r}")
    unknown = set(receipt) - set(RECEIPT_FIELDS)
    if unknown:
        raise ValueError(f"unknown receipt fields {sorted(unknown)}")
    return {k: v for k, v in receipt.items() if v is not None}, agent


def left_s(deadline_ts: float) -> float:
    return deadline_ts - time.time()
