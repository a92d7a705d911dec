"""What one Gym status names, once per attempt: :class:`GymListing`.

A status object (docs/PROTOCOL.md, section 4) lists every active attempt up to three times
(``blocking_attempts``, ``completed_unacknowledged_attempts``, ``executions``), each with its
receipt. The checkpoint gate needs each attempt once: its state and, when completed, its receipt
as the server issued it (to send back in an ACK). A listing holds the counts (a
:class:`~rl_gym_actors.protocol.StatusReport` whose lists are left empty) and one
``key -> Listed(state, completion_receipt)`` table, built either from a full status
(:meth:`GymListing.of`, a real Gym) or from our server's (ext) compact listing
(:meth:`GymListing.from_compact`: one column per field, receipts as the server's JSON objects,
never turned into models, or, with ``listing=text``, as the JSON text the server issued, never
even decoded: an ACK sends that text back as it came). Receipts stay in whichever form they came
(:data:`AnyReceipt`); the helpers below read any.
"""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from rl_gym_actors.protocol import CompletionReceipt, ExecutionKey, StatusReport

# a receipt as a model, as the JSON object a server listed, or as the JSON text it listed (sent
# back to it as it came)
AnyReceipt = CompletionReceipt | Mapping[str, Any] | str

COMPACT_FEATURE = "status-compact"  # (ext) capabilities: status and prepare take listing=compact
COMPACT_PARAM = ("listing", "compact")  # the query parameter that asks for it
KEYS_LISTING = "keys"  # listing=keys: compact without the receipts (every one null)
TEXT_FEATURE = "status-receipt-text"  # (ext) listing=text: compact, receipts as JSON text
TEXT_LISTING = "text"
ACK_COUNT_FEATURE = "ack-count"  # (ext) acknowledge-completed?count=1 answers the count only
ACK_COUNT_PARAM = ("count", "1")
# acknowledge-completed as our client writes it: these around the receipts' JSON joined by commas
# (our server compares such a body whole with the receipts it issued)
ACK_ENDS = ('{"schema_version":1,"executions":[', "]}")
_COLUMNS = ("rollout_id", "attempt_index", "state", "completion_receipt")
_TEXT_COLUMNS = (*_COLUMNS[:3], "completion_receipt_text")
_STR, _INT = frozenset({str}), frozenset({int})
_OBJECT, _TEXT = frozenset({dict, type(None)}), frozenset({str, type(None)})
_IS_NOT, _NONES = operator.is_not, itertools.repeat(None)


def _all_name(rids: list[str], atts: list[int], texts: list[str | None]) -> bool:
    """Whether every listed receipt text is the one of its key, with a digest, and without the
    lineage fields (which follow ``rollout_id``): by the thousand, with map, no loop in Python.
    False: :func:`_names` reads each."""
    listed = list(map(_IS_NOT, texts, _NONES))
    some: list[str] = list(itertools.compress(texts, listed))  # type: ignore[arg-type]
    heads = map(_ATT.format, itertools.compress(atts, listed))
    tails = map(_LAST.format, itertools.compress(rids, listed))
    return (
        all(map(str.startswith, some, heads))
        and all(map(str.endswith, some, tails))
        and all(map(str.__contains__, some, itertools.repeat(_DIGEST)))
    )


# canonical JSON: keys sorted, attempt_index first, rollout_id last but for the lineage fields
_ATT, _RID, _LAST = '{{"attempt_index":{},', '"rollout_id":"{}"', ',"rollout_id":"{}"}}'
_DIGEST = '"result_digest":"'


def _names(receipt: dict[str, Any] | str, rid: str, att: int) -> bool:
    """Whether a listed receipt is the one of (rid, att), with a digest. Its JSON text is read
    as our server writes it (canonical: keys sorted, ``attempt_index`` first), not decoded."""
    if type(receipt) is dict:
        return (
            receipt.get("rollout_id") == rid
            and receipt.get("attempt_index") == att
            and type(receipt.get("result_digest")) is str
        )
    return (
        isinstance(receipt, str)
        and receipt.startswith(_ATT.format(att))
        and _RID.format(rid) in receipt
        and _DIGEST in receipt
    )


class Listed(NamedTuple):
    state: str
    completion_receipt: AnyReceipt | None = None


def receipt_key(receipt: AnyReceipt) -> ExecutionKey:
    if isinstance(receipt, CompletionReceipt):
        return receipt.key
    data = receipt_wire(receipt)
    return (data["rollout_id"], data["attempt_index"])


def receipt_digest(receipt: AnyReceipt) -> str:
    if isinstance(receipt, CompletionReceipt):
        return receipt.result_digest
    return str(receipt_wire(receipt)["result_digest"])


