"""examples/train_loop.py: the policy learns through the orchestrator, every checkpoint commits,
and across a real SIGKILL of the trainer mid-step no rollout is counted twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rl_gym_actors.testing.polling import scaled


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
    out = tmp_path / "summary.json"
    env = {**os.environ, "RLGA_PROGRESS": "0"}
    # 2 rollout actors x 12 slots (--quick's 4 x 8 start two more worker processes per trainer,
    # the most of this test's time on 2 cores): still one wave per step of 24 rows
    proc = subprocess.run(
        [
            sys.executable,
            loop.__file__,
            "--quick",
            "--pool-size",
            "2",
            "--per-actor",
            "12",
            "--workdir",
            str(tmp_path / "work"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=scaled(180),
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    curve = result["reward_curve"]
    assert np.mean(curve[-2:]) > np.mean(curve[:2]) + 0.1  # the policy learned
    assert result["every_checkpoint_committed"] and len(result["checkpoints"]) == 3
    assert all(c["records"] > 0 for c in result["checkpoints"])
    crash = result["crash"]
    assert crash["processes_killed"] > 1 and crash["running_on_gym"] > 0
    assert crash["step"] in result["steps_redone_after_restart"]
    assert result["counted"] == result["counted_distinct"] == 8 * 6 * 4  # counted once each
    assert result["no_rollout_counted_twice"]
    assert result["adopted_tries"] > 0  # faults were adopted
    assert result["gym"]["completed_unacknowledged"] == 0  # nothing left behind
    assert "no rollout counted twice True" in proc.stdout


@pytest.mark.slow
def test_via_nemo_rl_the_drop_in_driven_as_nemo_rl_does_counts_nothing_twice(loop, tmp_path):
    out = tmp_path / "summary.json"
    env = {**os.environ, "RLGA_PROGRESS": "0"}
    proc = subprocess.run(
        [
            sys.executable,
            loop.__file__,
            "--via-nemo-rl",
            "--steps",
            "4",
            "--prompts",
            "4",
            "--group",
            "3",
            "--ckpt-every",
            "2",
            "--crash-in-step",
            "3",
            "--fault-rate",
            "0.1",
            "--pool-size",
            "1",
            "--per-actor",
            "12",  # 12 rows: one wave
            "--workdir",
            str(tmp_path / "work"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=scaled(240),
        env=env,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["every_checkpoint_committed"] and len(result["checkpoints"]) == 2
    assert result["crash"]["processes_killed"] > 1 and result["crash"]["running_on_gym"] > 0
    assert 3 in result["steps_redone_after_restart"]
    assert result["counted"] == result["counted_distinct"] == 4 * 4 * 3  # counted once each
    assert result["no_rollout_counted_twice"]
    assert result["redispatches"] > 0  # infrastructure failures re-dispatched
    assert result["gym"]["completed_unacknowledged"] == 0
    assert "no rollout counted twice True" in proc.stdout
    # counted from the results' gym_adopted flags (was a constant 0): the runs the killed
    # trainer left on Gym came back from Gym's store, and the summary prints that count
    replayed = result["replayed_after_restart"]
    assert 0 < replayed <= result["adopted_tries"]
    assert f"replayed from Gym instead of rerun: {replayed}" in proc.stdout.replace("\n", " ")
