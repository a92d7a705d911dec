"""The lifecycle of one execution key on a participant, as one table: (state, event) -> next state.

Per key (rollout_id, attempt_index), with ``None`` for a key never seen::

    None --RUN--> running --FINISH--> completed --ACK--> acknowledged
                     |  \\--FAIL / RETIRE / RESTART--> tombstoned
    None --RETIRE--> tombstoned

A pair maps to the state the key is in afterwards (the same state: the event moves nothing, as a
replay, a repeated ACK or a receipt), or to a :class:`Refuse`: the typed rejection to answer, with
its wire status and detail. A pair not in the table cannot happen (the agent cannot return for a
key that never ran); :func:`step` raises :class:`IllegalTransition` for it.

``PARKED`` exists in the wire model and is kept in the table as running's twin, but nothing parks
in this server. ``RESTART`` is what :class:`~rl_gym_actors.gym.store.SqliteStore` does to every key
when it reopens after a crash: a run it cannot resume is tombstoned.

Pure and synchronous; :class:`~rl_gym_actors.gym.agent_checkpoint.core.ParticipantCore` asks
:func:`step` before every change of a key's state and sets no state the table did not name.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rl_gym_actors.errors import (
    AckRejected,
    DuplicateExecution,
    GymRejected,
    IllegalTransition,
    NotCompleted,
    StaleAttempt,
    UnknownExecution,
)
from rl_gym_actors.protocol import ExecutionKey, ExecutionState

S = ExecutionState
State = ExecutionState | None  # None: a key the participant has never seen


class Event(StrEnum):
    RUN = "run"  # a /run of the key
    FINISH = "finish"  # its agent call returned a reply
    FAIL = "fail"  # its agent call raised
    RECEIPT = "receipt"  # a receipt request (moves nothing)
    ACK = "ack"  # an ACK of the key (its receipt is compared afterwards)
    RETIRE = "retire"  # retire the key: cancel it if it runs, fence it off if unknown
    RESTART = "restart"  # the server came back from its durable store


@dataclass(frozen=True, slots=True)
class Refuse:
    """The answer to a pair the participant refuses: ``error`` with ``status``; ``detail`` is
    formatted with ``key`` (the key's label) and ``state`` (its state's value, or ``unknown``)."""

    error: type[GymRejected]
    status: int
    detail: str

    def raised(self, key: ExecutionKey, state: State) -> GymRejected:
        label = f"({key[0]!r}, {key[1]})"
        text = self.detail.format(key=label, state="unknown" if state is None else state.value)
        return self.error(text, status=self.status)


_IS = "execution {key} is {state}"
_DUPLICATE = Refuse(DuplicateExecution, 409, _IS)
_STALE = Refuse(StaleAttempt, 409, _IS)
_RETIRED_WHILE_RUNNING = Refuse(StaleAttempt, 409, "execution {key} was retired while it ran")
_NOT_COMPLETED = Refuse(NotCompleted, 409, _IS)
_NEVER_SEEN = Refuse(UnknownExecution, 404, "execution {key} was never seen")
_NOT_ACKABLE = Refuse(AckRejected, 409, "execution {key} is {state}, not completed")

#: the whole lifecycle; a pair that is absent cannot happen
TRANSITIONS: dict[tuple[State, Event], ExecutionState | Refuse] = {
    # /run: a new key starts (if admission is open), a completed one replays its reply
    (None, Event.RUN): S.RUNNING,
    (S.RUNNING, Event.RUN): _DUPLICATE,
    (S.PARKED, Event.RUN): _DUPLICATE,
    (S.COMPLETED, Event.RUN): S.COMPLETED,
    (S.ACKNOWLEDGED, Event.RUN): _STALE,
    (S.TOMBSTONED, Event.RUN): _STALE,
    # the agent call ends; a retire may have tombstoned the key meanwhile
    (S.RUNNING, Event.FINISH): S.COMPLETED,
    (S.TOMBSTONED, Event.FINISH): _RETIRED_WHILE_RUNNING,
    (S.RUNNING, Event.FAIL): S.TOMBSTONED,
    (S.TOMBSTONED, Event.FAIL): S.TOMBSTONED,
    # (ext) the receipt of a completed or ACKed key
    (None, Event.RECEIPT): _NEVER_SEEN,
    (S.RUNNING, Event.RECEIPT): _NOT_COMPLETED,
    (S.PARKED, Event.RECEIPT): _NOT_COMPLETED,
    (S.COMPLETED, Event.RECEIPT): S.COMPLETED,
    (S.ACKNOWLEDGED, Event.RECEIPT): S.ACKNOWLEDGED,
    (S.TOMBSTONED, Event.RECEIPT): _STALE,
    # ACK: only a completed key is released; a repeated ACK is idempotent
    (None, Event.ACK): Refuse(AckRejected, 409, _IS),
    (S.RUNNING, Event.ACK): _NOT_ACKABLE,
    (S.PARKED, Event.ACK): _NOT_ACKABLE,
    (S.COMPLETED, Event.ACK): S.ACKNOWLEDGED,
    (S.ACKNOWLEDGED, Event.ACK): S.ACKNOWLEDGED,
    (S.TOMBSTONED, Event.ACK): _NOT_ACKABLE,
    # retire: never refused; a completed key stays (only an ACK releases it)
    (None, Event.RETIRE): S.TOMBSTONED,
    (S.RUNNING, Event.RETIRE): S.TOMBSTONED,
    (S.PARKED, Event.RETIRE): S.TOMBSTONED,
    (S.COMPLETED, Event.RETIRE): S.COMPLETED,
    (S.ACKNOWLEDGED, Event.RETIRE): S.ACKNOWLEDGED,
    (S.TOMBSTONED, Event.RETIRE): S.TOMBSTONED,
    # a restart: what ran cannot go on
    (S.RUNNING, Event.RESTART): S.TOMBSTONED,
    (S.PARKED, Event.RESTART): S.TOMBSTONED,
    (S.COMPLETED, Event.RESTART): S.COMPLETED,
    (S.ACKNOWLEDGED, Event.RESTART): S.ACKNOWLEDGED,
    (S.TOMBSTONED, Event.RESTART): S.TOMBSTONED,
}


def step(state: State, event: Event) -> ExecutionState | Refuse:
    """The table's entry for (state, event); raises :class:`IllegalTransition` if it has none."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        name = "unknown" if state is None else state.value
        raise IllegalTransition(
            f"no transition for event {event.value!r} in execution state {name!r}",
            state=name,
            event=event.value,
        ) from None


def next_state(key: ExecutionKey, state: State, event: Event) -> ExecutionState:
    """The state after ``event``; raises the table's typed rejection (or
    :class:`IllegalTransition`)."""
    after = step(state, event)
    if isinstance(after, Refuse):
        raise after.raised(key, state)
    return after
