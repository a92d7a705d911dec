"""The participant's execution table, pair by pair: every (state, event) either leads where the
table says (through the core's own calls) or is refused as the table says; a pair outside the
table raises ``IllegalTransition``."""

from __future__ import annotations

import itertools

import pytest

from rl_gym_actors.errors import GymRejected, IllegalTransition
from rl_gym_actors.gym.agent_checkpoint.core import ParticipantCore, Start, encode_reply
from rl_gym_actors.gym.agent_checkpoint.machine import (
    TRANSITIONS,
    Event,
    Refuse,
    next_state,
    step,
)
from rl_gym_actors.gym.store import Execution, SqliteStore
from rl_gym_actors.protocol import CompletionReceipt
from rl_gym_actors.protocol import ExecutionState as S

KEY = ("k", 0)
STATES = [None, *S]
PAIRS = list(itertools.product(STATES, Event))


def _core_in(state: S | None) -> tuple[ParticipantCore, bytes | None]:
    """A core holding KEY in ``state``, reached through the core's own calls (PARKED, which
    nothing here reaches, is loaded as a record)."""
    if state is S.PARKED:
        return ParticipantCore([Execution(KEY[0], KEY[1], S.PARKED, generation=1)]), None
    core = ParticipantCore()
    receipt = None
    if state is None:
        return core, None
    if state is S.TOMBSTONED:
        core.retire(None, KEY)
        return core, None
    assert isinstance(core.begin_run(KEY), Start)
    if state is S.RUNNING:
        return core, None
    raw, receipt = encode_reply(KEY, 1, {"id": "x"})
    core.finish_run(KEY, 1, raw, receipt)
    if state is S.ACKNOWLEDGED:
        core.acknowledge(CompletionReceipt.model_validate_json(receipt))
    return core, receipt


def _fire(core: ParticipantCore, event: Event, receipt: bytes | None) -> None:
    if event is Event.RUN:
        core.begin_run(KEY)
    elif event is Event.FINISH:
        raw, r = encode_reply(KEY, 1, {"id": "x"})
        core.finish_run(KEY, 1, raw, r)
    elif event is Event.FAIL:
        core.fail_run(KEY, 1)
    elif event is Event.RECEIPT:
        core.receipt(KEY)
    elif event is Event.ACK:
        if receipt is None:
            receipt = encode_reply(KEY, 1, {"id": "x"})[1]
        core.acknowledge(CompletionReceipt.model_validate_json(receipt))
    elif event is Event.RETIRE:
        core.retire(None, KEY)
    else:
        raise AssertionError(f"{event} is not the core's event")


def _restarted(state: S, directory) -> S:
    """RESTART is the store's transition: KEY's state after a store holding it reopens."""
    store = SqliteStore(directory)
    reply = b"{}" if state is S.COMPLETED else None
    store.submit([Execution(KEY[0], KEY[1], state, generation=1, reply=reply)])
    store.close()
    reopened = SqliteStore(directory)
    try:
        return {e.key: e.state for e in reopened.load().executions}[KEY]
    finally:
        reopened.close()


def test_the_table_names_only_known_states_and_events():
    for (state, event), after in TRANSITIONS.items():
        assert state in STATES and event in Event
        assert isinstance(after, (S, Refuse))
    # every event is defined from at least one state, every state takes some event
    assert {e for _, e in TRANSITIONS} == set(Event)
    assert {s for s, _ in TRANSITIONS} == set(STATES)


@pytest.mark.parametrize(
    ("state", "event"), PAIRS, ids=[f"{s.value if s else 'new'}-{e.value}" for s, e in PAIRS]
)
def test_every_pair(state, event, tmp_path):
    entry = TRANSITIONS.get((state, event))
    if event is Event.RESTART and entry is not None:
        assert _restarted(state, tmp_path) is entry
        return
    if entry is None:
        with pytest.raises(IllegalTransition) as info:
            step(state, event)
        assert (info.value.state, info.value.event) == (
            state.value if state else "unknown",
            event.value,
        )
        with pytest.raises(IllegalTransition):
            next_state(KEY, state, event)
        if event in (Event.FINISH, Event.FAIL) and state is not S.PARKED:
            core, receipt = _core_in(state)
            with pytest.raises(IllegalTransition):  # the core asks the table, too
                _fire(core, event, receipt)
        return
    core, receipt = _core_in(state)
    assert core.state_of(KEY) is state
    if isinstance(entry, Refuse):
        with pytest.raises(entry.error) as info:
            _fire(core, event, receipt)
        assert isinstance(info.value, GymRejected) and info.value.status == entry.status
        assert core.state_of(KEY) is state  # a refusal moves nothing
        return
    _fire(core, event, receipt)
    assert core.state_of(KEY) is entry
