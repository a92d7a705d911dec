"""The package's floors (docs/ARCHITECTURE.md): no module imports a floor above its own, no
production module imports its testing/ folder (cli.py included), and gym/ and core/ never import
each other: read from the source, so a lazy import counts too."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rl_gym_actors"


@functools.cache  # each module is parsed once for all three tests
def _imports(path: Path) -> frozenset[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(names)


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


# docs/ARCHITECTURE.md's floors, lowest first: a module imports from its own floor and below
FLOORS = {
    "errors": 1,
    "protocol": 1,
    "listing": 1,
    "failures": 1,
    "config": 1,
    "outcome": 1,
    "metrics": 1,
    "core": 2,
    "gym": 3,
    "actors": 4,
    "orchestrator": 5,
    "snapshot": 5,
    "rows": 5,
    "stream": 5,
    "dispatch": 5,
    "held_results": 5,
    "received": 5,
    "checkpoint_part": 5,
    "run_checkpoints": 5,
    "newer_parts": 5,
    "observe": 5,
    "progress": 5,
    "ray_attach": 5,
    "cli": 6,
    "cli_support": 6,
    "cli_observe": 6,
    "local_gym": 6,
    "integrations": 6,
    "testing": 6,
    "__init__": 6,
}


def _floor(parts: tuple[str, ...]) -> int:
    name = parts[0].removesuffix(".py")
    assert name in FLOORS, f"{name}: give it a floor here and in docs/ARCHITECTURE.md"
    return FLOORS[name]


def _package_module(name: str) -> str | None:
    """``rl_gym_actors.X...`` -> ``X`` when X is a module or folder of the package."""
    parts = name.split(".")
    if parts[0] != "rl_gym_actors" or len(parts) < 2:
        return None
    top = parts[1]
    return top if (PACKAGE / top).is_dir() or (PACKAGE / f"{top}.py").exists() else None


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_floor_above_its_own(path):
    own = _floor(path.relative_to(PACKAGE).parts)
    above = sorted(
        name
        for name in _imports(path)
        if (top := _package_module(name)) is not None and _floor((top,)) > own
    )
    assert above == []
