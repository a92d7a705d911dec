"""What one Gym status names, once per attempt: :class:`GymListing`.

A status object (docs/PROTOCOL.md, section 4) lists every active attempt up to three times
(``blocking_attempts``, ``completed_unacknowledged_attempts``, ``executions``), each with its
receipt. The checkpoint gate needs each attempt once: its state and, when completed, its receipt
as the server issued it (to send back in an ACK). A listing holds the counts (a
:class:`~rl_gym_actors.protocol.StatusReport` whose lists are left empty) and one
``key -> Listed(state, completion_receipt)`` table, built either from a full status
(:meth:`GymListing.of`, a real Gym) or from our server's (ext) compact listing
(:meth:`GymListing.from_compact`: one column per field, receipts as the server's JSON objects,
never turned into models). Receipts stay in whichever form they came (:data:`AnyReceipt`); the
helpers below read either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from rl_gym_actors.protocol import CompletionReceipt, ExecutionKey, StatusReport

# a receipt as a model, or as the JSON object a server listed (sent back to it as it came)
AnyReceipt = CompletionReceipt | Mapping[str, Any]

COMPACT_FEATURE = "status-compact"  # (ext) capabilities: status and prepare take listing=compact
COMPACT_PARAM = ("listing", "compact")  # the query parameter that asks for it
KEYS_LISTING = "keys"  # listing=keys: compact without the receipts (every one null)
ACK_COUNT_FEATURE = "ack-count"  # (ext) acknowledge-completed?count=1 answers the count only
ACK_COUNT_PARAM = ("count", "1")
_COLUMNS = ("rollout_id", "attempt_index", "state", "completion_receipt")


class Listed(NamedTuple):
    state: str
    completion_receipt: AnyReceipt | None = None


def receipt_key(receipt: AnyReceipt) -> ExecutionKey:
    if isinstance(receipt, CompletionReceipt):
        return receipt.key
    return (receipt["rollout_id"], receipt["attempt_index"])


def receipt_digest(receipt: AnyReceipt) -> str:
    if isinstance(receipt, CompletionReceipt):
        return receipt.result_digest
    return str(receipt["result_digest"])


def receipt_wire(receipt: AnyReceipt) -> Mapping[str, Any]:
    """The receipt as the JSON object an ACK sends."""
    return receipt.wire() if isinstance(receipt, CompletionReceipt) else receipt


def receipt_model(receipt: AnyReceipt) -> CompletionReceipt:
    """The receipt as a model (validated; raises pydantic's ValidationError)."""
    if isinstance(receipt, CompletionReceipt):
        return receipt
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
    def from_compact(cls, body: Mapping[str, Any], *, keys_only: bool = False) -> GymListing:
        """From our server's (ext) compact answer: the counts, and ``attempts`` as columns
        (``rollout_id``, ``attempt_index``, ``state``, ``completion_receipt``: a receipt object
        or null). Raises ValueError when the shape is not that (pydantic's ValidationError, a
        ValueError, for the counts)."""
        columns = body.get("attempts")
        if not isinstance(columns, Mapping):
            raise ValueError("compact listing without an attempts object")
        rids, atts, states, receipts = (columns.get(name) for name in _COLUMNS)
        if not (
            isinstance(rids, list)
            and isinstance(atts, list)
            and isinstance(states, list)
            and isinstance(receipts, list)
            and len(rids) == len(atts) == len(states) == len(receipts)
        ):
            raise ValueError("compact listing columns are not lists of one length")
        report = StatusReport.model_validate({k: v for k, v in body.items() if k != "attempts"})
        found: dict[ExecutionKey, Listed] = {}
        for rid, att, state, receipt in zip(rids, atts, states, receipts, strict=True):
            if not (
                type(rid) is str
                and type(att) is int
                and type(state) is str
                and (receipt is None or type(receipt) is dict)
            ):
                raise ValueError(f"compact listing entry ({rid!r}, {att!r}) is malformed")
            if receipt is not None and (
                receipt.get("rollout_id") != rid
                or receipt.get("attempt_index") != att
                or type(receipt.get("result_digest")) is not str
            ):
                raise ValueError(f"compact listing: the receipt of ({rid!r}, {att}) is another's")
            # (tuple.__new__: a named tuple's own __new__ is a Python lambda, twice the cost)
            found[(rid, att)] = tuple.__new__(Listed, (state, receipt))
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
