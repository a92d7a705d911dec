"""The trainer-facing API: run batches of rows as rollouts, gate checkpoints, read snapshots.

::

    with Orchestrator([GymEndpoint(url=url, token=token)],
                      policy=TryPolicy(rollout_s=60.0, receipt_s=5.0, max_tries=3),
                      pool_size=64, rollouts_per_actor=1) as orch:
        outcomes = orch.run_batch(rows)                 # one outcome per row, in row order
        for index, outcome in orch.stream(rows):        # each outcome as its rollout ends
            ...
        report = orch.checkpoint("step-10", "/ckpt/step-10", deadline_s=120.0)
        print(orch.snapshot())

The orchestrator creates the ledger actor and a warm pool of rollout actors. Its own async core
runs on a private event loop thread, so the sync methods work from a plain driver script and the
async variants (``arun_batch``, ``astream``, ``acheckpoint``, ``asnapshot``, ``aclose``,
``astart``) from any other loop, such as a Ray actor's.

Streams: ``stream(rows)`` / ``astream(rows)`` yield ``(index, outcome)`` (an
:class:`IndexedOutcome`) as each rollout ends; ``run_batch`` is the collected stream. ``astream``
also takes an async iterable of rows and dispatches each row as it arrives, so a trainer can keep
a fixed number in flight across steps. Closing a stream before its end abandons the rest exactly
as ``fail_fast`` does (each running try is retired, and one that had finished is adopted and its
result kept for the rollout's next row); an outcome that ended but was not taken is kept the
same way.

Runs sharing a Gym server: ``run_id`` names the training run (default: the orchestrator id; keep
it stable across restarts of the run). Minted rollout ids start with ``<run_id>-``. A checkpoint
acts only on its own run's attempts on Gym (those in its book, and those whose rollout id starts
with ``<run_id>-``): another run's are never retired or ACKed, only waited for, and named in
``CheckpointFailed`` when they still block at the deadline; ``checkpoint(..., sweep_foreign=True)``
treats them as orphans (after a run that is gone for good).

Rows: a row's rollout id is ``_ng_rollout_id`` (minted when absent), ``_ng_attempt_index`` the
first try's index, ``_ng_endpoint`` (an endpoint name or URL) its endpoint; without it the
endpoint is chosen by a stable hash of the rollout id. What is known of each rollout id lives in
one :class:`~rl_gym_actors.core.rollout_memory.RolloutMemory`: a rollout that comes again after
ending without a sealed result starts by retiring its current try (and adopts it if it
finished), as does a row that names try k > 0 of a rollout it has not seen (try k-1 is retired
first); when its rollout actor died, the current try is the one the ledger last heard of; and one
whose abandoned rollout had adopted a result gets that result back without running the agent
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import ray
from pydantic import BaseModel, ConfigDict
from ray.exceptions import RayActorError, RayTaskError

from rl_gym_actors.actors.checkpoint_gate import AbortReport, abort_everywhere
from rl_gym_actors.actors.chunks import ChunkSender
from rl_gym_actors.actors.ledger_actor import LedgerActor, ledger_name
from rl_gym_actors.actors.pool import PoolSnapshot, WarmPool, actor_pattern
from rl_gym_actors.actors.rollout_actor import RolloutActorSnapshot, RolloutCounters

# runtime sets Ray's env before Ray loads
from rl_gym_actors.actors.runtime import RAY_NAMESPACE, LoopThread, ensure_ray
from rl_gym_actors.config import GymEndpoint, LedgerConfig, PoolConfig, TryPolicy, deadline_s_arg
from rl_gym_actors.core.ledger import CheckpointReport, LedgerSnapshot
from rl_gym_actors.core.rollout_memory import RolloutMemory
from rl_gym_actors.errors import ConfigError, LedgerLost, PoolClosed, RlGymError
from rl_gym_actors.failures import FailureKind, failure_kind
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.probe import probe_endpoints
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.protocol import (
    ATTEMPT_INDEX_FIELD,
    ROLLOUT_ID_FIELD,
    WIRE_INT_MAX,
    is_valid_attempt_index,
    is_valid_rollout_id,
)

logger = logging.getLogger(__name__)

ENDPOINT_FIELD = "_ng_endpoint"
MEMORY = 1_000_000  # rollout ids remembered (oldest forgotten first)
WARN_UNACKED = 50_000  # sealed results held un-ACKed on Gym before a warning
CALL_SLACK_S = 30.0  # a ledger call may take this much beyond its own deadline
START_TIMEOUT_S = 120.0
LEDGER_RESTARTS = 16  # Ray restarts a dead ledger this often (then LedgerLost)


class ActorTotals(RolloutCounters):
    """The rollout actors' counters, summed over the pool."""

    actors: int = 0


