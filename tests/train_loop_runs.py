"""Running examples/train_loop.py as the README's commands say, for tests/test_train_loop.py and
tests/test_train_loop_nemo_rl.py (a file a command, so that ``make test``'s workers run the two
loops side by side: each is a trainer, a Gym server and a local Ray of its own, for minutes at
load)."""

from __future__ import annotations

import os
import subprocess

from readme_blocks import ROOT, readme_argv

from rl_gym_actors.testing.polling import scaled

__all__ = ["checkpoint_steps", "run_readme"]


def run_readme(command: str, tmp_path, timeout_s: float):
    """The README's command as written there (its block names the test file running it), plus where
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


def checkpoint_steps(size) -> list[int]:
    return [s for s in range(1, size.steps + 1) if s % size.ckpt_every == 0 or s == size.steps]
