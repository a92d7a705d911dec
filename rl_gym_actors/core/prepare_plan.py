"""The prepare plan: what the checkpoint gate does about each attempt one Gym endpoint lists.

Pure: the plan reads an endpoint's :class:`~rl_gym_actors.protocol.StatusReport`, the book and
the set of live owners, and returns steps; the ledger actor performs them.

=============  ======================================================================
ADOPT          completed, not ACKed, still its rollout's current try, and a live owner
               holds it: ask that owner to ``adopt(rid, att)`` (replay, seal, ACK)
ORPHAN_ACK     completed, not ACKed, and no live owner holds it as its current try:
               take its receipt (from the status, else fetch it) and ACK it
RETIRE         running or parked (or park_requested) and no live owner holds it as its current try,
               including attempts the book never heard of: cancel it on Gym
WAIT           running or parked and a live owner holds it as its current try: let it
               finish; or, with ``retire_unknown=False``, an attempt the book never heard
               of (its owner may have dispatched it after the last flush); or a foreign
               attempt (``foreign`` set: another run's, whatever its state)
=============  ======================================================================

Foreign attempts (shared Gym servers): with ``own`` given, an attempt whose rollout the book
does not know and for which ``own(rollout_id)`` is False belongs to another training run. It is
never adopted, ACKed or retired: the gate waits for its run to settle it.

A RETIRE that Gym answers with ``completed_unacknowledged`` turns into an ORPHAN_ACK; an ADOPT
whose owner says False or has died turns into an ORPHAN_ACK (see :func:`orphan_step`).
"""

from __future__ import annotations

from collections.abc import Callable, Set
from enum import Enum
from typing import NamedTuple

from rl_gym_actors.core.attempt_book import AttemptBook
from rl_gym_actors.listing import AnyReceipt, GymListing, Listed
from rl_gym_actors.protocol import ExecutionState, StatusReport

# a real Gym lists a running attempt as "park_requested" while a prepare is in progress
PARK_REQUESTED = "park_requested"
_RUNNING = frozenset({ExecutionState.RUNNING.value, ExecutionState.PARKED.value, PARK_REQUESTED})
_COMPLETED = ExecutionState.COMPLETED.value


class PrepareAction(Enum):
    ADOPT = "adopt"
    ORPHAN_ACK = "orphan_ack"
    RETIRE = "retire"
    WAIT = "wait"


class Step(NamedTuple):
    """One decision. ``owner`` is set for ADOPT and for a WAIT on a live owner's current try;
    ``receipt`` for an ADOPT or ORPHAN_ACK whose receipt the status carried (a refused ADOPT is
    ACKed with it); ``known`` says whether the book has heard of the attempt. (A named tuple:
    immutable, and a third of a frozen dataclass's cost to make, one per listed attempt.)"""

    action: PrepareAction
    rollout_id: str
    attempt_index: int
    owner: str | None = None
    receipt: AnyReceipt | None = None
    known: bool = True
    foreign: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return (self.rollout_id, self.attempt_index)


_ORPHAN, _ADOPT = PrepareAction.ORPHAN_ACK, PrepareAction.ADOPT
_WAIT, _RETIRE = PrepareAction.WAIT, PrepareAction.RETIRE


def gym_attempts(status: StatusReport | GymListing) -> dict[tuple[str, int], Listed]:
    """Every attempt a status names, once, by key (see :meth:`GymListing.of`)."""
    return GymListing.of(status).attempts


def plan_endpoint(
    status: StatusReport | GymListing,
    book: AttemptBook,
    endpoint: str,
    live_owners: Set[str],
    *,
    retire_unknown: bool = True,
    own: Callable[[str], bool] | None = None,
) -> list[Step]:
    """The steps for every running, parked or completed-un-ACKed attempt ``status`` lists, in a
    stable order (by key). Attempts that are ACKed or tombstoned on Gym need nothing."""
    steps: list[Step] = []
    add, new = steps.append, tuple.__new__
    current = book.current_attempt
    # (by the thousand: locals, the listed pair unpacked, steps made with tuple.__new__ without
    # the named tuple's Python __new__)
    for (rid, att), (state, receipt) in sorted(gym_attempts(status).items()):
        if state == _COMPLETED:
            completed = True
        elif state in _RUNNING:
            completed = False
        else:
            continue
        if current(rid) is None:  # a rollout the book never heard of
            if own is not None and not own(rid):
                add(new(Step, (_WAIT, rid, att, None, None, False, True)))
                continue
            owner, known = None, False
        else:
            owner = book.claimant(rid, att, endpoint, live_owners)
            known = book.knows(rid, att)
        if completed:
            action = _ORPHAN if owner is None else _ADOPT
            add(new(Step, (action, rid, att, owner, receipt, known, False)))
        elif owner is not None or (not known and not retire_unknown):
            add(new(Step, (_WAIT, rid, att, owner, None, known, False)))
        else:
            add(new(Step, (_RETIRE, rid, att, None, None, known, False)))
    return steps


def orphan_step(step: Step, receipt: AnyReceipt | None = None) -> Step:
    """The ORPHAN_ACK that replaces an ADOPT the owner refused or a RETIRE Gym refused because
    the attempt had completed."""
    return Step(
        PrepareAction.ORPHAN_ACK,
        step.rollout_id,
        step.attempt_index,
        receipt=receipt or step.receipt,
        known=step.known,
    )


def blockers(status: StatusReport | GymListing) -> list[dict[str, object]]:
    """What still stands in the way on one endpoint, for :class:`CheckpointFailed`."""
    return [
        {"rollout_id": key[0], "attempt_index": key[1], "state": info.state}
        for key, info in sorted(gym_attempts(status).items())
        if info.state in _RUNNING or info.state == _COMPLETED
    ]
