"""The SkyRL adapter's tests run against the real skyrl, pinned by the project's ``skyrl`` extra:
``make test-skyrl``. skyrl missing or another version is a failure here, never a skip."""

from __future__ import annotations

import os
from importlib.metadata import version

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

SKYRL_VERSION = "0.4.0"


def pytest_sessionstart(session: pytest.Session) -> None:
    found = version("skyrl")  # PackageNotFoundError: skyrl is not installed (a failure)
    if found != SKYRL_VERSION:
        raise pytest.UsageError(f"these tests pin skyrl {SKYRL_VERSION}, found {found}")


@pytest.fixture(scope="session")
def ray_address():
    """One local Ray (loopback) that every trainer incarnation joins as a driver of its own: a
    trainer's SIGKILL takes its actors with it, and no incarnation waits for a Ray to start."""
    import ray

    from rl_gym_actors.actors.runtime import start_local_ray

    # a loaded machine can miss Ray's fixed start-up waits: more tries than the default
    start_local_ray(tries=6, num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="module")
def policy():
    """The stand-in policy as the Gym agent, counting its runs per rollout id."""
    from rl_gym_actors.testing.skyrl_cpu import PolicyAgent

    return PolicyAgent()


@pytest.fixture(scope="module")
def gym(policy, tmp_path_factory):
    """The project's Gym server on loopback (durable: SQLite), one per module."""
    from rl_gym_actors.testing.gym_process import GymServerThread

    state = tmp_path_factory.mktemp("gym-state")
    with GymServerThread(agent=policy, token="test-token", state_dir=state) as server:
        yield server
