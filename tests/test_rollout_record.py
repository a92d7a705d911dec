"""The rollout table: every (state, event) pair either lands where the table says or is refused."""

from __future__ import annotations

import itertools
import pickle

import pytest

from rl_gym_actors import errors
from rl_gym_actors.core.rollout_record import (
    TRANSITIONS,
    RolloutEvent,
    RolloutRecord,
    RolloutState,
    RolloutView,
    next_state,
)

PAIRS = list(itertools.product(RolloutState, RolloutEvent))


@pytest.mark.parametrize(("state", "event"), PAIRS, ids=[f"{s.value}-{e.value}" for s, e in PAIRS])
def test_every_pair_lands_in_the_table_or_is_refused(state, event):
    target = TRANSITIONS.get((state, event))
    record = RolloutRecord(state=state)
    if target is None:
        with pytest.raises(errors.IllegalTransition) as info:
            record.move(event, "r1")
        assert (info.value.state, info.value.event) == (state.value, event.value)
        assert record.state is state  # a refused event changes nothing
    else:
        assert record.move(event, "r1") is target
        assert record.state is target is next_state(state, event)


def test_the_table_refuses_the_pairs_nobody_means():
    S, E = RolloutState, RolloutEvent
    # a second dispatch beside a running one; a kept result thrown away by a new dispatch
    for state, event in [(S.RUNNING, E.DISPATCH), (S.KEPT, E.DISPATCH)]:
        assert (state, event) not in TRANSITIONS
    # only a running dispatch ends; only a result is handed out or kept
    ends = (E.RESULT_OUT, E.RESULT_KEPT, E.NO_RESULT, E.NO_TRY, E.LOSE)
    assert {s for (s, e) in TRANSITIONS if e in ends} == {S.RUNNING}
    assert {s for (s, e) in TRANSITIONS if e in (E.HAND_OUT, E.UNTAKEN)} == {S.KEPT, S.SEALED}
    # every state is reachable from NEW and can move on
    reached, frontier = {S.NEW}, [S.NEW]
    while frontier:
        state = frontier.pop()
        for (s, _), t in TRANSITIONS.items():
            if s is state and t not in reached:
                reached.add(t)
                frontier.append(t)
    assert reached == set(S)
    assert {s for s, _ in TRANSITIONS} == set(S)


def test_the_view_is_the_record_without_its_results():
    view_fields = set(RolloutView.__dataclass_fields__)
    assert view_fields < set(RolloutRecord.__dataclass_fields__)
    view = RolloutView()
    with pytest.raises(AttributeError):
        view.kept = None  # type: ignore[attr-defined]  # the point: the view has no such field


def test_the_error_is_typed_and_pickles():
    with pytest.raises(errors.IllegalTransition) as info:
        next_state(RolloutState.NEW, RolloutEvent.LOSE, "r9")
    err = pickle.loads(pickle.dumps(info.value))
    assert isinstance(err, errors.RlGymError)
    assert (err.state, err.event, err.phase) == ("new", "lose", "new") and "r9" in str(err)
