"""examples/train_loop.py --via-nemo-rl, the README's command: the drop-in driven as NeMo RL drives
it commits every checkpoint, and across a real SIGKILL of the trainer mid-step no rollout is
counted twice; the runs the killed trainer left on Gym come back from Gym's store."""

from __future__ import annotations

import json

import pytest
from train_loop_runs import checkpoint_steps, run_readme


@pytest.fixture(scope="module")
def loop(load_example):
    return load_example("train_loop")


@pytest.mark.slow
def test_via_nemo_rl_the_drop_in_driven_as_nemo_rl_does_counts_nothing_twice(loop, tmp_path):
    proc, out, args = run_readme(
        ".venv/bin/python examples/train_loop.py --quick --via-nemo-rl", tmp_path, 300
    )
    size = loop.parse_args(args)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["every_checkpoint_committed"]
    assert len(result["checkpoints"]) == len(checkpoint_steps(size))
    assert result["crash"]["processes_killed"] > 1 and result["crash"]["running_on_gym"] > 0
    assert size.crash_in_step in result["steps_redone_after_restart"]
    rows = size.steps * size.prompts * size.group
    assert result["counted"] == result["counted_distinct"] == rows  # counted once each
    assert result["no_rollout_counted_twice"]
    assert result["redispatches"] > 0  # infrastructure failures re-dispatched
    assert result["gym"]["completed_unacknowledged"] == 0
    assert "no rollout counted twice True" in proc.stdout
    # counted from the results' gym_adopted flags (was a constant 0): the runs the killed
    # trainer left on Gym came back from Gym's store, and the summary prints that count
    replayed = result["replayed_after_restart"]
    assert 0 < replayed <= result["adopted_tries"]
    assert f"replayed from Gym instead of rerun: {replayed}" in proc.stdout.replace("\n", " ")
