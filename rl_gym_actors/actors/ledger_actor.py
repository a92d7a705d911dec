"""The ledger actor: one per orchestrator, the single writer of the book, and the checkpoint gate.

Created by the orchestrator as ``LedgerActor.options(name=ledger_name(oid),
namespace=RAY_NAMESPACE).remote(endpoints, policy, config)``. Rollout actors send their
:class:`~rl_gym_actors.core.attempt_reports.AttemptReport` batches to
:meth:`LedgerActor.report`; the pool registers them with :meth:`LedgerActor.register_owners`;
the trainer's checkpoint comes through :meth:`LedgerActor.checkpoint` (see
:mod:`rl_gym_actors.actors.checkpoint_gate`).

Restarts: the orchestrator creates the ledger with Ray's own ``max_restarts`` and
``max_task_retries``, so a ledger that dies comes back in a new process with the same arguments
and the calls in flight are sent again. A restarted ledger starts with an empty book and rebuilds
it: it finds the orchestrator's rollout actors by name (``owner_pattern``), registers them, and
asks each to report again every attempt it still holds and every sealed, un-ACKed result of a
rollout it finished (:meth:`RolloutWorker.rereport`), so a sealed result is never taken for an
orphan. What no live actor reports (handed-over tries, a dead actor's) the next checkpoint
settles from every server's status, as it does for any attempt the book never heard of.

Owner liveness: an ``ActorDiedError`` (any ``RayActorError`` but ``ActorUnavailableError``) from
an owner means it is gone and everything it held is forgotten; ``ActorUnavailableError`` or no
answer in time means it may still be alive, so the gate asks again in its next round.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from rl_gym_actors import metrics
from rl_gym_actors.actors.checkpoint_abort import AbortReport, EndpointAbort
from rl_gym_actors.actors.checkpoint_gate import CheckpointGate
from rl_gym_actors.actors.clear_own import own_holder
from rl_gym_actors.actors.gate_done import GateReports
from rl_gym_actors.actors.gate_endpoint import OwnerAnswer
from rl_gym_actors.actors.gate_select import GateSelect, own_rollouts
from rl_gym_actors.actors.gate_steps import CONCURRENCY
from rl_gym_actors.actors.heal import Healer
from rl_gym_actors.actors.runtime import LEDGER_PREFIX, RAY_NAMESPACE
from rl_gym_actors.config import (
    GymEndpoint,
    LedgerConfig,
    TryPolicy,
    checkpoint_id_arg,
    deadline_s_arg,
)
from rl_gym_actors.core.attempt_book import AttemptBook, LedgerSnapshot
from rl_gym_actors.core.attempt_reports import AttemptReport
from rl_gym_actors.core.checkpoint_report import CheckpointReport, RestoreReport, V2EndpointScope
from rl_gym_actors.errors import CheckpointFailed, ConfigError
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.wire import EpisodeId
from rl_gym_actors.outcome import Outcome

logger = logging.getLogger(__name__)

REBUILD_S = 10.0  # a restarted ledger waits this long for owners to report again


def ledger_name(orchestrator_id: str) -> str:
    """The ledger actor's name for one orchestrator."""
    return f"{LEDGER_PREFIX}{orchestrator_id}"


