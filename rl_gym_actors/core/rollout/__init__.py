"""One rollout's tries as a pure, synchronous state machine: events in, effects out.

:mod:`.machine` (:class:`RolloutMachine`), :mod:`.events` (what goes in and out), :mod:`.phases`
(its phases and transition table), :mod:`.steps` (the control call it waits on); everything is
reachable from here (callers write ``rollout.StartRun``).

No Ray, no sockets, no clock reads: every event carries the time it happened (``now``, Unix
seconds) and every effect that waits carries an absolute deadline. The rollout actor performs the
effects and feeds back what came of them; tests drive the machine against a model of Gym.

The rule it keeps is "retire, then adopt or cancel": whenever it gives up on a try (its
``rollout_s`` deadline fired, it was abandoned, the receipt fetch failed, the connection broke,
the digest did not match, a plain 5xx) it first retires that try on Gym.

- retired (the try was still running, now tombstoned): the try is cancelled; the next try starts
  if tries remain and the reason allows, else the rollout fails with the reason.
- completed, not ACKed: it replays ``/run`` for the same key (Gym answers with the stored reply
  and does not run the agent), fetches the receipt, seals the reply and ACKs it. That is the
  rollout's result (``adopted``); there is no next try.

``/run`` refused because admission is closed (a checkpoint is between prepare and resume) is not
a failed try: the machine waits with backoff and sends the same key again, for at most
``policy.admission_wait_s``; past it the rollout fails ``admission_closed`` without a retire
(Gym refused every send of that try, so nothing of it ran). A retire, replay, receipt fetch or
ACK is retried by its call (``policy.retry``) on a lost connection or a 5xx; the machine repeats
it itself, backing off by the same policy until that step's deadline, only for what passes once
Gym's state changed (a key not completed yet, a checkpoint in the way: see
:class:`~rl_gym_actors.failures.Repeat`), and never with no time left for the repeat. If it
still fails, the attempt is handed over to the ledger (reported ``released``), which settles it
at the next checkpoint.
"""

from rl_gym_actors.core.rollout.events import (
    BLOCKING,
    AbandonRequested,
    Ack,
    AckAnswered,
    AdoptRequested,
    DeadlineFired,
    DigestMismatch,
    Effect,
    Event,
    FetchReceipt,
    Finish,
    ReceiptDeferred,
    ReceiptReceived,
    Replay,
    ReplayReplied,
    Report,
    Retire,
    RetireAnswered,
    RunAdmissionClosed,
    RunFailed,
    RunReplied,
    Seal,
    Start,
    StartRun,
    StepFailed,
    WaitUntil,
    Woke,
    receipt_problem,
)
from rl_gym_actors.core.rollout.machine import RolloutMachine
from rl_gym_actors.core.rollout.phases import RolloutPhase
from rl_gym_actors.errors import IllegalTransition
from rl_gym_actors.failures import FailureKind

__all__ = [
    "BLOCKING",
    "AbandonRequested",
    "Ack",
    "AckAnswered",
    "AdoptRequested",
    "DeadlineFired",
    "DigestMismatch",
    "Effect",
    "Event",
    "FailureKind",
    "FetchReceipt",
    "Finish",
    "IllegalTransition",
    "ReceiptDeferred",
    "ReceiptReceived",
    "Replay",
    "ReplayReplied",
    "Report",
    "Retire",
    "RetireAnswered",
    "RolloutMachine",
    "RolloutPhase",
    "RunAdmissionClosed",
    "RunFailed",
    "RunReplied",
    "Seal",
    "Start",
    "StartRun",
    "StepFailed",
    "WaitUntil",
    "Woke",
    "receipt_problem",
]
