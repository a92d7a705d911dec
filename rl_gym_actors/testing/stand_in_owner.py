"""A tiny stand-in for a rollout actor, for ledger and checkpoint tests.

It owns the rollouts it starts (the latest try of each is its current try), reports every
transition to the ledger when asked to flush, and answers the ledger's ``adopt`` the way a
rollout actor does: it makes sure the attempt ends sealed and ACKed by replaying ``/run`` (Gym
answers the stored reply; the agent does not run again), checking the digest and ACKing the
receipt. A run whose reply is lost (``drop_reply`` rows, a deadline) stays "running" in its mind
until the ledger asks it to adopt.

With ``v2=True`` it speaks to a Gym v2 server: no receipt and no ACK exist, so a reply in hand
is reported sealed and the rollout released (the ledger's v2 gate forgets it after a commit);
``adopt`` replays ``/run`` of the same attempt (our server keeps a finished reply, (ext)).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray
from ray.actor import ActorHandle

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.core.attempt_reports import AttemptReport, AttemptState
from rl_gym_actors.errors import GymUnavailable, ProtocolViolation, StaleAttempt
from rl_gym_actors.gym.agent_checkpoint.client import GymClient

logger = logging.getLogger(__name__)


@ray.remote(num_cpus=0)
class StandInOwner:
    """``start`` runs tries; the ledger calls ``adopt``, ``flush_reports`` and ``ping``."""

    def __init__(
        self,
        name: str,
        endpoint: GymEndpoint,
        ledger: ActorHandle,
        control_s: float = 10.0,
        v2: bool = False,
    ) -> None:
        self._name = name
        self._v2 = v2
        self.replies: dict[str, Any] = {}  # v2: "rid/att" -> the reply body
        self._endpoint = endpoint
        self._client = GymClient(endpoint)
        self._ledger = ledger
        self._control_s = control_s
        self._pending: list[AttemptReport] = []
        self._late: list[AttemptReport] = []  # held back from the next flush (see start)
        self._current: dict[str, int] = {}
        self._rows: dict[tuple[str, int], dict[str, Any]] = {}
        self._states: dict[tuple[str, int], AttemptState] = {}
        self._tasks: set[asyncio.Task] = set()

    def _report(
        self,
        rid: str,
        att: int,
        state: AttemptState,
        *,
        adopted: bool = False,
        late: bool = False,
        released: bool = False,
    ) -> None:
        self._states[(rid, att)] = state
        (self._late if late else self._pending).append(
            AttemptReport(
                rid, att, self._endpoint.url, state, self._name, adopted=adopted, released=released
            )
        )

    async def start(
        self,
        row: dict[str, Any],
        rollout_id: str,
        attempt_index: int = 0,
        run_s: float = 60.0,
        report_late: bool = False,
    ) -> None:
        """Make ``attempt_index`` the rollout's current try and dispatch its ``/run`` in the
        background; returns once it is dispatched (reported RUNNING, not yet flushed).
        ``report_late``: the next flush misses the RUNNING report and the one after sends it,
        as if the try were dispatched just after a flush."""
        self._current[rollout_id] = attempt_index
        self._rows[(rollout_id, attempt_index)] = row
        self._report(rollout_id, attempt_index, AttemptState.RUNNING, late=report_late)
        task = asyncio.ensure_future(self._run(row, rollout_id, attempt_index, run_s))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, row: dict[str, Any], rid: str, att: int, run_s: float) -> None:
        try:
            result = await self._client.run(
                row, rollout_id=rid, attempt_index=att, deadline_ts=time.time() + run_s
            )
        except StaleAttempt:
            self._report(rid, att, AttemptState.TOMBSTONED)
            return
        except GymUnavailable:
            return  # the reply is lost; Gym may have finished the run
        except Exception as exc:  # a test double: any other failure ends the try
            logger.debug("%s: run %s/%s failed: %r", self._name, rid, att, exc)
            self._report(rid, att, AttemptState.TOMBSTONED)
            return
        if self._v2:
            self.replies[f"{rid}/{att}"] = {"reply": result.reply, "replayed": result.replayed}
            self._report(rid, att, AttemptState.SEALED, released=True)
            return
        await self._seal_and_ack(rid, att, result.digest, adopted=False)

    async def _seal_and_ack(self, rid: str, att: int, digest: str, *, adopted: bool) -> None:
        deadline = time.time() + self._control_s
        receipt = (await self._client.receipt(rid, att, deadline_ts=deadline)).completion_receipt
        if receipt is None:
            raise ProtocolViolation(f"{rid}/{att}: replied, yet no completion receipt")
        if receipt.result_digest != digest:
            raise ProtocolViolation(f"{rid}/{att}: reply digest differs from its receipt")
        self._report(rid, att, AttemptState.SEALED, adopted=adopted)
        await self._client.acknowledge(receipt, deadline_ts=deadline)
        self._report(rid, att, AttemptState.ACKED, adopted=adopted)

    async def adopt(self, rollout_id: str, attempt_index: int) -> bool:
        """True when this actor holds the attempt as its rollout's current try and it now is
        sealed and ACKed; False when it does not own it."""
        key = (rollout_id, attempt_index)
        if self._current.get(rollout_id) != attempt_index:
            return False
        if self._states.get(key) is AttemptState.ACKED:
            return True
        if self._v2:  # the same attempt's /run again: the kept reply, not a rerun
            result = await self._client.run(
                self._rows[key],
                rollout_id=rollout_id,
                attempt_index=attempt_index,
                deadline_ts=time.time() + self._control_s,
            )
            self.replies[f"{rollout_id}/{attempt_index}"] = {
                "reply": result.reply,
                "replayed": result.replayed,
            }
            self._report(
                rollout_id, attempt_index, AttemptState.SEALED, adopted=True, released=True
            )
            return True
        result = await self._client.replay(
            self._rows[key],
            rollout_id=rollout_id,
            attempt_index=attempt_index,
            deadline_ts=time.time() + self._control_s,
        )
        await self._seal_and_ack(rollout_id, attempt_index, result.digest, adopted=True)
        return True

    async def flush_reports(self, checkpoint_id: str | None = None) -> int:
        batch, self._pending, self._late = self._pending, self._late, []
        if batch:
            await self._ledger.report.remote(batch)
        return len(batch)

    async def ping(self) -> str:
        return self._name

    async def reply_bodies(self) -> dict[str, Any]:
        """v2: ``"rid/att" -> reply body`` of every reply in hand."""
        return dict(self.replies)

    async def states(self) -> dict[str, str]:
        """``"rid/att" -> state`` as this actor sees its attempts."""
        return {f"{rid}/{att}": state.value for (rid, att), state in self._states.items()}
