"""Hypothesis drives core/rollout/ against a small pure model of one Gym server.

Whatever the order of replies, deadlines, retire answers, losses, abandons and ledger requests,
every rollout ends with exactly one sealed result or none (failed/abandoned), the agent never
runs a sealed key twice, and no attempt is left running or completed-un-ACKed on Gym unless the
machine explicitly handed it to the ledger (which only happens when the control plane kept
failing past a step deadline).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.core import rollout as r
from rl_gym_actors.core.attempt_reports import AttemptState
from rl_gym_actors.protocol import CompletionReceipt, RetireAnswer

POLICY = TryPolicy(
    rollout_s=5.0, receipt_s=1.0, max_tries=3, control_s=2.0, admission_wait_s=3.0, ack="on_seal"
)
RID = "roll-1"
LOSS_S = 0.4  # time a lost answer costs


@dataclass
class FakeKeyState:
    state: str  # running, completed, acked, tombstoned
    reply: dict | None = None
    generation: int = 0
    runs: int = 0


@dataclass
class GymModel:
    """Gym's per-key rules from PROTOCOL.md, as plain data."""

    keys: dict[int, FakeKeyState] = field(default_factory=dict)
    admission_open: bool = True

    def post_run(self, att: int) -> tuple[str, object]:
        k = self.keys.get(att)
        if k is not None and k.state in ("acked", "tombstoned"):
            return "error", r.FailureKind.STALE
        if k is not None and k.state == "completed":
            return "replayed", k.reply
        if k is not None:
            return "error", r.FailureKind.DUPLICATE
        if not self.admission_open:
            return "error", r.FailureKind.ADMISSION_CLOSED
        self.keys[att] = FakeKeyState("running", generation=1, runs=1)
        return "started", None

    def complete(self, att: int) -> None:
        k = self.keys[att]
        k.state, k.reply = "completed", {"id": f"r-{RID}", "reward": float(att) + 0.5}

    def receipt(self, att: int) -> CompletionReceipt:
        k = self.keys[att]
        return CompletionReceipt.for_reply(RID, att, k.generation, k.reply)

    def retire(self, att: int) -> RetireAnswer:
        k = self.keys.get(att)
        if k is None:
            self.keys[att] = FakeKeyState("tombstoned")
            return RetireAnswer(retired=False, tombstoned=True)
        if k.state == "running":
            k.state = "tombstoned"
            return RetireAnswer(retired=True, tombstoned=True)
        if k.state == "completed":
            return RetireAnswer(retired=False, tombstoned=False, completed_unacknowledged=True)
        return RetireAnswer(retired=False, tombstoned=k.state == "tombstoned")

    def ack(self, receipt: CompletionReceipt) -> bool:
        k = self.keys.get(receipt.attempt_index)
        if (
            k is None
            or k.state not in ("completed", "acked")
            or receipt != self.receipt(receipt.attempt_index)
        ):
            return False
        k.state = "acked"
        return True


