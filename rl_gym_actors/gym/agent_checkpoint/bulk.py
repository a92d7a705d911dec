"""Answers about thousands of keys, written without a model per key.

- :func:`status_body`: a status (or a prepare 409's ``report``) as bytes. The full shape NeMo RL's
  checkpoint client reads (each active attempt in ``blocking_attempts`` and ``executions``, the
  completed ones also in ``completed_unacknowledged_attempts``) writes each attempt once and
  repeats its bytes; the stored receipt bytes (canonical JSON) are spliced in as they are. The
  (ext) compact shape (``?listing=compact``, feature ``status-compact``) leaves the three lists
  empty and names each attempt once, as columns under ``attempts``: ``rollout_id``,
  ``attempt_index``, ``state`` and ``completion_receipt`` (the receipt object, or null; every
  one null with ``?listing=keys``, for a caller that needs only who is left). ``?listing=text``
  (feature ``status-receipt-text``) is compact with the receipts as their issued JSON text
  (strings, column ``completion_receipt_text``): a caller splices them into an ACK as they came,
  never decoding them.
- :func:`ack_body`: the fast path of ``acknowledge-completed``: a batch whose every receipt is,
  canonically, the stored receipt of a completed key is ACKed without building a model per
  receipt (a body that is byte for byte the stored receipts joined by commas between
  :data:`ACK_ENDS` is not even canonicalized receipt by receipt). Anything else (an unknown
  key, a receipt that differs, a malformed body) is left to the checked path, which names what
  is wrong; the answer is the same either way.
"""

from __future__ import annotations

import itertools
import json
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any

from rl_gym_actors.gym.store import Execution
from rl_gym_actors.listing import ACK_ENDS as ACK_TEXT_ENDS
from rl_gym_actors.listing import TEXT_LISTING
from rl_gym_actors.protocol import (
    DEADLINE_TS_MAX,
    ID_PATTERN,
    MAX_RETIRE_BATCH,
    ROLLOUT_ID_MAX,
    WIRE_INT_MAX,
    ExecutionKey,
    ExecutionState,
    RetireAnswer,
    canonical_json,
    is_valid_checkpoint_id,
)

_COMPLETED = ExecutionState.COMPLETED
_LISTS = ("blocking_attempts", "completed_unacknowledged_attempts", "executions")
# an acknowledge-completed body as our client writes it, around the receipts joined by commas
ACK_ENDS = tuple(end.encode() for end in ACK_TEXT_ENDS)


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
    full shape (``listing`` None), compact (``"compact"``), compact without the receipts
    (``"keys"``: every receipt null), or compact with the receipts as JSON text (``"text"``)."""
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
        column = "completion_receipt"
        if listing == TEXT_LISTING:  # each receipt a JSON string of its canonical text
            column += "_text"
            receipts = _strings([e.receipt for e in active])
        else:
            receipts = ",".join(
                "null" if e.receipt is None or listing == "keys" else e.receipt.decode("ascii")
                for e in active
            )
        return (
            f'{head[:-1]},"blocking_attempts":[],"completed_unacknowledged_attempts":[],'
            f'"executions":[],"attempts":{columns[:-1]},"{column}":[{receipts}]}}}}'
        )
    items = [_item(e, age(e.key)) for e in active]
    every = ",".join(items)
    completed = ",".join(i for i, e in zip(items, active, strict=True) if e.state is _COMPLETED)
    return (
        f'{head[:-1]},"blocking_attempts":[{every}],'
        f'"completed_unacknowledged_attempts":[{completed}],"executions":[{every}]}}'
    )


def _strings(receipts: list[bytes | None]) -> str:
    """The receipts (canonical JSON: ASCII, no control character, none a NUL or SOH) as JSON
    strings, comma separated (null for None), escaped all at once."""
    if not receipts:
        return ""
    blob = b"\0".join(b"\1" if r is None else r for r in receipts)
    blob = blob.replace(b"\\", b"\\\\").replace(b'"', b'\\"').replace(b"\0", b'","')
    return (b'"' + blob + b'"').replace(b'"\1"', b"null").decode("ascii")


def ack_body(raw: bytes) -> tuple[list[ExecutionKey], list[dict[str, Any]]] | None:
    """An ``acknowledge-completed`` body as its keys (unique) and receipt objects; None when it
    is not plainly that shape (the checked path then answers it, naming what is wrong). The
    keys' types are not checked here: a receipt is ACKed on this path only once it equals a
    stored receipt (bytes, or canonically: :func:`canonical_pairs`)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # (nesting: the checked path refuses it by name)
        return None
    if type(body) is not dict or not set(body) <= {"schema_version", "executions"}:
        return None
    version, executions = body.get("schema_version", 1), body.get("executions")
    if type(version) is not int or version != 1 or type(executions) is not list or not executions:
        return None
    if set(map(type, executions)) != {dict}:
        return None
    try:
        keys = list(map(_KEY, executions))
        if len(set(keys)) != len(keys):
            return None
    except (KeyError, TypeError):  # a receipt without its key, or an unhashable one
        return None
    return keys, executions