def receipt_wire(receipt: AnyReceipt) -> Mapping[str, Any]:
    """The receipt as the JSON object an ACK sends (JSON text decoded: raises ValueError when
    it is no JSON object)."""
    if isinstance(receipt, CompletionReceipt):
        return receipt.wire()
    if isinstance(receipt, str):
        data = json.loads(receipt)
        if not isinstance(data, dict):
            raise ValueError("a receipt's JSON text is no object")
        return data
    return receipt


def receipt_json(receipt: AnyReceipt) -> str:
    """The receipt as the JSON text an ACK sends: JSON text as it came, else encoded."""
    if isinstance(receipt, str):
        return receipt
    return json.dumps(receipt_wire(receipt), separators=(",", ":"), allow_nan=False)


def receipt_model(receipt: AnyReceipt) -> CompletionReceipt:
    """The receipt as a model (validated; raises pydantic's ValidationError)."""
    if isinstance(receipt, CompletionReceipt):
        return receipt
    if isinstance(receipt, str):
        return CompletionReceipt.model_validate_json(receipt)
    return CompletionReceipt.model_validate(dict(receipt))


@dataclass(frozen=True, slots=True)
class GymListing:
    """One status: its counts (``report``, lists empty) and each active attempt once."""

    report: StatusReport
    attempts: dict[ExecutionKey, Listed] = field(default_factory=dict)
    keys_only: bool = False  # the server left the receipts out (listing=keys)

    @classmethod
    def of(cls, status: StatusReport | GymListing) -> GymListing:
        """From a full status: the completed list wins (it carries receipts), then the blocking
        list, then ``executions``."""
        if isinstance(status, GymListing):
            return status
        found: dict[ExecutionKey, Listed] = {}
        for group in (
            status.executions,
            status.blocking_attempts,
            status.completed_unacknowledged_attempts,
        ):
            for info in group:
                old = found.get(info.key)
                if old is None or old.completion_receipt is None or info.completion_receipt:
                    found[info.key] = Listed(info.state, info.completion_receipt)
        return cls(status, found)

    @classmethod
    def from_compact(
        cls, body: Mapping[str, Any], *, keys_only: bool = False, text: bool = False
    ) -> GymListing:
        """From our server's (ext) compact answer: the counts, and ``attempts`` as columns
        (``rollout_id``, ``attempt_index``, ``state``, ``completion_receipt``: a receipt object
        or null; with ``text``, ``completion_receipt_text``: a receipt's JSON text or null).
        Raises ValueError when the shape is not that (pydantic's ValidationError, a
        ValueError, for the counts)."""
        columns = body.get("attempts")
        if not isinstance(columns, Mapping):
            raise ValueError("compact listing without an attempts object")
        rids, atts, states, receipts = (
            columns.get(name) for name in (_TEXT_COLUMNS if text else _COLUMNS)
        )
        if not (
            isinstance(rids, list)
            and isinstance(atts, list)
            and isinstance(states, list)
            and isinstance(receipts, list)
            and len(rids) == len(atts) == len(states) == len(receipts)
        ):
            raise ValueError("compact listing columns are not lists of one length")
        report = StatusReport.model_validate({k: v for k, v in body.items() if k != "attempts"})
        # every column checked whole (by the thousand: map and set, no loop in Python)
        if not (
            set(map(type, rids)) <= _STR
            and set(map(type, atts)) <= _INT
            and set(map(type, states)) <= _STR
            and set(map(type, receipts)) <= (_TEXT if text else _OBJECT)
        ):
            raise ValueError("compact listing: a column holds a value of the wrong type")
        if not (text and _all_name(rids, atts, receipts)):  # (else: find the one)
            for i in itertools.compress(itertools.count(), map(_IS_NOT, receipts, _NONES)):
                if not _names(receipts[i], rids[i], atts[i]):
                    raise ValueError(
                        f"compact listing: the receipt of ({rids[i]!r}, {atts[i]}) is another's"
                    )
        # (tuple.__new__: a named tuple's own __new__ is a Python lambda, twice the cost)
        found: dict[ExecutionKey, Listed] = dict(
            zip(
                zip(rids, atts, strict=True),
                map(tuple.__new__, itertools.repeat(Listed), zip(states, receipts, strict=True)),
                strict=True,
            )
        )
        return cls(report, found, keys_only)

    def not_ready(self) -> GymListing:
        report = self.report.model_copy(update={"ready_to_commit": False})
        return GymListing(report, self.attempts, self.keys_only)

    # the counts, read through
    @property
    def ready_to_commit(self) -> bool:
        return self.report.ready_to_commit

    @property
    def state(self) -> str:
        return self.report.state

    @property
    def running(self) -> int:
        return self.report.running

    @property
    def parked(self) -> int:
        return self.report.parked

    @property
    def parked_without_boundary(self) -> int:
        return self.report.parked_without_boundary

    @property
    def completed_unacknowledged(self) -> int:
        return self.report.completed_unacknowledged

    def summary(self) -> str:
        return self.report.summary()
