"""The README's cost figures are generated from the committed benchmark results
(``benchmarks/glance.py``), so they cannot disagree with benchmarks/RESULTS.md or go stale: the
README's block is what the script makes of benchmarks/results/*.json, and RESULTS.md opens with
the same figures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _glance():
    spec = importlib.util.spec_from_file_location("glance", ROOT / "benchmarks" / "glance.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("glance", module)
    spec.loader.exec_module(module)
    return module


def test_the_readme_block_is_what_the_committed_results_say() -> None:
    glance = _glance()
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index(glance.BEGIN), readme.index(glance.END) + len(glance.END)
    assert readme[start:end] == glance.readme_block(), (
        "README.md's cost figures differ from benchmarks/results: "
        "run `.venv/bin/python benchmarks/glance.py --readme`"
    )


def test_results_md_opens_with_the_same_figures() -> None:
    glance = _glance()
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    first = results.index("\n## ")
    assert results[first:].startswith("\n## At a glance")
    for line in glance.cost_lines(glance.figures()):
        assert line in results


def test_every_figure_names_the_commit_it_came_from() -> None:
    glance = _glance()
    figures = glance.figures()
    for src in figures["src"].values():
        _name, commit, day = (part.strip() for part in src.split(","))
        assert commit != "?" and len(commit) >= 7, src
        assert day[:2] == "20", src
