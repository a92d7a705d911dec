"""Starting a local Ray the way this library needs it: loopback only, no usage stats, quiet.

``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray take 127.0.0.1 as the node address instead of
the machine's outward address. Ray reads it once, when it is first imported (into
``ray._private.ray_constants.ENABLE_RAY_CLUSTER``), so this module sets it at import time, before
anything here imports Ray. A process that imported Ray before this package has read it unset:
Ray 2.60 then turns even an explicit ``_node_ip_address="127.0.0.1"`` into the outward address
(``services.resolve_ip_for_localhost``) and every Ray process listens on it. :func:`ensure_ray`
therefore also sets the constant Ray read, before it starts a local Ray of its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from rl_gym_actors.errors import ConfigError, RayStartFailed

LOOPBACK = "127.0.0.1"
RAY_NAMESPACE = "rl_gym_actors"  # the Ray namespace of every named actor this library starts
LEDGER_PREFIX = "rlga-ledger-"  # a ledger actor's name: this prefix, then its orchestrator's id
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}

for _name, _value in RAY_ENV.items():
    os.environ.setdefault(_name, _value)

logger = logging.getLogger(__name__)


def ensure_ray(*, num_cpus: int | None = None, address: str | None = None) -> bool:
    """Connect to Ray: the running session if there is one, else ``address`` (or
    ``$RAY_ADDRESS``) when given, else a new local Ray of our own bound to loopback. True when
    this call started or connected it."""
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is None:  # a local Ray: loopback, whatever was set before
        os.environ.update(RAY_ENV)
    import ray

    if ray.is_initialized():
        return False
    started = time.perf_counter()
    # Ray's own loggers at ERROR: its start-up notices are not ours to print
    kwargs: dict = dict(
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        configure_logging=True,
    )
    if address is not None:
        ray.init(address=address, **kwargs)
    else:
        # "local": a new Ray of our own, never some other process's cluster found in /tmp/ray
        start_local_ray(num_cpus=num_cpus, **kwargs)
    logger.info("ray started in %.2fs", time.perf_counter() - started)
    return True


LOCAL_RAY_TRIES = 3  # Ray's raylet has a fixed 30 s to register; a loaded machine can miss it


def start_local_ray(*, tries: int = LOCAL_RAY_TRIES, **init_kwargs: Any) -> None:
    """``ray.init(address="local", ...)`` on loopback, tried up to ``tries`` times. A start that
    fails leaves Ray's processes of that session running (its GCS, raylet, monitors: children of
    this process that Ray no longer tracks); they are stopped before the next try, so a failed
    start never adds load to the one after it. Raises :class:`RayStartFailed` after the last try;
    a bad argument (``TypeError``/``ValueError``) is raised at once."""
    os.environ.update(RAY_ENV)
    import ray

    _loopback_constant()
    init_kwargs.setdefault("_node_ip_address", LOOPBACK)
    for attempt in range(1, tries + 1):
        before = _child_pids()
        try:
            ray.init(address="local", **init_kwargs)
            return
        except (TypeError, ValueError):
            raise
        except Exception as exc:  # Ray's start-up timeout is a bare Exception
            ray.shutdown()
            _stop_new_children(before)
            logger.warning(
                "local ray start %d/%d failed (%s); stopped its processes",
                attempt,
                tries,
                type(exc).__name__,
            )
            if attempt == tries:
                raise RayStartFailed(
                    f"a local Ray did not start in {tries} tries (is the machine overloaded?)",
                    tries=tries,
                ) from exc


def _child_pids() -> set[int]:
    import psutil  # Ray ships psutil (ray/thirdparty_files) and puts it on sys.path

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _stop_new_children(before: set[int]) -> None:
    """SIGKILL this process's children (and theirs) that were not there in ``before``."""
    import psutil

    new = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    for proc in new:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(new, timeout=5)


def _loopback_constant() -> None:
    """Make an already imported Ray resolve "this node" to 127.0.0.1, as it does when the
    environment variable was set before its import (``services.get_node_ip_address`` reads the
    module constant at each call)."""
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


class LoopThread:
    """A private asyncio loop on a daemon thread, so that sync methods work from a plain driver
    script and async ones from any other loop (a Ray actor's, a notebook's)."""

    def __init__(self, name: str = "rlga-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self.loop.is_closed()

    def run(self, coro):
        """Run ``coro`` on the loop and wait for its result (from any thread but the loop's)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise ConfigError(
                "a sync method was called on the orchestrator's own loop; "
                "await its async variant instead"
            )
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    async def arun(self, coro):
        """Await ``coro`` on the loop from another loop (or directly when already on it)."""
        if asyncio.get_running_loop() is self.loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self, timeout_s: float = 5.0) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()


DRIVER_POLL_S = 0.5  # how often a rollout actor asks whether its driver still lives


async def watch_driver(
    on_gone: Callable[[], None],
    *,
    interval_s: float = DRIVER_POLL_S,
    on_tick: Callable[[], None] | None = None,
) -> None:
    """Call ``on_gone()`` once the driver of this Ray job is dead, then return; ``on_tick()``
    (housekeeping of the caller's, e.g. metrics held back) at each of its ``interval_s``.

    Ray kills a job's actors some seconds after its driver dies; meanwhile they must not act for
    a driver that can no longer take their results. Runs inside an actor: it asks the GCS for
    this job's record (one small async call per ``interval_s``). A failed call is no verdict."""
    import ray
    from ray._private import worker

    job_id = ray.get_runtime_context().get_job_id()
    # Ray's private worker: gcs_client is set when the worker connects, not declared on the class
    gcs = worker.global_worker.gcs_client  # type: ignore[attr-defined]
    while True:
        await asyncio.sleep(interval_s)
        if on_tick is not None:
            on_tick()
        try:
            infos = await gcs.async_get_all_job_info(
                job_or_submission_id=job_id,
                skip_submission_job_info_field=True,
                skip_is_running_tasks_field=True,
                timeout=max(interval_s, 1.0),
            )
        except Exception as exc:  # the GCS is busy or restarting: ask again
            logger.debug("driver check failed: %r", exc)
            continue
        info = next(iter(infos.values()), None)
        if info is not None and info.is_dead:
            logger.warning("the driver of job %s is gone: dispatching nothing more", job_id)
            on_gone()
            return