class OrchestratorSnapshot(BaseModel):
    """The ledger's snapshot, the pool's, and the rollout actors' counters."""

    model_config = ConfigDict(frozen=True)

    orchestrator_id: str
    ledger: LedgerSnapshot
    pool: PoolSnapshot
    actors: ActorTotals
    known_rollouts: int
    in_flight: int


class IndexedOutcome(NamedTuple):
    """One streamed outcome and the index of its row (its position in the rows fed)."""

    index: int
    outcome: Outcome


@dataclass
class _Item:
    index: int
    rollout_id: str
    row: dict[str, Any]
    endpoint_index: int
    first_attempt: int
    previous_attempt: int | None
    ready: Outcome | None = None  # answered without dispatch


@dataclass
class _Batch:
    fail_fast: bool
    stopped: bool = False
    waiting: dict[str, asyncio.Task] = field(default_factory=dict)
    running: dict[str, tuple[Any, int]] = field(default_factory=dict)  # rid -> (handle, first)
    abandons: list[Any] = field(default_factory=list)


class Orchestrator:
    """See the module docstring. ``start=False`` defers creating the actors to :meth:`start` /
    :meth:`astart` (or the first call). ``progress`` draws a progress bar for each batch: None
    (the default) only on a terminal, False never."""

    def __init__(
        self,
        endpoints: Sequence[GymEndpoint | str],
        *,
        policy: TryPolicy | None = None,
        pool_size: int | None = None,
        rollouts_per_actor: int | None = None,
        pool: PoolConfig | None = None,
        ledger: LedgerConfig | None = None,
        orchestrator_id: str | None = None,
        run_id: str | None = None,
        progress: bool | None = None,
        ack: str | None = None,
        warn_unacked: int = WARN_UNACKED,
        check_endpoints: bool = True,
        start: bool = True,
    ) -> None:
        self.endpoints = _endpoints(endpoints)
        self.policy = policy or TryPolicy()
        if ack is not None:
            try:
                self.policy = TryPolicy.model_validate({**self.policy.model_dump(), "ack": ack})
            except ValueError as exc:
                raise ConfigError(f"ack must be 'at_checkpoint' or 'on_seal', got {ack!r}") from exc
        if not isinstance(warn_unacked, int) or isinstance(warn_unacked, bool) or warn_unacked < 1:
            raise ConfigError(f"warn_unacked must be an int >= 1, got {warn_unacked!r}")
        self.warn_unacked = warn_unacked
        self.check_endpoints = check_endpoints
        self._unacked = 0  # sealed results left un-ACKed since the last checkpoint
        self._warned_at = 0
        updates = {
            k: v
            for k, v in (("size", pool_size), ("rollouts_per_actor", rollouts_per_actor))
            if v is not None
        }
        try:
            self.pool_config = (pool or PoolConfig()).model_copy(update=updates)
            PoolConfig.model_validate(self.pool_config.model_dump())
        except ValueError as exc:
            raise ConfigError(f"invalid pool settings: {exc}") from exc
        self.ledger_config = ledger or LedgerConfig()
        self.id = orchestrator_id or uuid.uuid4().hex[:12]
        if not is_valid_rollout_id(self.id):
            raise ConfigError(f"invalid orchestrator id {self.id!r}")
        self.run_id = self.id if run_id is None else run_id
        if not is_valid_rollout_id(self.run_id) or len(self.run_id) > 200:
            raise ConfigError(f"invalid run_id {self.run_id!r}")
        self._run_prefix = self.run_id + "-"
        self._claims: set[str] = set()  # dispatched ids without the prefix, since a commit
        self.progress = progress
        self._loop = LoopThread(name=f"rlga-orchestrator-{self.id}")
        self._ledger: Any = None
        self._pool: WarmPool | None = None
        self._memory = RolloutMemory(MEMORY)  # what is known of every rollout id
        self._chunks = ChunkSender()
        self._start_lock: asyncio.Lock | None = None
        self._closed = False
        if start:
            self.start()

    # ------------------------------------------------------------ life cycle

    def start(self) -> Orchestrator:
        """Start Ray if needed, the ledger actor and the warm pool (idempotent)."""
        self._check_open()
        ensure_ray()  # on the caller's thread: Ray wants the main thread
        self._loop.run(self._start())
        return self

    async def astart(self) -> Orchestrator:
        self._check_open()
        if not ray.is_initialized():
            await asyncio.to_thread(ensure_ray)
        await self._loop.arun(self._start())
        return self

    def _sync(self, coro):
        if not self._loop.alive:
            coro.close()
            raise PoolClosed(f"orchestrator {self.id} is closed")
        return self._loop.run(coro)

    async def _async(self, coro):
        if not self._loop.alive:
            coro.close()
            raise PoolClosed(f"orchestrator {self.id} is closed")
        return await self._loop.arun(coro)

    def _check_open(self) -> None:
        if self._closed or not self._loop.alive:
            raise PoolClosed(f"orchestrator {self.id} is closed")

    def close(self) -> None:
        """Kill the rollout actors and the ledger actor; later calls raise PoolClosed."""
        if self._loop.alive:
            self._loop.run(self._close())
            self._loop.stop()

    async def aclose(self) -> None:
        if self._loop.alive:
            await self._loop.arun(self._close())
            self._loop.stop()

    def __enter__(self) -> Orchestrator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Orchestrator:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------ the API

    def run_batch(
        self, rows: Iterable[Mapping[str, Any]], *, fail_fast: bool = False
    ) -> list[Outcome]:
        """One outcome per row, in row order. A failed row never raises; with ``fail_fast`` the
        first failed row stops the batch: every other rollout is abandoned (it retires its try,
        and a try that had finished is adopted and its result kept). Raises ConfigError for
        malformed rows before anything is dispatched."""
        return self._sync(self._run_batch(rows, fail_fast))

    async def arun_batch(
        self, rows: Iterable[Mapping[str, Any]], *, fail_fast: bool = False
    ) -> list[Outcome]:
        return await self._async(self._run_batch(rows, fail_fast))

    def stream(
        self, rows: Iterable[Mapping[str, Any]], *, fail_fast: bool = False
    ) -> Iterator[IndexedOutcome]:
        """Yield ``(index, outcome)`` for each row as its rollout ends (completion order).
        Closing the iterator early (``close()``, ``break`` and dropping it, or leaving a ``with
        contextlib.closing(...)``) abandons the rest as ``fail_fast`` does. Raises ConfigError
        for malformed rows before anything is dispatched."""
        self._check_open()
        rows = _row_list(rows)
        return self._stream_sync(rows, fail_fast)

    def _stream_sync(self, rows: list, fail_fast: bool) -> Iterator[IndexedOutcome]:
        stream = self._sync(self._open_stream(rows, fail_fast))
        ended: list[IndexedOutcome] = []
        try:
            while (ended := self._sync(stream.next())) is not None:
                while ended:
                    yield ended.pop(0)
        finally:
            if self._loop.alive:
                self._loop.run(stream.stop(ended or ()))

    async def astream(
        self,
        rows: Iterable[Mapping[str, Any]] | AsyncIterable[Mapping[str, Any]],
        *,
        fail_fast: bool = False,
    ) -> AsyncIterator[IndexedOutcome]:
        """The async :meth:`stream`. ``rows`` may also be an async iterable: each row is
        dispatched as it arrives (a malformed one raises ConfigError from the iterator and the
        rest is abandoned); the stream ends once the rows end and every rollout has. Close it
        early with ``aclose()`` (or ``contextlib.aclosing``)."""
        self._check_open()
        lazy = isinstance(rows, AsyncIterable)
        stream = await self._async(self._open_stream(None if lazy else _row_list(rows), fail_fast))
        feeder = asyncio.ensure_future(self._feed(stream, rows)) if lazy else None
        ended: list[IndexedOutcome] = []
        try:
            while (ended := await self._async(stream.next())) is not None:
                while ended:
                    yield ended.pop(0)
        finally:
            if feeder is not None:
                feeder.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await feeder
            if self._loop.alive:
                await self._loop.arun(stream.stop(ended or ()))

    async def _feed(self, stream: _Stream, rows: AsyncIterable[Mapping[str, Any]]) -> None:
        """On the caller's loop: hand each row of ``rows`` to the stream as it arrives."""
        error: BaseException | None = None
        try:
            async for row in rows:
                await self._async(stream.add(row))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bad row or the iterable's own error ends the stream
            error = exc
        if self._loop.alive:
            await self._loop.arun(stream.end_of_rows(error))

    def checkpoint(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        *,
        deadline_s: float = 120.0,
        sweep_foreign: bool = False,
    ) -> CheckpointReport:
        """Gate a checkpoint on every Gym endpoint (the ledger adopts, ACKs orphans, retires
        forgotten runs, prepares, commits, resumes). Raises CheckpointFailed when an endpoint is
        not ready by the deadline (its ``blockers`` name another run's attempts ``foreign``, and
        another checkpoint id that holds a server ``active_checkpoint_id``), LedgerLost when the
        ledger is gone for good."""
        return self._sync(
            self._checkpoint(checkpoint_id, checkpoint_dir, deadline_s, sweep_foreign)
        )

    async def acheckpoint(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        *,
        deadline_s: float = 120.0,
        sweep_foreign: bool = False,
    ) -> CheckpointReport:
        return await self._async(
            self._checkpoint(checkpoint_id, checkpoint_dir, deadline_s, sweep_foreign)
        )

    def snapshot(self) -> OrchestratorSnapshot:
        return self._sync(self._snapshot())

    async def asnapshot(self) -> OrchestratorSnapshot:
        return await self._async(self._snapshot())

    def abort_checkpoint(self, checkpoint_id: str, *, deadline_s: float = 10.0) -> AbortReport:
        """Resume ``checkpoint_id`` on every endpoint: the way to free a Gym server that a
        checkpoint holds whose driver died between prepare and resume (the id a
        ``CheckpointConflict`` or a ``CheckpointFailed`` names as ``active_checkpoint_id``).
        Works on a server without checkpoint leases (a real Gym: resume is its abort). Never
        raises for an endpoint: ``report.aborted`` says whether every endpoint resumed it."""
        return self._sync(self._abort(checkpoint_id, deadline_s))

    async def aabort_checkpoint(
        self, checkpoint_id: str, *, deadline_s: float = 10.0
    ) -> AbortReport:
        return await self._async(self._abort(checkpoint_id, deadline_s))

    @property
    def ledger(self) -> Any:
        """The ledger actor's handle."""
        return self._ledger

    # ------------------------------------------------------------ on the private loop

    async def _start(self) -> None:
        if self._closed:
            raise PoolClosed(f"orchestrator {self.id} is closed")
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._pool is not None:
                return
            ensure_ray()
            if self.check_endpoints:
                await probe_endpoints(self.endpoints)
            # Ray restarts a ledger that dies and sends the calls in flight again; the
            # restarted ledger rebuilds its book from the rollout actors it finds by name
            ledger = LedgerActor.options(
                name=ledger_name(self.id),
                namespace=RAY_NAMESPACE,
                num_cpus=0,
                max_restarts=LEDGER_RESTARTS,
                max_task_retries=-1,
            ).remote(
                self.endpoints,
                self.policy,
                self.ledger_config,
                owner_pattern=actor_pattern(self.id),
                run_id=self.run_id,
            )
            try:
                await asyncio.wait_for(ledger.ping.remote(), START_TIMEOUT_S)
                pool = WarmPool(
                    self.id,
                    self.endpoints,
                    self.policy,
                    self.pool_config,
                    self.ledger_config,
                    ledger,
                )
                await pool.start()
            except BaseException:
                ray.kill(ledger, no_restart=True)
                raise
            self._ledger, self._pool = ledger, pool

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pool is not None:
            await self._pool.close()
        if self._ledger is not None:
            try:
                await asyncio.wait_for(self._ledger.close.remote(), 2.0)
            except Exception:  # closing is best effort; the kill below is not
                pass
            ray.kill(self._ledger, no_restart=True)

    async def _ready(self) -> WarmPool:
        if self._pool is None:
            await self._start()
        if self._closed or self._pool is None:
            raise PoolClosed(f"orchestrator {self.id} is closed")
        return self._pool

    async def _run_batch(self, rows: Iterable[Mapping[str, Any]], fail_fast: bool) -> list[Outcome]:
        stream = await self._open_stream(_row_list(rows), fail_fast)
        outcomes: list[Outcome | None] = [None] * stream.fed
        try:
            while (ended := await stream.next()) is not None:
                for index, outcome in ended:
                    outcomes[index] = outcome
        except BaseException:
            stream.cancel()  # the caller gave up: each running rollout retires its try
            raise
        finally:
            await stream.stop(())
        return outcomes  # type: ignore[return-value]

    async def _open_stream(self, rows: list[Mapping[str, Any]] | None, fail_fast: bool) -> _Stream:
        """A stream of ``rows`` (all checked before any is dispatched), or an open one (None)
        that :meth:`_Stream.add` feeds."""
        pool = await self._ready()
        if rows is None:
            return _Stream(self, pool, fail_fast, None)
        items = self._plan(rows)
        stream = _Stream(self, pool, fail_fast, _progress_bar(len(items), self.progress))
        for item in items:
            stream.dispatch(item)
        stream.end_of_rows_now()
        return stream

    async def _row(self, pool: WarmPool, item: _Item, batch: _Batch, bar: Any) -> Outcome:
        outcome = item.ready
        if outcome is None:
            try:
                outcome = await self._dispatch(pool, item, batch)
            except asyncio.CancelledError:
                if not batch.stopped or item.rollout_id in batch.running:
                    raise
                outcome = _not_dispatched(item, self.endpoints)
        if bar is not None:
            bar.update(outcome.status, adopted=outcome.adopted)
        return outcome

    async def _dispatch(self, pool: WarmPool, item: _Item, batch: _Batch) -> Outcome:
        rid = item.rollout_id
        async with pool.lease(rid) as slot:
            batch.waiting.pop(rid, None)
            if batch.stopped:
                return _not_dispatched(item, self.endpoints)
            batch.running[rid] = (slot.handle, item.first_attempt)
            try:
                if self._memory.unsure(rid):
                    item.previous_attempt = await self._learn_current(item)
                outcome = await self._chunks.run(
                    slot.handle,
                    (item.row, rid, item.endpoint_index, item.first_attempt, item.previous_attempt),
                )
            except asyncio.CancelledError:
                # the caller gave up on the batch: the rollout retires its try on its own
                slot.handle.abandon.remote(rid, item.first_attempt)
                self._memory.lose(rid, item.first_attempt, self.policy.max_tries)
                raise
            except RayActorError as exc:
                await pool.actor_failed(slot, exc)
                self._memory.lose(rid, item.first_attempt, self.policy.max_tries)
                outcome = self._failed(
                    item,
                    f"rollout actor {slot.name} died: {type(exc).__name__}",
                    FailureKind.ACTOR_DIED,
                )
            except (RayTaskError, RlGymError) as exc:
                cause = (
                    exc.cause
                    if isinstance(exc, RayTaskError) and isinstance(exc.cause, BaseException)
                    else exc
                )
                outcome = self._failed(
                    item, f"rollout actor {slot.name} raised: {cause!r}", failure_kind(cause)
                )
            else:
                self._memory.finish_outcome(rid, item.first_attempt, outcome)
                if outcome.has_result and not outcome.acked:
                    self._held_on_gym(1)
            finally:
                batch.running.pop(rid, None)
        if outcome.status == "failed" and batch.fail_fast:
            self._stop(batch)
        return outcome

    def _stop(self, batch: _Batch) -> None:
        """fail_fast: abandon what runs; rows still waiting for a slot are never dispatched."""
        if batch.stopped:
            return
        batch.stopped = True
        for task in list(batch.waiting.values()):
            task.cancel()
        for rid, (handle, first) in list(batch.running.items()):
            batch.abandons.append(handle.abandon.remote(rid, first))

    async def _checkpoint(
        self,
        checkpoint_id: str,
        checkpoint_dir: str,
        deadline_s: float,
        sweep_foreign: bool = False,
    ) -> CheckpointReport:
        await self._ready()
        deadline_s = deadline_s_arg(deadline_s)
        claims = sorted(self._claims)
        report = await self._ledger_call(
            "checkpoint",
            checkpoint_id,
            str(checkpoint_dir),
            deadline_s,
            bool(sweep_foreign),
            claims,
            timeout_s=deadline_s + CALL_SLACK_S,
        )
        # what the commit covered is settled on Gym; rollouts still running keep their claim
        self._claims.difference_update(r for r in claims if not self._memory.running(r))
        self._committed()
        return report

    def _committed(self) -> None:
        """A checkpoint committed: the trainer's state now holds every sealed result handed out,
        and Gym has released them. Forget those rollouts (a row sent again later fails typed,
        ``forgotten_rollout``); keep the ones in flight, failed, or holding a result the trainer
        has not taken yet."""
        self._unacked = self._warned_at = 0
        self._memory.forget_settled()

    def _held_on_gym(self, n: int) -> None:
        """Count sealed results Gym holds un-ACKed until the next checkpoint; warn at the
        threshold and at each doubling of it."""
        self._unacked += n
        if self._unacked >= max(self.warn_unacked, 2 * self._warned_at):
            self._warned_at = self._unacked
            logger.warning(
                "%d sealed results are held un-ACKed on Gym since the last checkpoint (ack=%r): "
                "Gym keeps each in memory until a checkpoint releases it. Call "
                "Orchestrator.checkpoint() more often, or pass ack='on_seal' to release each "
                "result at once (a crash then loses the results since the last checkpoint).",
                self._unacked,
                self.policy.ack,
            )

    async def _abort(self, checkpoint_id: str, deadline_s: float) -> AbortReport:
        await self._ready()
        deadline_s = deadline_s_arg(deadline_s)
        try:
            return await self._ledger_call(
                "abort_checkpoint", checkpoint_id, deadline_s, timeout_s=deadline_s + CALL_SLACK_S
            )
        except LedgerLost:
            # freeing Gym needs no book: resume from here, with clients of our own
            clients = [GymClient(ep) for ep in self.endpoints]
            try:
                return await abort_everywhere(clients, checkpoint_id, time.time() + deadline_s)
            finally:
                for client in clients:
                    await client.close()

    async def _ledger_call(self, method: str, *args: Any, timeout_s: float) -> Any:
        """Call the ledger; its typed errors come back as themselves, and a ledger that Ray
        could not bring back (or that did not answer in time) as LedgerLost."""
        try:
            return await asyncio.wait_for(getattr(self._ledger, method).remote(*args), timeout_s)
        except RayTaskError as exc:
            if isinstance(exc.cause, RlGymError):
                raise exc.cause from None
            raise
        except RayActorError as exc:
            raise LedgerLost(
                f"the ledger of orchestrator {self.id} is gone ({method}): {type(exc).__name__}",
                cause=f"{type(exc).__name__}: {exc}"[:500],
            ) from None
        except TimeoutError:
            raise LedgerLost(
                f"the ledger of orchestrator {self.id} did not answer {method} "
                f"within {timeout_s:.0f}s",
                cause="TimeoutError",
            ) from None

    async def _snapshot(self) -> OrchestratorSnapshot:
        pool = await self._ready()
        ledger = await self._ledger_call("snapshot", timeout_s=START_TIMEOUT_S)
        refs = [h.snapshot.remote() for h in pool.handles.values()]
        answers = await asyncio.gather(*refs, return_exceptions=True)
        sums: dict[str, int] = {}
        alive = [a for a in answers if isinstance(a, RolloutActorSnapshot)]
        for snap in alive:
            for name in RolloutCounters.model_fields:
                sums[name] = sums.get(name, 0) + getattr(snap, name)
        return OrchestratorSnapshot(
            orchestrator_id=self.id,
            ledger=ledger,
            pool=pool.snapshot(),
            actors=ActorTotals(actors=len(alive), **sums),
            known_rollouts=len(self._memory),
            in_flight=self._memory.in_flight,
        )

    # ------------------------------------------------------------ rows and memory

    def _plan(self, rows: list[Mapping[str, Any]]) -> list[_Item]:
        """Every row checked (ConfigError names the first bad one) before any is handed out."""
        seen: set[str] = set()
        items = [self._plan_row(i, row, seen) for i, row in enumerate(rows)]
        for item in items:  # every row is valid: hand out the kept results
            if item.ready is not None:
                self._memory.hand_out(item.rollout_id)
        return items

    def _handed_out(self, item: _Item) -> None:
        if item.ready is not None:
            self._known[item.rollout_id].handed_out = True

    def _plan_row(self, i: int, row: Any, seen: set[str]) -> _Item:
        if not isinstance(row, Mapping):
            raise ConfigError(f"row {i} must be a mapping, got {type(row).__name__}")
        rid = row.get(ROLLOUT_ID_FIELD)
        if rid is None:
            rid = f"{self.run_id}-{uuid.uuid4().hex}"
        if not is_valid_rollout_id(rid):
            raise ConfigError(f"row {i}: invalid {ROLLOUT_ID_FIELD} {rid!r}")
        if not rid.startswith(self._run_prefix):
            # an id of the trainer's own: the gate learns it is this run's with the next
            # checkpoint, even if the actor that ran it died before reporting it
            self._claims.add(rid)
        if rid in seen or self._memory.running(rid):
            raise ConfigError(f"row {i}: rollout {rid} is already in this or a running batch")
        seen.add(rid)
        first = row.get(ATTEMPT_INDEX_FIELD, 0)
        if not is_valid_attempt_index(first):
            raise ConfigError(
                f"row {i}: {ATTEMPT_INDEX_FIELD} must be an int from 0 to "
                f"{WIRE_INT_MAX}, got {first!r}"
            )
        gym_row = {
            k: v
            for k, v in row.items()
            if k not in (ENDPOINT_FIELD, ROLLOUT_ID_FIELD, ATTEMPT_INDEX_FIELD)
        }
        try:
            json.dumps(gym_row, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"row {i} ({rid}) is not JSON: {exc}") from exc
        plan = self._memory.plan(rid, first)
        return _Item(
            i,
            rid,
            gym_row,
            self._endpoint_for(row, rid, i),
            plan.first_attempt,
            plan.previous_attempt,
            plan.ready,
        )

    async def _learn_current(self, item: _Item) -> int | None:
        """A rollout whose actor died: the ledger knows which try was current (the dead
        actor's reports reached it); that try is the one to retire, and adopt if it finished."""
        rid = item.rollout_id
        try:
            current = await self._ledger_call("current_attempt", rid, timeout_s=CALL_SLACK_S)
        except (LedgerLost, RayTaskError) as exc:
            logger.warning(
                "ledger did not say the current try of %s (%r): retiring try %s",
                rid,
                exc,
                item.previous_attempt,
            )
            return item.previous_attempt
        self._memory.learn_current(rid, current)
        return self._memory.plan(rid, item.first_attempt).previous_attempt

    def _endpoint_for(self, row: Mapping[str, Any], rid: str, i: int) -> int:
        wanted = row.get(ENDPOINT_FIELD)
        if wanted is not None:
            for n, ep in enumerate(self.endpoints):
                if wanted in (ep.name, ep.url) or (
                    isinstance(wanted, str) and wanted.rstrip("/") == ep.url
                ):
                    return n
            raise ConfigError(f"row {i}: {ENDPOINT_FIELD} {wanted!r} names no endpoint")
        return endpoint_index_for(rid, len(self.endpoints))

    def _failed(self, item: _Item, reason: str, failure: FailureKind) -> Outcome:
        return Outcome(
            rollout_id=item.rollout_id,
            status="failed",
            attempt_index=item.first_attempt,
            endpoint=self.endpoints[item.endpoint_index].url,
            reason=reason,
            failure=failure,
        )


