"""core/rollout/ path by path: each way a reply gets lost and its repair, with a fake clock."""

from __future__ import annotations

import pytest

from rl_gym_actors import errors
from rl_gym_actors.config import TryPolicy
from rl_gym_actors.core import rollout as r
from rl_gym_actors.core.attempt_reports import AttemptState
from rl_gym_actors.protocol import CompletionReceipt, RetireAnswer

POLICY = TryPolicy(
    rollout_s=10.0, receipt_s=2.0, max_tries=3, control_s=4.0, admission_wait_s=5.0, ack="on_seal"
)
RID = "r7"
REPLY = {"id": "r-r7", "reward": 0.5}
RETIRED = RetireAnswer(retired=True, tombstoned=True)
COMPLETED = RetireAnswer(retired=False, tombstoned=False, completed_unacknowledged=True)


def receipt(att: int = 0, reply=REPLY) -> CompletionReceipt:
    return CompletionReceipt.for_reply(RID, att, 1, reply)


def machine(**kw) -> r.RolloutMachine:
    return r.RolloutMachine(RID, endpoint="http://127.0.0.1:1", owner="a0", policy=POLICY, **kw)


def last(effects):
    assert effects, "expected effects"
    return effects[-1]


def reports(effects):
    return [
        (e.report.attempt_index, e.report.state, e.report.released)
        for e in effects
        if isinstance(e, r.Report)
    ]


def test_happy_path_seals_and_acks_one_try():
    m = machine()
    fx = m.handle(r.Start(100.0))
    assert last(fx) == r.StartRun(0, 110.0)
    assert reports(fx) == [(0, AttemptState.RUNNING, False)]
    assert last(m.handle(r.RunReplied(101.0, REPLY))) == r.FetchReceipt(0, 103.0)
    fx = m.handle(r.ReceiptReceived(101.5, receipt()))
    assert isinstance(fx[0], r.Seal) and fx[0].adopted is False
    assert last(fx) == r.Ack(receipt(), 105.5)
    fx = m.handle(r.AckAnswered(102.0))
    out = last(fx).outcome
    assert (out.status, out.attempt_index, out.reward, out.adopted, out.acked, out.tries) == (
        "sealed",
        0,
        0.5,
        False,
        True,
        1,
    )
    assert reports(fx) == [(0, AttemptState.ACKED, False), (0, AttemptState.ACKED, True)]
    assert m.done


def test_deadline_while_running_retires_cancels_and_runs_next_try():
    m = machine()
    m.handle(r.Start(0.0))
    assert last(m.handle(r.DeadlineFired(10.0))) == r.Retire(0, 14.0)
    fx = m.handle(r.RetireAnswered(10.1, RETIRED))
    assert reports(fx) == [(0, AttemptState.TOMBSTONED, False), (1, AttemptState.RUNNING, False)]
    assert last(fx) == r.StartRun(1, 20.1)
    m.handle(r.RunReplied(11.0, REPLY))
    m.handle(r.ReceiptReceived(11.0, receipt(1)))
    out = last(m.handle(r.AckAnswered(11.0))).outcome
    assert (out.status, out.attempt_index, out.tries, out.adopted) == ("sealed", 1, 2, False)


def test_deadline_after_gym_finished_adopts_without_next_try():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.DeadlineFired(10.0))
    assert last(m.handle(r.RetireAnswered(10.1, COMPLETED))) == r.Replay(0, 14.1)
    assert last(m.handle(r.ReplayReplied(10.2, REPLY))) == r.FetchReceipt(0, 14.2)
    fx = m.handle(r.ReceiptReceived(10.3, receipt()))
    assert fx[0] == r.Seal(0, REPLY, receipt(), True)
    out = last(m.handle(r.AckAnswered(10.4))).outcome
    assert (out.status, out.attempt_index, out.adopted, out.tries, out.reward) == (
        "sealed",
        0,
        True,
        1,
        0.5,
    )


