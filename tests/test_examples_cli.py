"""The examples' command lines: defaults in --help, no internal flags shown, sizes honoured or
refused, and train_loop_nemo_rl.py's --help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rl_gym_actors.testing.polling import scaled

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_quick_keeps_the_sizes_given_explicitly(load_example):
    loop = load_example("train_loop")
    args = loop.parse_args(["--quick", "--steps", "20", "--group", "8"])
    assert (args.steps, args.group, args.prompts, args.ckpt_every) == (20, 8, 6, 3)
    full = loop.parse_args([])
    assert (full.steps, full.group, full.prompts, full.ckpt_every) == (24, 4, 8, 4)


@pytest.mark.parametrize(
    "argv",
    [["--steps", "0"], ["--group", "-1"], ["--fault-rate", "0.5"], ["--crash-in-step", "99"]],
)
def test_bad_sizes_are_refused(load_example, argv, capsys):
    loop = load_example("train_loop")
    with pytest.raises(SystemExit) as info:
        loop.parse_args(argv)
    assert info.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_help_shows_defaults_and_hides_the_internal_flags(load_example, capsys):
    loop = load_example("train_loop")
    with pytest.raises(SystemExit):
        loop.parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: 24)" in out and "(default: 1.5)" in out
    assert "--role" not in out and "--gym-url" not in out


@pytest.mark.slow  # a subprocess importing numpy and the package
def test_the_nemo_rl_train_loop_has_a_help():
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_loop_nemo_rl.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        cwd=EXAMPLES,
    )
    assert done.returncode == 0, done.stderr
    assert "--quick" in done.stdout and "--via-nemo-rl" in done.stdout
