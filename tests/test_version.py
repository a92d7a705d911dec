"""The version moves in one step: pyproject.toml, ``rl_gym_actors.__version__`` and the newest
released heading of CHANGELOG.md say the same version."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import rl_gym_actors

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_is_the_same_in_pyproject_the_package_and_the_changelog() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    headings = re.findall(r"^## (\S+)", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    released = [h for h in headings if h != "Unreleased"]
    assert released, "CHANGELOG.md has no released version"
    assert project == rl_gym_actors.__version__ == released[0]


def test_the_changelog_names_its_versions_newest_first() -> None:
    headings = re.findall(r"^## (\d+)\.(\d+)\.(\d+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    versions = [tuple(int(p) for p in h) for h in headings]
    assert versions == sorted(versions, reverse=True)
