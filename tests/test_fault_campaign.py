"""A few instants of the fault campaign (benchmarks/fault_campaign.py runs the whole of it).

A trainer with a buffer of handed results across 2 checkpoints (the next step's rows in flight
across each checkpoint, ``keep=``), killed with kill -9 where Gym committed and the trainer never
heard (agent-checkpoint; v2, at its third checkpoint) and between its prepare and its commit
(v2), then restored from ``latest_checkpoint_dir`` and sending the same rows: nothing lost, no
finished run rerun, nothing trained twice, the restored trainer's first checkpoint commits at its
first try, and Gym takes work within 5 s (load-scaled) of its start. The trainers join the
session's Ray (:mod:`rl_gym_actors.testing.campaign`)."""

from __future__ import annotations

import pytest

from rl_gym_actors.testing.campaign import Instant, run_campaign, totals
from rl_gym_actors.testing.polling import scaled

INSTANTS = [
    Instant("agent", "commit", 2),
    Instant("v2", "before-commit", 2),
    Instant("v2", "commit", 3),
]


@pytest.mark.ray
@pytest.mark.slow
def test_a_trainer_killed_in_its_checkpoints_loses_nothing(ray_session, tmp_path):
    address = ray_session.get_runtime_context().gcs_address
    results = run_campaign(INSTANTS, workdir=tmp_path, ray_address=address)
    for r in results:
        assert not r.errors, (r.instant, r.errors)
        assert r.landed == r.instant.phase, r.landed  # the kill landed where it was aimed
        assert (r.lost_ids, r.rerun_ids, r.twice_ids) == ([], [], []), r.instant
        assert r.tail_rerun_ids == [], r.instant  # killed before resume: nothing ran past it
        assert r.first_commit_first_try, r.instant
        assert r.start_to_open_s is not None and r.start_to_open_s < scaled(5.0), r.instant
    t = totals(results)
    assert t["rows"] == sum(6 * (i.step + 2) for i in INSTANTS)  # 6 rows a step, 2 steps past K
    assert t["gym_held_at_kill"] == len(INSTANTS)  # each kill left Gym held by its checkpoint