class _Stream:
    """One stream on the orchestrator's loop: rows dispatched as they come, outcomes queued as
    their rollouts end, taken in bunches by :meth:`next`."""

    def __init__(self, orch: Orchestrator, pool: WarmPool, fail_fast: bool, bar: Any) -> None:
        self._orch, self._pool, self._bar = orch, pool, bar
        self._batch = _Batch(fail_fast)
        self._tasks: set[asyncio.Task] = set()
        self._ended: list[IndexedOutcome] = []
        self._wake = asyncio.Event()
        self._rows_done = False
        self._error: BaseException | None = None
        self._stopped = False
        self._cancelled = False
        self.fed = 0

    def dispatch(self, item: _Item) -> None:
        orch = self._orch
        task = asyncio.ensure_future(orch._row(self._pool, item, self._batch, self._bar))
        self._tasks.add(task)
        if item.ready is None:
            self._batch.waiting[item.rollout_id] = task
            orch._memory.begin(item.rollout_id)
        task.add_done_callback(lambda t, item=item: self._on_end(item, t))
        self.fed += 1

    async def add(self, row: Mapping[str, Any]) -> None:
        """One more row (checked now; ConfigError when malformed)."""
        if self._rows_done or self._stopped:
            raise ConfigError("this stream takes no more rows")
        item = self._orch._plan_row(self.fed, row, set())
        if item.ready is not None:
            self._orch._memory.hand_out(item.rollout_id)
        self.dispatch(item)

    def end_of_rows_now(self, error: BaseException | None = None) -> None:
        self._rows_done = True
        if error is not None and self._error is None:
            self._error = error
        self._wake.set()

    async def end_of_rows(self, error: BaseException | None = None) -> None:
        self.end_of_rows_now(error)

    def _on_end(self, item: _Item, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._batch.waiting.pop(item.rollout_id, None)
        if item.ready is None:
            self._orch._memory.end(item.rollout_id)
        if task.cancelled():
            pass
        elif task.exception() is not None:
            if self._error is None:
                self._error = task.exception()
        else:
            self._ended.append(IndexedOutcome(item.index, task.result()))
        self._wake.set()

    async def next(self) -> list[IndexedOutcome] | None:
        """The outcomes that ended since the last call (waiting for one); None at the end."""
        while True:
            if self._error is not None:
                raise self._error
            if self._ended:
                ended, self._ended = self._ended, []
                return ended
            if self._rows_done and not self._tasks:
                return None
            self._wake.clear()
            await self._wake.wait()

    def cancel(self) -> None:
        """The caller gave up: cancel every row (a running rollout retires its try)."""
        self._cancelled = True
        for task in list(self._tasks):
            task.cancel()

    async def stop(self, untaken: Iterable[IndexedOutcome]) -> None:
        """End the stream: what still runs is abandoned as ``fail_fast`` does; outcomes that
        ended but were not taken keep their results for their rollouts' next rows."""
        if self._stopped:
            return
        self._stopped = True
        self._rows_done = True
        if self._tasks and not self._cancelled:
            self._orch._stop(self._batch)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._batch.abandons:
            await asyncio.gather(*self._batch.abandons, return_exceptions=True)
        for _, outcome in (*untaken, *self._ended):
            self._orch._memory.keep(outcome)
        self._ended = []
        if self._bar is not None:
            self._bar.close()


def _row_list(rows: Any) -> list[Mapping[str, Any]]:
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Iterable):
        raise ConfigError("rows must be a list (or other iterable) of row mappings")
    return list(rows)


