"""A benchmark run alone changes nothing git tracks: its result files go to build/bench-results/
unless it is given ``--write``, which run_all.py (``make bench``) passes, so only a whole run
rewrites benchmarks/results/. Checked on a copy of the harness (benchmarks/common.py) in a tree
of its own, with a benchmark of one row, run as a process as run_all runs it."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

from rl_gym_actors.testing.polling import scaled

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
from common import bench_main


def body(result, args):
    result.rows.append({"x": 1})
    result.add_table("", ["x"], [[1]])


if __name__ == "__main__":
    bench_main("probe", "A probe", body)
"""


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    (tree / "benchmarks").mkdir(parents=True)
    shutil.copy2(ROOT / "benchmarks" / "common.py", tree / "benchmarks" / "common.py")
    (tree / "benchmarks" / "probe.py").write_text(PROBE)
    return tree


def _run_all():
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
    assert spec is not None and spec.loader is not None
    sys.path.insert(0, str(ROOT / "benchmarks"))  # run_all imports its siblings
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


def test_a_benchmark_run_alone_writes_only_the_scratch_dir(tmp_path):
    tree = _tree(tmp_path)
    done = subprocess.run(
        [sys.executable, str(tree / "benchmarks" / "probe.py"), "--quick"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert done.returncode == 0, done.stderr
    assert not (tree / "benchmarks" / "results").exists()
    assert (tree / "build" / "bench-results" / "probe.json").exists()
    assert "wrote build/bench-results/probe.json" in done.stdout


def test_write_and_run_all_write_the_tracked_results(tmp_path):
    tree = _tree(tmp_path)
    done = subprocess.run(
        [sys.executable, str(tree / "benchmarks" / "probe.py"), "--quick", "--write"],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert done.returncode == 0, done.stderr
    written = tree / "benchmarks" / "results" / "probe.json"
    assert written.exists()
    written.unlink()
    # a process of the caller's own (here: as a test's Ray session is) outlives run_one, which
    # kills only what the benchmark left running
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        run = _run_all().run_one("probe", True, tree=tree)
        assert mine.poll() is None, "run_one killed a process the benchmark did not start"
    finally:
        mine.kill()
        mine.wait()
    assert run["rc"] == 0, run["tail"]
    assert written.exists() and (tree / "benchmarks" / "results" / "probe.md").exists()
    assert not (tree / "build").exists()
