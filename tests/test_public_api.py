"""The package's public names: what `from rl_gym_actors import ...` gives at run time, what mypy
sees (the lazy-import hook is hidden from it, so an unknown name is an error, not Any), and
use_in_nemo_rl()'s typed error where NeMo RL is not installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import rl_gym_actors
from rl_gym_actors.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_every_name_in_all_imports_and_failure_kind_is_public():
    for name in rl_gym_actors.__all__:
        assert getattr(rl_gym_actors, name) is not None, name
    from rl_gym_actors import FailureKind, LocalGym, local_gym_server
    from rl_gym_actors.failures import FailureKind as Home

    assert FailureKind is Home and FailureKind.AGENT_DATA.is_data
    assert {"FailureKind", "LocalGym", "local_gym_server"} <= set(rl_gym_actors.__all__)
    assert callable(local_gym_server) and LocalGym.__name__ == "LocalGym"
    with pytest.raises(AttributeError):
        rl_gym_actors.Nonexistent  # noqa: B018


def mypy(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent(code))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--config-file", "/dev/null",
         "--follow-imports=silent", str(snippet)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.mark.slow  # mypy over the package: ~30 s
def test_mypy_refuses_an_unknown_name_and_types_the_lazy_ones(tmp_path):
    done = mypy(
        tmp_path,
        """
        from rl_gym_actors import FailureKind, LocalGym, Orchestrator, local_gym_server
        from rl_gym_actors import Nonexistent
        from rl_gym_actors.integrations.nemo_rl import AlsoNonexistent

        kind: FailureKind = FailureKind.AGENT_DATA
        def url(gym: LocalGym) -> str:
            return gym.url
        reveal_type(local_gym_server)
        reveal_type(Orchestrator)
        wrong: int = LocalGym  # a class is no int
        """,
    )
    out = done.stdout
    assert done.returncode == 1, out
    assert 'Module "rl_gym_actors" has no attribute "Nonexistent"' in out, out
    assert 'has no attribute "AlsoNonexistent"' in out, out
    assert "rl_gym_actors.local_gym.LocalGym" in out, out  # local_gym_server's type
    assert "-> rl_gym_actors.orchestrator.Orchestrator" in out, out
    assert 'type "type[LocalGym]"' in out, out  # typed, not Any
    assert out.count("error:") == 3, out


def test_use_in_nemo_rl_without_nemo_rl_is_a_typed_error_naming_the_fix():
    from rl_gym_actors.integrations.nemo_rl import use_in_nemo_rl
    from rl_gym_actors.integrations.nemo_rl.selection import NemoRlNotFound

    with pytest.raises(NemoRlNotFound) as info:
        use_in_nemo_rl("no_such_nemo_rl.environments.nemo_gym")
    assert isinstance(info.value, ConfigError)
    assert info.value.module == "no_such_nemo_rl.environments.nemo_gym"
    assert "NeMo RL is not installed" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(NemoRlNotFound, match="has no NemoGym"):
        use_in_nemo_rl("json")  # importable, but not NeMo RL's module
