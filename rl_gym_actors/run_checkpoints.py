"""One run's checkpoints and restores, for the orchestrator: the part written before anything is
released, the gate, what a commit lets the trainer's memory forget, the same id committed again,
and what a dead trainer of the run left open on Gym.

Order of a checkpoint (docs/ARCHITECTURE.md, "A checkpoint"): the layer's part under the
checkpoint dir first (:mod:`rl_gym_actors.checkpoint_part`), then the ledger's gate, whose
releases the part lacks are added to it before they go out; on Gym v2 the exported episodes and
the results that finished before the cut follow; then the report beside the part. Only then does
the memory forget the handed results the trainer consumed (``keep``: the ones it still holds).
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from rl_gym_actors import checkpoint_part as parts
from rl_gym_actors import newer_parts
from rl_gym_actors.actors.checkpoint_abort import EndpointAbort
from rl_gym_actors.actors.clear_own import clear_own_directly
from rl_gym_actors.actors.ledger_client import LedgerClient
from rl_gym_actors.config import GymEndpoint, checkpoint_id_arg, deadline_s_arg
from rl_gym_actors.core.checkpoint_report import CheckpointReport, RestoreReport
from rl_gym_actors.core.rollout_memory import RolloutMemory
from rl_gym_actors.dispatch import CALL_SLACK_S, UnackedCount
from rl_gym_actors.errors import CheckpointFailed, ConfigError
from rl_gym_actors.gym.v2.wire import EpisodeId
from rl_gym_actors.protocol import CHECKPOINT_ID_MAX
from rl_gym_actors.rows import RowPlanner

DRAIN_S = 10.0  # v2: how long a checkpoint waits for rows that finished before its cut
DRAIN_POLL_S = 0.02
CLEAR_S = 10.0  # resuming a dead trainer's open checkpoint at start

PathArg = str | os.PathLike[str]


class RunCheckpoints:
    """The checkpoints of run ``run_id``: see the module docstring. ``claims`` is the
    orchestrator's set of dispatched ids since a commit (shared with its row planner)."""

    def __init__(
        self,
        run_id: str,
        endpoints: Sequence[GymEndpoint],
        memory: RolloutMemory,
        planner: RowPlanner,
        claims: set[str],
        unacked: UnackedCount,
        keep_results: bool,
        sealed_retention: int,
    ) -> None:
        self.run_id = run_id
        self._endpoints = endpoints
        self._memory = memory
        self._planner = planner
        self._claims = claims
        self._unacked = unacked
        self.keep_results = keep_results
        self.sealed_retention = sealed_retention
        self._done: dict[str, tuple[str, CheckpointReport]] = {}  # committed: id -> dir, report
        self.restore_report: RestoreReport | None = None  # what the last v2 restore did
        self.cleared: list[EndpointAbort] = []  # what a dead trainer of the run left open
        # ids a dead trainer of the run may have spent on Gym (own_open_ids): asked again and
        # not committed, they go to Gym under a fresh id (:meth:`_gym_id`)
        self._spent: set[str] = set()

    # ------------------------------------------------------------ checkpoint

    async def checkpoint(
        self,
        ready: Callable[[], Awaitable[LedgerClient]],
        checkpoint_id: str,
        checkpoint_dir: PathArg,
        keep: Iterable[str] | None,
        deadline_s: float,
        sweep_foreign: bool,
        keep_if_handed: Iterable[str] | None = None,
    ) -> CheckpointReport:
        """Gate ``checkpoint_id`` (see :meth:`Orchestrator.checkpoint`); ``ready`` answers the
        ledger, starting the orchestrator when it has not started yet."""
        checkpoint_dir = str(checkpoint_dir)
        done = await self._committed_before(checkpoint_id, checkpoint_dir)
        if done is not None:
            return done
        # what was handed out before now, less what is kept
        consumed = self._consumed(keep, keep_if_handed)
        ledger = await ready()
        started = time.monotonic()
        gym_id = self._gym_id(checkpoint_id)
        # the layer's part first: nothing is released before it is durable
        kept = set() if consumed is None else self._memory.handed() - consumed
        part = await parts.write_memory_part(
            self._memory,
            checkpoint_id,
            checkpoint_dir,
            self.run_id,
            self.keep_results,
            kept,
            None if gym_id == checkpoint_id else gym_id,
        )
        recorded = sorted((r, a) for r, a in part.holds() if a is not None)
        claims = sorted(self._claims)
        # a fresh id's Gym files go to a sub-folder: the dead trainer's commit stays as it is
        gym_dir = (
            checkpoint_dir if gym_id == checkpoint_id else os.path.join(checkpoint_dir, gym_id)
        )
        try:
            report = await ledger.checkpoint(
                gym_id,
                gym_dir,
                deadline_s,
                bool(sweep_foreign),
                claims,
                timeout_s=deadline_s + CALL_SLACK_S,
                # the results the gate releases that the part lacks (handed-over tries it
                # adopts, runs that finished while it waited): into the part first
                keep_handed=functools.partial(_add_undelivered, checkpoint_dir),
                recorded=recorded,
                # asked again after a restart (Ray resends the call), the gate answers this
                reports=parts.GateReportBeside(checkpoint_dir),
            )
        except CheckpointFailed as exc:
            exc.restore_from = checkpoint_dir  # the part holds all it released
            raise
        if gym_id != checkpoint_id:  # the trainer's id and dir in what it is answered
            update = {"checkpoint_id": checkpoint_id, "checkpoint_dir": checkpoint_dir}
            report = report.model_copy(update=update)
        self._spent.discard(checkpoint_id)
        for outcome in report.kept:  # ... and to their rollouts' next rows (no agent run)
            self._memory.adopt_handed(outcome)
        if scopes := parts.v2_scopes(report):  # what a restore continues: into the part, durably
            await asyncio.to_thread(parts.add_gym_v2, checkpoint_dir, scopes)
            left = deadline_s - (time.monotonic() - started)
            await self._record_finished(checkpoint_dir, report, part.holds(), left)
        await asyncio.to_thread(parts.add_report, checkpoint_dir, report)
        self._done[checkpoint_id] = (checkpoint_dir, report)
        # what the commit covered is settled on Gym; rollouts still running keep their claim
        self._claims.difference_update(r for r in claims if not self._memory.running(r))
        self._committed(consumed)
        return report

    async def _record_finished(
        self,
        checkpoint_dir: str,
        report: CheckpointReport,
        recorded: set[tuple[str, int | None]],
        budget_s: float,
    ) -> int:
        """Gym v2: the attempts that ran when the gate started and finished before its cut
        (each commit answer's ``ended``; their outcomes may still be on the way here): wait for
        their rollouts (at most ``budget_s``, :data:`DRAIN_S`) and add their results to the
        part, as NeMo RL's coordinator drains the runs it did not export. The v2 gate forgot
        none of them (see actors/v2_gate.py). How many were added."""
        waits = {
            EpisodeId.from_capture_key(k).rollout_id
            for entry in report.endpoints
            if entry.protocol == "v2"
            for k in (entry.commit.model_extra or {}).get("ended") or []
        }
        until = time.monotonic() + max(0.0, min(budget_s, DRAIN_S))
        while any(self._memory.running(r) for r in waits) and time.monotonic() < until:
            await asyncio.sleep(DRAIN_POLL_S)
        results = [o for r in sorted(waits) if (o := self._memory.result_of(r)) is not None]
        new = [o for o in results if (o.rollout_id, o.attempt_index) not in recorded]
        if not new:
            return 0
        return await asyncio.to_thread(parts.add_undelivered, checkpoint_dir, new)

    async def _committed_before(
        self, checkpoint_id: str, checkpoint_dir: str
    ) -> CheckpointReport | None:
        """The report of ``checkpoint_id`` when this run committed it before into the same dir
        (read back from its part); ConfigError when into another dir."""
        done = self._done.get(checkpoint_id)
        if done is None:
            return None
        first_dir, report = done
        if not parts.same_dir(first_dir, checkpoint_dir):
            raise ConfigError(
                f"checkpoint {checkpoint_id} was committed into {first_dir}, "
                f"not {checkpoint_dir}: a committed checkpoint id cannot name another dir"
            )
        stored = await asyncio.to_thread(parts.committed_report, first_dir, checkpoint_id)
        return stored or report

    def _gym_id(self, checkpoint_id: str) -> str:
        """The id Gym is asked to checkpoint under: ``checkpoint_id``, unless a dead trainer of
        this run may have spent it there (its part is the restored one or a newer one beside
        it) and it did not commit (a committed one is answered by :meth:`_committed_before`):
        a trainer that writes its state after ``checkpoint()`` returns and died before that
        write asks for that id again, which Gym refuses once resumed (``StaleCheckpoint``).
        Then a fresh id of its own: ``<id>-again-<hex>``, recorded in the part (``gym_id``)."""
        if checkpoint_id not in self._spent:
            return checkpoint_id
        suffix = f"-again-{uuid.uuid4().hex[:8]}"
        return checkpoint_id[: CHECKPOINT_ID_MAX - len(suffix)] + suffix

    def _consumed(
        self, keep: Iterable[str] | None, keep_if_handed: Iterable[str] | None = None
    ) -> set[str] | None:
        """The handed rollouts this checkpoint counts as consumed: every one handed out so far
        but those in ``keep`` and the handed ones of ``keep_if_handed`` (both None: every one).
        ConfigError naming the ids of ``keep`` that were never handed out, or already
        released."""
        handed = self._memory.handed()
        if keep is None and keep_if_handed is None:
            return handed
        kept = _rollout_ids(keep, "keep")
        if unknown := sorted(kept - handed):
            more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
            shown = ", ".join(unknown[:10]) + more
            raise ConfigError(
                f"keep names {len(unknown)} rollout id(s) this orchestrator holds no handed result "
                f"of (never handed out, or released at an earlier checkpoint): {shown}"
            )
        kept |= _rollout_ids(keep_if_handed, "keep_if_handed") & handed
        return handed - kept

    def _committed(self, consumed: set[str] | None = None) -> None:
        """Committed: forget the sealed rollouts handed out that the trainer consumed (their ids
        go to the sealed-id record: sent again, ``forgotten_rollout``, no run); keep the others
        (kept, or handed out while the checkpoint ran: in the next part)."""
        self._unacked.reset()
        self._memory.forget_settled(consumed)

    # ------------------------------------------------------------ restore

    def note_committed(self, part: Any, checkpoint_dir: PathArg | None) -> None:
        """A restored part whose checkpoint committed (on every endpoint: its report, or the
        gate's kept before its resumes): its id asked again answers that report."""
        if part is None or checkpoint_dir is None:
            return
        report = parts.gate_committed(checkpoint_dir, part)
        if report is not None:
            self._done[part.checkpoint_id] = (str(checkpoint_dir), report)

    def load_restored(
        self, restore_from: PathArg | None, part: Any, sealed: Any, newer: Any = None
    ) -> Any:
        """Load the restored ``part`` (read from ``restore_from``) and the run's newer parts
        beside it (:mod:`rl_gym_actors.newer_parts`; ``newer``: read already) into the memory;
        note those that committed. The part whose Gym v2 episodes the restore continues (None:
        none)."""
        parts.load_part(self._memory, part, sealed)
        if part is None or restore_from is None:
            return None
        if newer is None:
            newer = newer_parts.newer_parts(restore_from, part)
        newer_parts.load_newer(self._memory, newer, sealed)
        self.note_committed(part, restore_from)
        for where, other in newer:
            self.note_committed(other, where)
        return newer_parts.v2_source(part, newer)

    async def load(self, checkpoint_dir: PathArg) -> tuple[Any, Any]:
        """Read ``checkpoint_dir``'s part of this run (and the newer ones beside it) into the
        memory (the files in a thread, the memory on the orchestrator's loop): the part (None:
        no part) and the one whose v2 episodes the restore continues."""
        args = (checkpoint_dir, self.run_id, self.sealed_retention)
        _, part, sealed = await asyncio.to_thread(parts.restore_run, *args)
        newer = []
        if part is not None:
            newer = await asyncio.to_thread(newer_parts.newer_parts, checkpoint_dir, part)
        return part, self.load_restored(checkpoint_dir, part, sealed, newer)

    async def clear_dead_now(self, where: Any, checkpoint_id: str) -> list[str]:
        """Resume what a dead trainer of this run left open on Gym (its checkpoint, named by
        the part restored or a newer one of the run beside it; a v2 restore of the run), from
        the driver with clients of its own, before any Ray actor starts: an actor's start
        takes seconds on a loaded machine (10-20 s at load 30), and Gym refused all work for
        that long (see actors/checkpoint_abort.py). The ids, for :meth:`clear_dead`."""
        ids = await asyncio.to_thread(parts.own_open_ids, where, self.run_id, checkpoint_id)
        self._spent.update(i for i in ids if i not in self._done)
        self.cleared = await clear_own_directly(
            self._endpoints, ids, self.run_id, time.time() + CLEAR_S
        )
        return ids

    async def clear_dead(self, ledger: LedgerClient, ids: list[str]) -> None:
        """The ledger takes the ids as its own (a prepare one of them refuses clears it) and
        resumes any still open (one :meth:`clear_dead_now` could not reach)."""
        late = await ledger.clear_own_checkpoints(ids, CLEAR_S, timeout_s=CLEAR_S + CALL_SLACK_S)
        self.cleared = [*self.cleared, *late]

    async def restore_v2(self, ledger: LedgerClient, part: Any) -> RestoreReport:
        """Continue the part's exported Gym v2 episodes from their boundary."""
        urls, claims = [e.url for e in self._endpoints], sorted(self._claims)
        args = (ledger, self._memory, self._planner.placed, urls, part, claims)
        self.restore_report = await parts.restore_gym_v2(*args)
        return self.restore_report


