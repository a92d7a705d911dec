"""The package's production modules never import its testing/ folder (cli.py included), and
gym/ and core/ never import each other: read from the source, so a lazy import counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rl_gym_actors"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _modules(floor: str = "") -> list[Path]:
    return sorted((PACKAGE / floor).rglob("*.py"))


@pytest.mark.parametrize(
    "path",
    [p for p in _modules() if "testing" not in p.relative_to(PACKAGE).parts],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_no_production_module_imports_testing(path):
    upward = sorted(n for n in _imports(path) if n.startswith("rl_gym_actors.testing"))
    assert upward == []


@pytest.mark.parametrize(("floor", "other"), [("gym", "core"), ("core", "gym")])
def test_gym_and_core_never_import_each_other(floor, other):
    crossing = {
        str(p.relative_to(PACKAGE)): sorted(
            n for n in _imports(p) if n.startswith(f"rl_gym_actors.{other}")
        )
        for p in _modules(floor)
    }
    assert {k: v for k, v in crossing.items() if v} == {}
