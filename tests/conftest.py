"""Shared fixtures: one local Ray session per test process, bound to loopback."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path

import pytest

# Ray 2.60 binds the machine's address unless told otherwise; keep everything on loopback.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@contextlib.contextmanager
def _one_ray_start_at_a_time(tmp_path_factory):
    """Under ``make test``'s workers (pytest-xdist) each worker process has a Ray of its own;
    their starts take turns (a lock file in the machine's temp dir, so that the workers of two
    suites at once, as in CI, take turns too): Ray's raylet has a fixed 30 s to register, which
    starts racing one another on a loaded machine miss. A serial run takes no lock."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        yield
        return
    lock = Path(tempfile.gettempdir()) / "rl-gym-actors-ray-start.lock"
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory):
    """One local Ray per test process (``ray.init`` costs seconds here): the whole suite's in a
    serial run, each worker's under ``make test``."""
    import ray

    from rl_gym_actors.actors.runtime import start_local_ray

    if not ray.is_initialized():
        # address="local": always a Ray of our own, never another process's live cluster
        # metrics reach the node's metrics agent every 2 s (Ray's default: 10 s), so a test
        # reading Ray's export waits seconds, not tens of them
        # a start that misses Ray's fixed 30 s raylet registration (a loaded machine) is
        # retried after its processes are stopped (runtime.start_local_ray)
        with _one_ray_start_at_a_time(tmp_path_factory):
            start_local_ray(
                num_cpus=4,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                _system_config={"metrics_report_interval_ms": 2000},
            )
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def agent():
    """A counting simulated agent (:mod:`rl_gym_actors.testing.counting_agent`), one per module."""
    from rl_gym_actors.testing.counting_agent import CountingAgent

    return CountingAgent()


@pytest.fixture(scope="module")
def gym(agent):
    """A real Gym server on loopback in a thread of this process, one per module: it runs
    ``agent``, takes the token ``test-token`` and honours the fault fields of a row."""
    from rl_gym_actors.testing.gym_process import GymServerThread

    with GymServerThread(agent=agent, token="test-token", allow_faults=True) as server:
        yield server


@pytest.fixture(scope="session")
def load_example():
    """Import ``examples/<name>.py`` as a module (the examples are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    examples = Path(__file__).resolve().parents[1] / "examples"

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, examples / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


# seconds each test file took (setup, calls and teardown), measured: make test's workers take
# the files in this order, the longest first, so that the run does not end on one worker still
# in a long file the others could have shared. Refresh it with RLGA_FILE_SECONDS_OUT (below).
FILE_SECONDS = Path(__file__).with_name("file_seconds.json")


def _estimated_seconds(tests: int, slow: int) -> float:
    """What a file missing from FILE_SECONDS (a new one) counts: a slow test ~10 s, others 0.2 s."""
    return 10.0 * slow + 0.2 * (tests - slow)


def pytest_collection_modifyitems(config, items):
    """The files in the order of their measured seconds (FILE_SECONDS), the longest first, the
    tests of each in their usual order: with ``make test``'s workers (one file at a time each,
    ``--no-loadscope-reorder``) the longest files start first instead of being the last ones
    left. A serial run keeps each file whole; a new file needs nothing to be placed."""
    import json

    measured = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.is_file() else {}
    counts: dict[str, list[int]] = {}
    for item in items:
        tests_slow = counts.setdefault(item.nodeid.split("::", 1)[0], [0, 0])
        tests_slow[0] += 1
        tests_slow[1] += item.get_closest_marker("slow") is not None
    cost = {f: measured.get(f, _estimated_seconds(*n)) for f, n in counts.items()}
    order = {f: i for i, f in enumerate(sorted(cost, key=lambda f: -cost[f]))}
    items.sort(key=lambda item: order[item.nodeid.split("::", 1)[0]])


_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Each file's seconds, summed over its tests' phases (in a pytest-xdist run the controller
    sees every worker's reports)."""
    if os.environ.get("RLGA_FILE_SECONDS_OUT"):
        f = report.nodeid.split("::", 1)[0]
        _file_seconds[f] = _file_seconds.get(f, 0.0) + report.duration


def pytest_sessionfinish(session):
    """``RLGA_FILE_SECONDS_OUT=tests/file_seconds.json make test`` writes the measured seconds
    of the files this run ran (merged into what the file held): FILE_SECONDS, refreshed."""
    import json

    out = os.environ.get("RLGA_FILE_SECONDS_OUT")
    if not out or hasattr(session.config, "workerinput") or not _file_seconds:
        return
    path = Path(out)
    merged = json.loads(path.read_text()) if path.is_file() else {}
    merged.update({f: round(s, 1) for f, s in _file_seconds.items()})
    path.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
