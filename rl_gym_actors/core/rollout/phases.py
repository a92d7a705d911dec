"""The phases of one rollout's tries and its transition table (see machine.py).

Pure data: which phase a :class:`~rl_gym_actors.core.rollout.RolloutMachine` is in, and for each
(phase, event type) pair the name of the machine's handler that takes it. A pair not in
:data:`TABLE` is an illegal transition (:class:`~rl_gym_actors.errors.IllegalTransition`).
:func:`step_call` builds the call a step phase waits on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from enum import StrEnum

from rl_gym_actors.core.rollout.events import (
    AbandonRequested,
    Ack,
    AckAnswered,
    AdoptRequested,
    DeadlineFired,
    DigestMismatch,
    Effect,
    FetchReceipt,
    ReceiptDeferred,
    ReceiptReceived,
    Replay,
    ReplayReplied,
    Retire,
    RetireAnswered,
    RunAdmissionClosed,
    RunFailed,
    RunReplied,
    Start,
    StepFailed,
    Woke,
)
from rl_gym_actors.protocol import CompletionReceipt


class RolloutPhase(StrEnum):
    """Where one rollout stands. Every phase but NEW and DONE waits on exactly one effect."""

    NEW = "new"
    RUNNING = "running"  # /run in flight for the current try
    ADMISSION_WAIT = "admission_wait"  # /run refused while admission is closed; waiting to resend
    RECEIPT = "receipt"  # reply in hand; fetching its receipt
    RETIRING = "retiring"  # giving up on the current try: retire in flight
    REPLAYING = "replaying"  # retire said completed: replaying /run for the stored reply
    ADOPT_RECEIPT = "adopt_receipt"  # stored reply in hand; fetching its receipt
    ACKING = "acking"  # sealed; ACK in flight
    RELEASING = "releasing"  # ACKing a stored reply that could not be sealed
    STALE_CHECK = "stale_check"  # a new rollout's first try is stale: ACKed or tombstoned?
    DONE = "done"


STEP_PHASES = (
    RolloutPhase.RECEIPT,
    RolloutPhase.RETIRING,
    RolloutPhase.REPLAYING,
    RolloutPhase.ADOPT_RECEIPT,
    RolloutPhase.ACKING,
    RolloutPhase.RELEASING,
    RolloutPhase.STALE_CHECK,
)


#: the call each step phase waits on (an ACK on a receipt; the others on the current try)
STEP_CALLS: dict[RolloutPhase, type[FetchReceipt | Retire | Replay | Ack]] = {
    RolloutPhase.RECEIPT: FetchReceipt,
    RolloutPhase.ADOPT_RECEIPT: FetchReceipt,
    RolloutPhase.STALE_CHECK: FetchReceipt,
    RolloutPhase.RETIRING: Retire,
    RolloutPhase.REPLAYING: Replay,
    RolloutPhase.ACKING: Ack,
    RolloutPhase.RELEASING: Ack,
}

#: the receipt fetches a server without a per-key receipt may defer to the checkpoint gate
_DEFERRABLE = frozenset({RolloutPhase.RECEIPT, RolloutPhase.ADOPT_RECEIPT})


def step_call(
    phase: RolloutPhase,
    attempt: int,
    *,
    may_defer: bool,
    receipt: CompletionReceipt | None = None,
) -> Callable[[float], Effect]:
    """The call a step phase sends (:data:`STEP_CALLS`), built for a deadline: an ACK on
    ``receipt``, the others on ``attempt``; with ``may_defer`` (results ACKed at the checkpoint,
    receipts deferred) a receipt fetch the checkpoint gate may take over."""
    call = STEP_CALLS[phase]
    if issubclass(call, Ack):
        assert receipt is not None  # the ACK phases are entered with the receipt they send
        return functools.partial(Ack, receipt)
    if phase in _DEFERRABLE and may_defer:
        return functools.partial(FetchReceipt, attempt, may_defer=True)
    return functools.partial(call, attempt)


def _table() -> dict[tuple[RolloutPhase, type], str]:
    t: dict[tuple[RolloutPhase, type], str] = {
        (RolloutPhase.NEW, Start): "_on_start",
        (RolloutPhase.NEW, AbandonRequested): "_on_abandon_flag",
        (RolloutPhase.NEW, AdoptRequested): "_on_noop",
        (RolloutPhase.RUNNING, RunReplied): "_on_run_replied",
        (RolloutPhase.RUNNING, RunFailed): "_on_run_failed",
        (RolloutPhase.RUNNING, RunAdmissionClosed): "_on_admission_closed",
        (RolloutPhase.RUNNING, DeadlineFired): "_on_deadline",
        (RolloutPhase.RUNNING, AbandonRequested): "_on_abandon_running",
        (RolloutPhase.RUNNING, AdoptRequested): "_on_adopt_running",
        (RolloutPhase.ADMISSION_WAIT, Woke): "_on_admission_woke",
        (RolloutPhase.ADMISSION_WAIT, AbandonRequested): "_on_abandon_running",
        (RolloutPhase.ADMISSION_WAIT, AdoptRequested): "_on_noop",
        (RolloutPhase.RECEIPT, ReceiptReceived): "_on_receipt",
        (RolloutPhase.RECEIPT, ReceiptDeferred): "_on_receipt_deferred",
        (RolloutPhase.RECEIPT, StepFailed): "_on_receipt_failed",
        (RolloutPhase.RECEIPT, DigestMismatch): "_on_digest_mismatch",
        (RolloutPhase.ADOPT_RECEIPT, ReceiptReceived): "_on_receipt",
        (RolloutPhase.ADOPT_RECEIPT, ReceiptDeferred): "_on_receipt_deferred",
        (RolloutPhase.ADOPT_RECEIPT, StepFailed): "_on_receipt_failed",
        (RolloutPhase.ADOPT_RECEIPT, DigestMismatch): "_on_digest_mismatch",
        (RolloutPhase.STALE_CHECK, ReceiptReceived): "_on_stale_result",
        (RolloutPhase.STALE_CHECK, DigestMismatch): "_on_stale_result",
        (RolloutPhase.STALE_CHECK, StepFailed): "_on_stale_no_result",
        (RolloutPhase.RETIRING, RetireAnswered): "_on_retire_answered",
        (RolloutPhase.RETIRING, StepFailed): "_on_retire_failed",
        (RolloutPhase.REPLAYING, ReplayReplied): "_on_replay_replied",
        (RolloutPhase.REPLAYING, StepFailed): "_on_replay_failed",
        (RolloutPhase.ACKING, AckAnswered): "_on_ack",
        (RolloutPhase.ACKING, StepFailed): "_on_ack_failed",
        (RolloutPhase.RELEASING, AckAnswered): "_on_ack",
        (RolloutPhase.RELEASING, StepFailed): "_on_ack_failed",
    }
    for phase in STEP_PHASES:
        t[(phase, Woke)] = "_on_woke"
        t[(phase, AbandonRequested)] = "_on_abandon_flag"
        t[(phase, AdoptRequested)] = "_on_noop"
    # the reply is in hand but its receipt is not: give up at once (retire, then adopt)
    t[(RolloutPhase.RECEIPT, AbandonRequested)] = "_on_abandon_running"
    return t


#: (phase, event type) -> the name of the machine's handler; a pair not here is illegal
TABLE = _table()
