"""What goes in and out of one rollout's state machine (machine.py).

Pure data. Events carry the time they happened (``now``, Unix seconds); effects that wait carry
an absolute deadline. A failed call's event carries its
:class:`~rl_gym_actors.failures.FailureKind`; :func:`receipt_problem` checks a receipt against
the reply it should prove; :func:`outcome_of` is what a finished rollout hands back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rl_gym_actors.core.attempt_reports import AttemptReport
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.outcome import Outcome, OutcomeStatus, reward_of
from rl_gym_actors.protocol import CompletionReceipt, RetireAnswer, result_digest


def receipt_problem(
    receipt: CompletionReceipt, rollout_id: str, attempt_index: int, reply: Any
) -> str | None:
    """Why ``receipt`` does not prove ``reply`` for this key, or None when it does."""
    if receipt.key != (rollout_id, attempt_index):
        return f"receipt is for {receipt.key}, not {(rollout_id, attempt_index)}"
    digest = result_digest(reply)
    if receipt.result_digest != digest:
        return f"receipt digest {receipt.result_digest[:12]}... != reply digest {digest[:12]}..."
    return None


# ---------------------------------------------------------------- events (in)


@dataclass(frozen=True, slots=True)
class Start:
    now: float


@dataclass(frozen=True, slots=True)
class RunReplied:
    now: float
    reply: Any
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class RunFailed:
    now: float
    failure: FailureKind
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RunAdmissionClosed:
    now: float


@dataclass(frozen=True, slots=True)
class DeadlineFired:
    now: float


@dataclass(frozen=True, slots=True)
class ReceiptReceived:
    now: float
    receipt: CompletionReceipt


@dataclass(frozen=True, slots=True)
class ReceiptDeferred:
    """A deferrable receipt fetch (``FetchReceipt.may_defer``) on a server that gives no receipt
    per key (no receipt with ``/run``, no per-key route): the rollout seals on the reply's own
    digest and the checkpoint gate takes the receipt from the one status listing it reads, and
    checks it against that digest, before it ACKs."""

    now: float


@dataclass(frozen=True, slots=True)
class StepFailed:
    """The pending control call (receipt fetch, retire, replay or ACK) failed; the phase says
    which one it was."""

    now: float
    failure: FailureKind
    detail: str = ""


@dataclass(frozen=True, slots=True)
class DigestMismatch:
    now: float
    receipt: CompletionReceipt
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RetireAnswered:
    now: float
    answer: RetireAnswer


@dataclass(frozen=True, slots=True)
class ReplayReplied:
    now: float
    reply: Any


@dataclass(frozen=True, slots=True)
class AckAnswered:
    now: float


@dataclass(frozen=True, slots=True)
class AbandonRequested:
    now: float


@dataclass(frozen=True, slots=True)
class AdoptRequested:
    """The ledger found the current try completed on Gym and wants it sealed and ACKed."""

    now: float


@dataclass(frozen=True, slots=True)
class Woke:
    """A ``WaitUntil`` ran out."""

    now: float


Event = (
    Start
    | RunReplied
    | RunFailed
    | RunAdmissionClosed
    | DeadlineFired
    | ReceiptReceived
    | ReceiptDeferred
    | StepFailed
    | DigestMismatch
    | RetireAnswered
    | ReplayReplied
    | AckAnswered
    | AbandonRequested
    | AdoptRequested
    | Woke
)


# ---------------------------------------------------------------- effects (out)


@dataclass(frozen=True, slots=True)
class StartRun:
    """POST /run for (rollout id, attempt_index); never repeated by the performer."""

    attempt_index: int
    deadline_ts: float


@dataclass(frozen=True, slots=True)
class FetchReceipt:
    """The try's completion receipt. ``may_defer``: the result is ACKed at the checkpoint, so a
    server without a per-key receipt may answer :class:`ReceiptDeferred`."""

    attempt_index: int
    deadline_ts: float
    may_defer: bool = False


@dataclass(frozen=True, slots=True)
class Retire:
    attempt_index: int
    deadline_ts: float


@dataclass(frozen=True, slots=True)
class Replay:
    """POST /run again for a key Gym reported completed: answers with the stored reply."""

    attempt_index: int
    deadline_ts: float


@dataclass(frozen=True, slots=True)
class Ack:
    receipt: CompletionReceipt
    deadline_ts: float


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """Sleep until ``wake_ts``, then feed ``Woke``."""

    wake_ts: float


@dataclass(frozen=True, slots=True)
class Seal:
    """The rollout's one result. Emitted at most once per rollout."""

    attempt_index: int
    reply: Any
    receipt: CompletionReceipt | None  # None: deferred to the checkpoint gate (ReceiptDeferred)
    adopted: bool

    @property
    def digest(self) -> str:
        """The sealed reply's digest: its receipt's, or (receipt deferred) the reply's own."""
        return self.receipt.result_digest if self.receipt else result_digest(self.reply)


@dataclass(frozen=True, slots=True)
class Report:
    report: AttemptReport


@dataclass(frozen=True, slots=True)
class Finish:
    outcome: Outcome


def outcome_of(
    rollout_id: str,
    status: OutcomeStatus,
    seal: Seal | None,
    last_attempt: int | None,
    *,
    acked: bool,
    tries: int,
    endpoint: str,
    reason: str | None,
    failure: FailureKind | None,
) -> Outcome:
    """What a finished rollout hands back: the sealed result when there is one (``attempt_index``
    its try's), else none (``attempt_index`` the last try made)."""
    return Outcome(
        rollout_id=rollout_id,
        status=status,
        attempt_index=seal.attempt_index if seal else last_attempt,
        reply=seal.reply if seal else None,
        reward=reward_of(seal.reply) if seal else None,
        receipt=seal.receipt if seal else None,
        result_digest=seal.digest if seal else None,
        adopted=seal.adopted if seal else False,
        acked=acked,
        tries=tries,
        endpoint=endpoint,
        reason=reason,
        failure=failure,
    )


Effect = StartRun | FetchReceipt | Retire | Replay | Ack | WaitUntil | Seal | Report | Finish
BLOCKING = (StartRun, FetchReceipt, Retire, Replay, Ack, WaitUntil)
