"""Everything stays on loopback: the shared local Ray and the Gym test servers bind 127.0.0.1."""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlparse

import pytest


def _is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


def test_ray_node_binds_loopback(ray_session):
    ray = ray_session
    assert os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == "0"
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    assert nodes, "no live Ray node"
    for node in nodes:
        assert _is_loopback(node["NodeManagerAddress"]), node["NodeManagerAddress"]
    assert _is_loopback(ray.util.get_node_ip_address())


@pytest.mark.slow  # seconds: out of make test-fast
def test_rollout_actor_runs_on_a_loopback_node(ray_session):
    ray = ray_session

    @ray.remote(num_cpus=0)
    def where() -> str:
        return ray.util.get_node_ip_address()

    assert _is_loopback(ray.get(where.remote(), timeout=60))


def test_gym_test_server_binds_loopback():
    from rl_gym_actors.testing.gym_process import GymServerThread

    with GymServerThread() as server:
        assert _is_loopback(urlparse(server.url).hostname)
