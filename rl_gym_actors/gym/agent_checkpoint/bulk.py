"""Answers about thousands of keys, written without a model per key.

- :func:`status_body`: a status (or a prepare 409's ``report``) as bytes. The full shape NeMo RL's
  checkpoint client reads (each active attempt in ``blocking_attempts`` and ``executions``, the
  completed ones also in ``completed_unacknowledged_attempts``) writes each attempt once and
  repeats its bytes; the stored receipt bytes (canonical JSON) are spliced in as they are. The
  (ext) compact shape (``?listing=compact``, feature ``status-compact``) leaves the three lists
  empty and names each attempt once, as columns under ``attempts``: ``rollout_id``,
  ``attempt_index``, ``state`` and ``completion_receipt`` (the receipt object, or null; every
  one null with ``?listing=keys``, for a caller that needs only who is left).
- :func:`exact_acks`: the fast path of ``acknowledge-completed``: a batch whose every receipt is,
  canonically, the stored receipt of a completed key is ACKed without building a model per
  receipt. Anything else (an unknown key, a receipt that differs, a malformed body) is left to
  the checked path, which names what is wrong; the answer is the same either way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from rl_gym_actors.gym.store import Execution
from rl_gym_actors.protocol import ExecutionKey, ExecutionState, canonical_json

_COMPLETED = ExecutionState.COMPLETED
_LISTS = ("blocking_attempts", "completed_unacknowledged_attempts", "executions")


def _item(e: Execution, age: float) -> str:
    receipt = "" if e.receipt is None else ',"completion_receipt":' + e.receipt.decode("ascii")
    return (
        f'{{"rollout_id":{json.dumps(e.rollout_id)},"attempt_index":{e.attempt_index},'
        f'"state":"{e.state.value}"{receipt},"generation":{e.generation},'
        f'"parked_boundary_state":null,"age_seconds":{json.dumps(age)}}}'
    )


def status_body(
    counts: dict[str, Any],
    active: Sequence[Execution],
    age: Callable[[ExecutionKey], float],
    *,
    listing: str | None = None,
) -> str:
    """The status JSON: ``counts`` (the status object without its lists) and ``active``, in the
    full shape (``listing`` None), compact (``"compact"``), or compact without the receipts
    (``"keys"``: every receipt null)."""
    head = json.dumps({k: v for k, v in counts.items() if k not in _LISTS}, separators=(",", ":"))
    if listing is not None:
        columns = json.dumps(
            {
                "rollout_id": [e.rollout_id for e in active],
                "attempt_index": [e.attempt_index for e in active],
                "state": [e.state.value for e in active],
            },
            separators=(",", ":"),
        )
        receipts = ",".join(
            "null" if e.receipt is None or listing == "keys" else e.receipt.decode("ascii")
            for e in active
        )
        return (
            f'{head[:-1]},"blocking_attempts":[],"completed_unacknowledged_attempts":[],'
            f'"executions":[],"attempts":{columns[:-1]},"completion_receipt":[{receipts}]}}}}'
        )
    items = [_item(e, age(e.key)) for e in active]
    every = ",".join(items)
    completed = ",".join(i for i, e in zip(items, active, strict=True) if e.state is _COMPLETED)
    return (
        f'{head[:-1]},"blocking_attempts":[{every}],'
        f'"completed_unacknowledged_attempts":[{completed}],"executions":[{every}]}}'
    )


def exact_receipts(raw: bytes) -> list[tuple[ExecutionKey, bytes]] | None:
    """An ``acknowledge-completed`` body as (key, canonical receipt) pairs, keys unique; None
    when it is not plainly that shape (the checked path then answers it)."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None
    if type(body) is not dict or not set(body) <= {"schema_version", "executions"}:
        return None
    version, executions = body.get("schema_version", 1), body.get("executions")
    if type(version) is not int or version != 1 or type(executions) is not list or not executions:
        return None
    pairs: list[tuple[ExecutionKey, bytes]] = []
    for receipt in executions:
        if type(receipt) is not dict:
            return None
        rid, att = receipt.get("rollout_id"), receipt.get("attempt_index")
        if type(rid) is not str or type(att) is not int:
            return None
        pairs.append(((rid, att), canonical_json(receipt)))
    if len({key for key, _ in pairs}) != len(pairs):
        return None
    return pairs


def acked_body(receipts: Sequence[bytes]) -> bytes:
    """``{"acknowledged": [receipt, ...]}`` from the stored receipts' bytes."""
    return b'{"acknowledged":[' + b",".join(receipts) + b"]}"