def named_actors(pattern: str) -> dict[str, ActorHandle]:
    """Live named actors in RAY_NAMESPACE whose whole name matches ``pattern`` (blocking: GCS)."""
    regex = re.compile(pattern)
    out: dict[str, ActorHandle] = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry.get("namespace") != RAY_NAMESPACE or not regex.fullmatch(entry.get("name", "")):
            continue
        try:
            out[entry["name"]] = ray.get_actor(entry["name"], namespace=RAY_NAMESPACE)
        except ValueError:  # gone since the listing
            continue
    return out


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

    async def call(
        self, name: str, what: str, send: Callable[[ActorHandle], Any], deadline_ts: float
    ) -> tuple[bool, Any]:
        """``send(handle)`` to the owner ``name`` (``what`` names the call in logs): (True,
        value) on an answer; (False, OwnerAnswer) otherwise."""
        handle = self.handles.get(name)
        if handle is None or name in self.dead:
            return False, OwnerAnswer.GONE
        try:
            ref = send(handle)
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
            logger.warning("owner %s: %s raised: %s", name, what, exc)
            return False, OwnerAnswer.UNSURE

    async def adopt(
        self, owner: str, rollout_id: str, attempt_index: int, deadline_ts: float
    ) -> OwnerAnswer:
        answered, value = await self.call(
            owner, "adopt", lambda h: h.adopt.remote(rollout_id, attempt_index), deadline_ts
        )
        if not answered:
            return value
        return OwnerAnswer.ADOPTED if value else OwnerAnswer.REFUSED

    async def flush(self, deadline_ts: float, checkpoint_id: str | None = None) -> int:
        names = sorted(self.live())
        answers = await asyncio.gather(
            *(
                self.call(
                    n,
                    "flush_reports",
                    lambda h: h.flush_reports.remote(checkpoint_id),
                    deadline_ts,
                )
                for n in names
            )
        )
        return sum(1 for answered, _ in answers if answered)


