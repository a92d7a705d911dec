"""README.md's Python code blocks: each one parses, and each one not marked
``<!-- readme-test: skip ... -->`` on the line before it runs as pasted into a file."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rl_gym_actors.testing.polling import scaled

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"(?P<before>[^\n]*)\n```python\n(?P<code>.*?)\n```", re.S)
SKIP = "<!-- readme-test: skip"


def blocks() -> list[tuple[int, str, bool]]:
    """(line number, code, runs) of every ```python block."""
    text = README.read_text()
    found = []
    for m in BLOCK.finditer(text):
        line = text.count("\n", 0, m.start("code")) + 1
        found.append((line, m.group("code"), not m.group("before").startswith(SKIP)))
    return found


def test_every_python_block_parses_and_the_first_one_runs():
    found = blocks()
    assert found and found[0][2], "the README's first Python block must be runnable"
    for line, code, _ in found:
        ast.parse(code, filename=f"README.md:{line}")


@pytest.mark.slow  # starts a Gym server and a local Ray
@pytest.mark.parametrize("line", [line for line, _, runs in blocks() if runs])
def test_a_readme_block_runs_as_pasted(line, tmp_path):
    code = next(c for n, c, _ in blocks() if n == line)
    script = tmp_path / "snippet.py"
    script.write_text(code + "\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    env.pop("RAY_ADDRESS", None)  # a Ray of its own, as on a fresh machine
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(240),
    )
    assert done.returncode == 0, (
        f"README.md:{line} exited {done.returncode}:\n{done.stderr[-3000:]}"
    )
    assert "Traceback" not in done.stderr
    if "orch.snapshot()" in code:  # the first snippet: rows, a checkpoint, a short summary
        assert " committed in " in done.stdout
        assert "book consistent" in done.stdout
        assert len(done.stdout.splitlines()) < 40
    if "orch.astream(" in code:  # the async snippet: 4 rows streamed, one sent again
        streamed = [line for line in done.stdout.splitlines() if " step-1-row-" in line]
        assert len(streamed) == 4 and all(" sealed " in line for line in streamed)
        assert "sent again: sealed repeated" in done.stdout
        assert "received by the driver: 5 sealed, 0 failed" in done.stdout
