"""`make setup PY=python3.13` picks that Python also where `python3.13` is a pyenv shim that
refuses it (that version installed, not the active one: "pyenv: python3.13: command not
found"): .ci/resolve-python runs pyenv's install of 3.13 instead (issue 31, item 9). The shim
is a stand-in that exits 127 as pyenv's does; the install, the interpreter running this test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rl_gym_actors.testing.polling import scaled

ROOT = Path(__file__).resolve().parents[1]


def _pyenv(tmp_path: Path) -> dict[str, str]:
    shims = tmp_path / "shims"
    shims.mkdir()
    shim = shims / "python3.13"
    shim.write_text('#!/bin/sh\necho "pyenv: python3.13: command not found" >&2\nexit 127\n')
    shim.chmod(0o755)
    install = tmp_path / "pyenv" / "versions" / "3.13.9" / "bin"
    install.mkdir(parents=True)
    (install / "python3.13").symlink_to(sys.executable)
    return {
        **os.environ,
        "PATH": os.pathsep.join((str(shims), "/usr/bin", "/bin")),
        "PYENV_ROOT": str(tmp_path / "pyenv"),
    }


def test_a_refusing_shim_resolves_to_the_pyenv_install(tmp_path):
    env = _pyenv(tmp_path)
    install = tmp_path / "pyenv" / "versions" / "3.13.9" / "bin" / "python3.13"

    def resolve(py: str) -> str:
        done = subprocess.run(
            [str(ROOT / ".ci" / "resolve-python"), py],
            env=env,
            capture_output=True,
            text=True,
            timeout=scaled(30),
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert resolve("python3.13") == str(install)
    assert resolve(sys.executable) == sys.executable  # one that runs is kept
    assert resolve("python3.99") == "python3.99"  # nothing to resolve to: its own error shows


def test_make_setup_runs_the_resolved_python(tmp_path):
    done = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "setup", "PY=python3.13", f"VENV={tmp_path / 'v'}"],
        env=_pyenv(tmp_path),
        capture_output=True,
        text=True,
        timeout=scaled(30),
    )
    assert done.returncode == 0, done.stderr
    install = tmp_path / "pyenv" / "versions" / "3.13.9" / "bin" / "python3.13"
    assert f"{install} -m venv {tmp_path / 'v'}" in done.stdout, done.stdout
