"""One orchestrator for every process of a run: a named, detached Ray actor.

verl plays its agent loops in several ``AgentLoopWorker`` actors and checkpoints on the driver,
so no one process can own the :class:`~rl_gym_actors.orchestrator.Orchestrator`. The host is an
actor named after the run (``rlga-host-<run_id>`` in namespace ``rl_gym_actors``), detached so
that no callback object or worker owns it: whoever needs it first creates it
(:func:`ensure_host`, Ray's ``get_if_exists``, so it starts once however many processes race),
and it restores the layer's part from ``restore_from`` in its constructor (so once). It lives as
long as the Ray cluster, or until :func:`close_host`. Nothing in it is verl's: any framework
whose rollouts run in several processes can use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.core.checkpoint_report import CheckpointReport
from rl_gym_actors.errors import PoolClosed
from rl_gym_actors.orchestrator import Orchestrator
from rl_gym_actors.outcome import Outcome

NAMESPACE = "rl_gym_actors"
MAX_CONCURRENCY = 10_000  # rows in flight through the host at once (one call each)
START_TIMEOUT_S = 180.0
FINISH_SLACK_S = 30.0


def host_name(run_id: str) -> str:
    return f"rlga-host-{run_id}"


@dataclass(frozen=True)
class HostSpec:
    """What the host is built from (plain data: it crosses Ray)."""

    endpoints: tuple[GymEndpoint, ...]
    run_id: str
    pool_size: int
    rollouts_per_actor: int = 1
    policy: TryPolicy | None = None
    restore_from: str | None = None


class OrchestratorHost:
    """The actor's class (``ray.remote`` applied in :func:`ensure_host`)."""

    def __init__(self, spec: HostSpec) -> None:
        self.spec = spec
        self.orch = Orchestrator(
            list(spec.endpoints),
            policy=spec.policy,
            pool_size=spec.pool_size,
            rollouts_per_actor=spec.rollouts_per_actor,
            run_id=spec.run_id,
            orchestrator_id=f"{spec.run_id[:40]}-host",
            progress=False,
            start=False,
            restore_from=spec.restore_from,
            keep_results=True,  # a restored handed result is the trainer's only copy
        )
        self._started: asyncio.Task[Any] | None = None
        self._calls = 0  # run / run_batch calls under way
        self._idle = asyncio.Event()
        self._idle.set()
        self._finishing = False

    async def _ready(self) -> Orchestrator:
        if self._started is None:
            self._started = asyncio.ensure_future(self.orch.astart())
        await asyncio.shield(self._started)
        return self.orch

    async def ready(self) -> dict[str, Any]:
        """Start the orchestrator (once); what it was built from."""
        orch = await self._ready()
        return {"run_id": orch.run_id, "restored_from": self.spec.restore_from}

    async def run(self, row: Mapping[str, Any]) -> Outcome:
        return (await self.run_batch([row]))[0]

    async def run_batch(self, rows: Sequence[Mapping[str, Any]]) -> list[Outcome]:
        if self._finishing:
            raise PoolClosed(f"run {self.spec.run_id!r} has finished: its host takes no rows")
        self._calls += 1
        self._idle.clear()
        try:
            return await (await self._ready()).arun_batch(rows)
        finally:
            self._calls -= 1
            if self._calls == 0:
                self._idle.set()

    async def finish(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        deadline_s: float = 120.0,
        keep_if_handed: list[str] | None = None,
    ) -> CheckpointReport:
        """The run's training ended: take no more rows, let the ones under way end (within
        ``deadline_s``; the sessions of the last batch the trainer fetched, which it never
        trains), then one more checkpoint into ``checkpoint_dir`` that records and releases
        their results, so the run leaves nothing held on Gym (a run extended later restores
        them from this part, as from any newer part)."""
        self._finishing = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), deadline_s)
        return await self.checkpoint(
            checkpoint_id, checkpoint_dir, deadline_s, keep_if_handed=keep_if_handed
        )

    async def checkpoint(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        deadline_s: float = 120.0,
        keep: list[str] | None = None,
        keep_if_handed: list[str] | None = None,
    ) -> CheckpointReport:
        """The layer's checkpoint into ``checkpoint_dir``. ``keep``: rollout ids the trainer
        still holds untrained; ``keep_if_handed``: ids it may hold, kept if handed out (the
        in-flight API, issue 27; each passed on only when given)."""
        orch = await self._ready()
        extra: dict[str, Any] = {}
        if keep is not None:
            extra["keep"] = list(keep)
        if keep_if_handed is not None:
            extra["keep_if_handed"] = list(keep_if_handed)
        return await orch.acheckpoint(checkpoint_id, checkpoint_dir, deadline_s=deadline_s, **extra)

    async def snapshot(self) -> Any:
        return await (await self._ready()).asnapshot()

    async def close(self) -> None:
        await self.orch.aclose()


def ensure_host(spec: HostSpec) -> Any:
    """The run's host actor: the running one, or a new one built from ``spec`` (restoring
    ``spec.restore_from``). Waits until its orchestrator has started."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    actor = _options(spec).remote(spec)
    ray.get(actor.ready.remote(), timeout=START_TIMEOUT_S)
    return actor


async def aensure_host(spec: HostSpec) -> Any:
    """:func:`ensure_host` for code on an event loop (verl's agent loops)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    actor = _options(spec).remote(spec)
    await asyncio.wait_for(actor.ready.remote(), START_TIMEOUT_S)
    return actor


def _options(spec: HostSpec) -> Any:
    return ray.remote(OrchestratorHost).options(
        name=host_name(spec.run_id),
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        max_concurrency=MAX_CONCURRENCY,
        num_cpus=0,
    )


def find_host(run_id: str) -> Any | None:
    """The run's host if it is running, else None."""
    try:
        return ray.get_actor(host_name(run_id), namespace=NAMESPACE)
    except ValueError:
        return None


def finish_host(
    run_id: str,
    checkpoint_id: str,
    checkpoint_dir: str,
    deadline_s: float = 120.0,
    keep_if_handed: list[str] | None = None,
) -> CheckpointReport | None:
    """:meth:`OrchestratorHost.finish` on the run's host; None when there is none."""
    actor = find_host(run_id)
    if actor is None:
        return None
    call = actor.finish.remote(checkpoint_id, checkpoint_dir, deadline_s, keep_if_handed)
    report: CheckpointReport = ray.get(call, timeout=2 * deadline_s + FINISH_SLACK_S)
    return report


def close_host(run_id: str, timeout_s: float = 60.0) -> bool:
    """Close the run's host (its orchestrator's actors, then the host itself); False when there
    was none."""
    actor = find_host(run_id)
    if actor is None:
        return False
    try:
        ray.get(actor.close.remote(), timeout=timeout_s)
    finally:
        ray.kill(actor, no_restart=True)
    return True
