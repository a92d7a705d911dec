"""The warm pool: rollout actors created once, each with ``rollouts_per_actor`` slots.

A rollout leases a free slot for as long as it runs and frees it when it ends. A dead actor is
replaced by a new actor under a new name (a dead actor's process is never reused), and the
ledger is told about every actor it should ask (``register_owners``). All methods run on one
event loop (the orchestrator's); nothing here blocks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import ray
from pydantic import BaseModel, ConfigDict
from ray.actor import ActorHandle
from ray.exceptions import ActorUnavailableError, RayActorError

from rl_gym_actors.actors.rollout_actor import RolloutActor
from rl_gym_actors.actors.runtime import RAY_NAMESPACE
from rl_gym_actors.config import GymEndpoint, LedgerConfig, PoolConfig, TryPolicy
from rl_gym_actors.errors import PoolClosed

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # at least; a large pool gets more (actor start is ~1 s of CPU here)
START_S_PER_ACTOR = 2.0


def start_timeout_s(size: int) -> float:
    """How long the pool may take to start ``size`` actors."""
    return max(START_TIMEOUT_S, START_S_PER_ACTOR * size)


PING_TIMEOUT_S = 5.0
PROBE_EVERY_S = 1.0  # an unreachable actor is pinged this often ...
PROBE_FOR_S = 60.0  # ... for this long, then replaced
CLOSE_TIMEOUT_S = 2.0


def actor_name(orchestrator_id: str, index: int, generation: int = 0) -> str:
    """``rlga-rollout-<orchestrator id>-<i>``; a replacement adds ``-r<generation>``."""
    base = f"rlga-rollout-{orchestrator_id}-{index}"
    return base if generation == 0 else f"{base}-r{generation}"


def actor_pattern(orchestrator_id: str) -> str:
    """A regular expression that matches exactly the names :func:`actor_name` gives."""
    return rf"rlga-rollout-{re.escape(orchestrator_id)}-\d+(-r\d+)?"


class PoolSnapshot(BaseModel):
    """The pool's state: its actors (current names), leases, replacements, start-up time."""

    model_config = ConfigDict(frozen=True)

    size: int
    rollouts_per_actor: int
    actors: list[str]
    leased: int
    free: int
    replaced: int
    startup_s: float
    leases: dict[str, str]  # rollout id -> actor name


@dataclass
class Slot:
    """One leased slot: the actor to call for this rollout."""

    index: int
    generation: int
    name: str
    handle: ActorHandle


@dataclass
class _Member:
    generation: int
    name: str
    handle: ActorHandle
    ready: asyncio.Event