def test_receipt_fetch_timeout_gives_up_and_adopts():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.RunReplied(1.0, REPLY))
    # the client gave up at the step deadline: no repeat, retire at once
    fx = m.handle(r.StepFailed(3.0, r.FailureKind.DEADLINE, "slow"))
    assert last(fx) == r.Retire(0, 7.0)
    assert "receipt fetch failed" in m.reason
    m.handle(r.RetireAnswered(3.1, COMPLETED))
    m.handle(r.ReplayReplied(3.2, REPLY))
    m.handle(r.ReceiptReceived(3.3, receipt()))
    out = last(m.handle(r.AckAnswered(3.4))).outcome
    assert out.status == "sealed" and out.adopted and out.attempt_index == 0 and out.tries == 1


def test_receipt_not_completed_yet_is_repeated_within_receipt_s():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.RunReplied(1.0, REPLY))
    fx = m.handle(r.StepFailed(1.1, r.FailureKind.NOT_COMPLETED))
    assert last(fx) == r.WaitUntil(1.1 + TryPolicy().retry.backoff(1))  # the policy's backoff
    assert last(m.handle(r.Woke(last(fx).wake_ts))) == r.FetchReceipt(0, 3.0)
    with pytest.raises(r.IllegalTransition):
        m.handle(r.Woke(1.3))  # not asleep any more
    fx = m.handle(r.StepFailed(1.2, r.FailureKind.NOT_COMPLETED))
    assert last(fx) == r.WaitUntil(1.2 + TryPolicy().retry.backoff(2))


@pytest.mark.parametrize("kind", ["LOST", "SERVER_ERROR"])
def test_a_failure_the_call_retried_itself_is_not_repeated_by_the_machine(kind):
    # the client's retry decider already repeated it until it gave up: the machine moves on
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.RunReplied(1.0, REPLY))
    fx = m.handle(r.StepFailed(1.1, r.FailureKind[kind]))
    assert last(fx) == r.Retire(0, 5.1) and "receipt fetch failed" in m.reason


def test_abandon_running_retires_and_keeps_an_adopted_result():
    m = machine()
    m.handle(r.Start(0.0))
    assert isinstance(last(m.handle(r.AbandonRequested(1.0))), r.Retire)
    m.handle(r.RetireAnswered(1.1, COMPLETED))
    m.handle(r.ReplayReplied(1.2, REPLY))
    m.handle(r.ReceiptReceived(1.3, receipt()))
    out = last(m.handle(r.AckAnswered(1.4))).outcome
    assert (out.status, out.adopted, out.reward, out.acked) == ("abandoned", True, 0.5, True)


def test_abandon_running_cancelled_ends_abandoned_without_next_try():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.AbandonRequested(1.0))
    fx = m.handle(r.RetireAnswered(1.1, RETIRED))
    out = last(fx).outcome
    assert out.status == "abandoned" and not out.has_result and out.tries == 1
    assert not any(isinstance(e, r.StartRun) for e in fx)


def test_abandon_while_acking_finishes_the_ack_first():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.RunReplied(1.0, REPLY))
    m.handle(r.ReceiptReceived(1.2, receipt()))
    assert m.handle(r.AbandonRequested(1.1)) == []
    out = last(m.handle(r.AckAnswered(1.3))).outcome
    assert out.status == "abandoned" and out.has_result and not out.adopted


def test_abandon_while_fetching_the_receipt_retires_then_adopts():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.RunReplied(1.0, REPLY))
    m.handle(r.StepFailed(1.1, r.FailureKind.NOT_COMPLETED))  # asleep before the next fetch
    assert last(m.handle(r.AbandonRequested(1.2))) == r.Retire(0, 5.2)
    m.handle(r.RetireAnswered(1.3, COMPLETED))
    m.handle(r.ReplayReplied(1.4, REPLY))
    m.handle(r.ReceiptReceived(1.5, receipt()))
    out = last(m.handle(r.AckAnswered(1.6))).outcome
    assert out.status == "abandoned" and out.adopted and out.reward == 0.5


def test_abandon_before_start_never_dispatches():
    m = machine()
    m.handle(r.AbandonRequested(0.0))
    fx = m.handle(r.Start(0.0))
    assert [type(e) for e in fx] == [r.Finish] and fx[0].outcome.tries == 0


