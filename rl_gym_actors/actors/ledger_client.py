"""The orchestrator's side of its ledger actor: one typed method per call it makes.

Every call maps the same way: the ledger's typed errors come back as themselves, and a ledger
that Ray could not bring back (or that did not answer in time) as :class:`LedgerLost`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import RayActorError, RayTaskError

from rl_gym_actors.actors.checkpoint_abort import AbortReport, EndpointAbort
from rl_gym_actors.actors.gate_done import GateReports
from rl_gym_actors.actors.ledger_actor import LedgerActor, ledger_name
from rl_gym_actors.actors.runtime import RAY_NAMESPACE
from rl_gym_actors.config import GymEndpoint, LedgerConfig, TryPolicy
from rl_gym_actors.core.attempt_book import LedgerSnapshot
from rl_gym_actors.core.checkpoint_report import CheckpointReport, RestoreReport, V2EndpointScope
from rl_gym_actors.errors import LedgerLost, RlGymError
from rl_gym_actors.outcome import Outcome

LEDGER_RESTARTS = 16  # Ray restarts a dead ledger this often (then LedgerLost)


class LedgerClient:
    """Typed calls to one orchestrator's ledger actor (``handle``)."""

    def __init__(self, handle: ActorHandle, orchestrator_id: str) -> None:
        self.handle = handle
        self.orchestrator_id = orchestrator_id

    @classmethod
    async def start(
        cls,
        orchestrator_id: str,
        endpoints: Sequence[GymEndpoint],
        policy: TryPolicy,
        config: LedgerConfig,
        *,
        owner_pattern: str,
        run_id: str,
        timeout_s: float,
        log_level: str = "WARNING",
    ) -> LedgerClient:
        """Create the orchestrator's ledger actor and wait until it answers. Ray restarts a
        ledger that dies and sends the calls in flight again; the restarted ledger rebuilds its
        book from the rollout actors it finds by name (``owner_pattern``)."""
        # @ray.remote's stubs keep the class's own type; the ActorClass it made has .options
        handle = LedgerActor.options(  # type: ignore[attr-defined]
            name=ledger_name(orchestrator_id),
            namespace=RAY_NAMESPACE,
            num_cpus=0,
            max_restarts=LEDGER_RESTARTS,
            max_task_retries=-1,
        ).remote(
            endpoints,
            policy,
            config,
            owner_pattern=owner_pattern,
            run_id=run_id,
            log_level=log_level,
        )
        try:
            await asyncio.wait_for(handle.ping.remote(), timeout_s)
        except BaseException:
            ray.kill(handle, no_restart=True)
            raise
        return cls(handle, orchestrator_id)

    async def close(self) -> None:
        """Ask the ledger to close (best effort, 2 s), then kill it for good."""
        try:
            await asyncio.wait_for(self.handle.close.remote(), 2.0)
        except Exception:  # closing is best effort; the kill below is not
            pass
        ray.kill(self.handle, no_restart=True)

    async def checkpoint(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        deadline_s: float,
        sweep_foreign: bool,
        claims: Sequence[str],
        *,
        timeout_s: float,
        keep_handed: Callable[[str, list[Outcome]], int] | None = None,
        recorded: Sequence[tuple[str, int]] | None = None,
        reports: GateReports | None = None,
    ) -> CheckpointReport:
        return await self._call(
            "checkpoint",
            lambda: self.handle.checkpoint.remote(
                checkpoint_id,
                checkpoint_dir,
                deadline_s,
                sweep_foreign,
                claims,
                keep_handed,
                recorded,
                reports,
            ),
            timeout_s,
        )

    async def restore_v2(
        self,
        restore_id: str,
        source_checkpoint_id: str,
        scopes: Sequence[V2EndpointScope],
        deadline_s: float,
        claims: Sequence[str],
        *,
        timeout_s: float,
    ) -> RestoreReport:
        return await self._call(
            "restore_v2",
            lambda: self.handle.restore_v2.remote(
                restore_id, source_checkpoint_id, list(scopes), deadline_s, list(claims)
            ),
            timeout_s,
        )

    async def abort_checkpoint(
        self, checkpoint_id: str, deadline_s: float, *, timeout_s: float
    ) -> AbortReport:
        return await self._call(
            "abort_checkpoint",
            lambda: self.handle.abort_checkpoint.remote(checkpoint_id, deadline_s),
            timeout_s,
        )

    async def clear_own_checkpoints(
        self, checkpoint_ids: Sequence[str], deadline_s: float, *, timeout_s: float
    ) -> list[EndpointAbort]:
        return await self._call(
            "clear_own_checkpoints",
            lambda: self.handle.clear_own_checkpoints.remote(list(checkpoint_ids), deadline_s),
            timeout_s,
        )

    async def snapshot(self, *, timeout_s: float) -> LedgerSnapshot:
        return await self._call("snapshot", lambda: self.handle.snapshot.remote(), timeout_s)

    async def protocols(self, *, timeout_s: float) -> dict[str, str]:
        """Each endpoint's checkpoint protocol (``"agent"`` or ``"v2"``), by URL."""
        return await self._call("protocols", lambda: self.handle.protocols.remote(), timeout_s)

    async def current_attempt(self, rollout_id: str, *, timeout_s: float) -> int | None:
        return await self._call(
            "current_attempt", lambda: self.handle.current_attempt.remote(rollout_id), timeout_s
        )

    async def _call(self, what: str, send: Callable[[], Any], timeout_s: float) -> Any:
        """Await ``send()``'s answer; ``what`` names the call in a LedgerLost's message."""
        try:
            return await asyncio.wait_for(send(), timeout_s)
        except RayTaskError as exc:
            if isinstance(exc.cause, RlGymError):
                raise exc.cause from None
            raise
        except RayActorError as exc:
            raise LedgerLost(
                f"the ledger of orchestrator {self.orchestrator_id} is gone ({what}): "
                f"{type(exc).__name__}",
                cause=f"{type(exc).__name__}: {exc}"[:500],
            ) from None
        except TimeoutError:
            raise LedgerLost(
                f"the ledger of orchestrator {self.orchestrator_id} did not answer {what} "
                f"within {timeout_s:.0f}s",
                cause="TimeoutError",
            ) from None
