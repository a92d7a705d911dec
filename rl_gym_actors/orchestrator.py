"""The trainer-facing API: run batches of rows as rollouts, gate checkpoints, read snapshots.

::

    with Orchestrator([GymEndpoint(url=url, token=token)],
                      policy=TryPolicy(rollout_s=60.0, receipt_s=5.0, max_tries=3),
                      pool_size=64, rollouts_per_actor=1) as orch:
        outcomes = orch.run_batch(rows)                 # one outcome per row, in row order
        for index, outcome in orch.stream(rows):        # each outcome as its rollout ends
            print(index, outcome.status, outcome.reward)
        report = orch.checkpoint("step-10", "/ckpt/step-10", deadline_s=120.0)
        print(orch.snapshot())

The orchestrator creates the ledger actor and a warm pool of rollout actors. Its own async core
runs on a private event loop thread, so the sync methods work from a plain driver script and the
async variants (``arun_batch``, ``astream``, ``acheckpoint``, ``asnapshot``, ``aclose``,
``astart``) from any other loop, such as a Ray actor's.

Streams (:mod:`rl_gym_actors.stream`): ``stream(rows)`` / ``astream(rows)`` yield ``(index,
outcome)`` as each rollout ends; ``run_batch`` is the collected stream; ``astream`` also takes an
async iterable of rows. Closing a stream before its end abandons the rest as ``fail_fast`` does.

Runs sharing a Gym server: ``run_id`` names the training run (default: the orchestrator id; keep
it stable across restarts). A checkpoint acts only on its own run's attempts on Gym (those in its
book, and those whose rollout id starts with ``<run_id>-``); another run's are only waited for
(named in ``CheckpointFailed`` if they block), or swept as orphans with ``sweep_foreign=True``.

Rows (:mod:`rl_gym_actors.rows`): ``_ng_rollout_id`` (minted when absent), ``_ng_attempt_index``,
``_ng_endpoint``. What is known of each rollout id lives in one
:class:`~rl_gym_actors.core.rollout_memory.RolloutMemory`, which says how each row is dispatched
(:mod:`rl_gym_actors.dispatch`); when a rollout's actor died, the current try is the one the ledger
last heard of.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any

import ray

from rl_gym_actors import checkpoint_part as parts
from rl_gym_actors.actors.checkpoint_abort import (
    AbortReport,
    EndpointAbort,
    abort_with_own_clients,
)
from rl_gym_actors.actors.chunks import ChunkSender
from rl_gym_actors.actors.ledger_client import LedgerClient
from rl_gym_actors.actors.pool import WarmPool, actor_pattern

# runtime sets Ray's env before Ray loads
from rl_gym_actors.actors.runtime import LoopThread, ensure_ray
from rl_gym_actors.config import (
    GymEndpoint,
    LedgerConfig,
    PoolConfig,
    TryPolicy,
    deadline_s_arg,
    policy_with_ack,
    pool_with,
    run_id_arg,
)
from rl_gym_actors.core.checkpoint_report import CheckpointReport, RestoreReport
from rl_gym_actors.core.rollout_memory import RolloutMemory
from rl_gym_actors.core.sealed_ids import DEFAULT_RETENTION
from rl_gym_actors.dispatch import CALL_SLACK_S, RowRunner, UnackedCount
from rl_gym_actors.errors import ConfigError, LedgerLost, PoolClosed
from rl_gym_actors.gym.probe import probe_endpoints
from rl_gym_actors.held_results import warn_if_held
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.progress import bar_for
from rl_gym_actors.protocol import is_valid_rollout_id
from rl_gym_actors.ray_attach import check_env_address
from rl_gym_actors.received import Received
from rl_gym_actors.rows import (
    ENDPOINT_FIELD,
    RowPlanner,
    endpoint_index_for,
    endpoint_list,
    row_list,
)
from rl_gym_actors.run_checkpoints import RunCheckpoints, checkpoint_args
from rl_gym_actors.snapshot import OrchestratorSnapshot
from rl_gym_actors.stream import IndexedOutcome, Stream

# re-exported: imported from here by the package's __init__, integrations and tests
__all__ = [
    "ENDPOINT_FIELD",
    "IndexedOutcome",
    "Orchestrator",
    "OrchestratorSnapshot",
    "endpoint_index_for",
]

MEMORY = 1_000_000  # rollout ids remembered (oldest forgotten first)
WARN_UNACKED = 50_000  # sealed results held un-ACKed on Gym before a warning
START_TIMEOUT_S = 120.0


class Orchestrator:
    """See the module docstring. ``start=False`` defers creating the actors to :meth:`start` /
    :meth:`astart` (or the first call). ``progress``: a bar per batch (None: on a terminal only).
    ``restore_from``: a checkpoint dir whose part (:mod:`rl_gym_actors.checkpoint_part`) this run
    resumes from (:func:`~rl_gym_actors.checkpoint_part.latest_checkpoint_dir` finds it; a
    checkpoint of this run that a dead trainer left open on a Gym server is resumed at start,
    before any row: :attr:`cleared`); ``keep_results``: parts keep the replies of handed
    results, so a restore gives them back in full (the default; False: id, try, receipt and
    reward only); ``sealed_retention``: sealed ids kept."""

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
        restore_from: str | os.PathLike[str] | None = None,
        keep_results: bool = True,
        sealed_retention: int = DEFAULT_RETENTION,
    ) -> None:
        self.endpoints = endpoint_list(endpoints)
        self.policy = policy_with_ack(policy or TryPolicy(), ack)
        self._unacked = UnackedCount(warn_unacked, self.policy.ack)  # checks warn_unacked
        self.warn_unacked = warn_unacked
        self.check_endpoints = check_endpoints  # probed once, before Ray starts
        self.pool_config = pool_with(pool or PoolConfig(), pool_size, rollouts_per_actor)
        self.ledger_config = ledger or LedgerConfig()
        self.id = orchestrator_id or uuid.uuid4().hex[:12]
        if not is_valid_rollout_id(self.id):
            raise ConfigError(f"invalid orchestrator id {self.id!r}")
        run_id, part, sealed = parts.restore_run(restore_from, run_id, sealed_retention)
        self.run_id = run_id_arg(self.id if run_id is None else run_id)
        self._claims: set[str] = set()  # dispatched ids without the prefix, since a commit
        self.progress = progress
        self._loop = LoopThread(name=f"rlga-orchestrator-{self.id}")
        self._ledger: LedgerClient | None = None
        self._pool: WarmPool | None = None
        self._runner: RowRunner | None = None
        self._memory = RolloutMemory(MEMORY, max_tries=self.policy.max_tries)  # every id's
        self._received = Received()  # the outcomes handed to the trainer (snapshot())
        self._dead = None if part is None else (restore_from, part.checkpoint_id)
        self._planner = RowPlanner(self.endpoints, self.run_id, self._memory, self._claims)
        self._checkpoints = RunCheckpoints(
            self.run_id,
            self.endpoints,
            self._memory,
            self._planner,
            self._claims,
            self._unacked,
            bool(keep_results),  # restore_from: run id, results, sealed ids
            sealed_retention,
        )
        # the part and the run's newer ones beside it; their v2 episodes restored at start
        self._v2_part = self._checkpoints.load_restored(restore_from, part, sealed)
        self._chunks = ChunkSender()
        self._start_lock: asyncio.Lock | None = None
        self._closed = False
        if start:
            self.start()

    # ------------------------------------------------------------ life cycle

    def start(self) -> Orchestrator:
        """Start Ray if needed, the ledger actor and the warm pool (idempotent)."""
        self._check_open()
        if self.check_endpoints and self._pool is None:  # a bad URL or token: seconds, no Ray
            self._loop.run(probe_endpoints(self.endpoints))
        check_env_address()  # $RAY_ADDRESS with token auth: attach, or a typed error at once
        ensure_ray()  # on the caller's thread: Ray wants the main thread
        self._loop.run(self._start(probed=True))
        return self

    async def astart(self) -> Orchestrator:
        self._check_open()
        if self.check_endpoints and self._pool is None:
            await self._loop.arun(probe_endpoints(self.endpoints))
        if not ray.is_initialized():
            await asyncio.to_thread(check_env_address)
            await asyncio.to_thread(ensure_ray)
        await self._loop.arun(self._start(probed=True))
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
        rows = row_list(rows)
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
        lazy = rows if isinstance(rows, AsyncIterable) else None
        stream = await self._async(self._open_stream(None if lazy else row_list(rows), fail_fast))
        feeder = asyncio.ensure_future(self._feed(stream, lazy)) if lazy is not None else None
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

    async def _feed(self, stream: Stream, rows: AsyncIterable[Mapping[str, Any]]) -> None:
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
        checkpoint_dir: str | os.PathLike[str],
        *,
        keep: Iterable[str] | None = None,
        deadline_s: float = 120.0,
        sweep_foreign: bool = False,
        keep_if_handed: Iterable[str] | None = None,
    ) -> CheckpointReport:
        """Gate a checkpoint on every Gym endpoint (the ledger adopts, ACKs orphans, retires
        forgotten runs, prepares, commits, resumes). Write the trainer's own state for the step
        first: the layer's part goes under ``checkpoint_dir`` before anything is released.

        ``keep``: the rollout ids of handed results the trainer still holds untrained (an async
        trainer's buffer). They stay in this part and in every later one for as long as they are
        passed in ``keep``; every other result handed out before this call counts as consumed
        here and leaves the next part (None: all of them, a synchronous trainer's case). An id
        this orchestrator never handed out, or already released, is a ConfigError naming it.
        ``keep_if_handed``: ids the trainer may hold, kept when their result was handed out by
        the time this checkpoint counts, ignored else (a trainer that cannot tell a result on
        its way to its buffer from a rollout still running: verl's async modes; the count and
        the handing out happen on the orchestrator's loop, so none falls between).

        The same ``checkpoint_id`` again, once committed, answers its committed report (read
        back from the part, not gated again) for the same dir, and is a ConfigError for another.

        Raises CheckpointFailed when an endpoint is not ready by the deadline (its ``blockers``
        name another run's attempts ``foreign``, and another checkpoint id that holds a server
        ``active_checkpoint_id``; ``released`` says how many results it let go of first, all in
        the part under ``restore_from``), LedgerLost when the ledger is gone for good."""
        return self._sync(
            self._checkpoint(
                checkpoint_id, checkpoint_dir, keep, deadline_s, sweep_foreign, keep_if_handed
            )
        )

    async def acheckpoint(
        self,
        checkpoint_id: str,
        checkpoint_dir: str | os.PathLike[str],
        *,
        keep: Iterable[str] | None = None,
        deadline_s: float = 120.0,
        sweep_foreign: bool = False,
        keep_if_handed: Iterable[str] | None = None,
    ) -> CheckpointReport:
        return await self._async(
            self._checkpoint(
                checkpoint_id, checkpoint_dir, keep, deadline_s, sweep_foreign, keep_if_handed
            )
        )

    def restore(self, checkpoint_dir: str | os.PathLike[str]) -> RestoreReport | None:
        """Load a checkpoint's part of this run into a started orchestrator before any row, as
        ``restore_from=`` does (the NeMo RL drop-in restores after its spin-up): handed results
        answer a row sent again ``repeated``, undelivered ones are its result, sealed ids never
        run again; exported Gym v2 episodes continue from their boundary (the report, also
        :attr:`restore_report`). ConfigError: the part is missing, torn, another run's."""
        self._check_open()
        return self._sync(self._restore(checkpoint_dir))

    async def arestore(self, checkpoint_dir: str | os.PathLike[str]) -> RestoreReport | None:
        self._check_open()
        return await self._async(self._restore(checkpoint_dir))

    async def _restore(self, checkpoint_dir: str | os.PathLike[str]) -> RestoreReport | None:
        part, v2_part = await self._checkpoints.load(checkpoint_dir)
        if part is None:
            return None
        _, _, ledger = await self._ready()
        ids = await self._checkpoints.clear_dead_now(checkpoint_dir, part.checkpoint_id)
        await self._checkpoints.clear_dead(ledger, ids)
        if v2_part is None:
            return None
        return await self._checkpoints.restore_v2(ledger, v2_part)

    @property
    def keep_results(self) -> bool:
        """Whether parts keep the replies of handed results (the constructor's argument)."""
        return self._checkpoints.keep_results

    @property
    def restore_report(self) -> RestoreReport | None:
        """What the last Gym v2 restore did (None: none ran)."""
        return self._checkpoints.restore_report

    @property
    def cleared(self) -> list[EndpointAbort]:
        """What a dead trainer of this run left open on Gym, resumed at start or restore."""
        return self._checkpoints.cleared

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
        return None if self._ledger is None else self._ledger.handle

    # ------------------------------------------------------------ on the private loop

    async def _start(self, probed: bool = False) -> None:
        if self._closed:
            raise PoolClosed(f"orchestrator {self.id} is closed")
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._pool is not None:
                return
            if self.check_endpoints and not probed:
                await probe_endpoints(self.endpoints)
            dead_ids: list[str] | None = None
            if self._dead is not None:  # what a dead trainer of this run left open, first
                dead_ids = await self._checkpoints.clear_dead_now(*self._dead)
                self._dead = None
            ensure_ray()
            ledger = await LedgerClient.start(
                self.id,
                self.endpoints,
                self.policy,
                self.ledger_config,
                owner_pattern=actor_pattern(self.id),
                run_id=self.run_id,
                timeout_s=START_TIMEOUT_S,
                log_level=self.pool_config.log_level,
            )
            try:
                if dead_ids is not None:  # the ledger takes them as its own
                    await self._checkpoints.clear_dead(ledger, dead_ids)
                pool = WarmPool(
                    self.id,
                    self.endpoints,
                    self.policy,
                    self.pool_config,
                    self.ledger_config,
                    ledger.handle,
                )
                await pool.start()
            except BaseException:
                ray.kill(ledger.handle, no_restart=True)
                raise
            self._ledger = ledger
            self._runner = RowRunner(
                pool, self._chunks, self._ledger, self._unacked, self.endpoints
            )
            self._pool = pool
            if self._v2_part is not None:  # restore_from's v2 episodes, before any row
                part, self._v2_part = self._v2_part, None
                await self._checkpoints.restore_v2(ledger, part)

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._warn_held_at_close()
        if self._pool is not None:
            await self._pool.close()
        if self._ledger is not None:
            await self._ledger.close()

    async def _warn_held_at_close(self) -> None:
        """With ``ack="at_checkpoint"``, warn when results sealed since the last checkpoint are
        still held un-ACKed on Gym, per server (:mod:`rl_gym_actors.held_results`)."""
        if self.policy.ack == "at_checkpoint":
            warn_if_held(self.run_id, self._unacked.by_endpoint, self._unacked.count)

    async def _ready(self) -> tuple[WarmPool, RowRunner, LedgerClient]:
        if self._pool is None:
            await self._start()
        if self._closed or self._pool is None or self._runner is None or self._ledger is None:
            raise PoolClosed(f"orchestrator {self.id} is closed")
        return self._pool, self._runner, self._ledger

    async def _run_batch(self, rows: Iterable[Mapping[str, Any]], fail_fast: bool) -> list[Outcome]:
        return await (await self._open_stream(row_list(rows), fail_fast)).collect()

    async def _open_stream(self, rows: list[Mapping[str, Any]] | None, fail_fast: bool) -> Stream:
        """A stream of ``rows`` (all checked before any is dispatched), or an open one (None)
        that :meth:`Stream.add` feeds."""
        _, runner, _ = await self._ready()
        if rows is None:
            return Stream(runner, self._planner, self._memory, fail_fast, None, self._received)
        items = self._planner.plan(rows)
        bar = bar_for(len(items), self.progress)
        stream = Stream(runner, self._planner, self._memory, fail_fast, bar, self._received)
        for item in items:
            stream.dispatch(item)
        stream.end_of_rows_now()
        return stream

    async def _checkpoint(
        self,
        checkpoint_id: str,
        checkpoint_dir: str | os.PathLike[str],
        keep: Iterable[str] | None,
        deadline_s: float,
        sweep_foreign: bool,
        keep_if_handed: Iterable[str] | None = None,
    ) -> CheckpointReport:
        deadline_s = checkpoint_args(checkpoint_id, checkpoint_dir, deadline_s)
        return await self._checkpoints.checkpoint(
            self._ledger_ready,
            checkpoint_id,
            checkpoint_dir,
            keep,
            deadline_s,
            sweep_foreign,
            keep_if_handed,
        )

    async def _ledger_ready(self) -> LedgerClient:
        return (await self._ready())[2]

    async def _abort(self, checkpoint_id: str, deadline_s: float) -> AbortReport:
        _, _, ledger = await self._ready()
        deadline_s = deadline_s_arg(deadline_s)
        try:
            return await ledger.abort_checkpoint(
                checkpoint_id, deadline_s, timeout_s=deadline_s + CALL_SLACK_S
            )
        except LedgerLost:
            # freeing Gym needs no book: resume from here, with clients of our own
            deadline_ts = time.time() + deadline_s
            return await abort_with_own_clients(self.endpoints, checkpoint_id, deadline_ts)

    async def _snapshot(self) -> OrchestratorSnapshot:
        pool, _, client = await self._ready()
        return await OrchestratorSnapshot.take(
            self.id, pool, client, self._memory, self._received, START_TIMEOUT_S
        )
