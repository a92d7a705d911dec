"""examples/train_loop.py: the policy learns through the orchestrator, every checkpoint commits,
and across a real SIGKILL of the trainer mid-step no rollout is counted twice (the same through
the NeMo RL drop-in: tests/test_train_loop_nemo_rl.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from train_loop_runs import checkpoint_steps, run_readme


@pytest.fixture(scope="module")
def loop(load_example):
    return load_example("train_loop")


def test_grpo_update_moves_probability_to_the_better_action(loop):
    logits = np.zeros((1, 3))
    new = loop.grpo_update(logits, [0, 0, 0, 0], [0, 1, 2, 2], [0.1, 1.0, 0.2, 0.2], lr=1.0)
    probs = loop.softmax(new)[0]
    assert probs.argmax() == 1 and probs[1] > 1 / 3
    same = loop.grpo_update(logits, [0, 0], [0, 1], [0.5, 0.5], lr=1.0)  # no spread: no step
    assert np.array_equal(same, logits)


def test_rows_are_deterministic_per_step_and_name_their_action(loop):
    args = loop.parse_args(["--quick"])
    values = loop.action_values(args.prompts, args.actions, args.seed)
    logits = np.zeros(values.shape)
    rows_a, faults_a = loop.make_rows(3, logits, values, args)
    rows_b, _ = loop.make_rows(3, logits, values, args)
    assert rows_a == rows_b and len(rows_a) == args.prompts * args.group
    for row in rows_a:
        assert row["_ng_rollout_id"].endswith(f"-a{row['action']}")
        assert row["reward"] == values[row["prompt"], row["action"]]
    assert sum(faults_a.values()) == sum(loop._faulty(r) for r in rows_a)


@pytest.mark.slow
def test_quick_run_learns_commits_every_checkpoint_and_counts_nothing_twice(loop, tmp_path):
    proc, out, args = run_readme(".venv/bin/python examples/train_loop.py --quick", tmp_path, 240)
    size = loop.parse_args(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    curve = result["reward_curve"]
    assert np.mean(curve[-2:]) > np.mean(curve[:2]) + 0.1  # the policy learned
    assert result["every_checkpoint_committed"]
    assert len(result["checkpoints"]) == len(checkpoint_steps(size)) == 3
    assert all(c["records"] > 0 for c in result["checkpoints"])
    crash = result["crash"]
    assert crash["processes_killed"] > 1 and crash["running_on_gym"] > 0
    assert (
        crash["step"] == size.crash_in_step
        and crash["step"] in result["steps_redone_after_restart"]
    )
    rows = size.steps * size.prompts * size.group
    assert result["counted"] == result["counted_distinct"] == rows == 8 * 6 * 4  # once each
    assert result["no_rollout_counted_twice"]
    assert result["adopted_tries"] > 0  # faults were adopted
    assert result["gym"]["completed_unacknowledged"] == 0  # nothing left behind
    assert "no rollout counted twice True" in proc.stdout
