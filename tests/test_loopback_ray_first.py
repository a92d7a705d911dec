"""`import ray` before the project's import: the local Ray the orchestrator starts still listens on
127.0.0.1 only (issue 16). Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, when it is first
imported; without the fix every Ray process of such a driver listened on the host's outward
address (and on 0.0.0.0 / ::)."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

DRIVER = textwrap.dedent(
    """
    import json, os, sys
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ
    import ray  # first, with the variable unset: Ray reads it now
    import psutil
    from rl_gym_actors import GymEndpoint, Orchestrator
    from rl_gym_actors.testing.gym_process import GymServerThread

    with GymServerThread(token="t") as gym:
        with Orchestrator([GymEndpoint(url=gym.url, token="t")], pool_size=2,
                          progress=False) as orch:
            outcomes = orch.run_batch([{"x": i} for i in range(4)])
            me = psutil.Process()
            found = []
            for proc in [me, *me.children(recursive=True)]:
                try:
                    conns = proc.net_connections(kind="inet")
                    name = proc.name()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                found += [[name, c.laddr.ip, c.laddr.port] for c in conns
                          if c.status == psutil.CONN_LISTEN]
            node_ip = ray.util.get_node_ip_address()
    print(json.dumps({"sealed": sum(o.status == "sealed" for o in outcomes),
                      "node_ip": node_ip, "listening": found}))
    """
)


def _loopback(host: str) -> bool:
    ip = ipaddress.ip_address(host.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


@pytest.mark.slow
def test_every_ray_port_is_loopback_when_ray_was_imported_first():
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" and k != "RAY_ADDRESS"
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", DRIVER],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["sealed"] == 4
    assert _loopback(report["node_ip"]), report["node_ip"]
    names = {name for name, _, _ in report["listening"]}
    # the GCS and the raylet at least: the check saw Ray's own processes
    assert {"gcs_server", "raylet"} <= names, names
    outward = [entry for entry in report["listening"] if not _loopback(entry[1])]
    assert outward == [], outward
