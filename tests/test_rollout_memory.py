"""The rollout memory: one owner of what is known about each rollout (pure, no Ray)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rl_gym_actors import errors
from rl_gym_actors.core.rollout_memory import Dispatch, RolloutMemory
from rl_gym_actors.core.rollout_record import RolloutRecord, RolloutState
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.protocol import CompletionReceipt


def outcome(status="failed", attempt=0, *, result=False, acked=False, rid="r1"):
    receipt = None
    if result:
        receipt = CompletionReceipt(
            rollout_id=rid,
            attempt_index=attempt,
            execution_generation=1,
            result_identity="x",
            result_digest="d" * 64,
        )
    return Outcome(
        rollout_id=rid,
        status=status,
        attempt_index=attempt,
        receipt=receipt,
        reply={"reward": 1.0} if result else None,
        acked=acked,
        reason=None if status == "sealed" else "why",
        failure=None if status == "sealed" else FailureKind.LOST,
    )


def run(memory, rid, out=None, *, named=0, lost=False):
    """One row of ``rid``: planned, taken, and its dispatch ended with ``out``."""
    plan = memory.plan(rid, named)
    memory.take(rid, plan)
    if plan.ready is None:
        memory.end(rid, plan, out, lost=lost)
    return plan


def test_an_unseen_rollout_starts_where_it_is_named_and_retires_the_try_before():
    memory = RolloutMemory()
    assert memory.plan("r1") == Dispatch(0, None)
    assert memory.plan("r1", 3) == Dispatch(3, 2)
    assert len(memory) == 0  # planning changes nothing


def test_a_failed_rollout_comes_again_at_its_next_try_after_retiring_its_last():
    memory = RolloutMemory()
    run(memory, "r1", outcome("failed", 2))
    assert memory.state("r1") is RolloutState.UNSETTLED
    assert memory.plan("r1") == Dispatch(3, 2)
    assert memory.plan("r1", 7) == Dispatch(7, 2)  # a later named try is honoured


def test_a_sealed_rollout_sent_again_gets_its_result_back_repeated_until_forgotten():
    memory = RolloutMemory()
    sealed = outcome("sealed", 1, result=True, acked=True)
    run(memory, "r1", sealed)
    plan = memory.plan("r1")
    assert (plan.first_attempt, plan.previous_attempt) == (2, None)  # nothing to retire
    assert plan.ready is not None and plan.ready.repeated and plan.ready.tries == 0
    assert (plan.ready.status, plan.ready.receipt) == ("sealed", sealed.receipt)
    memory.take("r1", plan)  # answered without a dispatch: still sealed
    assert memory.state("r1") is RolloutState.SEALED and memory.in_flight == 0
    run(memory, "r2", outcome("failed", 0, rid="r2"))
    memory.begin("r3")
    assert memory.forget_settled() == 1 and len(memory) == 2  # failed and in flight stay
    assert memory.plan("r1") == Dispatch(0, None)  # forgotten: Gym decides


def test_an_abandoned_result_is_kept_for_the_next_row_once():
    memory = RolloutMemory()
    run(memory, "r1", outcome("abandoned", 0, result=True, acked=True))
    assert memory.state("r1") is RolloutState.KEPT
    plan = memory.plan("r1")
    ready = plan.ready
    assert ready is not None and (ready.status, ready.adopted, ready.tries) == ("sealed", True, 0)
    assert ready.reason is None and ready.failure is None and not ready.repeated
    memory.take("r1", plan)
    again = memory.plan("r1").ready  # handed out once: from now on it is repeated
    assert again is not None and again.repeated and again.adopted


def test_a_handed_over_try_the_gate_adopted_is_the_next_rows_result_once():
    memory = RolloutMemory()
    run(memory, "r1", outcome("failed", 1))  # the try was handed to the ledger unsettled
    adopted = outcome("abandoned", 1, result=True)
    assert memory.adopt_handed(adopted)
    assert memory.state("r1") is RolloutState.KEPT and memory.in_flight == 0
    assert memory.results() == ([], [adopted.model_copy(update={"acked": False})])
    plan = run(memory, "r1")
    assert (
        plan.ready is not None
        and plan.ready.status == "sealed"
        and plan.ready.reply == {"reward": 1.0}
    )
    assert memory.state("r1") is RolloutState.SEALED
    assert not memory.adopt_handed(adopted)  # only a rollout without a result takes one
    run(memory, "r2", outcome("failed", 3, rid="r2"))
    assert not memory.adopt_handed(outcome("abandoned", 2, result=True, rid="r2"))  # older try
    assert memory.state("r2") is RolloutState.UNSETTLED
    assert memory.adopt_handed(outcome("abandoned", 0, result=True, rid="r3"))  # unknown: kept
    assert memory.state("r3") is RolloutState.KEPT


def test_an_untaken_result_is_kept_only_for_a_rollout_with_a_result():
    memory = RolloutMemory()
    sealed = outcome("sealed", 0, result=True)
    memory.keep(sealed)  # unknown rollout: nothing kept
    assert memory.plan("r1").ready is None
    run(memory, "r2", outcome("failed", 0, rid="r2"))
    memory.keep(outcome("sealed", 0, result=True, rid="r2"))  # it failed: nothing to keep
    assert memory.state("r2") is RolloutState.UNSETTLED
    run(memory, "r1", sealed)
    memory.keep(sealed)
    assert memory.state("r1") is RolloutState.KEPT and memory.plan("r1").ready is not None


def test_a_dispatch_that_ends_without_news_leaves_what_was_known():
    memory = RolloutMemory()
    run(memory, "r1", outcome("failed", 1))
    assert run(memory, "r1", None) == Dispatch(2, 1)  # called off (not dispatched, refused)
    assert memory.plan("r1") == Dispatch(2, 1) and memory.state("r1") is RolloutState.UNSETTLED
    run(memory, "r2", None, named=4)  # never tried: new again, and still named at 4
    assert memory.state("r2") is RolloutState.NEW and memory.plan("r2", 4) == Dispatch(4, 3)


def test_a_lost_dispatch_is_unsure_until_the_ledger_names_the_current_try():
    memory = RolloutMemory(max_tries=3)
    run(memory, "r1", lost=True)
    plan = memory.plan("r1")
    assert memory.state("r1") is RolloutState.LOST
    assert plan == Dispatch(3, 0, lost_from=0)  # the guess: its first try
    assert plan.retire_given(1) == 1  # the ledger heard of try 1
    assert plan.retire_given(None) == 0  # the ledger never heard: the guess
    run(memory, "r1", None)  # a dispatch of it called off: still unsure
    assert memory.plan("r1") == plan


def test_the_ledger_knowing_only_an_older_dispatch_tells_nothing_new():
    memory = RolloutMemory(max_tries=2)
    run(memory, "r1", outcome("failed", 2))
    run(memory, "r1", lost=True)  # dispatched from 3
    plan = memory.plan("r1")
    assert plan == Dispatch(5, 3, lost_from=3)
    assert plan.retire_given(2) == 3  # from the earlier, settled dispatch
    assert plan.retire_given(4) == 4


def test_a_rollout_runs_once_at_a_time_and_in_flight_counts_it():
    memory = RolloutMemory()
    memory.begin("r1")
    memory.begin("r2")
    with pytest.raises(errors.IllegalTransition):
        memory.begin("r1")  # a second dispatch beside the running one
    assert memory.in_flight == 2 and memory.running("r1")
    memory.end("r1", Dispatch(0, None), outcome("failed", 0))
    with pytest.raises(errors.IllegalTransition):
        memory.end("r1", Dispatch(0, None), outcome("failed", 0))  # it ended already
    with pytest.raises(errors.IllegalTransition):
        memory.end("r9", Dispatch(0, None), outcome("failed", 0, rid="r9"))  # never began
    assert memory.in_flight == 1 and not memory.running("r1")


def test_an_abandon_before_its_dispatch_applies_to_that_dispatch_only():
    memory = RolloutMemory(view=True)
    memory.request_abandon("r1", 3)
    assert not memory.take_abandon("r1", 0)  # an earlier dispatch: not abandoned
    assert memory.take_abandon("r1", 3)
    assert not memory.take_abandon("r1", 3)  # taken once
    memory.begin("r1")
    memory.end_run("r1", 3, 3, sealed=False, acked=False)
    memory.request_abandon("r1", 3)  # that dispatch already ended
    assert not memory.take_abandon("r1", 3)


def test_an_actor_view_holds_a_result_only_when_its_try_sealed_and_was_released():
    memory = RolloutMemory(view=True)
    memory.begin("r1")
    memory.end_run("r1", 0, 1, sealed=True, acked=True)
    assert memory.holds_result("r1", 1) and not memory.holds_result("r1", 0)
    assert not isinstance(memory.record("r1"), RolloutRecord)  # the view keeps no results
    memory.begin("r1")  # sent again after its orchestrator forgot it
    memory.end_run("r1", 2, None, sealed=False, acked=False)  # no try made
    assert memory.state("r1") is RolloutState.UNSETTLED and not memory.holds_result("r1", 1)
    memory.begin("r2")
    memory.end_run("r2", 0, 0, sealed=True, acked=False)  # left to the checkpoint
    assert not memory.holds_result("r2", 0)


def test_the_least_recently_touched_rollouts_are_forgotten_beyond_capacity_but_not_running():
    memory = RolloutMemory(capacity=2)
    memory.begin("a")
    run(memory, "b", outcome("failed", 0, rid="b"))
    run(memory, "c", outcome("failed", 0, rid="c"))
    assert len(memory) == 2 and memory.record("b") is None and memory.running("a")
    assert memory.in_flight == 1


# ---------------------------------------------------------------- any interleaving

RIDS = ("r1", "r2", "r3")


class MemoryMachine(RuleBasedStateMachine):
    """Rows planned, taken and ended in any order: the record stays one of the meant states."""

    def __init__(self) -> None:
        super().__init__()
        self.memory = RolloutMemory(max_tries=3)
        self.plans: dict[str, Dispatch] = {}

    @precondition(lambda self: len(self.plans) < len(RIDS))
    @rule(rid=st.sampled_from(RIDS), named=st.integers(0, 4))
    def take_a_row(self, rid, named):
        if self.memory.running(rid):
            return
        plan = self.memory.plan(rid, named)
        assert (
            plan.previous_attempt is None
            or plan.previous_attempt < plan.first_attempt
            or (plan.lost_from is None and plan.previous_attempt == named - 1)
        )
        self.memory.take(rid, plan)
        if plan.ready is None:
            self.plans[rid] = plan

    @precondition(lambda self: self.plans)
    @rule(
        data=st.data(),
        kind=st.sampled_from(["sealed", "abandoned", "failed", "untried", "none", "lost"]),
        tries=st.integers(1, 3),
        acked=st.booleans(),
    )
    def end_a_dispatch(self, data, kind, tries, acked):
        rid = data.draw(st.sampled_from(sorted(self.plans)))
        plan = self.plans.pop(rid)
        first = plan.first_attempt
        if kind == "lost":
            self.memory.end(rid, plan, lost=True)
            return
        if kind == "none":
            self.memory.end(rid, plan)
            return
        attempt = None if kind == "untried" else first + tries - 1
        status = "failed" if kind == "untried" else kind
        out = outcome(status, attempt, result=kind != "failed" and attempt is not None, rid=rid)
        self.memory.end(rid, plan, out.model_copy(update={"acked": acked}))

    @rule(rid=st.sampled_from(RIDS), status=st.sampled_from(["sealed", "abandoned"]))
    def not_taken(self, rid, status):
        self.memory.keep(outcome(status, 0, result=True, rid=rid))

    @rule()
    def checkpoint(self):
        self.memory.forget_settled()

    @invariant()
    def records_are_meant_states(self):
        running = 0
        for rid in RIDS:
            rec = self.memory.record(rid)
            if rec is None:
                continue
            assert isinstance(rec, RolloutRecord)
            S = RolloutState
            running += rec.state is S.RUNNING
            assert (rec.kept is not None) == (rec.state is S.KEPT)
            assert (rec.result is not None) == (rec.state is S.SEALED)
            if rec.state in (S.UNSETTLED, S.LOST, S.KEPT, S.SEALED):
                assert rec.current is not None and rec.current < rec.next_fresh
            if rec.state is S.LOST:
                assert rec.current == rec.dispatched_from
            if rec.acked:
                assert rec.state in (S.KEPT, S.SEALED)
            assert (rid in self.plans) == (rec.state is S.RUNNING)
        assert running == self.memory.in_flight


MemoryMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)
test_memory_machine = MemoryMachine.TestCase
test_memory_machine.pytestmark = [pytest.mark.slow]  # ~5 s: out of make test-fast