def _was_restarted() -> bool:
    """Whether Ray restarted this actor. Ray 2.60's property reads its own deprecated
    ``actor_id`` and warns (a RayDeprecationWarning on the driver's terminal): not ours to show."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


@ray.remote(num_cpus=0)
class LedgerActor:
    """The book of every attempt, and the checkpoint gate over every Gym endpoint."""

    def __init__(
        self,
        endpoints: Sequence[GymEndpoint],
        policy: TryPolicy | None = None,
        config: LedgerConfig | None = None,
        *,
        owner_pattern: str | None = None,
        run_id: str | None = None,
        log_level: str = "WARNING",
    ) -> None:
        if not endpoints:
            raise ConfigError("a ledger needs at least one Gym endpoint")
        from rl_gym_actors.actors.rollout_actor import set_actor_log_level

        set_actor_log_level(log_level)  # PoolConfig.log_level: the gate's INFO lines (its drain)
        self._endpoints = list(endpoints)
        self._policy = policy or TryPolicy()
        self._config = config or LedgerConfig()
        self._book = AttemptBook(e.url for e in self._endpoints)
        self._owners = RayOwners()
        # sessions open lazily inside this actor's event loop; the control pool is as wide as
        # the gate's concurrent retire / receipt calls per endpoint
        self._clients = [
            GymClient(e, control_limit=CONCURRENCY, retry=self._policy.retry)
            for e in self._endpoints
        ]
        self._select = GateSelect(self._endpoints, self._clients)  # protocol per server
        self._gate_lock = asyncio.Lock()
        self._healer = Healer()  # failed resumes retried in the background
        self._kept_unanswered: list[Outcome] = []  # see checkpoint(): kept, answer failed
        self._owner_pattern = owner_pattern
        self._run_id = run_id
        self._restarted = _was_restarted()
        self._rebuild: asyncio.Task | None = None
        self.rebuilt_owners = 0

    def _kick(self) -> asyncio.Task | None:
        """After a restart, start rebuilding the book (once)."""
        if self._restarted and self._rebuild is None:
            self._rebuild = asyncio.ensure_future(self._rebuild_book())
        return self._rebuild

    async def _rebuilt(self) -> None:
        task = self._kick()
        if task is not None:
            await asyncio.shield(task)

    async def _rebuild_book(self) -> None:
        started = time.monotonic()
        owners: dict[str, ActorHandle] = {}
        if self._owner_pattern is not None:
            try:
                owners = await asyncio.to_thread(named_actors, self._owner_pattern)
            except Exception as exc:  # the GCS may be busy: the gate copes
                logger.warning("restarted ledger could not list its owners: %r", exc)
        self._owners.register(owners)
        deadline = time.time() + REBUILD_S
        answers = await asyncio.gather(
            *(
                self._owners.call(n, "rereport", lambda h: h.rereport.remote(), deadline)
                for n in sorted(owners)
            )
        )
        self.rebuilt_owners = sum(1 for answered, _ in answers if answered)
        logger.warning(
            "ledger restarted: %d of %d rollout actors reported again in %.2fs",
            self.rebuilt_owners,
            len(owners),
            time.monotonic() - started,
        )

    async def ping(self) -> str:
        self._kick()
        return ray.get_runtime_context().get_actor_name() or "ledger"

    async def restarted(self) -> bool:
        """Whether this ledger is a restart (its book rebuilt from the owners and Gym)."""
        await self._rebuilt()
        return self._restarted

    async def register_owners(self, owners: dict[str, ActorHandle]) -> None:
        """Add rollout actors by name. The book ties attempts to owner names, so a replacement
        for a dead actor must take a new name: under the old one it would be taken to hold the
        dead actor's tries (the gate would wait for them instead of retiring them)."""
        self._owners.register(owners)

    async def report(self, batch: list[AttemptReport]) -> None:
        """Fold a batch of reports, in any order."""
        self._kick()  # never awaited here: the rebuild reports too
        self._book.apply_all(batch)

    async def snapshot(self) -> LedgerSnapshot:
        await self._rebuilt()
        return self._book.snapshot(self._owners.live())

    async def abort_checkpoint(self, checkpoint_id: str, deadline_s: float) -> AbortReport:
        """Resume ``checkpoint_id`` on every endpoint (see :func:`abort_everywhere`). Does not
        wait for a checkpoint of this ledger's own that is running."""
        checkpoint_id_arg(checkpoint_id)
        return await self._select.abort(checkpoint_id, time.time() + deadline_s_arg(deadline_s))

    async def clear_own_checkpoints(
        self, checkpoint_ids: Sequence[str], deadline_s: float
    ) -> list[EndpointAbort]:
        """Resume on every server the checkpoint of this run that holds it: one of
        ``checkpoint_ids`` (a dead trainer's, named by the part a new trainer restores from),
        or a v2 restore of this run (see :mod:`rl_gym_actors.actors.checkpoint_abort`). The ids
        count as this ledger's own from now on (a prepare refused by one of them clears it)."""
        ids = frozenset(checkpoint_id_arg(c) for c in checkpoint_ids)
        for checkpoint_id in sorted(ids):
            self._healer.issue(checkpoint_id)
        deadline_ts = time.time() + deadline_s_arg(deadline_s)
        async with self._gate_lock:
            return await self._select.clear_own(own_holder(ids, self._run_id), deadline_ts)

    async def current_attempt(self, rollout_id: str) -> int | None:
        """The highest try any owner reported for the rollout (None: none reported)."""
        await self._rebuilt()
        return self._book.current_attempt(rollout_id)

    async def checkpoint(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        deadline_s: float,
        sweep_foreign: bool = False,
        claims: Sequence[str] = (),
        keep_handed: Callable[[str, list[Outcome]], int] | None = None,
        recorded: Sequence[tuple[str, int]] | None = None,
        reports: GateReports | None = None,
    ) -> CheckpointReport:
        """Gate a checkpoint on every Gym endpoint: adopt, ACK orphans, retire forgotten runs,
        prepare, commit, resume. Raises :class:`CheckpointFailed` (every endpoint resumed) when
        an endpoint is not ready by the deadline. One checkpoint at a time. With a ``run_id``,
        attempts of other runs on the same servers are left alone (waited for) unless
        ``sweep_foreign``; ``claims`` are rollout ids of this run without its prefix (the
        trainer's own ids dispatched since the last commit). ``keep_handed(dir, outcomes)``
        writes handed-over tries the gate adopts into the checkpoint part before any ACK (see
        actors/handover.py); without it they are ACKed as orphans. ``recorded``: the results
        (rollout id, try) that part holds; the gate adds the others of this run it releases
        (actors/gate_record.py), and the v2 gate forgets no finished rollout whose result it
        lacks (None: no part to keep, as before). ``reports`` keeps the agent-checkpoint gate's
        report between its commits and its resumes, so that the call sent again after a restart
        answers it (actors/gate_done.py)."""
        checkpoint_id_arg(checkpoint_id)
        if not isinstance(checkpoint_dir, str) or not checkpoint_dir:
            raise ConfigError("checkpoint_dir must be a non-empty path")
        deadline_s = deadline_s_arg(deadline_s)
        deadline_ts = time.time() + deadline_s
        try:  # a restarted ledger: owners report first
            await asyncio.wait_for(self._rebuilt(), 0.5 * deadline_s)
        except TimeoutError:
            logger.warning("checkpoint %s starts before the book is rebuilt", checkpoint_id)
        try:
            await asyncio.wait_for(self._gate_lock.acquire(), max(deadline_ts - time.time(), 0))
        except TimeoutError:
            metrics.CHECKPOINTS.inc(tags={"result": "failed"})
            raise CheckpointFailed(
                f"checkpoint {checkpoint_id}: another checkpoint held the gate until the deadline",
                checkpoint_id=checkpoint_id,
                blockers={},
            ) from None

        gates: list[CheckpointGate] = []
        held = None if recorded is None else frozenset((r, int(a)) for r, a in recorded)

        def agent_gate(
            endpoints: Sequence[GymEndpoint], clients: Sequence[GymClient]
        ) -> CheckpointGate:
            gate = CheckpointGate(
                self._book,
                endpoints,
                clients,
                self._owners,
                self._config,
                run_id=self._run_id,
                sweep_foreign=bool(sweep_foreign),
                claims=frozenset(claims),
                healer=self._healer,
                keep=None
                if keep_handed is None
                else functools.partial(keep_handed, checkpoint_dir),
                carried=self._kept_unanswered,
                recorded=held,
                reports=reports,
            )
            gates.append(gate)
            return gate

        self._healer.issue(checkpoint_id)
        try:  # each server's gate by the protocol it speaks (see actors/gate_select.py)
            report = await self._select.checkpoint(
                self._book,
                self._owners,
                agent_gate,
                checkpoint_id,
                checkpoint_dir,
                deadline_ts,
                control_s=self._policy.control_s,
                forget_batch=self._config.forget_batch,
                own=own_rollouts(self._run_id, bool(sweep_foreign), frozenset(claims)),
                healer=self._healer,
                recorded=None if held is None else frozenset(r for r, _ in held),
            )
        except CheckpointFailed:
            # kept handed-over results the orchestrator was not told of: the next answer's
            self._kept_unanswered = [o for g in gates for o in g.pending]
            self._book.record_checkpoint(checkpoint_id, committed=False)
            metrics.CHECKPOINTS.inc(tags={"result": "failed"})
            raise
        finally:
            self._gate_lock.release()
        self._kept_unanswered = []
        self._book.record_checkpoint(checkpoint_id, committed=True)
        metrics.CHECKPOINTS.inc(tags={"result": "committed"})
        return report

    async def restore_v2(
        self,
        restore_id: str,
        source_checkpoint_id: str,
        scopes: Sequence[V2EndpointScope],
        deadline_s: float,
        claims: Sequence[str] = (),
    ) -> RestoreReport:
        """Restore the v2 episodes a checkpoint of this run exported (see
        :mod:`rl_gym_actors.actors.v2_restore`), before the trainer sends any row: never raises
        for Gym (a restore that fails is reported, and its rollouts start over). This run's
        episodes are those with its run id's prefix, the scopes' and ``claims``."""
        checkpoint_id_arg(restore_id)
        deadline_ts = time.time() + deadline_s_arg(deadline_s)
        named = {
            EpisodeId.from_capture_key(k).rollout_id
            for s in scopes
            for k in (*s.exported, *s.start_over)
        }
        own = own_rollouts(self._run_id, False, frozenset(claims) | named)
        async with self._gate_lock:
            return await self._select.restore(
                self._book,
                list(scopes),
                restore_id=restore_id,
                source_checkpoint_id=source_checkpoint_id,
                deadline_ts=deadline_ts,
                own=own,
            )

    async def protocols(self) -> dict[str, str]:
        """Each Gym endpoint's checkpoint protocol (``"agent"`` or ``"v2"``), asked once."""
        await self._select.discover(time.time() + 10.0)
        return self._select.protocols()

    async def close(self) -> None:
        """Close the Gym clients (the orchestrator calls it before killing the actor)."""
        self._healer.close()
        for client in self._clients:
            await client.close()