def test_admission_closed_waits_and_resends_the_same_key():
    m = machine()
    m.handle(r.Start(0.0))
    fx = m.handle(r.RunAdmissionClosed(1.0))
    assert m.phase is r.RolloutPhase.ADMISSION_WAIT and isinstance(last(fx), r.WaitUntil)
    assert last(m.handle(r.Woke(last(fx).wake_ts))) == r.StartRun(0, last(fx).wake_ts + 10.0)
    assert m.tries == 1


def test_admission_closed_past_admission_wait_gives_up_without_next_try():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.RunAdmissionClosed(1.0))
    m.handle(r.Woke(1.05))
    fx = m.handle(r.RunFailed(6.5, r.FailureKind.ADMISSION_CLOSED))
    # Gym refused every send of the try, so nothing of it ran: no retire; the failure is typed
    assert not any(isinstance(e, r.Retire) for e in fx)
    out = last(fx).outcome
    assert out.status == "failed" and "admission" in out.reason and out.tries == 1
    assert out.failure is r.FailureKind.ADMISSION_CLOSED and out.attempt_index == 0
    assert reports(fx) == [(0, AttemptState.RUNNING, True)]  # released: the ledger settles it


def test_admission_closed_after_a_duplicate_retires_before_it_fails():
    # the key ran elsewhere (a dead driver's run) before admission closed: it may still run
    m = machine()
    m.handle(r.Start(0.0))
    fx = m.handle(r.RunFailed(0.5, r.FailureKind.DUPLICATE))
    m.handle(r.Woke(last(fx).wake_ts))
    fx = m.handle(r.RunAdmissionClosed(1.0))
    m.handle(r.Woke(last(fx).wake_ts))
    fx = m.handle(r.RunAdmissionClosed(6.5))
    assert last(fx) == r.Retire(0, 6.5 + POLICY.control_s)
    out = last(m.handle(r.RetireAnswered(6.6, RETIRED))).outcome
    assert out.failure is r.FailureKind.ADMISSION_CLOSED and out.status == "failed"


def test_abandon_during_admission_wait_retires():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.RunAdmissionClosed(1.0))
    assert isinstance(last(m.handle(r.AbandonRequested(1.01))), r.Retire)


def test_stale_on_a_later_try_moves_to_the_next_try():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.DeadlineFired(10.0))
    assert last(m.handle(r.RetireAnswered(10.1, RETIRED))) == r.StartRun(1, 20.1)
    fx = m.handle(r.RunFailed(11.0, r.FailureKind.STALE, "retired by restore"))
    assert last(fx) == r.StartRun(2, 21.0)
    assert reports(fx)[0] == (1, AttemptState.TOMBSTONED, False)


def test_stale_first_try_of_a_new_rollout_that_was_acked_fails_forgotten():
    m = machine()
    m.handle(r.Start(0.0))
    fx = m.handle(r.RunFailed(1.0, r.FailureKind.STALE, "completed result was acknowledged"))
    assert last(fx) == r.FetchReceipt(0, 5.0) and m.phase is r.RolloutPhase.STALE_CHECK
    fx = m.handle(r.DigestMismatch(1.1, receipt(), "no reply in hand"))
    out = last(fx).outcome
    assert out.status == "failed" and out.failure is r.FailureKind.FORGOTTEN and out.tries == 1
    assert out.failure.is_data and out.reward is None
    assert not any(isinstance(e, r.StartRun) for e in fx)


def test_stale_first_try_of_a_new_rollout_that_was_tombstoned_moves_on():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.RunFailed(1.0, r.FailureKind.STALE, "retired"))
    fx = m.handle(r.StepFailed(1.1, r.FailureKind.STALE, "tombstoned"))
    assert last(fx) == r.StartRun(1, 11.1)
    assert reports(fx)[0] == (0, AttemptState.TOMBSTONED, False)


def test_agent_failed_retires_each_try_then_fails_typed_with_its_text():
    m = machine()
    fx = m.handle(r.Start(0.0))
    for i in range(3):
        assert last(fx) == r.StartRun(i, 10.0)
        fx = m.handle(r.RunFailed(0.0, r.FailureKind.AGENT_FAILED, "boom"))
        assert last(fx) == r.Retire(i, 4.0)
        fx = m.handle(r.RetireAnswered(0.0, RetireAnswer(retired=False, tombstoned=True)))
    out = last(fx).outcome
    assert out.status == "failed" and out.tries == 3 and "agent_failed: boom" in out.reason
    assert out.failure is r.FailureKind.AGENT_FAILED and out.failure.is_transport


