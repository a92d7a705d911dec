"""The drop-in's health and status calls (mixed into :class:`~.dropin.GymRolloutEnv`):
``health_check()`` raises when the ledger, a rollout actor or a Gym server does not answer;
``status()`` reports the drop-in, the orchestrator's snapshot and every Gym server's status."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.errors import GymRejected, RlGymError
from rl_gym_actors.integrations.nemo_rl.rows import RolloutTransportError
from rl_gym_actors.observe import STATUS_CHECKPOINT_ID, fetch_status
from rl_gym_actors.protocol import StatusReport


class DropInStatus:
    """Mixed into the drop-in, which provides these attributes and ``_require_spinup``."""

    endpoints: list[GymEndpoint]
    _orch: Any
    _tasks: dict[str, asyncio.Task[Any]]
    _steps: Any
    _book: Any
    stats: Any
    _require_spinup: Callable[[], None]

    async def health_check(self) -> None:
        """Raise when the ledger, a rollout actor or a Gym server does not answer."""
        self._require_spinup()
        try:
            snap = await self._orch.asnapshot()
        except Exception as exc:
            raise RolloutTransportError(
                f"orchestrator unhealthy: {type(exc).__name__}: {exc}"
            ) from None
        if snap.actors.actors < snap.pool.size:
            raise RolloutTransportError(
                f"{snap.pool.size - snap.actors.actors} of "
                f"{snap.pool.size} rollout actors did not answer"
            )
        for url, answer in (await self._gym_status(STATUS_CHECKPOINT_ID)).items():
            # a refusal (GymRejected) still proves the server is up
            if isinstance(answer, RlGymError) and not isinstance(answer, GymRejected):
                raise RolloutTransportError(
                    f"Gym server {url} did not answer: {type(answer).__name__}: {answer}"
                )

    async def _gym_status(self, checkpoint_id: str) -> dict[str, StatusReport | RlGymError]:
        """Every Gym server's status, or the typed error of why there is none."""

        async def one(endpoint: GymEndpoint) -> StatusReport | RlGymError:
            try:
                return await fetch_status(endpoint, checkpoint_id)
            except RlGymError as exc:
                return exc

        answers = await asyncio.gather(*(one(e) for e in self.endpoints))
        return {e.url: a for e, a in zip(self.endpoints, answers, strict=True)}

    def _held_count(self) -> int:
        return sum(t.done() for t in self._tasks.values())

    async def status(self) -> dict[str, Any]:
        """This actor's state, the orchestrator's snapshot (ledger, pool, rollout actors) and
        every Gym server's status (or why there is none)."""
        steps = self._steps.snapshot()
        out: dict[str, Any] = {
            "spun_up": self._orch is not None,
            "python": sys.executable,
            **steps,
            "held_results": self._held_count(),
            "stats": asdict(self.stats),
            "book": asdict(self._book.stats),
        }
        if self._orch is not None:
            out["orchestrator"] = (await self._orch.asnapshot()).model_dump(mode="json")
            active = steps["checkpoint"]
            gym = await self._gym_status(
                active["checkpoint_id"] if active else STATUS_CHECKPOINT_ID
            )
            out["gym"] = {
                url: a.model_dump(mode="json", exclude={"executions"})
                if isinstance(a, StatusReport)
                else {"error": f"{type(a).__name__}: {a}"}
                for url, a in gym.items()
            }
        return out
