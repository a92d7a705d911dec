"""What a rollout is, across its dispatches: one state, one transition table, one record.

Pure data: no Ray, no sockets, no clock. The only place that says which states a rollout id
can be in and how it moves between them; the orchestrator's memory, each rollout actor's view
and the NeMo RL drop-in's book all move their rollouts through :func:`next_state`:

- a row goes out: ``NEW | UNSETTLED | LOST -> RUNNING``;
- its dispatch ends: with its result handed out ``-> SEALED``, with a result its row did not
  take ``-> KEPT``, without a result ``-> UNSETTLED``, before any try ``-> NEW``, or its actor
  died ``-> LOST``;
- a row is answered from the result without a dispatch: ``KEPT | SEALED -> SEALED``; a result
  that went out but was never taken: ``SEALED | KEPT -> KEPT``.

(``SEALED --DISPATCH--> RUNNING`` too: a holder that does not answer from the result, such as a
rollout actor whose orchestrator forgot the rollout, or the drop-in when RL asks again for a row
it had.) A pair the table does not hold raises :class:`~rl_gym_actors.errors.IllegalTransition`.

What is not state sits beside it in the record: the current try, the lowest attempt index never
used, the first try of the latest dispatch, the results, the abandons that came early.
:class:`RolloutView` is what a rollout actor keeps; :class:`RolloutRecord` is the same view
with what only the orchestrator keeps (the next fresh index and the results).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rl_gym_actors.errors import IllegalTransition
from rl_gym_actors.outcome import Outcome


class RolloutState(StrEnum):
    """Where one rollout id stands between its rows."""

    NEW = "new"  # no try of it is known (never dispatched, or forgotten)
    RUNNING = "running"  # a dispatch of it is in flight
    UNSETTLED = "unsettled"  # ended without a result: its current try is retired first next time
    LOST = "lost"  # its rollout actor died: the current try is a guess until the ledger names it
    KEPT = "kept"  # ended with a result nobody took: the next row gets it (adopted)
    SEALED = "sealed"  # its result went out: a row sent again gets it back (repeated)


class RolloutEvent(StrEnum):
    """What happens to a rollout id."""

    DISPATCH = "dispatch"  # a row of it goes to a rollout actor
    RESULT_OUT = "result_out"  # the dispatch ended with a result, handed out with its row
    RESULT_KEPT = "result_kept"  # ... with a result its row did not take (abandoned)
    NO_RESULT = "no_result"  # ... without a result; its last try is the current one
    NO_TRY = "no_try"  # ... before any try was made, and none was known before it
    LOSE = "lose"  # its rollout actor died (or the caller gave up waiting on it)
    HAND_OUT = "hand_out"  # a kept or sealed result answered a row
    UNTAKEN = "untaken"  # a result that went out was never taken: kept for the next row


S, E = RolloutState, RolloutEvent

#: (state, event) -> next state; a pair not in the table is an illegal transition
TRANSITIONS: dict[tuple[RolloutState, RolloutEvent], RolloutState] = {
    (S.NEW, E.DISPATCH): S.RUNNING,
    (S.UNSETTLED, E.DISPATCH): S.RUNNING,
    (S.LOST, E.DISPATCH): S.RUNNING,
    (S.SEALED, E.DISPATCH): S.RUNNING,
    (S.RUNNING, E.RESULT_OUT): S.SEALED,
    (S.RUNNING, E.RESULT_KEPT): S.KEPT,
    (S.RUNNING, E.NO_RESULT): S.UNSETTLED,
    (S.RUNNING, E.NO_TRY): S.NEW,
    (S.RUNNING, E.LOSE): S.LOST,
    (S.KEPT, E.HAND_OUT): S.SEALED,
    (S.SEALED, E.HAND_OUT): S.SEALED,
    (S.SEALED, E.UNTAKEN): S.KEPT,
    (S.KEPT, E.UNTAKEN): S.KEPT,
}

del S, E

#: states in which the rollout holds a result (its current try sealed)
WITH_RESULT = frozenset({RolloutState.KEPT, RolloutState.SEALED})


def next_state(state: RolloutState, event: RolloutEvent, rollout_id: str = "") -> RolloutState:
    """The state ``event`` moves a rollout in ``state`` to; IllegalTransition when none."""
    target = TRANSITIONS.get((state, event))
    if target is None:
        raise IllegalTransition(
            f"rollout {rollout_id}: {event.value} while {state.value}",
            state=state.value,
            event=event.value,
        )
    return target


@dataclass(slots=True)
class RolloutView:
    """What a rollout actor keeps of a rollout it ran (the part of :class:`RolloutRecord` it
    needs): its state, the try last known current, whether that try's result was released on
    Gym, the first try of its latest dispatch that ended, and dispatches abandoned before they
    started. ``state`` moves only through :meth:`move`."""

    state: RolloutState = RolloutState.NEW
    current: int | None = None  # the try last known current (None: no try known)
    acked: bool = False  # the current try's result was released on Gym (WITH_RESULT only)
    dispatched_from: int | None = None  # first try of the latest dispatch that ended
    abandons: frozenset[int] = frozenset()  # dispatches (by first try) abandoned early

    def move(self, event: RolloutEvent, rollout_id: str = "") -> RolloutState:
        self.state = next_state(self.state, event, rollout_id)
        return self.state


@dataclass(slots=True)
class RolloutRecord(RolloutView):
    """The orchestrator's record of a rollout: the view, the lowest attempt index never used,
    and its results: ``kept`` in KEPT (a result nobody took), ``result`` in SEALED (the result
    handed out, repeated to a row that sends the rollout again until a checkpoint forgets it)."""

    next_fresh: int = 0
    kept: Outcome | None = None
    result: Outcome | None = None
