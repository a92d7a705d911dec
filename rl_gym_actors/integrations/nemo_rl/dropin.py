"""A drop-in for NeMo RL's ``NemoGym`` environment actor, backed by the :class:`Orchestrator`.

NeMo RL creates its environment actor once, then calls ``_spinup()``, ``set_tokenizer(tok)``,
``health_check()`` now and then, ``shutdown()`` at the end, and for every batch::

    for ref in env.run_rollouts.options(num_returns="streaming").remote(rows, "timer"):
        rowidx, agent_ref, result, timing = ray.get(ref)    # (rowidx, result, timing) before

Configuration, selection from NeMo RL, the Gym servers it starts and the results it builds:
:mod:`.config`, :mod:`.selection`, :mod:`.servers`, :mod:`.results`.

:class:`GymRolloutEnv` answers the same calls (``NemoGymDropIn`` is it as a Ray actor). This
module imports nothing of NeMo RL; see :mod:`rl_gym_actors.integrations.nemo_rl.rows` for the
row identity, message logs and failure types it uses.

Rollouts
    Each row becomes one rollout of the orchestrator: its tries run on the warm pool's rollout
    actors, which retire a try before giving up on it and adopt it when it had finished. Rows
    are yielded as they end, in any order, each ``_rowidx`` at most once; the stream's timing
    metrics ride on its last yield. A failed row never stops the stream: successful rows keep
    coming, and the stream raises once at the end (:func:`~.rows.failure_for`: a
    ``ConnectionError`` or ``TimeoutError`` subclass, which RL re-dispatches, or a data failure).
    A row Gym refused with 409 ``admission_closed`` past ``admission_wait_s`` (a checkpoint held
    it) is yielded in its place as ``GymAdmissionClosed(message, row_idx)`` when the consumer
    takes it, as NeMo RL's newest ``run_rollouts`` does (``admission_refusals``).
    The rollouts of a stream RL cancels keep running here; their results are held (up to
    ``hold_s``) for RL's re-dispatch of the same rows, which gets them without a rerun. A
    re-dispatched row whose earlier rollout failed starts its next try after retiring the last
    one, so a try that finished on Gym after all is adopted, not rerun. Each result carries
    ``gym_adopted`` (True: it came from Gym's store, not a run of this call) and, when its
    receipt is known, ``gym_completion_receipt``: always with 4-tuples (receipts never
    deferred); with 3-tuples left out while deferred to the checkpoint (NeMo RL main reads none).

Checkpoints
    The calls of NeMo RL's checkpoint-participant work (``prepare_checkpoint(id, deadline_ts)``,
    ``commit_checkpoint(id, deadline_ts, dir)``, ``resume_checkpoint``, ``abort_checkpoint``,
    ``restore_checkpoint``, ``discover_checkpoint_capabilities``,
    ``acknowledge_completed_executions``) map onto the ledger's one-shot gate: see
    :mod:`.participants`. ``status()`` reports this actor, the ledger, the pool and
    every Gym server.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.failures import FailureKind, failure_kind
from rl_gym_actors.integrations.nemo_rl.checkpoint_calls import CheckpointCalls
from rl_gym_actors.integrations.nemo_rl.checkpoints import CheckpointSteps
from rl_gym_actors.integrations.nemo_rl.config import DropInConfig
from rl_gym_actors.integrations.nemo_rl.dropin_status import DropInStatus
from rl_gym_actors.integrations.nemo_rl.feed import RolloutFeed, check_json
from rl_gym_actors.integrations.nemo_rl.participants import ReceiptBook
from rl_gym_actors.integrations.nemo_rl.results import list_tensor, to_nemo_rl_result, torch_tensor
from rl_gym_actors.integrations.nemo_rl.rows import (
    ROWIDX_FIELD,
    Claim,
    ClaimAction,
    RolloutBook,
    RolloutDataError,
    StreamTimer,
    check_prefix,
    failure_for,
)
from rl_gym_actors.integrations.nemo_rl.servers import OwnServers, PolicyEndpoint
from rl_gym_actors.integrations.nemo_rl.v2_checkpoint_calls import V2CheckpointCalls
from rl_gym_actors.integrations.nemo_rl.v2_shapes import admission_closed
from rl_gym_actors.orchestrator import ENDPOINT_FIELD
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.protocol import ROLLOUT_ID_FIELD

logger = logging.getLogger(__name__)

EXPIRE_EVERY_S = 10.0


class ReceiptMissing(Exception):
    """A sealed result without the completion receipt a 4-tuple consumer requires (a bug: its
    receipts are never deferred); the row fails as ``internal_error``."""


@dataclass(slots=True)
class DropInStats:
    rows: int = 0
    yielded: int = 0
    failed_rows: int = 0
    adopted: int = 0  # results adopted on Gym (retire said completed)
    streams: int = 0
    cancelled_streams: int = 0
    refused: int = 0  # rows yielded as GymAdmissionClosed


class GymRolloutEnv(DropInStatus, CheckpointCalls, V2CheckpointCalls):
    """NeMo RL's environment actor interface over the orchestrator; see the module docstring."""

    def __init__(self, cfg: DropInConfig | Mapping[str, Any]) -> None:
        self.cfg = DropInConfig.from_any(cfg)
        self.checkpoint_instance = (
            cfg.get("checkpoint_instance") if isinstance(cfg, Mapping) else None
        )
        prefix = check_prefix(f"{self.cfg.run_id}-{uuid.uuid4().hex[:8]}")
        self._book = RolloutBook(prefix, hold_s=self.cfg.hold_s, max_entries=self.cfg.max_held)
        self._orch: Any = None
        self._feed: RolloutFeed | None = None
        self._servers: OwnServers | None = None
        self.endpoints: list[GymEndpoint] = list(self.cfg.endpoints)
        self._tokenizer: Any = None
        self._tensor = (torch_tensor() if self.cfg.tensors == "auto" else None) or list_tensor
        self._tasks: dict[str, asyncio.Task[Outcome]] = {}
        self._stream_ids = itertools.count(1)
        self._steps = CheckpointSteps(
            admission_wait_s=self.cfg.policy.admission_wait_s, commit_min_s=self.cfg.commit_min_s
        )
        self._last_expire = 0.0
        self._agent_name = self.cfg.default_agent_name()
        self.receipts = ReceiptBook(self.cfg.max_held)
        self._participant_names: dict[str, str] = {}
        self._topology: dict[str, Any] | None = None
        self.stats = DropInStats()
        self.stream_tuple: int = 3 if self.cfg.stream_tuple == "auto" else self.cfg.stream_tuple
        self.yield_refusals = self.cfg.admission_refusals == "yield"

    # ------------------------------------------------------------ lifecycle (NeMo RL's calls)

    async def _spinup(self) -> None:
        """Start the Gym servers of ``servers`` (their agents get the policy NeMo RL passed),
        then the orchestrator (its ledger actor and warm pool) over them and ``endpoints``.
        Idempotent."""
        if self._orch is None:
            from rl_gym_actors.integrations.nemo_rl.consumer import (
                detect_refusals,
                detect_stream_tuple,
            )
            from rl_gym_actors.orchestrator import Orchestrator

            if self.cfg.stream_tuple == "auto":
                self.stream_tuple = detect_stream_tuple()
            if self.cfg.admission_refusals == "auto":
                self.yield_refusals = detect_refusals()

            cfg = self.cfg
            own: list[GymEndpoint] = []
            if cfg.servers and self._servers is None:
                servers = OwnServers(list(cfg.servers), PolicyEndpoint.from_settings(cfg.nemo))
                own = await asyncio.to_thread(servers.start)
                self._servers = servers
            self.endpoints = [*cfg.endpoints, *own]
            orch = Orchestrator(
                self.endpoints,
                policy=self._try_policy(),
                pool=cfg.pool,
                ledger=cfg.ledger,
                orchestrator_id=cfg.orchestrator_id,
                run_id=cfg.run_id,  # the book's ids start with it, also a restored instance's
                progress=False,
                start=False,
            )
            await orch.astart()
            self._orch = orch
            self._feed = RolloutFeed(orch)

    def _try_policy(self) -> TryPolicy:
        """The rollouts' policy. A 4-tuple consumer (NeMo RL's checkpoint work, PR #4093) needs
        every result's ``gym_completion_receipt`` (its actor asserts one on each result and its
        ACK validates it), so receipts are never deferred to the checkpoint for it: on a Gym
        without a per-key receipt route each rollout reads its receipt from a status listing at
        seal. A 3-tuple consumer (NeMo RL main) reads no receipt: receipts may be deferred, and
        a result whose receipt was deferred carries no ``gym_completion_receipt``."""
        if self.stream_tuple == 3 or not self.cfg.policy.defer_receipts:
            return self.cfg.policy
        logger.info(
            "stream_tuple 4: receipts are not deferred (each result carries its receipt); "
            "on a Gym without a receipt route that costs a status listing per rollout"
        )
        return self.cfg.policy.model_copy(update={"defer_receipts": False})

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Install the tokenizer message logs are built with (once, at spin-up)."""
        self._tokenizer = tokenizer

    def _require_spinup(self) -> None:
        if self._orch is None:
            raise RuntimeError("the Gym drop-in was not spun up: call _spinup() first")

    def _spun_up_feed(self) -> RolloutFeed:
        if self._feed is None:
            raise RuntimeError("the Gym drop-in was not spun up (or is shut down)")
        return self._feed

    async def shutdown(self) -> None:
        """Stop every rollout and the orchestrator. Safe before spin-up and when repeated."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        feed, self._feed = self._feed, None
        if feed is not None:
            await feed.aclose()
        orch, self._orch = self._orch, None
        if orch is not None:
            await orch.aclose()
        servers, self._servers = self._servers, None
        if servers is not None:
            await asyncio.to_thread(servers.stop)

    # ------------------------------------------------------------ rollouts

    async def run_rollouts(
        self,
        rows: Sequence[Mapping[str, Any]],
        timer_prefix: str,
        deduplicate_multimodal_data: bool = False,
    ) -> AsyncIterator[tuple[Any, ...] | Exception]:
        """Yield ``(rowidx, agent_ref, result, timing_or_None)`` per successful row as rows
        end (``(rowidx, result, timing_or_None)`` with ``stream_tuple: 3``), and with
        ``admission_refusals`` a ``GymAdmissionClosed`` per row Gym refused; raise a
        :class:`~.rows.RolloutFailure` at the end if any other row failed. ``agent_ref`` is
        the row's own, else ``{"name": <agent name>}``. Rows without media ignore
        ``deduplicate_multimodal_data``."""
        self._require_spinup()
        if not rows:
            raise ValueError("a rollout batch must not be empty")
        if self._tokenizer is None:
            raise RuntimeError("set_tokenizer must be called before run_rollouts")
        started = time.monotonic()
        timer = StreamTimer(timer_prefix)
        stream = next(self._stream_ids)
        self.stats.streams += 1
        self.stats.rows += len(rows)
        self._maybe_expire()
        claims = self._book.claim(rows, stream, time.time())  # RolloutDataError: bad rows
        pending: dict[asyncio.Task[Outcome], tuple[Claim, Mapping[str, Any]]] = {}
        failures: list[tuple[int, FailureKind | None, str]] = []
        raise_as: type[RolloutDataError] | None = None
        # One converted result is held back, so that the stream's last yield carries the timing.
        # It is delivered (marked handed out) only as it is yielded: a stream cancelled while
        # holding it leaves it for RL's re-dispatch.
        held: tuple[Claim, Mapping[str, Any], dict[str, Any]] | None = None
        finished = False

        def watch(claim: Claim, row: Mapping[str, Any]) -> None:
            pending[self._task_for(claim, row)] = (claim, row)

        def reclaim(claim: Claim, row: Mapping[str, Any]) -> None:
            # another stream handed this shared rollout out first: claim the row again
            watch(self._book.reclaim(row, stream, time.time(), rowidx=claim.rowidx), row)

        def emit(
            item: tuple[Claim, Mapping[str, Any], dict[str, Any]], timing: dict[str, float] | None
        ) -> tuple[Any, ...] | None:
            claim, row, result = item
            if self._book.deliver(claim.rollout_id, time.time()):
                self._tasks.pop(claim.rollout_id, None)
                self.stats.yielded += 1
                receipt = result.get("gym_completion_receipt")
                if receipt is not None:
                    self.receipts.handed(receipt)
                if self.stream_tuple == 3:
                    return (claim.rowidx, result, timing)
                return (claim.rowidx, self._agent_ref(row), result, timing)
            reclaim(claim, row)
            return None

        try:
            for claim, row in zip(claims, rows, strict=True):
                watch(claim, row)
            while pending or held is not None:
                if not pending:
                    assert held is not None  # the loop runs while either is left
                    out = emit(held, timer.metrics(time.monotonic() - started))
                    held = None
                    if out is not None:
                        yield out
                    continue
                t0 = time.monotonic()
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                timer.add("await_results", time.monotonic() - t0)
                for task in done:
                    claim, row = pending.pop(task)
                    outcome = task.result()
                    if not outcome.has_result:
                        if self.yield_refusals and outcome.failure is FailureKind.ADMISSION_CLOSED:
                            # in its place, as NeMo RL's own run_rollouts yields it: the other
                            # rows keep streaming, and RL unwinds this one (re-dispatches it)
                            self.stats.refused += 1
                            yield admission_closed(
                                f"Gym refused /run of {claim.rollout_id} while a checkpoint "
                                f"had admission closed: {outcome.reason}",
                                claim.rowidx,
                            )
                            continue
                        failures.append(
                            (claim.rowidx, outcome.failure, outcome.reason or outcome.status)
                        )
                        continue
                    if not self._book.available(claim.rollout_id):
                        reclaim(claim, row)
                        continue
                    t1 = time.monotonic()
                    try:
                        result = to_nemo_rl_result(
                            row,
                            outcome.reply,
                            self._tokenizer,
                            settings=self.cfg.nemo,
                            tensor=self._tensor,
                            untrained=self.cfg.untrained_replies,
                        )
                        if outcome.receipt is not None:
                            result["gym_completion_receipt"] = outcome.receipt.model_dump(
                                mode="json", exclude_none=True
                            )
                        elif self.stream_tuple == 4:  # never deferred for it (_try_policy)
                            raise ReceiptMissing(
                                f"{claim.rollout_id}: sealed without a completion receipt, "
                                "which a 4-tuple consumer requires"
                            )
                        # from Gym's store, not from a run this call started: a finished try
                        # adopted (a dead trainer's, a lost reply) or a sealed result re-sent
                        result["gym_adopted"] = outcome.adopted or outcome.repeated
                    except ReceiptMissing as exc:
                        failures.append((claim.rowidx, FailureKind.INTERNAL, str(exc)))
                        continue
                    except Exception as exc:
                        if isinstance(exc, RolloutDataError) and raise_as is None:
                            raise_as = type(exc)  # NeMo RL's ValueError / RuntimeError
                        # the result stays held: converting again on re-dispatch needs no rerun
                        failures.append(
                            (
                                claim.rowidx,
                                FailureKind.INVALID_REPLY,
                                f"invalid row or reply: {type(exc).__name__}: {exc}",
                            )
                        )
                        continue
                    finally:
                        timer.add("postprocess_results", time.monotonic() - t1)
                    self.stats.adopted += outcome.adopted
                    out = emit(held, None) if held is not None else None
                    held = (claim, row, result)
                    if out is not None:
                        yield out
            finished = True
        finally:
            if not finished:
                self.stats.cancelled_streams += 1
                logger.info(
                    "stream %d stopped early: its rollouts keep running for a re-dispatch", stream
                )
            self._book.release(stream)
        logger.debug(
            "stream %d: %d rows, %d failed, %.3fs",
            stream,
            len(rows),
            len(failures),
            time.monotonic() - started,
        )
        if failures:
            self.stats.failed_rows += len(failures)
            failure = failure_for(sorted(failures), len(rows))
            if raise_as is not None and isinstance(failure, RolloutDataError):
                failure = raise_as(str(failure))
            raise failure

    def _endpoint_names(self) -> set[str]:
        return {e.name for e in self.endpoints if e.name}

    def _agent_ref(self, row: Mapping[str, Any]) -> dict[str, Any]:
        ref = row.get("agent_ref")
        return dict(ref) if isinstance(ref, Mapping) else {"name": self._agent_name}

    def _task_for(self, claim: Claim, row: Mapping[str, Any]) -> asyncio.Task[Outcome]:
        if claim.action is ClaimAction.REUSE:
            task = self._tasks.get(claim.rollout_id)
            if task is not None:
                return task
            # held by the book but its task is gone (dropped at expiry): run it again
        gym_row = {k: v for k, v in row.items() if k != ROWIDX_FIELD}
        agent = self._agent_ref(row).get("name")
        if ENDPOINT_FIELD not in gym_row and agent in self._endpoint_names():
            gym_row[ENDPOINT_FIELD] = agent  # the row's agent is served there
        gym_row[ROLLOUT_ID_FIELD] = claim.rollout_id  # the row's own attempt index stays
        # A fresh context: Ray keeps the calling task's id in a context variable, and work
        # submitted under it is cancelled with it. RL cancelling a stream must not cancel the
        # rollouts it started: they finish, and their results wait for RL's re-dispatch.
        task = asyncio.create_task(
            self._rollout(claim, gym_row),
            name=f"rlga-nemo-rl-{claim.rollout_id}",
            context=contextvars.Context(),
        )
        self._tasks[claim.rollout_id] = task
        return task

    async def _rollout(self, claim: Claim, row: dict[str, Any]) -> Outcome:
        """One rollout, to its end; never raises (a failure is a failed Outcome)."""
        rid = claim.rollout_id
        try:
            await self._steps.admitted()
            async with self._steps.running(rid):
                # the orchestrator remembers the rollout's earlier tries: a rollout that comes
                # again retires its last try first, and adopts it if it had finished
                check_json(row)  # a bad row fails alone, not the shared stream
                outcome = await self._spun_up_feed().run(row)
        except asyncio.CancelledError:
            self._book.settle(rid, ok=False, now=time.time())
            raise
        except Exception as exc:
            logger.info("rollout %s raised: %s", rid, exc)
            outcome = Outcome(
                rollout_id=rid,
                status="failed",
                reason=f"{type(exc).__name__}: {exc}",
                failure=failure_kind(exc),
            )
        self._book.settle(rid, ok=outcome.has_result, now=time.time())
        if not outcome.has_result:
            self._tasks.pop(rid, None)
        return outcome

    def _maybe_expire(self) -> None:
        now = time.monotonic()
        if now - self._last_expire < EXPIRE_EVERY_S:
            return
        self._last_expire = now
        for rid in self._book.expire(time.time()):
            self._tasks.pop(rid, None)

    # ------------------------------------------------------------ checkpoints: see CheckpointCalls
    # ------------------------------------------------------------ health and status: DropInStatus

    # ------------------------------------------------------------ NeMo RL's unused hooks

    def step(self, message_log_batch: Any, metadata: Any) -> Any:
        raise RuntimeError("the Gym drop-in runs whole rollouts; step() is not used")

    def global_post_process_and_metrics(self, batch: Any) -> Any:
        raise RuntimeError(
            "the Gym drop-in runs whole rollouts; global_post_process_and_metrics() is not used"
        )


# Fail fast rather than restart: a restarted actor has lost its spin-up and its held results.
NemoGymDropIn = ray.remote(max_restarts=0, max_task_retries=0, num_cpus=0)(GymRolloutEnv)
