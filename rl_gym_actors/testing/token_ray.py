"""A real Ray head with token authentication, on loopback, for the tests that attach to one.

:func:`token_ray_head` starts ``ray.init(address="local")`` in a child process (not ``ray start
--head``, whose ``ray stop`` kills by name) in a process group of its own, with
``RAY_AUTH_MODE=token`` and the given token, and yields the GCS address it prints; the whole group
is SIGKILLed when the block ends. ``None`` is yielded when Ray's own start-up timed out (a loaded
machine): the caller decides what that means.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

HEAD = """
import time, ray
ray.init(address="local", num_cpus={num_cpus}, include_dashboard=False,
         _node_ip_address="127.0.0.1")
print(ray.get_runtime_context().gcs_address, flush=True)
time.sleep(900)
"""


@contextlib.contextmanager
def token_ray_head(token: str, *, num_cpus: int = 1) -> Iterator[str | None]:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen(
        [sys.executable, "-c", HEAD.format(num_cpus=int(num_cpus))],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
        start_new_session=True,  # its Ray processes share its process group
    )
    try:
        assert head.stdout is not None
        yield head.stdout.readline().strip() or None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        head.wait()