def canonical_pairs(
    keys: Sequence[ExecutionKey], receipts: Sequence[dict[str, Any]]
) -> list[tuple[ExecutionKey, bytes]] | None:
    """(key, canonical receipt) pairs, for a body that is not the stored receipts' bytes; None
    when a key is not a (str, int) pair."""
    for rid, att in keys:
        if type(rid) is not str or type(att) is not int:
            return None
    return [(key, canonical_json(r)) for key, r in zip(keys, receipts, strict=True)]


_KEY = operator.itemgetter("rollout_id", "attempt_index")


def acked_body(receipts: Sequence[bytes]) -> bytes:
    """``{"acknowledged": [receipt, ...]}`` from the stored receipts' bytes."""
    return b'{"acknowledged":[' + b",".join(receipts) + b"]}"


# ---------------------------------------------------------------- retire-batch

_RETIRE_FIELDS = frozenset({"schema_version", "checkpoint_id", "deadline_ts", "executions"})
_KEY_FIELDS = frozenset({"rollout_id", "attempt_index"})


def retire_batch_keys(raw: bytes) -> tuple[str, float, list[ExecutionKey]] | None:
    """A ``retire-batch`` body checked by hand, by the thousand (checkpoint id, deadline,
    keys): only bodies :class:`~rl_gym_actors.protocol.RetireBatchRequest` takes too; None for
    any other (the model then names what is wrong, or takes what these checks are too strict
    for)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if type(body) is not dict or not body.keys() <= _RETIRE_FIELDS:
        return None
    cid, deadline = body.get("checkpoint_id"), body.get("deadline_ts")
    version, executions = body.get("schema_version", 1), body.get("executions")
    if not (
        type(version) is int
        and version == 1
        and is_valid_checkpoint_id(cid)
        and type(deadline) is float
        and 0 <= deadline <= DEADLINE_TS_MAX  # (NaN fails it; the model names what is wrong)
        and type(executions) is list
        and 0 < len(executions) <= MAX_RETIRE_BATCH
        and set(map(type, executions)) == {dict}
        and all(map(operator.eq, map(dict.keys, executions), itertools.repeat(_KEY_FIELDS)))
    ):
        return None
    keys = list(map(_KEY, executions))
    rids, atts = [k[0] for k in keys], [k[1] for k in keys]
    if not (
        set(map(type, rids)) == {str}
        and set(map(type, atts)) == {int}
        and min(atts) >= 0
        and max(atts) <= WIRE_INT_MAX
        and max(map(len, rids)) <= ROLLOUT_ID_MAX
        and all(map(_ID_MATCH, rids))
        and len(set(keys)) == len(keys)
    ):
        return None
    return cid, deadline, keys


def retired_body(keys: Sequence[ExecutionKey], answers: Sequence[RetireAnswer]) -> bytes:
    """``retire-batch``'s answer, ``{"retired": [...]}``, as its model writes it (each key's
    answer fields, then its key), each distinct answer's fields encoded once."""
    fields: dict[RetireAnswer, str] = {}
    items = []
    for (rid, att), answer in zip(keys, answers, strict=True):
        text = fields.get(answer)
        if text is None:
            text = fields[answer] = answer.model_dump_json(exclude_none=True)[1:-1]
        items.append(f'{{{text},"rollout_id":{_json_string(rid)},"attempt_index":{att}}}')
    return ('{"retired":[' + ",".join(items) + "]}").encode()


_ID_MATCH = re.compile(ID_PATTERN[1:-1]).fullmatch  # (fullmatch: no final newline either)
_json_string = json.encoder.encode_basestring_ascii