class Driver:
    """Performs the machine's effects on the model, with choices drawn by Hypothesis."""

    def __init__(self, data, machine: r.RolloutMachine, reliable_control: bool) -> None:
        self.data, self.m, self.gym = data, machine, GymModel()
        self.reliable_control = reliable_control
        self.now = 1000.0
        self.seals: list[r.Seal] = []
        self.reports: list = []
        self.outcome = None
        self.signals_left = {"abandon": 1, "adopt": 2, "admission": 3}

    def draw(self, options: list[str]) -> str:
        return self.data.draw(st.sampled_from(options))

    def feed(self, event) -> r.Effect | None:
        effects = self.m.handle(event)
        blocking = None
        for i, e in enumerate(effects):
            if isinstance(e, r.Seal):
                self.seals.append(e)
            elif isinstance(e, r.Report):
                self.reports.append(e.report)
            elif isinstance(e, r.Finish):
                assert i == len(effects) - 1
                self.outcome = e.outcome
            else:
                assert isinstance(e, r.BLOCKING) and i == len(effects) - 1
                if isinstance(e, r.StartRun):
                    self.check_nothing_left_behind(e.attempt_index)
                blocking = e
        return blocking

    def check_nothing_left_behind(self, new_att: int) -> None:
        for att, k in self.gym.keys.items():
            if att != new_att and k.state in ("running", "completed"):
                assert att in self.m.handed_over, f"try {att} left {k.state} when {new_att} began"

    def signal(self):
        """Maybe an abandon, a ledger adopt request or an admission toggle arrives now."""
        # mostly quiet: a signal at every step would end nearly every rollout abandoned
        opts = ["none"] * 8 + [k for k, v in self.signals_left.items() if v > 0]
        choice = self.draw(opts)
        if choice == "none":
            return None
        self.signals_left[choice] -= 1
        if choice == "admission":
            self.gym.admission_open = not self.gym.admission_open
            return None
        if choice == "adopt":
            k = self.gym.keys.get(self.m.attempt) if self.m.attempt is not None else None
            if k is None or k.state != "completed":
                return None  # the ledger only asks about completed attempts
            return r.AdoptRequested(self.now)
        return r.AbandonRequested(self.now)

    def lose(self, failure_event, step):
        if self.reliable_control and not isinstance(step, r.StartRun):
            return None
        self.now += LOSS_S
        return failure_event(self.now, r.FailureKind.LOST, "lost")

    def run(self) -> None:
        step = self.feed(r.Start(self.now))
        for _ in range(400):
            if self.outcome is not None:
                return
            sig = self.signal()
            if sig is not None:
                new = self.feed(sig)
                if new is not None:  # the machine left the pending effect behind
                    step = new
                    continue
                if self.outcome is not None:
                    return
            step = self.perform(step)
        raise AssertionError("rollout did not finish")

    def perform(self, step):
        now = self.now
        if isinstance(step, r.WaitUntil):
            self.now = max(self.now, step.wake_ts)
            return self.feed(r.Woke(self.now))
        if isinstance(step, r.StartRun):
            return self.perform_run(step)
        if isinstance(step, r.FetchReceipt):
            options = ["deliver", "lose", "timeout", "corrupt"]
            if self.reliable_control and self.m.phase is r.RolloutPhase.ADOPT_RECEIPT:
                options = ["deliver", "corrupt"]
            choice = self.draw(options)
            k = self.gym.keys.get(step.attempt_index)
            if choice == "timeout":
                self.now = max(now, step.deadline_ts)
                return self.feed(r.StepFailed(self.now, r.FailureKind.DEADLINE))
            if choice == "lose":
                self.now += LOSS_S
                return self.feed(r.StepFailed(self.now, r.FailureKind.LOST, "lost"))
            if k is None:
                return self.feed(r.StepFailed(now, r.FailureKind.UNKNOWN))
            if k.state == "tombstoned":
                return self.feed(r.StepFailed(now, r.FailureKind.STALE))
            if k.state == "running":
                return self.feed(r.StepFailed(now, r.FailureKind.NOT_COMPLETED))
            rec = self.gym.receipt(step.attempt_index)
            # "corrupt": the reply the caller holds was garbled on the way; the receipt is true
            reply = {"garbled": True} if choice == "corrupt" else k.reply
            problem = r.receipt_problem(rec, RID, step.attempt_index, reply)
            if problem:
                return self.feed(r.DigestMismatch(now, rec, problem))
            return self.feed(r.ReceiptReceived(now, rec))
        if isinstance(step, r.Retire):
            options = ["deliver", "lose_before", "lose_after"]
            choice = self.draw(options + ([] if self.reliable_control else ["conflict"]))
            if choice == "conflict":  # a checkpoint in progress refuses it, unapplied
                self.now += LOSS_S
                return self.feed(r.StepFailed(self.now, r.FailureKind.CONFLICT))
            if choice != "lose_before" or self.reliable_control:
                answer = self.gym.retire(step.attempt_index)
            if choice != "deliver" and (ev := self.lose(r.StepFailed, step)) is not None:
                return self.feed(ev)
            return self.feed(r.RetireAnswered(now, answer))
        if isinstance(step, r.Replay):
            choice = self.draw(["deliver", "lose"])
            if choice == "lose" and (ev := self.lose(r.StepFailed, step)) is not None:
                return self.feed(ev)
            kind, value = self.gym.post_run(step.attempt_index)
            if kind == "replayed":
                return self.feed(r.ReplayReplied(now, value))
            assert kind == "error", "a replay must never start the agent"
            return self.feed(r.StepFailed(now, value))
        if isinstance(step, r.Ack):
            choice = self.draw(["deliver", "lose_before", "lose_after"])
            ok = True
            if choice != "lose_before" or self.reliable_control:
                ok = self.gym.ack(step.receipt)
            if choice != "deliver" and (ev := self.lose(r.StepFailed, step)) is not None:
                return self.feed(ev)
            if not ok:
                return self.feed(r.StepFailed(now, r.FailureKind.REJECTED))
            return self.feed(r.AckAnswered(now))
        raise AssertionError(f"unexpected effect {step}")

    def perform_run(self, step: r.StartRun):
        att = step.attempt_index
        if self.draw(["arrive", "lost_on_the_way"]) == "lost_on_the_way":
            self.now += LOSS_S
            return self.feed(r.RunFailed(self.now, r.FailureKind.LOST))
        kind, value = self.gym.post_run(att)
        if kind == "replayed":
            return self.feed(r.RunReplied(self.now, value, replayed=True))
        if kind == "error":
            if value is r.FailureKind.ADMISSION_CLOSED:
                return self.feed(r.RunAdmissionClosed(self.now))
            return self.feed(r.RunFailed(self.now, value))
        # The agent works; anything may happen before the caller hears back.
        choice = self.draw(
            [
                "reply",
                "finish_reply_lost",
                "agent_fails",
                "deadline_running",
                "deadline_finished",
                "retired_by_other",
            ]
        )
        if choice == "agent_fails":
            self.gym.keys[att].state = "tombstoned"
            return self.feed(r.RunFailed(self.now, r.FailureKind.AGENT_FAILED, "boom"))
        if choice == "retired_by_other":
            self.gym.keys[att].state = "tombstoned"
            return self.feed(r.RunFailed(self.now, r.FailureKind.STALE))
        if choice == "deadline_running":
            self.now = step.deadline_ts
            return self.feed(r.DeadlineFired(self.now))
        self.gym.complete(att)
        if choice == "deadline_finished":
            self.now = step.deadline_ts
            return self.feed(r.DeadlineFired(self.now))
        if choice == "finish_reply_lost":
            self.now += LOSS_S
            return self.feed(r.RunFailed(self.now, r.FailureKind.LOST))
        # the ledger may ask to adopt it just as the reply lands
        if self.signals_left["adopt"] > 0 and self.draw(["no", "adopt_first"]) == "adopt_first":
            self.signals_left["adopt"] -= 1
            return self.feed(r.AdoptRequested(self.now))
        return self.feed(r.RunReplied(self.now, self.gym.keys[att].reply))