def test_agent_failed_whose_try_completed_after_all_is_adopted():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.RunFailed(0.5, r.FailureKind.AGENT_FAILED, "502 Bad Gateway"))
    assert last(m.handle(r.RetireAnswered(0.6, COMPLETED))) == r.Replay(0, 4.6)


def test_duplicate_waits_for_the_running_key_and_takes_its_reply():
    m = machine()
    m.handle(r.Start(0.0))
    fx = m.handle(r.RunFailed(1.0, r.FailureKind.DUPLICATE, "running"))
    assert isinstance(last(fx), r.WaitUntil) and m.phase is r.RolloutPhase.ADMISSION_WAIT
    assert last(m.handle(r.Woke(1.05))) == r.StartRun(0, 11.05)  # the same key again
    assert last(m.handle(r.RunReplied(2.0, REPLY, replayed=True))) == r.FetchReceipt(0, 4.0)
    fx = m.handle(r.ReceiptReceived(2.1, receipt()))
    assert fx[0].adopted is True and m.tries == 1


def test_duplicate_past_rollout_s_retires_and_moves_on():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.RunFailed(1.0, r.FailureKind.DUPLICATE))
    m.handle(r.Woke(1.05))
    assert last(m.handle(r.RunFailed(11.5, r.FailureKind.DUPLICATE))) == r.Retire(0, 15.5)
    assert last(m.handle(r.RetireAnswered(11.6, RETIRED))) == r.StartRun(1, 21.6)


def test_at_checkpoint_seals_without_ack_and_hands_the_result_to_the_ledger():
    m = r.RolloutMachine(
        RID,
        endpoint="http://127.0.0.1:1",
        owner="a0",
        policy=POLICY.model_copy(update={"ack": "at_checkpoint"}),
    )
    m.handle(r.Start(0.0))
    m.handle(r.RunReplied(1.0, REPLY))
    fx = m.handle(r.ReceiptReceived(1.5, receipt()))
    assert not any(isinstance(e, r.Ack) for e in fx)
    assert reports(fx) == [(0, AttemptState.SEALED, False), (0, AttemptState.SEALED, True)]
    out = last(fx).outcome
    assert out.status == "sealed" and out.acked is False and out.reward == 0.5


def test_rejected_run_retires_and_fails_without_next_try():
    m = machine()
    m.handle(r.Start(0.0))
    assert isinstance(last(m.handle(r.RunFailed(0.1, r.FailureKind.REJECTED, "422"))), r.Retire)
    out = last(m.handle(r.RetireAnswered(0.2, RETIRED))).outcome
    assert out.status == "failed" and out.tries == 1
    assert out.failure is r.FailureKind.REJECTED and out.failure.is_data


def test_redispatch_adopts_a_finished_previous_attempt():
    m = machine(first_attempt=0, previous_attempt=2)
    assert last(m.handle(r.Start(0.0))) == r.Retire(2, 4.0)
    m.handle(r.RetireAnswered(0.1, COMPLETED))
    m.handle(r.ReplayReplied(0.2, REPLY))
    m.handle(r.ReceiptReceived(0.3, receipt(2)))
    out = last(m.handle(r.AckAnswered(0.4))).outcome
    assert (out.status, out.attempt_index, out.adopted, out.tries) == ("sealed", 2, True, 0)


def test_redispatch_cancels_previous_then_starts_after_it():
    m = machine(first_attempt=0, previous_attempt=2)
    m.handle(r.Start(0.0))
    assert last(m.handle(r.RetireAnswered(0.1, RETIRED))) == r.StartRun(3, 10.1)


def test_retire_that_keeps_failing_hands_over_and_stops():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.DeadlineFired(10.0))
    fx = m.handle(r.StepFailed(10.1, r.FailureKind.LOST))  # the call retried it already
    assert reports(fx)[0] == (0, AttemptState.RUNNING, True)
    assert last(fx).outcome.status == "failed" and m.handed_over == [0]
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.DeadlineFired(10.0))
    fx = m.handle(r.StepFailed(14.0, r.FailureKind.DEADLINE))
    assert reports(fx)[0] == (0, AttemptState.RUNNING, True)
    assert last(fx).outcome.status == "failed" and m.handed_over == [0]


