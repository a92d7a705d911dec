"""One retry policy, set once in the TryPolicy, reaches every place that backs off."""

from __future__ import annotations

import pytest

from rl_gym_actors.actors.rollout_actor import RolloutWorker
from rl_gym_actors.config import GymEndpoint, RetryPolicy, TryPolicy
from rl_gym_actors.core import rollout as r

RETRY = RetryPolicy(attempts=3, backoff_initial_s=0.3, backoff_max_s=0.5, jitter=0.25)
POLICY = TryPolicy(rollout_s=10.0, receipt_s=5.0, control_s=5.0, retry=RETRY)


def test_the_rollout_actors_gym_clients_retry_by_the_try_policys_retry():
    worker = RolloutWorker("w0", [GymEndpoint(url="http://127.0.0.1:1")], POLICY)
    assert worker._client(0).retry == RETRY


def test_the_machine_backs_off_by_the_same_policy_without_jitter():
    m = r.RolloutMachine("r1", endpoint="http://127.0.0.1:1", owner="w0", policy=POLICY)
    m.handle(r.Start(0.0))
    m.handle(r.RunReplied(1.0, {"reward": 1.0}))
    waits = []
    for _ in range(3):
        fx = m.handle(r.StepFailed(1.0, r.FailureKind.NOT_COMPLETED))
        waits.append(fx[-1].wake_ts - 1.0)
        m.handle(r.Woke(fx[-1].wake_ts))
    assert waits == pytest.approx([RETRY.backoff(1), RETRY.backoff(2), RETRY.backoff(3)])
    assert waits == pytest.approx([0.3, 0.5, 0.5])


def test_a_try_policy_given_as_data_carries_its_retry_policy():
    again = TryPolicy.model_validate(POLICY.model_dump())
    assert again == POLICY and again.retry.attempts == 3