def check_end(d: Driver, reliable_control: bool) -> None:
    m, out = d.m, d.outcome
    event(f"{out.status} adopted={out.adopted} handed_over={bool(m.handed_over)}")
    assert m.done and out is not None and out.rollout_id == RID
    assert len(d.seals) <= 1, "two sealed results for one rollout"
    assert out.has_result == bool(d.seals)
    if out.status == "sealed":
        assert out.has_result
    if out.status == "failed":
        assert not out.has_result and out.reason
    if d.seals:
        seal = d.seals[0]
        k = d.gym.keys[seal.attempt_index]
        assert seal.reply == k.reply and k.runs == 1 and k.generation == 1
        assert out.reward == k.reply["reward"] and out.attempt_index == seal.attempt_index
    # nothing left behind on Gym, unless handed to the ledger
    for att, k in d.gym.keys.items():
        if k.state in ("running", "completed"):
            assert att in m.handed_over, f"attempt {att} left {k.state}"
    if reliable_control:
        assert m.handed_over == []
    if out.acked:
        assert d.gym.keys[out.attempt_index].state == "acked"
    # reports: monotone per attempt, and the last one releases the rollout
    ranks: dict[int, int] = {}
    for rep in d.reports:
        assert rep.state.rank >= ranks.get(rep.attempt_index, 0)
        ranks[rep.attempt_index] = rep.state.rank
    if d.reports:
        assert d.reports[-1].released
        released = [rep for rep in d.reports if rep.released]
        assert {rep.attempt_index for rep in released} <= set(m.handed_over) | {m.attempt}
    assert m.tries <= POLICY.max_tries


SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.slow
@SETTINGS
@given(st.data(), st.sampled_from([None, 0, 4]))
def test_any_interleaving_ends_with_one_result_and_nothing_left_behind(data, previous):
    m = r.RolloutMachine(
        RID, endpoint="http://gym", owner="a0", policy=POLICY, previous_attempt=previous
    )
    d = Driver(data, m, reliable_control=False)
    if previous is not None and data.draw(st.booleans()):
        # the earlier dispatch got as far as Gym finishing it
        d.gym.keys[previous] = FakeKeyState("running", generation=1, runs=1)
        d.gym.complete(previous)
    d.run()
    check_end(d, reliable_control=False)


@pytest.mark.slow
@SETTINGS
@given(st.data())
def test_with_a_reliable_control_plane_nothing_is_ever_handed_over(data):
    m = r.RolloutMachine(RID, endpoint="http://gym", owner="a0", policy=POLICY)
    d = Driver(data, m, reliable_control=True)
    d.run()
    check_end(d, reliable_control=True)
    if d.outcome.status == "sealed" and d.outcome.adopted:
        assert d.gym.keys[d.outcome.attempt_index].state == "acked"


def test_attempt_states_rank_as_the_ledger_folds_them():
    assert AttemptState.RUNNING.rank < AttemptState.SEALED.rank < AttemptState.ACKED.rank
