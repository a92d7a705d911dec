"""Hypothesis drives the participant core through any sequence of run, finish, fail, replay,
retire, ACK (single and batch), prepare, commit and resume, against a plain model of PROTOCOL.md.

Invariants: a replay never runs the agent (each key starts at most once and a replay returns the
first reply's bytes); retire never destroys a completed un-ACKed reply; batch ACK is all or
nothing and idempotent; ``ready_to_commit`` holds exactly when nothing runs and nothing completed
is un-ACKed; the counts in status match the model.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rl_gym_actors.errors import (
    AckRejected,
    AdmissionClosed,
    CheckpointConflict,
    CheckpointNotReady,
    DuplicateExecution,
    StaleAttempt,
    StaleCheckpoint,
)
from rl_gym_actors.gym.agent_checkpoint.core import (
    ParticipantCore,
    PrepareIncomplete,
    Replay,
    Start,
    encode_reply,
)
from rl_gym_actors.protocol import CommitAnswer, CompletionReceipt


def _j(answer):
    """A wire model as the JSON data a client receives."""
    return answer.model_dump(mode="json", exclude_none=True)


KEYS = [("a", 0), ("a", 1), ("b", 0)]
keys = st.sampled_from(KEYS)
RUNNING, COMPLETED, ACKED, TOMBSTONED = "running", "completed", "acknowledged", "tombstoned"


class ParticipantMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = ParticipantCore()
        self.model: dict[tuple[str, int], str] = {}
        self.starts: Counter = Counter()
        self.replies: dict[tuple[str, int], bytes] = {}
        self.receipts: dict[tuple[str, int], CompletionReceipt] = {}
        self.generation: dict[tuple[str, int], int] = {}
        self.phase = "idle"
        self.active: str | None = None
        self.spent: set[str] = set()
        self.serial = 0

    # ------------------------------------------------------------ data plane

    @rule(key=keys)
    def run(self, key):
        state = self.model.get(key)
        try:
            decision = self.core.begin_run(key)
        except StaleAttempt:
            assert state in (ACKED, TOMBSTONED)
        except DuplicateExecution:
            assert state == RUNNING
        except AdmissionClosed:
            assert state is None and self.phase != "idle"
        else:
            if isinstance(decision, Replay):
                assert state == COMPLETED
                assert decision.reply == self.replies[key]  # the first reply, byte for byte
            else:
                assert isinstance(decision, Start)
                assert state is None and self.phase == "idle"
                self.starts[key] += 1
                self.model[key] = RUNNING
                self.generation[key] = decision.generation
        assert self.starts[key] <= 1  # a replay never runs the agent

    def _keys_in(self, *states: str) -> list[tuple[str, int]]:
        return sorted(k for k, s in self.model.items() if s in states)

    def _pick(self, data, *states: str):
        """Mostly a key in one of ``states`` (so that the interesting paths are walked often),
        sometimes any key."""
        known = self._keys_in(*states)
        if known and data.draw(st.integers(0, 3), label="known") > 0:
            return data.draw(st.sampled_from(known), label="key")
        return data.draw(keys, label="key")

    @precondition(lambda self: RUNNING in self.model.values())
    @rule(data=st.data(), reward=st.floats(allow_nan=False, allow_infinity=False, width=32))
    def finish(self, data, reward):
        self._finish(data.draw(st.sampled_from(self._keys_in(RUNNING)), label="key"), reward)

    @rule(key=keys)
    def run_to_completion(self, key):
        self.run(key)
        if self.model.get(key) == RUNNING:
            self._finish(key, 0.5)

    def _finish(self, key, reward: float) -> None:
        raw, receipt = encode_reply(
            key, self.generation[key], {"id": f"r-{key[0]}", "reward": reward}
        )
        self.core.finish_run(key, self.generation[key], raw, receipt)
        self.model[key] = COMPLETED
        self.replies[key] = raw
        self.receipts[key] = CompletionReceipt.model_validate_json(receipt)

    @precondition(lambda self: RUNNING in self.model.values())
    @rule(data=st.data())
    def fail(self, data):
        key = data.draw(st.sampled_from(self._keys_in(RUNNING)), label="key")
        self.core.fail_run(key, self.generation[key])
        self.model[key] = TOMBSTONED

    @rule(data=st.data())
    def replay(self, data):
        self.run(self._pick(data, COMPLETED))

    # ------------------------------------------------------------ retire and ACK

    @rule(data=st.data(), own_id=st.booleans())
    def retire(self, data, own_id):
        key = self._pick(data, RUNNING, COMPLETED)
        checkpoint_id = f"actor-{self.serial}" if own_id else (self.active or "actor-x")
        if (self.active is not None and checkpoint_id != self.active) or self.phase == "committed":
            # as a real Gym: while a checkpoint is active only its id retires, and only
            # while preparing or prepared
            try:
                self.core.retire(checkpoint_id, key)
            except CheckpointConflict:
                return
            raise AssertionError(f"retire under {checkpoint_id} in {self.phase} was taken")
        answer, cancel = self.core.retire(checkpoint_id, key)
        answer = _j(answer)
        state = self.model.get(key)
        if state == COMPLETED:
            assert answer["completed_unacknowledged"] and not answer["tombstoned"]
            assert self.core.get(key).reply == self.replies[key]  # never destroyed
        elif state == ACKED:
            assert not answer["retired"] and not answer["tombstoned"]
        else:
            assert answer["tombstoned"] and answer["retired"] == (state == RUNNING)
            assert cancel == (state == RUNNING)
            self.model[key] = TOMBSTONED

    def _receipt_for(self, key, tamper: bool) -> CompletionReceipt:
        base = self.receipts.get(key) or CompletionReceipt(
            rollout_id=key[0],
            attempt_index=key[1],
            execution_generation=1,
            result_identity="x",
            result_digest="0" * 64,
        )
        return base.model_copy(update={"result_digest": "f" * 64}) if tamper else base

    def _ackable(self, key, tamper: bool) -> bool:
        if self.model.get(key) == ACKED and self.core.get(key) is None:
            return True  # compacted at a commit, no store: its receipt is no longer kept
        return self.model.get(key) in (COMPLETED, ACKED) and key in self.receipts and not tamper

    @rule(data=st.data(), tamper=st.integers(0, 4))
    def ack(self, data, tamper):
        key = self._pick(data, COMPLETED, ACKED)
        tamper = tamper == 0
        receipt = self._receipt_for(key, tamper)
        try:
            answer = _j(self.core.acknowledge(receipt))
        except AckRejected:
            assert not self._ackable(key, tamper)
            return
        assert self._ackable(key, tamper)
        assert answer == {
            "acknowledged": self.model[key] == COMPLETED,
            "idempotent": self.model[key] == ACKED,
        }
        self.model[key] = ACKED

    @precondition(lambda self: COMPLETED in self.model.values() or ACKED in self.model.values())
    @rule(data=st.data(), repeat=st.booleans(), spoil=st.integers(0, 7))
    def ack_batch(self, data, repeat, spoil):
        candidates = self._keys_in(COMPLETED, ACKED)
        chosen = data.draw(
            st.lists(st.sampled_from(candidates), min_size=1, max_size=4, unique=True),
            label="chosen",
        )
        tampered: set = set()
        if spoil == 0:  # a key that may never have completed
            chosen = list(dict.fromkeys([*chosen, data.draw(keys, label="odd")]))
        elif spoil == 1:  # one receipt with a field changed
            tampered = {data.draw(st.sampled_from(chosen), label="tampered")}
        receipts = [self._receipt_for(k, k in tampered) for k in chosen]
        before = {k: self.core.get(k) for k in KEYS}
        all_ok = all(self._ackable(k, k in tampered) for k in chosen)
        try:
            answer = _j(self.core.acknowledge_batch(receipts))
        except AckRejected:
            assert not all_ok
            assert {k: self.core.get(k) for k in KEYS} == before  # nothing released
            return
        assert all_ok
        assert answer == {"acknowledged": [r.wire() for r in receipts]}
        for k in chosen:
            self.model[k] = ACKED
        if repeat:  # idempotent
            assert _j(self.core.acknowledge_batch(receipts)) == answer

    # ------------------------------------------------------------ checkpoints

    def _new_id(self) -> str:
        self.serial += 1
        return f"c{self.serial}"

    @rule(other=st.integers(0, 4))
    def prepare(self, other):
        # mostly the active id (or a new one when idle); sometimes another id, which conflicts
        checkpoint_id = self._new_id() if other == 0 or self.active is None else self.active
        try:
            recorded = self.core.begin_prepare(checkpoint_id)
        except CheckpointConflict:
            assert self.active not in (None, checkpoint_id)
            return
        assert self.active in (None, checkpoint_id)
        self.active = checkpoint_id
        if recorded is not None:
            assert self.phase in ("prepared", "committed")
            return
        self.phase = "preparing"
        try:
            report = _j(self.core.finish_prepare(checkpoint_id))
        except PrepareIncomplete as refused:
            assert not refused.body["ready_to_commit"]
            return
        assert report["ready_to_commit"]
        self.phase = "prepared"

    @rule()
    def commit(self):
        checkpoint_id = self.active or self._new_id()
        try:
            recorded, executions = self.core.begin_commit(checkpoint_id)
        except CheckpointNotReady:
            assert self.phase in ("idle", "preparing")
            return
        assert self.phase in ("prepared", "committed")
        if recorded is None:
            unsettled = {k for k, s in self.model.items() if s not in (ACKED, TOMBSTONED)}
            assert unsettled <= {e.key for e in executions}
            self.core.finish_commit(
                checkpoint_id, CommitAnswer(records=len(executions), manifest_digest="0" * 64)
            )
            self.phase = "committed"

    @rule(other=st.integers(0, 4))
    def resume(self, other):
        checkpoint_id = self._new_id() if other == 0 or self.active is None else self.active
        try:
            answer = _j(self.core.resume(checkpoint_id))
        except CheckpointConflict:
            assert self.active not in (None, checkpoint_id)
            return
        assert answer == {"state": "accepting", "released": 0}
        self.phase, self.active = "idle", None
        self.spent.add(checkpoint_id)

    @precondition(lambda self: self.spent)
    @rule(data=st.data())
    def spent_ids_are_stale(self, data):
        checkpoint_id = data.draw(st.sampled_from(sorted(self.spent)))
        for call in (
            lambda: self.core.begin_prepare(checkpoint_id),
            lambda: self.core.begin_commit(checkpoint_id),
            lambda: self.core.status(checkpoint_id),
            lambda: self.core.retire(checkpoint_id, ("z", 0)),
        ):
            try:
                call()
            except StaleCheckpoint:
                continue
            raise AssertionError(f"spent id {checkpoint_id} was accepted")

    # ------------------------------------------------------------ invariants

    @invariant()
    def status_matches_the_model(self):
        report = _j(self.core.status(f"status-{self.serial}"))
        count = Counter(self.model.values())
        assert (
            report["running"],
            report["completed_unacknowledged"],
            report["acknowledged_completed"],
            report["parked"],
        ) == (count[RUNNING], count[COMPLETED], count[ACKED], 0)
        assert report["ready_to_commit"] == (count[RUNNING] == 0 and count[COMPLETED] == 0)
        assert report["state"] == ("accepting" if self.phase == "idle" else "preparing")
        listed = {
            (a["rollout_id"], a["attempt_index"])
            for a in report["completed_unacknowledged_attempts"]
        }
        assert listed == {k for k, s in self.model.items() if s == COMPLETED}

    @invariant()
    def every_key_is_in_its_model_state(self):
        for key in KEYS:
            state = self.core.state_of(key)
            assert (state.value if state else None) == self.model.get(key)

    @invariant()
    def completed_replies_are_kept(self):
        for key, state in self.model.items():
            if state == COMPLETED:
                assert self.core.get(key).reply == self.replies[key]


ParticipantMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)
TestParticipantMachine = ParticipantMachine.TestCase
TestParticipantMachine.pytestmark = [pytest.mark.slow]
