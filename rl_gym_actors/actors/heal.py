"""Faults heal without a person: :class:`Healer`.

A checkpoint that could not resume an endpoint (a partition swallowed the call) leaves that Gym
closed until its lease lapses (a real agent-checkpoint Gym has none; a v2 one's default is
600 s). The ledger keeps one Healer: each protocol's gate hands it every resume that failed,
and it goes on resuming in the background, with backoff, until the server answers (a resume of
a spent id answers as the first did; another id holding the server means ours no longer does)
or :data:`HEAL_S` passes. It also remembers the checkpoint ids this ledger issued, so a prepare
refused by a conflict naming one of them is this run's own
to clear (the gate resumes that id and prepares again).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from rl_gym_actors.errors import CheckpointConflict, GymRejected, RlGymError

logger = logging.getLogger(__name__)

HEAL_S = 600.0  # background resumes stop after this long
FIRST_WAIT_S = 0.25
MAX_WAIT_S = 5.0
CALL_S = 5.0  # one resume's deadline
ISSUED = 256  # checkpoint ids remembered as this ledger's own


class Resumable(Protocol):
    """A client whose server a checkpoint id holds: the agent-checkpoint ``GymClient`` or the
    v2 ``V2Client`` (both resume by id and answer a spent id as the first resume did)."""

    @property
    def endpoint(self) -> Any: ...

    async def resume(self, checkpoint_id: str, *, deadline_ts: float) -> Any: ...


class Healer:
    """Background resumes per (endpoint, checkpoint id), and the ids this ledger issued."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._issued: deque[str] = deque(maxlen=ISSUED)
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.healed = 0

    def issue(self, checkpoint_id: str) -> None:
        self._issued.append(checkpoint_id)

    def own_ids(self) -> frozenset[str]:
        return frozenset(self._issued)

    def pending(self) -> int:
        return sum(1 for t in self._tasks.values() if not t.done())

    def resume_later(self, client: Resumable, checkpoint_id: str) -> None:
        key = (client.endpoint.url, checkpoint_id)
        task = self._tasks.get(key)
        if task is None or task.done():
            self._tasks[key] = asyncio.ensure_future(self._resume(client, checkpoint_id))

    async def _resume(self, client: Resumable, checkpoint_id: str) -> None:
        until = self._clock() + HEAL_S
        wait = FIRST_WAIT_S
        while self._clock() < until:
            await asyncio.sleep(wait)
            wait = min(2 * wait, MAX_WAIT_S)
            try:
                await client.resume(checkpoint_id, deadline_ts=self._clock() + CALL_S)
            except CheckpointConflict:
                return  # another id holds the server: ours does not any more
            except GymRejected as exc:  # a refusal is an answer: nothing of ours holds it
                logger.info("resume %s on %s: %r", checkpoint_id, client.endpoint.label, exc)
                return
            except RlGymError as exc:  # no answer yet: try again
                logger.debug("resume %s on %s: %r", checkpoint_id, client.endpoint.label, exc)
                continue
            self.healed += 1
            logger.warning(
                "checkpoint %s resumed on %s in the background",
                checkpoint_id,
                client.endpoint.label,
            )
            return
        logger.error(
            "checkpoint %s could not be resumed on %s within %.0fs: abort it with "
            "`rl-gym-actors gym abort %s --checkpoint-id %s`",
            checkpoint_id,
            client.endpoint.label,
            HEAL_S,
            client.endpoint.url,
            checkpoint_id,
        )

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