def test_ack_failure_keeps_the_result_and_hands_it_to_the_ledger():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.RunReplied(1.0, REPLY))
    m.handle(r.ReceiptReceived(1.0, receipt()))
    fx = m.handle(r.StepFailed(1.1, r.FailureKind.REJECTED, "differs"))
    out = last(fx).outcome
    assert out.status == "sealed" and not out.acked and m.handed_over == [0]
    assert reports(fx) == [(0, AttemptState.SEALED, True)]


def test_digest_mismatch_on_replayed_reply_releases_it_and_tries_again():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.RunReplied(1.0, REPLY))
    bad = receipt(0, {"id": "r-r7", "reward": 9})
    assert isinstance(last(m.handle(r.DigestMismatch(1.1, bad, "x"))), r.Retire)
    m.handle(r.RetireAnswered(1.2, COMPLETED))
    m.handle(r.ReplayReplied(1.3, REPLY))
    assert last(m.handle(r.DigestMismatch(1.4, bad, "x"))) == r.Ack(bad, 5.4)
    fx = m.handle(r.AckAnswered(1.5))
    assert last(fx) == r.StartRun(1, 11.5) and m.sealed is None


def test_illegal_transition_is_named():
    m = machine()
    with pytest.raises(r.IllegalTransition) as info:
        m.handle(r.RunReplied(0.0, REPLY))
    assert info.value.phase == "new" and info.value.event == "RunReplied"
    assert isinstance(info.value, errors.RlGymError)


def test_receipt_problem_checks_key_and_digest():
    assert r.receipt_problem(receipt(), RID, 0, REPLY) is None
    assert "digest" in r.receipt_problem(receipt(), RID, 0, {"id": "r-r7", "reward": 1})
    assert "not" in r.receipt_problem(receipt(1), RID, 0, REPLY)


def test_a_retire_refused_by_a_checkpoint_waits_for_it_up_to_admission_wait_s():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.DeadlineFired(10.0))  # Retire(0, deadline 14.0)
    fx = m.handle(r.StepFailed(13.9, r.FailureKind.CONFLICT, "checkpoint_conflict"))
    wake = last(fx).wake_ts
    fx = m.handle(r.Woke(wake))
    assert isinstance(last(fx), r.Retire) and last(fx).deadline_ts > 14.0  # renewed
    least = POLICY.retry.min_try_s + POLICY.retry.reply_margin_s
    fx = m.handle(r.StepFailed(14.7, r.FailureKind.CONFLICT))
    # the last wait ends while a repeat still has time before admission_wait_s (15.0)
    assert isinstance(last(fx), r.WaitUntil) and last(fx).wake_ts == pytest.approx(15.0 - least)
    fx = m.handle(r.Woke(last(fx).wake_ts))
    assert isinstance(last(fx), r.Retire) and last(fx).deadline_ts == 15.0
    fx = m.handle(r.StepFailed(14.9, r.FailureKind.CONFLICT))  # no time for another: fails
    assert last(fx).outcome.status == "failed" and m.handed_over == [0]
    assert last(fx).outcome.failure is r.FailureKind.CONFLICT


def test_a_repeat_is_never_sent_without_time_left():
    m = machine()
    m.handle(r.Start(0.0))
    m.handle(r.DeadlineFired(10.0))  # Retire(0, deadline 14.0); a checkpoint refuses it
    fx = m.handle(r.StepFailed(10.1, r.FailureKind.CONFLICT, "checkpoint_conflict"))
    assert isinstance(last(fx), r.WaitUntil)
    # the wake comes late (a busy loop), past the last moment a repeat fits: nothing is sent,
    # the refusal that began the wait ends the step as if it had come now
    fx = m.handle(r.Woke(14.9))
    assert not any(isinstance(e, r.Retire) for e in fx)
    out = last(fx).outcome
    assert out.status == "failed" and out.failure is r.FailureKind.CONFLICT
    assert "checkpoint_conflict" in out.reason and m.handed_over == [0]
