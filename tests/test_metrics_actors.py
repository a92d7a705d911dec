"""The actors' metric calls: a rollout worker and the checkpoint gate, run in this process
against the real Gym server, move the shared Ray metric wrappers (their local tallies)."""

from __future__ import annotations

from rl_gym_actors import metrics
from rl_gym_actors.actors.checkpoint_gate import CheckpointGate
from rl_gym_actors.actors.gate_endpoint import OwnerAnswer
from rl_gym_actors.actors.rollout_actor import RolloutWorker
from rl_gym_actors.config import LedgerConfig, TryPolicy
from rl_gym_actors.core.attempt_book import AttemptBook
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.polling import soon


class NoOwners:
    """No rollout actor is alive: everything on Gym is an orphan."""

    def live(self) -> frozenset[str]:
        return frozenset()

    async def adopt(self, owner, rollout_id, attempt_index, deadline_ts) -> OwnerAnswer:
        return OwnerAnswer.GONE

    async def flush(self, deadline_ts, checkpoint_id=None) -> int:
        return 0


async def test_a_rollout_worker_counts_tries_seals_and_adoptions(gym):
    before = (metrics.TRIES.local_total, metrics.SEALS.local_total, metrics.ADOPTIONS.local_total)
    worker = RolloutWorker("metrics-worker", [gym.endpoint], TryPolicy(receipt_s=2.0), slots=2)
    try:
        plain = await worker.run_rollout({"reward": 1.0}, "mw-plain")
        lost = await worker.run_rollout({"reward": 0.5, "drop_reply": True}, "mw-lost")
    finally:
        await worker.close()
    assert plain.status == lost.status == "sealed" and lost.adopted
    after = (metrics.TRIES.local_total, metrics.SEALS.local_total, metrics.ADOPTIONS.local_total)
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 2, 1]


async def test_the_gate_counts_orphans_acked_and_times_prepare(gym, tmp_path):
    async with GymClient(gym.endpoint) as client:  # a run no rollout actor reported
        await client.run(
            {"reward": 0.5}, rollout_id="mg-orphan", attempt_index=0, deadline_ts=soon(10)
        )
    orphans, prepares = (
        metrics.ORPHANS_ACKED.local_total,
        metrics.CHECKPOINT_PREPARE_SECONDS.local_total,
    )
    client = GymClient(gym.endpoint)
    try:
        gate = CheckpointGate(
            AttemptBook([gym.url]), [gym.endpoint], [client], NoOwners(), LedgerConfig()
        )
        report = await gate.run("metrics-ck", str(tmp_path), soon(20))
    finally:
        await client.close()
    assert report.orphans_acked >= 1
    assert metrics.ORPHANS_ACKED.local_total - orphans == report.orphans_acked
    assert 0 < metrics.CHECKPOINT_PREPARE_SECONDS.local_total - prepares <= report.elapsed_s