class WarmPool:
    """``size`` rollout actors, created by :meth:`start` and kept until :meth:`close`."""

    def __init__(
        self,
        orchestrator_id: str,
        endpoints: Sequence[GymEndpoint],
        policy: TryPolicy,
        config: PoolConfig,
        ledger_config: LedgerConfig,
        ledger: ActorHandle,
    ) -> None:
        self.orchestrator_id = orchestrator_id
        self._endpoints = list(endpoints)
        self._policy = policy
        self._config = config
        self._ledger_config = ledger_config
        self._ledger = ledger
        self._members: list[_Member] = []
        self._free: asyncio.Queue[int] | None = None
        self._leases: dict[str, str] = {}
        self._replaced = 0
        self._probes: dict[int, asyncio.Task] = {}
        self._startup_s = 0.0
        self._closed = False

    # ------------------------------------------------------------ life cycle

    def _create(self, index: int, generation: int) -> _Member:
        name = actor_name(self.orchestrator_id, index, generation)
        options: dict = dict(
            name=name,
            namespace=RAY_NAMESPACE,
            num_cpus=self._config.num_cpus,
            max_restarts=0,
            max_task_retries=0,
        )
        if self._config.spread:
            options["scheduling_strategy"] = "SPREAD"
        # @ray.remote's stubs keep the class's own type; the ActorClass it made has .options
        handle = RolloutActor.options(**options).remote(  # type: ignore[attr-defined]
            name,
            self._endpoints,
            self._policy,
            self._ledger,
            self._ledger_config,
            self._config.rollouts_per_actor,
            log_level=self._config.log_level,
        )
        return _Member(generation, name, handle, asyncio.Event())

    async def start(self) -> float:
        """Create every actor, wait until each answers a ping, register them with the ledger.
        Returns (and logs) the start-up time in seconds."""
        began = time.perf_counter()
        size, per = self._config.size, self._config.rollouts_per_actor
        self._members = [self._create(i, 0) for i in range(size)]
        try:
            await asyncio.wait_for(
                asyncio.gather(*(m.handle.ping.remote() for m in self._members)),
                start_timeout_s(size),
            )
        except BaseException:
            await self.close()
            raise
        for m in self._members:
            m.ready.set()
        await self._ledger.register_owners.remote({m.name: m.handle for m in self._members})
        self._free = asyncio.Queue()
        # slots interleaved across actors, so a small batch spreads over the pool
        for _ in range(per):
            for i in range(size):
                self._free.put_nowait(i)
        self._startup_s = time.perf_counter() - began
        logger.info(
            "warm pool of %d rollout actors (%d slots each) started in %.2fs",
            size,
            per,
            self._startup_s,
        )
        return self._startup_s

    async def close(self) -> None:
        """Close every actor's Gym clients (briefly) and kill the actors."""
        if self._closed:
            return
        self._closed = True
        for probe in list(self._probes.values()):
            probe.cancel()
        members, self._members = self._members, []
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.gather(*(m.handle.close.remote() for m in members), return_exceptions=True),
                CLOSE_TIMEOUT_S,
            )
        for m in members:
            with contextlib.suppress(Exception):
                ray.kill(m.handle, no_restart=True)

    # ------------------------------------------------------------ leasing

    @contextlib.asynccontextmanager
    async def lease(self, rollout_id: str) -> AsyncIterator[Slot]:
        """Wait for a free slot; hold it for the body. Cancelling the wait leases nothing."""
        if self._closed or self._free is None:
            raise PoolClosed("the rollout pool is closed or not started")
        index = await self._free.get()
        try:
            while True:
                if self._closed:
                    raise PoolClosed("the rollout pool closed")
                member = self._members[index]
                if member.ready.is_set():
                    break
                await member.ready.wait()  # a replacement is starting
            self._leases[rollout_id] = member.name
            yield Slot(index, member.generation, member.name, member.handle)
        finally:
            self._leases.pop(rollout_id, None)
            self._free.put_nowait(index)

    async def actor_failed(self, slot: Slot, exc: BaseException) -> bool:
        """A call on ``slot``'s actor raised ``exc``. Replace the actor when it is dead (an
        ``ActorUnavailableError`` is checked with a ping first). True when it was replaced."""
        if self._closed or slot.index >= len(self._members):
            return False
        member = self._members[slot.index]
        if member.generation != slot.generation:
            return True  # already replaced
        if not member.ready.is_set():
            await member.ready.wait()
            return True
        if isinstance(exc, ActorUnavailableError) or not isinstance(exc, RayActorError):
            try:
                await asyncio.wait_for(member.handle.ping.remote(), PING_TIMEOUT_S)
                return False  # alive after all
            except (ActorUnavailableError, TimeoutError):
                # unreachable for now (its node may be going away): keep its slots out of
                # rotation until it answers again, is declared dead, or PROBE_FOR_S passes
                self._quarantine(slot.index, member)
                return False
            except RayActorError:
                pass
        await self._replace(slot.index)
        return True

    def _quarantine(self, index: int, member: _Member) -> None:
        if index in self._probes or self._closed:
            return
        member.ready.clear()  # leasers of its slots wait (see lease)
        self._probes[index] = asyncio.get_running_loop().create_task(self._probe(index, member))

    async def _probe(self, index: int, member: _Member) -> None:
        try:
            give_up = time.monotonic() + PROBE_FOR_S
            while not self._closed and time.monotonic() < give_up:
                try:
                    await asyncio.wait_for(member.handle.ping.remote(), PING_TIMEOUT_S)
                    member.ready.set()  # reachable again: back in rotation
                    return
                except (ActorUnavailableError, TimeoutError):
                    await asyncio.sleep(PROBE_EVERY_S)
                except RayActorError:
                    break  # declared dead
            if not self._closed and self._members[index] is member:
                await self._replace(index)
        finally:
            self._probes.pop(index, None)
            member.ready.set()  # never leave a waiter on a dropped member

    async def _replace(self, index: int) -> None:
        old = self._members[index]
        with contextlib.suppress(Exception):
            ray.kill(old.handle, no_restart=True)
        new = self._create(index, old.generation + 1)
        new.ready.clear()
        self._members[index] = new
        try:
            try:
                await asyncio.wait_for(new.handle.ping.remote(), START_TIMEOUT_S)
            except RayActorError as exc:
                # replaced again meanwhile (killed before it ran) or dead at birth: whoever
                # replaced it owns the slot now; a call that fails on it replaces it again
                logger.warning("replacement %s gone before it started: %r", new.name, exc)
                return
            except TimeoutError:
                # no room for it yet (a lost node's CPUs went with the node): it starts when
                # Ray can place it; calls leased to it wait for that
                logger.warning("replacement %s not started after %.0f s", new.name, START_TIMEOUT_S)
            try:
                await self._ledger.register_owners.remote({new.name: new.handle})
            except RayActorError as exc:
                # a ledger Ray could not bring back: rollouts go on without it, and the
                # orchestrator's snapshot and checkpoint say LedgerLost
                logger.warning("ledger gone; %s not registered: %r", new.name, exc)
        finally:
            new.ready.set()
        self._replaced += 1
        logger.warning("rollout actor %s died; replaced by %s", old.name, new.name)

    # ------------------------------------------------------------ reading

    @property
    def handles(self) -> dict[str, ActorHandle]:
        return {m.name: m.handle for m in self._members}

    def snapshot(self) -> PoolSnapshot:
        free = self._free.qsize() if self._free is not None else 0
        return PoolSnapshot(
            size=self._config.size,
            rollouts_per_actor=self._config.rollouts_per_actor,
            actors=[m.name for m in self._members],
            leased=len(self._leases),
            free=free,
            replaced=self._replaced,
            startup_s=round(self._startup_s, 4),
            leases=dict(self._leases),
        )
