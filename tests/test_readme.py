"""README.md's code: every ```python and ```bash block carries a marker on the line before it,
``<!-- readme-test: run -->`` (a test here runs it as pasted), ``<!-- readme-test: run in
(tests/test_x.py) -->`` (that file runs it, adding output flags) or ``<!-- readme-test: skip (why)
-->`` (not runnable here: the reason says why), so that a new block cannot go untested by
accident. Every Python block parses; a ``run`` Python block runs pasted into a file, a ``run``
bash block runs in ``bash -e`` from the repository's root, with ``.venv/bin/`` meaning the bin
directory of the Python running the tests (CI's 3.13 suite runs in ``.venv313``)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from readme_blocks import MARKER, README, ROOT, blocks, command_of

from rl_gym_actors.testing.polling import scaled


def test_every_python_and_bash_block_is_marked_run_or_skip_with_a_reason():
    found = blocks()
    unmarked = [b.where for b in found if not MARKER.match(b.marker)]
    assert not unmarked, (
        "mark each block on the line before it: <!-- readme-test: run --> (a test runs it) or "
        f"<!-- readme-test: skip (why) -->: {unmarked}"
    )
    assert found[0].lang == "bash" and any(b.runs and b.lang == "python" for b in found)


def test_the_marker_check_sees_an_unmarked_block_and_a_skip_without_a_reason():
    text = "intro\n```bash\nls\n```\n<!-- readme-test: skip -->\n```python\npass\n```\n"
    assert [MARKER.match(b.marker) for b in blocks(text)] == [None, None]
    good = "<!-- readme-test: skip (needs a GPU) -->\n```bash\nnvidia-smi\n```\n"
    assert [b.runs for b in blocks("\n" + good)] == [False]
    assert MARKER.match(blocks("\n" + good)[0].marker)


def test_a_block_run_elsewhere_is_run_by_the_file_it_names():
    owned = [b for b in blocks() if b.owner]
    for b in owned:
        assert b.lang == "bash" and "\n" not in b.code.strip(), f"{b.where}: one command"
        owner = ROOT / b.owner
        assert owner.is_file(), f"{b.where} names {b.owner}, which does not exist"
        assert f'"{command_of(b)}"' in owner.read_text(), (
            f"{b.where}: {b.owner} does not name {command_of(b)!r} (run it with readme_argv)"
        )
    assert owned  # the train loops' commands: tests/test_train_loop.py, test_train_loop_nemo_rl.py


def test_every_python_block_parses():
    for b in blocks():
        if b.lang == "python":
            ast.parse(b.code, filename=b.where)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    env.pop("RAY_ADDRESS", None)  # a Ray of its own, as on a fresh machine
    env["RLGA_PROGRESS"] = "0"
    return env


def _run_python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "snippet.py"
    script.write_text(code + "\n")
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=scaled(240),
    )


def _run_bash(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    code = code.replace(".venv/bin/", f"{Path(sys.executable).parent}/")
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=ROOT,  # as pasted in a clone: paths are the repository's
        env=_env(),
        capture_output=True,
        text=True,
        timeout=scaled(400),
    )


@pytest.mark.slow  # each starts a Gym server and a local Ray
@pytest.mark.parametrize("line", [b.line for b in blocks() if b.runs])
def test_a_readme_block_runs_as_pasted(line, tmp_path):
    block = next(b for b in blocks() if b.line == line)
    done = (_run_python if block.lang == "python" else _run_bash)(block.code, tmp_path)
    assert done.returncode == 0, (
        f"{block.where} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    )
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    code, out = block.code, done.stdout
    if "orch.snapshot()" in code:  # the first snippet: rows, a checkpoint, a short summary
        assert " committed in " in out
        assert "book consistent" in out
        assert len(out.splitlines()) < 40
    if "orch.astream(" in code:  # the async snippet: 4 rows streamed, one sent again
        streamed = [ln for ln in out.splitlines() if " step-1-row-" in ln]
        assert len(streamed) == 4 and all(" sealed " in ln for ln in streamed)
        assert "sent again: sealed repeated" in out
        assert "received by the driver: 5 sealed, 0 failed" in out


@pytest.mark.slow  # a `gym serve` process
def test_the_agent_snippet_served_as_module_function_fails_rows_as_the_table_says(
    tmp_path, monkeypatch
):
    """The "When an agent fails a row" snippet, saved as mymodule.py and served as its comment
    says (``gym serve --agent mymodule:agent``): a row with a prompt gets its reward, one
    without fails as data (422 ``agent_data_failed``), a busy sandbox as transient (500)."""
    import asyncio

    from rl_gym_actors import local_gym_server
    from rl_gym_actors.errors import AgentDataFailed, AgentFailed
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient
    from rl_gym_actors.testing.polling import soon

    (block,) = [b for b in blocks() if "--agent mymodule:agent" in b.code]
    assert block.runs
    (tmp_path / "mymodule.py").write_text(block.code + "\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join((str(tmp_path), str(ROOT))))

    async def run_rows(gym) -> list:
        async with GymClient(gym.endpoint) as client:
            got = []
            for i, row in enumerate(({"prompt": "2+2"}, {}, {"prompt": "x", "sandbox": "busy"})):
                try:
                    answer = await client.run(
                        row, rollout_id=f"agent-{i}", attempt_index=0, deadline_ts=soon(30)
                    )
                    got.append(answer.reply)
                except (AgentDataFailed, AgentFailed) as exc:
                    got.append(exc)
            return got

    with local_gym_server(agent="mymodule:agent") as gym:
        ok, data, transient = asyncio.run(run_rows(gym))
    assert ok == {"reward": 1.0}
    assert isinstance(data, AgentDataFailed) and data.status == 422 and "no prompt" in str(data)
    assert isinstance(transient, AgentFailed) and transient.status == 500
    assert "no sandbox free" in str(transient)


def test_the_nemo_rl_yaml_loads_and_its_values_are_the_defaults_it_says():
    """The drop-in's YAML section loads through ``DropInConfig`` as pasted, and every value it
    shows is the default but those the sentence after it names."""
    import yaml

    from rl_gym_actors.integrations.nemo_rl.config import DropInConfig

    text = README.read_text()
    (found,) = re.findall(r"```yaml\n(env:\n.*?)\n```", text, re.S)
    section = yaml.safe_load(found)["env"]["nemo_gym"]["rl_gym_actors"]
    shown = DropInConfig.model_validate(section)
    default = DropInConfig(servers=section["servers"])
    differ = {k for k in section if getattr(shown, k) != getattr(default, k)}
    assert differ == {"run_id", "agent_name", "policy", "pool"}, differ
    assert shown.pool.model_dump() == {**default.pool.model_dump(), "rollouts_per_actor": 8}
    sentence = " ".join(text[text.index(found) :].split("`run_id` starts")[0].split())
    assert "except `run_id`, `agent_name`, the `servers`' and `policy`'s, and `pool`'s" in (
        sentence
    )
    assert "`rollouts_per_actor` (default 1" in sentence
