"""Shared fixtures: one local Ray session per test process, bound to loopback."""

from __future__ import annotations

import contextlib
import fcntl
import os

import pytest

# Ray 2.60 binds the machine's address unless told otherwise; keep everything on loopback.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@contextlib.contextmanager
def _one_ray_start_at_a_time(tmp_path_factory):
    """Under ``make test``'s workers (pytest-xdist) each worker process has a Ray of its own;
    their starts take turns (a lock file shared by the run's workers): Ray's raylet has a fixed
    30 s to register, which starts racing one another on a loaded machine miss. A serial run
    takes no lock."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        yield
        return
    lock = tmp_path_factory.getbasetemp().parent / "ray-start.lock"
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


def pytest_collection_modifyitems(config, items):
    """Files with the most tests marked ``slow`` first, the rest in their usual order: with
    ``make test``'s workers (one file at a time each, ``--no-loadscope-reorder``) the longest
    files start first instead of being the last ones left. A serial run keeps each file whole,
    in the same order; a new file needs nothing to be placed."""
    slow: dict[str, int] = {}
    for item in items:
        slow.setdefault(item.nodeid.split("::", 1)[0], 0)
        if item.get_closest_marker("slow") is not None:
            slow[item.nodeid.split("::", 1)[0]] += 1
    order = {f: i for i, f in enumerate(sorted(slow, key=lambda f: -slow[f]))}
    items.sort(key=lambda item: order[item.nodeid.split("::", 1)[0]])
