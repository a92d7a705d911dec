"""The rollout memory: one owner of what is known about each rollout (pure, no Ray)."""

from __future__ import annotations

from rl_gym_actors.core.rollout_memory import Dispatch, RolloutMemory
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


def test_an_unseen_rollout_starts_where_it_is_named_and_retires_the_try_before():
    memory = RolloutMemory()
    assert memory.plan("r1") == Dispatch(0, None)
    assert memory.plan("r1", 3) == Dispatch(3, 2)
    assert len(memory) == 0  # planning changes nothing


def test_a_failed_rollout_comes_again_at_its_next_try_after_retiring_its_last():
    memory = RolloutMemory()
    memory.finish_outcome("r1", 0, outcome("failed", 2))
    assert memory.plan("r1") == Dispatch(3, 2)
    assert memory.plan("r1", 7) == Dispatch(7, 2)  # a later named try is honoured


def test_a_sealed_rollout_sent_again_gets_its_result_back_repeated_until_forgotten():
    memory = RolloutMemory()
    sealed = outcome("sealed", 1, result=True, acked=True)
    memory.finish_outcome("r1", 0, sealed)
    plan = memory.plan("r1")
    assert (plan.first_attempt, plan.previous_attempt) == (2, None)  # nothing to retire
    assert plan.ready is not None and plan.ready.repeated and plan.ready.tries == 0
    assert (plan.ready.status, plan.ready.receipt) == ("sealed", sealed.receipt)
    assert memory.holds_result("r1", 1) and not memory.holds_result("r1", 0)
    memory.finish_outcome("r2", 0, outcome("failed", 0, rid="r2"))
    memory.begin("r3")
    assert memory.forget_settled() == 1 and len(memory) == 2  # failed and in flight stay
    assert memory.plan("r1") == Dispatch(0, None)  # forgotten: Gym decides


def test_an_abandoned_result_is_kept_for_the_next_row_once():
    memory = RolloutMemory()
    memory.finish_outcome("r1", 0, outcome("abandoned", 0, result=True, acked=True))
    ready = memory.plan("r1").ready
    assert ready is not None and (ready.status, ready.adopted, ready.tries) == ("sealed", True, 0)
    assert ready.reason is None and ready.failure is None and not ready.repeated
    memory.hand_out("r1")
    again = memory.plan("r1").ready  # handed out once: from now on it is repeated
    assert again is not None and again.repeated and again.adopted


def test_an_untaken_result_is_kept_only_for_a_settled_rollout():
    memory = RolloutMemory()
    sealed = outcome("sealed", 0, result=True)
    memory.keep(sealed)  # unknown rollout: nothing kept
    assert memory.plan("r1").ready is None
    memory.finish_outcome("r1", 0, sealed)
    memory.keep(sealed)
    assert memory.plan("r1").ready is not None


def test_a_dispatch_without_a_try_leaves_what_was_known():
    memory = RolloutMemory()
    memory.finish_outcome("r1", 0, outcome("failed", 1))
    memory.finish("r1", 2, None, result=False)
    assert memory.plan("r1") == Dispatch(2, 1)


def test_a_lost_dispatch_is_unsure_until_the_ledger_names_the_current_try():
    memory = RolloutMemory()
    memory.lose("r1", 0, max_tries=3)
    assert memory.unsure("r1")
    assert memory.plan("r1") == Dispatch(3, 0)  # the guess: its first try
    memory.learn_current("r1", 1)  # the ledger heard of try 1
    assert not memory.unsure("r1")
    assert memory.plan("r1") == Dispatch(3, 1)


def test_the_ledger_knowing_only_an_older_dispatch_tells_nothing_new():
    memory = RolloutMemory()
    memory.finish_outcome("r1", 0, outcome("failed", 2))
    memory.lose("r1", 3, max_tries=2)
    memory.learn_current("r1", 2)  # from the earlier, settled dispatch
    assert memory.plan("r1") == Dispatch(5, 3)
    memory.learn_current("r1", 4)  # already sure: ignored
    assert memory.plan("r1") == Dispatch(5, 3)
    memory.lose("r1", 5, max_tries=2)
    memory.learn_current("r1", None)  # the ledger never heard: the guess
    assert memory.plan("r1") == Dispatch(7, 5)


def test_in_flight_is_counted_once_per_rollout():
    memory = RolloutMemory()
    memory.begin("r1")
    memory.begin("r1")
    memory.begin("r2")
    assert memory.in_flight == 2 and memory.running("r1")
    memory.end("r1")
    memory.end("r1")
    assert memory.in_flight == 1 and not memory.running("r1")


def test_an_abandon_before_its_dispatch_applies_to_that_dispatch_only():
    memory = RolloutMemory()
    memory.request_abandon("r1", 3)
    assert not memory.take_abandon("r1", 0)  # an earlier dispatch: not abandoned
    assert memory.take_abandon("r1", 3)
    assert not memory.take_abandon("r1", 3)  # taken once
    memory.finish("r1", 3, 3, result=False)
    memory.request_abandon("r1", 3)  # that dispatch already ended
    assert not memory.take_abandon("r1", 3)


def test_the_least_recently_touched_rollouts_are_forgotten_beyond_capacity():
    memory = RolloutMemory(capacity=2)
    memory.begin("a")
    memory.finish_outcome("b", 0, outcome("failed", 0, rid="b"))
    memory.finish_outcome("c", 0, outcome("failed", 0, rid="c"))
    assert len(memory) == 2 and memory.facts("a") is None and memory.in_flight == 0
