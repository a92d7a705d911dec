"""NeMo RL's checkpoint steps for the drop-in, mapped onto the ledger's one-shot gate.

The ledger gates a checkpoint in one call: adopt, ACK orphans, retire forgotten runs, prepare,
commit and resume on every Gym server. NeMo RL calls prepare, commit and resume separately, and
saves its own state in between. :class:`CheckpointSteps` keeps the drop-in's side consistent
with that. Which id holds the drop-in, in which phase, and which ids are spent is the same
:class:`~rl_gym_actors.gym.fence.CheckpointFence` a Gym server keeps; this module adds what only
the drop-in has (its rollouts in flight, the one gate run per commit):

- ``prepare(id, deadline_ts)`` closes admission (new rollouts wait in :meth:`admitted`; results
  already held are still handed out) and waits until no rollout is in flight. Not drained by the
  deadline: ``CheckpointFailed`` naming what is in flight; admission stays closed, and prepare
  may be called again with the same id (or the checkpoint aborted, or given up).
- ``commit(id, dir, gate)`` runs the gate with the prepare's deadline (at least
  ``commit_min_s``). A gate that fails has resumed every Gym server and spent the id there, so
  the id is spent here too: admission reopens and ``CheckpointFailed`` propagates.
- ``end(id)`` (resume or abort) reopens admission and spends the id; the gate already resumed
  Gym. ``give_up(id)`` reopens admission without spending it (a prepare that missed its
  deadline may be sent again).

Each step is safe to repeat: the same call with the same id returns the recorded answer; a
different id while one is active raises ``CheckpointConflict``; a spent id ``StaleCheckpoint``.
Asyncio only: no Ray, no sockets; the clock is injectable.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from rl_gym_actors.config import checkpoint_id_arg
from rl_gym_actors.errors import CheckpointConflict, CheckpointFailed, ConfigError, GymRejected
from rl_gym_actors.gym.fence import CheckpointFence, CheckpointPhase
from rl_gym_actors.integrations.nemo_rl.rows import RolloutTransportError

SPENT_MEMORY = 256

Gate = Callable[[str, str, float], Awaitable[Any]]  # (id, dir, deadline_s) -> CheckpointReport


@dataclass(slots=True)
class _Commit:
    """What the active checkpoint has beyond its phase: the deadline, the one gate run."""

    deadline_ts: float
    committing: asyncio.Task | None = None
    checkpoint_dir: str | None = None
    answers: dict[str, Any] = field(default_factory=dict)  # the callers' own recorded answers


class CheckpointSteps:
    """Admission and checkpoint phases of one drop-in actor. One event loop."""

    def __init__(
        self,
        *,
        admission_wait_s: float,
        commit_min_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.admission_wait_s = admission_wait_s
        self.commit_min_s = commit_min_s
        self._clock = clock
        self.in_flight: set[str] = set()
        self.committed = 0
        self._fence = CheckpointFence()
        self._open = asyncio.Event()  # mirrors fence.admission_open, for admitted()
        self._open.set()
        self._drained = asyncio.Condition()  # notified whenever a rollout leaves in_flight
        self._active: _Commit | None = None  # set while the fence holds an id

    # ------------------------------------------------------------ rollouts

    async def admitted(self) -> None:
        """Return once admission is open; wait while a checkpoint holds it closed, at most
        ``admission_wait_s`` (then RolloutTransportError: RL re-dispatches the row)."""
        if self._open.is_set():
            return
        try:
            await asyncio.wait_for(self._open.wait(), self.admission_wait_s)
        except TimeoutError:
            raise RolloutTransportError(
                "admission stayed closed (a checkpoint between prepare "
                "and resume) past admission_wait_s"
            ) from None

    @asynccontextmanager
    async def running(self, rollout_id: str) -> AsyncIterator[None]:
        """Count a rollout as in flight while the block runs. Enter it right after
        :meth:`admitted` returns, with no await in between (entering does not suspend)."""
        self.in_flight.add(rollout_id)
        try:
            yield
        finally:
            self.in_flight.discard(rollout_id)
            async with self._drained:
                self._drained.notify_all()

    # ------------------------------------------------------------ the steps

    def _moved(self) -> None:
        """After every fence move: admission follows the phase; idle drops the commit state."""
        if self._fence.admission_open:
            self._active = None
            self._open.set()
        else:
            self._open.clear()

    async def prepare(
        self, checkpoint_id: str, deadline_ts: float, facts: Callable[[], dict[str, Any]] = dict
    ) -> dict[str, Any]:
        """Close admission and drain. The answer (with ``facts()`` taken the moment the
        drain ends) is recorded: a repeat answers exactly the same, whatever changed since."""
        checkpoint_id_arg(checkpoint_id)
        recorded = self._fence.recorded(checkpoint_id, "prepare")
        if recorded is not None:
            return recorded
        self._fence.advance(checkpoint_id, "prepare")
        self._moved()
        if self._active is None:
            self._active = _Commit(float(deadline_ts))
        active = self._active
        active.deadline_ts = float(deadline_ts)
        started = time.monotonic()
        if self.in_flight:
            async with self._drained:
                try:
                    await asyncio.wait_for(
                        self._drained.wait_for(lambda: not self.in_flight),
                        max(active.deadline_ts - self._clock(), 0),
                    )
                except TimeoutError:
                    raise CheckpointFailed(
                        f"checkpoint {checkpoint_id}: {len(self.in_flight)} rollouts still in "
                        f"flight at the deadline; admission stays closed (prepare again, or "
                        f"abort)",
                        checkpoint_id=checkpoint_id,
                        blockers={"in_flight": sorted(self.in_flight)},
                    ) from None
        recorded = self._fence.recorded(checkpoint_id, "prepare")  # a concurrent repeat
        if recorded is not None:
            return recorded
        answer = {
            "checkpoint_id": checkpoint_id,
            "ready_to_commit": True,
            "drained_s": round(time.monotonic() - started, 6),
            **facts(),
        }
        self._fence.advance(checkpoint_id, "prepared", answer)
        return answer

    async def commit(
        self, checkpoint_id: str, checkpoint_dir: str, gate: Gate, deadline_ts: float | None = None
    ) -> dict[str, Any]:
        """Run the gate (once; repeats join it). ``deadline_ts`` replaces the prepare's."""
        checkpoint_id_arg(checkpoint_id)
        spent = self._fence.spent.get(checkpoint_id)
        if spent is not None:  # committed, then resumed: the same commit
            committed = spent.get("committed")
            if committed and committed["checkpoint_dir"] == checkpoint_dir:
                return committed
        recorded = self._fence.recorded(checkpoint_id, "commit")  # stale / conflict
        if recorded is None:
            self._fence.check(checkpoint_id, "commit")  # not ready: 409
        active = self._active
        assert active is not None  # the fence holds this id
        if active.checkpoint_dir is not None and active.checkpoint_dir != checkpoint_dir:
            raise ConfigError(
                f"checkpoint {checkpoint_id} commits to "
                f"{active.checkpoint_dir!r}, not {checkpoint_dir!r}"
            )
        if recorded is not None:
            return recorded
        if active.committing is None:  # a repeated call joins the one in progress
            active.checkpoint_dir = checkpoint_dir
            if deadline_ts is not None:
                active.deadline_ts = float(deadline_ts)
            budget = max(active.deadline_ts - self._clock(), self.commit_min_s)
            active.committing = asyncio.ensure_future(gate(checkpoint_id, checkpoint_dir, budget))
        try:
            report = await asyncio.shield(active.committing)
        except (CheckpointFailed, GymRejected) as exc:
            if self._active is active:
                self._finish(
                    checkpoint_id, {"state": "accepting", "committed": None, "failed": str(exc)}
                )
            raise
        if self._fence.active == checkpoint_id and self._fence.phase is CheckpointPhase.PREPARED:
            self._fence.advance(
                checkpoint_id,
                "commit",
                {
                    "checkpoint_id": checkpoint_id,
                    "checkpoint_dir": checkpoint_dir,
                    "adopted": report.adopted,
                    "orphans_acked": report.orphans_acked,
                    "retired": report.retired,
                    "elapsed_s": report.elapsed_s,
                    "endpoints": [e.model_dump(mode="json") for e in report.endpoints],
                },
            )
            self.committed += 1
        answer = self._fence.recorded(checkpoint_id, "commit")
        if answer is None:  # the fence no longer knows this id (forgotten while the gate ran)
            raise CheckpointFailed(
                f"checkpoint {checkpoint_id} left the fence while it committed",
                checkpoint_id=checkpoint_id,
            )
        return answer

    def end(self, checkpoint_id: str) -> dict[str, Any]:
        """Resume or abort: reopen admission; the id is spent. Repeats answer the same."""
        checkpoint_id_arg(checkpoint_id)
        recorded = self._fence.recorded(checkpoint_id, "resume")
        if recorded is not None:
            return recorded
        active = self._active
        if (
            active is not None
            and active.committing is not None
            and (self._fence.phase is not CheckpointPhase.COMMITTED)
        ):
            raise CheckpointConflict(f"checkpoint {checkpoint_id} is committing", status=409)
        committed = (
            self._fence.recorded(checkpoint_id, "commit")
            if self._fence.active == checkpoint_id
            else None
        )
        return self._finish(checkpoint_id, {"state": "accepting", "committed": committed})

    def answer(self, checkpoint_id: str, key: str) -> Any:
        """An answer recorded under ``key`` for the active checkpoint (None if none)."""
        if self._active is None or self._fence.active != checkpoint_id:
            return None
        return self._active.answers.get(key)

    def record(self, checkpoint_id: str, key: str, answer: Any) -> Any:
        """Record ``answer`` under ``key`` for the active checkpoint (the first one wins)."""
        if self._active is None or self._fence.active != checkpoint_id:
            return answer
        return self._active.answers.setdefault(key, answer)

    def give_up(self, checkpoint_id: str) -> None:
        """Forget a checkpoint that was not committed, without spending its id (it may be
        prepared again): admission reopens. No-op when it is not the active one."""
        if self._fence.active != checkpoint_id or (
            self._active is not None and self._active.committing is not None
        ):
            return
        self._fence.advance(checkpoint_id, "release")
        self._moved()

    def _finish(self, checkpoint_id: str, answer: dict[str, Any]) -> dict[str, Any]:
        answer = {"checkpoint_id": checkpoint_id, **answer}
        self._fence.advance(checkpoint_id, "resume", answer)
        spent = self._fence.spent
        while len(spent) > SPENT_MEMORY:  # the oldest spent ids are forgotten first
            del spent[next(iter(spent))]
        self._moved()
        return answer

    def snapshot(self) -> dict[str, Any]:
        fence = self._fence
        return {
            "admission": "open" if fence.admission_open else "closed",
            "checkpoint": None
            if fence.active is None
            else {"checkpoint_id": fence.active, "phase": fence.phase.value},
            "in_flight": len(self.in_flight),
            "checkpoints_committed": self.committed,
        }
