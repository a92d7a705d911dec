"""A local Ray start that fails (Ray's raylet misses its fixed 30 s to register on a loaded
machine) leaves that session's processes behind; ``start_local_ray`` stops them and tries again.

Run in a process of its own: the suite's process already has its Ray."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from rl_gym_actors.testing.polling import scaled

SCRIPT = textwrap.dedent(
    """
    import json, ray, psutil
    from ray._private import node as ray_node
    from rl_gym_actors import RayStartFailed, start_local_ray

    real = ray_node.Node.start_ray_processes
    left = []

    def start_then_time_out(self):
        real(self)  # the GCS, raylet and monitors really start ...
        left.extend(p.pid for p in psutil.Process().children(recursive=True))
        raise Exception("The current node timed out during startup.")  # ... then Ray gives up

    ray_node.Node.start_ray_processes = start_then_time_out
    try:
        start_local_ray(tries=1, num_cpus=1, include_dashboard=False)
    except RayStartFailed as exc:
        failed = {"tries": exc.tries, "cause": type(exc.__cause__).__name__}
    ray_node.Node.start_ray_processes = real
    alive_after_failure = [pid for pid in left if psutil.pid_exists(pid)
                           and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]

    start_local_ray(tries=2, num_cpus=1, include_dashboard=False)
    answer = ray.get(ray.remote(lambda: 41 + 1).remote())
    node = ray.nodes()[0]["NodeManagerAddress"]
    ray.shutdown()
    print(json.dumps(dict(failed=failed, left=len(left), alive=alive_after_failure,
                          answer=answer, node=node)))
    """
)


@pytest.mark.slow  # two Ray starts in a process of its own
def test_a_failed_start_stops_its_processes_and_the_next_start_works():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=scaled(120),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["failed"] == {"tries": 1, "cause": "Exception"}
    assert got["left"] >= 2  # at least the GCS and the raylet had started
    assert got["alive"] == []  # every one of them stopped before the error reached the caller
    assert got["answer"] == 42  # and the next start gives a working Ray
    assert got["node"] == "127.0.0.1"
