"""The compact record of sealed rollout ids (issue 16): 8-byte digests that outlive any number of
committed checkpoints, so a sealed id sent again is answered ``forgotten_rollout`` and never run.
Before, Gym's own memory decided: after two committed checkpoints Gym no longer knew the key and
a re-sent sealed id ran the agent again as a new result."""

from __future__ import annotations

import pytest

from rl_gym_actors import Orchestrator, TryPolicy
from rl_gym_actors.checkpoint_part import read_part
from rl_gym_actors.core.rollout_memory import RolloutMemory
from rl_gym_actors.core.sealed_ids import SealedIds
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.protocol import CompletionReceipt


def test_ids_are_kept_across_generations_and_dropped_past_the_retention():
    ids = SealedIds(retention=1000)
    for gen in range(30):
        ids.add(f"r-{gen}-{i}" for i in range(100))
        ids.seal_generation()
    assert len(ids) >= 1000 and ids.dropped > 0
    assert all(f"r-29-{i}" in ids for i in range(100))  # the newest are always there
    assert "r-0-0" not in ids and "never" not in ids and 7 not in ids
    assert ids.generations <= 12
    again = SealedIds.from_bytes(ids.to_bytes(), retention=1000)
    assert len(again) == len(ids) and "r-29-5" in again
    # 8 bytes per id on disk, plus 8 per generation and 8 for the count
    assert len(ids.to_bytes()) == 8 * len(ids) + 8 * ids.generations + 8


def test_a_torn_record_is_refused():
    ids = SealedIds()
    ids.add(["a", "b"])
    data = ids.to_bytes()
    with pytest.raises(ValueError):
        SealedIds.from_bytes(data[:-3])
    with pytest.raises(ValueError):
        SealedIds.from_bytes(b"\x01")


def test_memory_answers_a_forgotten_sealed_id_without_a_dispatch():
    memory = RolloutMemory()
    memory.sealed = SealedIds()
    receipt = CompletionReceipt(
        rollout_id="m-1",
        attempt_index=0,
        execution_generation=1,
        result_identity="r-m-1",
        result_digest="0" * 64,
    )
    outcome = Outcome(
        rollout_id="m-1", status="sealed", attempt_index=0, reward=0.5, receipt=receipt
    )
    memory.restore(outcome, delivered=True)
    plan = memory.plan("m-1")
    assert plan.ready is not None and plan.ready.repeated and plan.ready.reward == 0.5
    memory.take("m-1", plan)
    assert memory.forget_settled() == 1 and len(memory) == 0
    plan = memory.plan("m-1")
    assert plan.ready is not None and plan.ready.failure is FailureKind.FORGOTTEN
    memory.take("m-1", plan)  # nothing to record
    assert memory.plan("m-2").ready is None


@pytest.mark.slow
@pytest.mark.ray
def test_a_sealed_id_sent_again_after_1_2_and_10_commits_never_runs(
    ray_session, gym, agent, tmp_path
):
    policy = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=2, control_s=5.0)
    with Orchestrator(
        [gym.endpoint], policy=policy, pool_size=1, rollouts_per_actor=4, progress=False
    ) as orch:
        rows = [{"_ng_rollout_id": f"si-{i}", "reward": 0.25} for i in range(3)]
        assert [o.status for o in orch.run_batch(rows)] == ["sealed"] * 3
        for n in range(1, 11):
            orch.run_batch([{"_ng_rollout_id": f"si-filler-{n}"}])
            orch.checkpoint(f"si-ck-{n}", str(tmp_path / f"ck{n}"), deadline_s=30)
            if n in (1, 2, 10):
                again = orch.run_batch(rows)
                assert [(o.status, o.failure) for o in again] == [
                    ("failed", FailureKind.FORGOTTEN)
                ] * 3, n
                assert all(o.reward is None for o in again)
                assert all(agent.runs_of(f"si-{i}") == 1 for i in range(3)), n
        part, sealed = read_part(tmp_path / "ck10")
        assert all(f"si-{i}" in sealed for i in range(3)) and "si-filler-9" in sealed
        assert [o.rollout_id for o in part.handed] == ["si-filler-10"]
