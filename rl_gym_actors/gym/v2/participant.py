"""The v2 agent participant's async shell around :class:`~rl_gym_actors.gym.v2.machine.Machine`
(phases, fencing, lease, retired marks) and :class:`~rl_gym_actors.gym.v2.episodes.EpisodeTable`
(episodes, boundaries, restored and kept state).

It runs each ``/run`` as a task of its own (a caller that goes away never cancels it; only
retire and shutdown do), parks episodes at boundaries, waits in prepare, writes and reads the
checkpoint files in a thread, and reopens admission on its own when the lease runs out. With a
:class:`~rl_gym_actors.gym.v2.state.V2State` ((ext) ``--state-dir``) it loads the kept replies,
retired marks and committed answers at construction and writes each change before answering. Every
transition holds one lock; prepare waits for readiness outside it, so a resume can end a waiting
prepare. Rejections are the typed errors of :mod:`rl_gym_actors.errors`, with their HTTP status.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rl_gym_actors.errors import (
    CheckpointConflict,
    CheckpointDeadlinePassed,
    CheckpointRejected,
    GymError,
    InvalidPhase,
    NotCompleted,
    RestartInScope,
    StaleAttempt,
)
from rl_gym_actors.gym.agent_failure import agent_failure
from rl_gym_actors.gym.v2 import records as files
from rl_gym_actors.gym.v2.episodes import RUNNING, Episode, EpisodeTable, Replay
from rl_gym_actors.gym.v2.machine import Machine
from rl_gym_actors.gym.v2.state import V2State
from rl_gym_actors.gym.v2.stepped import RawReply, StepAgent
from rl_gym_actors.gym.v2.wire import (
    CheckpointRequest,
    CommitRequest,
    EpisodeId,
    ForgetRequest,
    Phase,
    RestoreRequest,
    RetireRequest,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_LEASE_GRACE_S = 600.0  # Gym's default lease_grace_seconds


@dataclass(frozen=True, slots=True)
class RunOutcome:
    reply: bytes
    replayed: bool
    headers: Mapping[str, str] = field(default_factory=dict)  # from a RawReply


@dataclass
class _Write:
    checkpoint_id: str
    checkpoint_dir: str
    scope: list[EpisodeId] | None
    records: list[dict[str, Any]]
    task: asyncio.Task[dict[str, Any]] | None = None


class _EpisodeSteps:
    """What a step agent sees of its episode."""

    def __init__(self, owner: V2Participant, episode: Episode) -> None:
        self._owner = owner
        self._episode = episode
        self.episode_id = episode.episode_id
        self.continuation = episode.continuation

    async def boundary(self, progress: Any) -> None:
        self._owner.steps_run += 1
        await self._owner._boundary(self._episode, progress)


class V2Participant:
    """One agent participant (kind ``agent``) served over the v2 routes."""

    kind = "agent"

    def __init__(
        self,
        agent: StepAgent,
        *,
        instance: str = "agent",
        lease_grace_s: float = DEFAULT_LEASE_GRACE_S,
        restart_only: bool = False,
        keep_replies: bool = True,
        export_every_session: bool = False,
        hide_restored_pending: bool = False,
        state: V2State | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.agent = agent
        self.instance = instance
        self.restart_only = restart_only
        self.hide_restored_pending = hide_restored_pending  # as NeMo Gym's agent's status
        self.machine = Machine(lease_grace_s=lease_grace_s)
        self.table = EpisodeTable(
            restart_only=restart_only,
            keep_replies=keep_replies,
            export_every_session=export_every_session,
            retired=self.machine.retired,
        )
        self.steps_run = 0  # (ext) boundaries reached by agents, all episodes together
        self.agent_starts = 0  # agent calls begun by this process (GET /metrics)
        self.completions = 0  # of those, the ones that ended with a reply
        self.state = state
        if state is not None:
            self._load(state)
        self._clock = clock
        self._tasks: dict[str, asyncio.Task[RunOutcome]] = {}
        self._lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        self._write: _Write | None = None
        self._lease_timer: asyncio.TimerHandle | None = None
        self._closing = False

    def _load(self, state: V2State) -> None:
        loaded = state.load()
        self.table.kept.update(loaded.kept)
        self.machine.retired.mark(
            EpisodeId(rollout_id=r, attempt=a) for r, a in loaded.marks.items()
        )
        for checkpoint_id, answer in loaded.committed.items():
            self.machine.record(checkpoint_id, "commit", answer)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def _wait(self, done: Callable[[], bool], deadline_ts: float) -> None:
        async with self._changed:
            while not done():
                left = deadline_ts - self._clock()
                if left <= 0:
                    return
                try:
                    await asyncio.wait_for(self._changed.wait(), min(left, 1.0))
                except TimeoutError:
                    pass

    async def _within(self, deadline_ts: float, work: Awaitable[T], what: str) -> T:
        left = deadline_ts - self._clock()
        if left <= 0:
            if asyncio.iscoroutine(work):
                work.close()
            raise CheckpointDeadlinePassed(f"deadline passed before {what}", status=409)
        try:
            async with asyncio.timeout(left):
                return await work
        except TimeoutError as exc:
            raise CheckpointDeadlinePassed(f"deadline passed during {what}", status=409) from exc

    # ------------------------------------------------------------ data plane

    async def run(self, episode_id: EpisodeId, row: dict[str, Any]) -> RunOutcome:
        decision = self.table.admit(
            episode_id, replacement_open=self.machine.phase is Phase.RESTORED
        )
        if isinstance(decision, Replay):
            return RunOutcome(decision.reply, replayed=True)
        episode = decision.episode
        task = asyncio.create_task(self._execute(episode, row), name=f"v2-run-{episode_id}")
        self._tasks[episode_id.rollout_id] = task
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise StaleAttempt(f"{episode_id} was retired while it ran", status=409) from None
            raise

    def kept_reply(self, episode_id: EpisodeId) -> RunOutcome:
        """(ext) The attempt's kept reply, never a run: StaleAttempt when it was retired,
        NotCompleted when nothing is kept (it runs, or never started)."""
        self.table.retired.check(episode_id)
        kept = self.table.kept.get(episode_id.rollout_id, {}).get(episode_id.attempt)
        if kept is None:
            live = self.table.live.get(episode_id.rollout_id)
            what = "runs" if live is not None and live.episode_id == episode_id else "is not kept"
            raise NotCompleted(f"{episode_id} {what}: no reply to replay", status=409)
        return RunOutcome(kept, replayed=True)

    async def _execute(self, episode: Episode, row: dict[str, Any]) -> RunOutcome:
        rollout = episode.episode_id.rollout_id
        try:
            await self._boundary(episode, episode.boundary)  # the start is a boundary
            try:
                self.agent_starts += 1
                reply = await self.agent(row, _EpisodeSteps(self, episode))
                if isinstance(reply, RawReply):
                    raw, headers = reply.body, reply.headers
                else:
                    raw = json.dumps(reply, separators=(",", ":"), allow_nan=False).encode()
                    headers = {}
            except asyncio.CancelledError:
                raise
            except GymError:  # a rejection of the participant behind, with its own code
                self.table.finish(episode, None)
                raise
            except Exception as exc:
                logger.info("agent failed for %s: %r", episode.episode_id, exc)
                self.table.finish(episode, None)
                raise agent_failure(exc) from exc
            self.table.finish(episode, raw)
            self.completions += 1
            e = episode.episode_id
            if self.state is not None and self.table.kept.get(e.rollout_id, {}).get(e.attempt):
                await self.state.keep(e, raw)  # durable before it is answered
            return RunOutcome(raw, replayed=False, headers=headers)
        finally:
            if self._tasks.get(rollout) is asyncio.current_task():
                del self._tasks[rollout]
            await self._notify()

    async def _boundary(self, episode: Episode, progress: Any) -> None:
        if not self.table.is_current(episode) or episode.retiring:
            raise asyncio.CancelledError()
        if not self.table.at_boundary(episode, progress):
            return
        await self._notify()
        async with self._changed:
            while not self.table.unpark(episode):
                await self._changed.wait()

    # ------------------------------------------------------------ control plane

    def kept_keys(self, limit: int) -> dict[str, Any]:
        """(ext) The capture keys of the kept replies, sorted, at most ``limit``; and the
        count. A controller finds there the replies of runs it never saw (a dead driver's)."""
        keys = sorted(
            EpisodeId(rollout_id=r, attempt=a).capture_key
            for r, attempts in self.table.kept.items()
            for a in attempts
        )
        return {"kept": keys[: max(0, limit)], "count": len(keys)}

    def snapshot(self) -> dict[str, Any]:
        """The counts ``GET /metrics`` reads (v2 has no ACK: the ACK series read 0)."""
        return {
            "agent_starts": self.agent_starts,
            "completions": self.completions,
            "running": sum(e.state == RUNNING for e in self.table.live.values()),
        }

    def status(self) -> dict[str, Any]:
        m = self.machine
        answer: dict[str, Any] = {
            "kind": self.kind,
            "instance": self.instance,
            "phase": m.phase.value,
            "checkpoint_id": m.checkpoint_id,
            "lease_expires_at": m.lease_expires_at,
            "retired_rollouts": len(m.retired),
            "report": self.table.readiness().model_dump(),
            "accepting": self.table.accepting,
            "restored_pending": sorted(e.capture_key for e in self.table.restored_pending()),
            "restart_only": self.restart_only,  # (ext)
            "kept_replies": sum(len(k) for k in self.table.kept.values()),  # (ext)
            "steps_run": self.steps_run,  # (ext)
            "durable": self.state is not None,  # (ext)
        }
        if self.hide_restored_pending:
            del answer["restored_pending"]
        return answer

    async def prepare(self, req: CheckpointRequest) -> dict[str, Any]:
        cid = req.checkpoint_id
        async with self._lock:
            recorded = self.machine.admit("prepare", cid)
            if recorded is not None:
                return recorded
            if self.machine.phase is Phase.IDLE:
                self.machine.open_checkpoint(cid, Phase.PREPARING, req.deadline_ts)
                self.table.close()
            else:
                self.machine.renew(req.deadline_ts)
            self._arm_lease()
        await self._wait(
            lambda: self.table.ready() or self.machine.checkpoint_id != cid, req.deadline_ts
        )
        async with self._lock:
            report = self.table.readiness()
            if self.machine.checkpoint_id != cid or self.machine.phase is not Phase.PREPARING:
                return {"phase": self.machine.phase.value, "report": report.model_dump()}
            if report.ready:
                self.machine.to(Phase.PREPARED)
            answer = {"phase": self.machine.phase.value, "report": report.model_dump()}
            if report.ready:
                self.machine.record(cid, "prepare", answer)
            return answer

    async def renew(self, req: CheckpointRequest) -> dict[str, Any]:
        async with self._lock:
            self.machine.admit("renew", req.checkpoint_id)
            expires = self.machine.renew(req.deadline_ts)
            self._arm_lease()
            return {"lease_expires_at": expires}

    def _outside(self, req: CheckpointRequest, operation: str) -> None:
        self.machine.admit(operation, req.checkpoint_id)
        if self.machine.phase is not Phase.IDLE:
            self.machine.renew(req.deadline_ts)
            self._arm_lease()

    async def retire(self, req: RetireRequest) -> dict[str, Any]:
        async with self._lock:
            self._outside(req, "retire")
            self.machine.retired.mark(req.episode_ids)  # before anything stops, and for good
            if self.state is not None:
                await self.state.retire(req.episode_ids)
            stopping = [ep for e in req.episode_ids for ep in self.table.retire(e)]
            tasks = []
            for ep in stopping:
                task = self._tasks.get(ep.episode_id.rollout_id)
                if task is not None and not task.done():
                    if not task.cancelling():
                        task.cancel()
                    tasks.append(task)
            if tasks:
                await self._within(req.deadline_ts, asyncio.wait(tasks), "retire")
            for ep in stopping:
                self.table.gone(ep)
        await self._notify()
        return {"retired": [e.capture_key for e in req.episode_ids]}

    async def forget(self, req: ForgetRequest) -> dict[str, Any]:
        async with self._lock:
            self._outside(req, "forget")
            self.table.forget(req.rollout_ids)
            if self.state is not None:
                await self.state.forget(req.rollout_ids)
        return {"forgotten": sorted(req.rollout_ids)}

    async def commit(self, req: CommitRequest) -> dict[str, Any]:
        cid = req.checkpoint_id
        async with self._lock:
            recorded = self.machine.admit("commit", cid)
            if recorded is not None:
                return recorded
            self.machine.renew(req.deadline_ts)
            self._arm_lease()
            report = self.table.readiness()
            if not report.ready:
                raise InvalidPhase(
                    f"participant is no longer ready to commit: blockers={report.blockers}",
                    status=409,
                )
            if req.episode_ids is not None:
                restarted = sorted(set(report.restarts) & {e.capture_key for e in req.episode_ids})
                if restarted:
                    raise RestartInScope(
                        f"the commit scope names episodes that restart: {restarted}", status=409
                    )
            write = self._start_write(req)
            assert write.task is not None  # _start_write leaves its task running or done
            manifest = await self._within(req.deadline_ts, asyncio.shield(write.task), "write")
            if req.episode_ids is not None:
                scope = set(req.episode_ids)
                for e in self.table.restored_pending():
                    if e not in scope:
                        self.table.delete_restored(e)
            self.machine.to(Phase.COMMITTED)
            answer = {
                "phase": Phase.COMMITTED.value,
                "manifest": manifest,
                "episode_ids": sorted(
                    EpisodeId.model_validate(r["episode_id"]).capture_key for r in write.records
                ),
            }
            self.machine.record(cid, "commit", answer)
            if self.state is not None:
                await self.state.committed(cid, answer)
            return answer

    def _start_write(self, req: CommitRequest) -> _Write:
        write = self._write
        if write is None or write.checkpoint_id != req.checkpoint_id:
            scope = None if req.episode_ids is None else set(req.episode_ids)
            write = self._write = _Write(
                req.checkpoint_id, req.checkpoint_dir, req.episode_ids, self.table.export(scope)
            )
        elif (write.checkpoint_dir, write.scope) != (req.checkpoint_dir, req.episode_ids):
            raise CheckpointConflict(
                f"checkpoint {req.checkpoint_id!r} is already being written to another "
                "directory or scope",
                status=409,
            )
        if write.task is None or (write.task.done() and write.task.exception() is not None):
            write.task = asyncio.ensure_future(
                asyncio.to_thread(
                    files.write_state,
                    req.checkpoint_dir,
                    kind=self.kind,
                    instance=self.instance,
                    checkpoint_id=req.checkpoint_id,
                    records=list(write.records),
                )
            )
            write.task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return write

    async def restore(self, req: RestoreRequest) -> dict[str, Any]:
        cid = req.checkpoint_id
        async with self._lock:
            recorded = self.machine.admit("restore", cid)
            if recorded is not None:
                return recorded
            if self.table.live or self.table.restored:
                raise CheckpointRejected(
                    "agent restore requires a process without live episodes", status=409
                )
            scope = {e.capture_key for e in req.episode_ids}
            manifest, raw = await self._within(
                req.deadline_ts,
                asyncio.to_thread(
                    files.read_state,
                    req.checkpoint_dir,
                    kind=self.kind,
                    instance=self.instance,
                    select=lambda r: files.record_key(r) in scope,
                ),
                "restore read",
            )
            installed = [(files.record_episode(r), r.get("boundary")) for r in raw]
            self.table.close()
            restored = self.table.install(installed)
            self.machine.open_checkpoint(cid, Phase.RESTORED, req.deadline_ts)
            self._arm_lease()
            answer = {
                "phase": Phase.RESTORED.value,
                "source_checkpoint_id": manifest["checkpoint_id"],
                "restored": restored,
            }
            self.machine.record(cid, "restore", answer)
            return answer

    async def resume(self, req: CheckpointRequest) -> dict[str, Any]:
        async with self._lock:
            answer, reopen = self.machine.resume(req.checkpoint_id)
            if reopen:
                await self._reopen()
            if self.state is not None:
                await self.state.resumed(req.checkpoint_id)
        return answer

    async def _reopen(self) -> None:
        self._write = None  # a write still running finishes, but nothing awaits it
        self.table.open()
        if self._lease_timer is not None:
            self._lease_timer.cancel()
            self._lease_timer = None
        await self._notify()

    # ------------------------------------------------------------ the lease

    def _arm_lease(self) -> None:
        if self._lease_timer is not None:
            self._lease_timer.cancel()
        until = self.machine.lease_expires_at
        if until is None:
            self._lease_timer = None
            return
        self._lease_timer = asyncio.get_running_loop().call_later(
            max(0.0, until - self._clock()) + 0.01,
            lambda: asyncio.ensure_future(self._on_lease()),
        )

    async def _on_lease(self) -> None:
        async with self._lock:
            cid = self.machine.expired(self._clock())
            if cid is None:
                self._arm_lease()
                return
            logger.warning(
                "checkpoint %s lease expired in phase %s; resuming", cid, self.machine.phase.value
            )
            self.machine.close_checkpoint(cid)
            await self._reopen()
            if self.state is not None:
                await self.state.resumed(cid)

    # ------------------------------------------------------------ serving

    async def start(self) -> None:
        """Nothing to arm: what a state dir keeps was loaded at construction."""

    async def stop_runs(self) -> None:
        self._closing = True
        tasks = [t for t in self._tasks.values() if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)

    def crash(self) -> None:
        """As a crash would: nothing more is written (the server's ``kill``)."""
        self._closing = True
        if self.state is not None:
            self.state.crash()

    async def aclose(self) -> None:
        await self.stop_runs()
        if self._lease_timer is not None:
            self._lease_timer.cancel()
        if self.state is not None:
            await asyncio.to_thread(self.state.close)


__all__ = ["GymError", "RunOutcome", "V2Participant"]