def endpoint_index_for(rollout_id: str, n_endpoints: int) -> int:
    """The endpoint a rollout goes to when its row names none: a hash of its id that is the
    same in every process and run (SHA-256, not ``hash()``)."""
    digest = hashlib.sha256(rollout_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % n_endpoints


def _not_dispatched(item: _Item, endpoints: list[GymEndpoint]) -> Outcome:
    return Outcome(
        rollout_id=item.rollout_id,
        status="abandoned",
        endpoint=endpoints[item.endpoint_index].url,
        reason="batch stopped (fail_fast) before this row was dispatched",
        failure=FailureKind.ABANDONED,
    )


def _endpoints(endpoints: Sequence[GymEndpoint | str]) -> list[GymEndpoint]:
    if isinstance(endpoints, (str, GymEndpoint)) or not endpoints:
        raise ConfigError("endpoints must be a non-empty list of GymEndpoint (or URLs)")
    out: list[GymEndpoint] = []
    for ep in endpoints:
        if isinstance(ep, str):
            try:
                ep = GymEndpoint(url=ep)
            except ValueError as exc:
                raise ConfigError(f"invalid endpoint {ep!r}: {exc}") from exc
        if not isinstance(ep, GymEndpoint):
            raise ConfigError(f"not a GymEndpoint: {ep!r}")
        out.append(ep)
    if len({ep.url for ep in out}) != len(out):
        raise ConfigError("endpoint URLs must be unique")
    return out


def _progress_bar(total: int, enabled: bool | None) -> Any:
    if enabled is False or total == 0:
        return None
    try:
        from rl_gym_actors.progress import ProgressBar
    except ImportError:
        return None
    bar = ProgressBar(total, enabled=enabled)
    return bar if bar.enabled else None