def _add_undelivered(part_dir: str, _gym_dir: str, outcomes: list[Any]) -> int:
    """The gate's ``keep_handed`` (called with the dir Gym commits into): into the part under
    ``part_dir``."""
    return parts.add_undelivered(part_dir, outcomes)


def checkpoint_args(checkpoint_id: str, checkpoint_dir: Any, deadline_s: float) -> float:
    """Check a checkpoint call's arguments before anything starts (ConfigError); the deadline."""
    checkpoint_id_arg(checkpoint_id)
    if not isinstance(checkpoint_dir, (str, os.PathLike)) or not str(checkpoint_dir):
        raise ConfigError("checkpoint_dir must be a non-empty path")
    return deadline_s_arg(deadline_s)


def _rollout_ids(ids: Iterable[str] | None, what: str) -> set[str]:
    """``keep`` / ``keep_if_handed`` as a set (None: empty); ConfigError for one string or a
    non-string id."""
    if ids is None:
        return set()
    if isinstance(ids, (str, bytes)):
        raise ConfigError(f"{what} must be an iterable of rollout ids, not one string")
    out = set()
    for rid in ids:
        if not isinstance(rid, str):
            raise ConfigError(f"{what} holds {rid!r}: rollout ids are strings")
        out.add(rid)
    return out
