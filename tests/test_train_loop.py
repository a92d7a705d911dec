"""examples/train_loop.py: the policy learns through the orchestrator, every checkpoint commits,
and across a real SIGKILL of the trainer mid-step no rollout is counted twice."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from readme_blocks import ROOT, readme_argv

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


def _run_readme(command: str, tmp_path, timeout_s: float):
    """The README's command as written there (its block says this file runs it), plus where
    to work and write the summary; the parsed args say the run's sizes."""
    argv = readme_argv(command)
    out = tmp_path / "summary.json"
    env = {**os.environ, "RLGA_PROGRESS": "0"}
    extra = ["--workdir", str(tmp_path / "work"), "--json", str(out)]
    proc = subprocess.run(
        [*argv, *extra],
        cwd=ROOT,  # the README's paths are the repository's
        capture_output=True,
        text=True,
        timeout=scaled(timeout_s),
        env=env,
    )
    return proc, out, argv[2:]


@pytest.mark.slow
def test_quick_run_learns_commits_every_checkpoint_and_counts_nothing_twice(loop, tmp_path):
    proc, out, args = _run_readme(".venv/bin/python examples/train_loop.py --quick", tmp_path, 240)
    size = loop.parse_args(args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    curve = result["reward_curve"]
    assert np.mean(curve[-2:]) > np.mean(curve[:2]) + 0.1  # the policy learned
    assert result["every_checkpoint_committed"]
    assert len(result["checkpoints"]) == len(_checkpoint_steps(size)) == 3
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


@pytest.mark.slow
def test_via_nemo_rl_the_drop_in_driven_as_nemo_rl_does_counts_nothing_twice(loop, tmp_path):
    proc, out, args = _run_readme(
        ".venv/bin/python examples/train_loop.py --quick --via-nemo-rl", tmp_path, 300
    )
    size = loop.parse_args(args)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["every_checkpoint_committed"]
    assert len(result["checkpoints"]) == len(_checkpoint_steps(size))
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


def _checkpoint_steps(size) -> list[int]:
    return [s for s in range(1, size.steps + 1) if s % size.ckpt_every == 0 or s == size.steps]
