"""The ledger actor: one per orchestrator, the single writer of the book, and the checkpoint gate.

Created by the orchestrator as ``LedgerActor.options(name=ledger_name(oid),
namespace=RAY_NAMESPACE).remote(endpoints, policy, config)``. Rollout actors send their
:class:`~rl_gym_actors.core.attempt_reports.AttemptReport` batches to
:meth:`LedgerActor.report`; the pool registers them with :meth:`LedgerActor.register_owners`;
the trainer's checkpoint comes through :meth:`LedgerActor.checkpoint` (see :mod:`rl_gym_actors.actors.checkpoint_gate`).

Owner liveness: an ``ActorDiedError`` (any ``RayActorError`` but ``ActorUnavailableError``) from
an owner means it is gone and everything it held is forgotten; ``ActorUnavailableError`` or no
answer in time means it may still be alive, so the gate asks again in its next round.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence

import ray
from ray.actor import ActorHandle
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from rl_gym_actors.actors.checkpoint_gate import CONCURRENCY, CheckpointGate, OwnerAnswer
from rl_gym_actors.actors.runtime import LEDGER_PREFIX
from rl_gym_actors.config import GymEndpoint, LedgerConfig, TryPolicy
from rl_gym_actors.core.attempt_reports import AttemptReport
from rl_gym_actors.core.ledger import Book, CheckpointReport, LedgerSnapshot
from rl_gym_actors.errors import CheckpointFailed, ConfigError
from rl_gym_actors.gym.client import GymClient
from rl_gym_actors.protocol import is_valid_checkpoint_id

logger = logging.getLogger(__name__)


def ledger_name(orchestrator_id: str) -> str:
    """The ledger actor's name for one orchestrator."""
    return f"{LEDGER_PREFIX}{orchestrator_id}"


class RayOwners:
    """Rollout actors by name, and which of them are known dead."""

    def __init__(self) -> None:
        self.handles: dict[str, ActorHandle] = {}
        self.dead: set[str] = set()

    def register(self, owners: dict[str, ActorHandle]) -> None:
        self.handles.update(owners)
        self.dead.difference_update(owners)

    def live(self) -> frozenset[str]:
        return frozenset(n for n in self.handles if n not in self.dead)

    async def _call(self, name: str, method: str, args: tuple, deadline_ts: float):
        """(True, value) on an answer; (False, OwnerAnswer) otherwise."""
        handle = self.handles.get(name)
        if handle is None or name in self.dead:
            return False, OwnerAnswer.GONE
        try:
            ref = getattr(handle, method).remote(*args)
            return True, await asyncio.wait_for(ref, max(deadline_ts - time.time(), 0.001))
        except ActorUnavailableError:
            return False, OwnerAnswer.UNSURE
        except RayActorError:
            logger.info("owner %s is dead", name)
            self.dead.add(name)
            return False, OwnerAnswer.GONE
        except TimeoutError:
            return False, OwnerAnswer.UNSURE
        except RayTaskError as exc:
            logger.warning("owner %s: %s raised: %s", name, method, exc)
            return False, OwnerAnswer.UNSURE

    async def adopt(self, owner: str, rollout_id: str, attempt_index: int,
                    deadline_ts: float) -> OwnerAnswer:
        answered, value = await self._call(owner, "adopt", (rollout_id, attempt_index),
                                           deadline_ts)
        if not answered:
            return value
        return OwnerAnswer.ADOPTED if value else OwnerAnswer.REFUSED

    async def flush(self, deadline_ts: float) -> int:
        names = sorted(self.live())
        answers = await asyncio.gather(*(self._call(n, "flush_reports", (), deadline_ts)
                                         for n in names))
        return sum(1 for answered, _ in answers if answered)


@ray.remote(num_cpus=0)
class LedgerActor:
    """The book of every attempt, and the checkpoint gate over every Gym endpoint."""

    def __init__(self, endpoints: Sequence[GymEndpoint], policy: TryPolicy | None = None,
                 config: LedgerConfig | None = None) -> None:
        if not endpoints:
            raise ConfigError("a ledger needs at least one Gym endpoint")
        self._endpoints = list(endpoints)
        self._policy = policy or TryPolicy()
        self._config = config or LedgerConfig()
        self._book = Book(e.url for e in self._endpoints)
        self._owners = RayOwners()
        # sessions open lazily inside this actor's event loop; the control pool is as wide as
        # the gate's concurrent retire / receipt calls per endpoint
        self._clients = [GymClient(e, control_limit=CONCURRENCY) for e in self._endpoints]
        self._gate_lock = asyncio.Lock()

    async def ping(self) -> str:
        return ray.get_runtime_context().get_actor_name() or "ledger"

    async def register_owners(self, owners: dict[str, ActorHandle]) -> None:
        """Add rollout actors by name. The book ties attempts to owner names, so a replacement
        for a dead actor must take a new name: under the old one it would be taken to hold the
        dead actor's tries (the gate would wait for them instead of retiring them)."""
        self._owners.register(owners)

    async def report(self, batch: list[AttemptReport]) -> None:
        """Fold a batch of reports, in any order."""
        self._book.apply_all(batch)

    async def snapshot(self) -> LedgerSnapshot:
        return self._book.snapshot(self._owners.live())

    async def checkpoint(self, checkpoint_id: str, checkpoint_dir: str,
                         deadline_s: float) -> CheckpointReport:
        """Gate a checkpoint on every Gym endpoint: adopt, ACK orphans, retire forgotten runs,
        prepare, commit, resume. Raises :class:`CheckpointFailed` (every endpoint resumed) when
        an endpoint is not ready by the deadline. One checkpoint at a time."""
        if not is_valid_checkpoint_id(checkpoint_id):
            raise ConfigError(f"invalid checkpoint_id {checkpoint_id!r}")
        if not isinstance(checkpoint_dir, str) or not checkpoint_dir:
            raise ConfigError("checkpoint_dir must be a non-empty path")
        if (not isinstance(deadline_s, (int, float)) or isinstance(deadline_s, bool)
                or not math.isfinite(deadline_s) or deadline_s <= 0):
            raise ConfigError(f"deadline_s must be a positive number, got {deadline_s!r}")
        deadline_ts = time.time() + deadline_s
        try:
            await asyncio.wait_for(self._gate_lock.acquire(), deadline_s)
        except TimeoutError:
            raise CheckpointFailed(f"checkpoint {checkpoint_id}: another checkpoint held the "
                                   f"gate until the deadline", checkpoint_id=checkpoint_id,
                                   blockers={}) from None
        try:
            gate = CheckpointGate(self._book, self._endpoints, self._clients, self._owners,
                                  self._config)
            report = await gate.run(checkpoint_id, checkpoint_dir, deadline_ts)
        except CheckpointFailed:
            self._book.record_checkpoint(checkpoint_id, committed=False)
            raise
        finally:
            self._gate_lock.release()
        self._book.record_checkpoint(checkpoint_id, committed=True)
        return report

    async def close(self) -> None:
        """Close the Gym clients (the orchestrator calls it before killing the actor)."""
        for client in self._clients:
            await client.close()
