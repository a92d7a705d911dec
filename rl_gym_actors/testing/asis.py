"""The "as-is" policy: RL that ACKs what it receives and never retires a try, as a baseline.

It ACKs every finished run whose reply it receives, and nothing else. When it gives up on a try
(its ``rollout_s`` deadline fired, the connection broke, the receipt fetch failed, or the batch
was abandoned because another row failed) it starts the next try WITHOUT retiring the old one.
Gym keeps running the old try and keeps its reply, completed and un-ACKed, forever: every later
prepare answers 409 until someone ACKs it. Its checkpoint just prepares with a short deadline and,
on a 409, resumes and reports the checkpoint as blocked.

This is a plain asyncio loop over
:class:`~rl_gym_actors.gym.agent_checkpoint.client.GymClient` (no Ray), shared by the benchmarks
(``benchmarks/fault_storm.py``) and the tests. It is a foil: never train with it.

``transient_faults=True`` (the default) sends the fault-injection fields of the simulated agent
(``drop_reply``, ``receipt_delay_s``) with a rollout's first try only, so that a lost reply is a
one-off and the next try succeeds: the kindest reading of the baseline (it gets its reward, one
try late, and leaves the first try behind). ``sleep_s`` always travels with every try.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.errors import (
    AdmissionClosed,
    AgentFailed,
    ConfigError,
    GymError,
    GymUnavailable,
    ProtocolViolation,
    RlGymError,
)
from rl_gym_actors.failures import FailureKind, failure_kind
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.agent_checkpoint.faults import without_faults
from rl_gym_actors.outcome import Outcome, reward_of
from rl_gym_actors.protocol import ROLLOUT_ID_FIELD, CompletionReceipt, StatusReport

logger = logging.getLogger(__name__)

ENDPOINT_FIELD = "_ng_endpoint"
_ADMISSION_POLL_S = 0.05


@dataclass
class AsIsStats:
    """Counters of what the as-is loop did (its own view, not Gym's)."""

    tries_started: int = 0
    replies_received: int = 0
    acked: int = 0
    tries_given_up: Counter = field(default_factory=Counter)  # step -> count
    rollouts_abandoned: int = 0
    checkpoints_tried: int = 0
    checkpoints_committed: int = 0
    checkpoints_blocked: int = 0


@dataclass(frozen=True)
class AsIsCheckpoint:
    """One checkpoint attempt: committed, or blocked with each endpoint's prepare answer."""

    checkpoint_id: str
    committed: bool
    reports: dict[str, StatusReport | None]  # endpoint URL -> the prepare answer, if any
    seconds: float

    @property
    def blocked(self) -> bool:
        return not self.committed


class _TryLost(Exception):
    """Internal: this try's reply did not reach us at ``step`` (``run`` or ``receipt``)."""

    def __init__(self, step: str, cause: BaseException) -> None:
        self.step = step
        super().__init__(f"{step}: {type(cause).__name__}")


def choose_endpoint(
    row: Mapping[str, Any], rollout_id: str, endpoints: Sequence[GymEndpoint]
) -> GymEndpoint:
    """The endpoint a rollout's tries go to: the one the row names in ``_ng_endpoint`` (name or
    URL), else one picked by a stable hash of the rollout id."""
    named = row.get(ENDPOINT_FIELD)
    if named is not None:
        for ep in endpoints:
            if named in (ep.name, ep.url, ep.url + "/"):
                return ep
        raise ConfigError(f"row names unknown endpoint {named!r}")
    digest = hashlib.sha256(rollout_id.encode("utf-8")).digest()
    return endpoints[int.from_bytes(digest[:8], "big") % len(endpoints)]


class AsIsRunner:
    """Plays rollouts the as-is way over one or more Gym servers, ``concurrency`` at once.

    Use it inside one event loop (its clients bind to the loop that first uses them) and
    ``await close()`` at the end.
    """

    def __init__(
        self,
        endpoints: Sequence[GymEndpoint],
        policy: TryPolicy | None = None,
        *,
        concurrency: int = 64,
        transient_faults: bool = True,
    ) -> None:
        if not endpoints:
            raise ConfigError("at least one endpoint is needed")
        if concurrency < 1:
            raise ConfigError("concurrency must be >= 1")
        self.endpoints = list(endpoints)
        self.policy = policy or TryPolicy()
        self.concurrency = concurrency
        self.transient_faults = transient_faults
        self.stats = AsIsStats()
        # pools sized to the concurrency, so that the baseline never queues for a connection
        self._clients = {
            ep.url: GymClient(ep, limit=max(100, concurrency), control_limit=max(16, concurrency))
            for ep in endpoints
        }

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()

    async def __aenter__(self) -> AsIsRunner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def client(self, endpoint: GymEndpoint | str) -> GymClient:
        url = endpoint if isinstance(endpoint, str) else endpoint.url
        return self._clients[url.rstrip("/")]

    # ------------------------------------------------------------ rollouts

    async def run_batch(
        self, rows: Sequence[Mapping[str, Any]], *, fail_fast: bool = False
    ) -> list[Outcome]:
        """One outcome per row, in row order. With ``fail_fast`` the first failed row abandons
        the batch: every other rollout stops waiting (Gym keeps running its try)."""
        sem = asyncio.Semaphore(self.concurrency)
        ids = [str(r.get(ROLLOUT_ID_FIELD) or f"asis-{uuid.uuid4().hex[:16]}") for r in rows]
        current: dict[int, tuple[int, str]] = {}  # row -> (try in flight, endpoint)

        async def one(i: int) -> Outcome:
            def on_try(attempt: int, url: str) -> None:
                current[i] = (attempt, url)

            async with sem:
                return await self._rollout(rows[i], ids[i], on_try)

        tasks = {asyncio.ensure_future(one(i)): i for i in range(len(rows))}
        outcomes: list[Outcome | None] = [None] * len(rows)
        pending = set(tasks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                failed = False
                for t in done:
                    out = t.result()
                    outcomes[tasks[t]] = out
                    failed |= out.status == "failed"
                if fail_fast and failed and pending:
                    break
        finally:
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.wait(pending)
        for i, kept in enumerate(outcomes):
            if kept is None:
                self.stats.rollouts_abandoned += 1
                att, ep = current.get(i, (None, ""))
                if att is not None:
                    self.stats.tries_given_up["abandoned"] += 1
                outcomes[i] = Outcome(
                    rollout_id=ids[i],
                    status="abandoned",
                    attempt_index=att,
                    tries=0 if att is None else att + 1,
                    endpoint=ep,
                    reason="batch abandoned: another row failed",
                    failure=FailureKind.ABANDONED,
                )
        return [o for o in outcomes if o is not None]  # every None was just filled

    async def _rollout(self, row: Mapping[str, Any], rollout_id: str, on_try) -> Outcome:
        endpoint = choose_endpoint(row, rollout_id, self.endpoints)
        client = self.client(endpoint)
        reason, kind = "no try made", FailureKind.INTERNAL

        def failed(attempt: int, why: str, failure: FailureKind) -> Outcome:
            """No result, after try ``attempt``."""
            return Outcome(
                rollout_id=rollout_id,
                status="failed",
                attempt_index=attempt,
                tries=attempt + 1,
                endpoint=endpoint.url,
                reason=why,
                failure=failure,
            )

        for attempt in range(self.policy.max_tries):
            on_try(attempt, endpoint.url)
            sent = without_faults(row) if self.transient_faults and attempt > 0 else dict(row)
            sent.pop(ENDPOINT_FIELD, None)
            sent.pop(ROLLOUT_ID_FIELD, None)
            try:
                reply, receipt = await self._one_try(client, sent, rollout_id, attempt)
            except _TryLost as lost:
                # the as-is flaw: no retire; Gym keeps this try (and, once done, its reply)
                reason = str(lost)
                kind = failure_kind(lost.__cause__ or lost)
                self.stats.tries_given_up[lost.step] += 1
                continue
            except AgentFailed as exc:
                return failed(attempt, f"agent_failed: {exc.detail}", FailureKind.AGENT_FAILED)
            except RlGymError as exc:
                return failed(attempt, f"{type(exc).__name__}: {exc}", failure_kind(exc))
            acked = await self._ack(client, receipt)
            return Outcome(
                rollout_id=rollout_id,
                status="sealed",
                attempt_index=attempt,
                reply=reply,
                reward=reward_of(reply),
                receipt=receipt,
                acked=acked,
                tries=attempt + 1,
                endpoint=endpoint.url,
            )
        return failed(self.policy.max_tries - 1, f"out of tries: {reason}", kind)

    async def _one_try(
        self, client: GymClient, row: dict[str, Any], rollout_id: str, attempt: int
    ) -> tuple[Any, CompletionReceipt]:
        p = self.policy
        self.stats.tries_started += 1
        deadline = time.time() + p.rollout_s
        admission_deadline = time.time() + p.admission_wait_s
        while True:
            try:
                result = await client.run(
                    row, rollout_id=rollout_id, attempt_index=attempt, deadline_ts=deadline
                )
                break
            except AdmissionClosed:
                if time.time() > admission_deadline:
                    raise
                await asyncio.sleep(_ADMISSION_POLL_S)
                deadline = time.time() + p.rollout_s
            except GymUnavailable as exc:
                raise _TryLost("run", exc) from exc
        self.stats.replies_received += 1
        try:
            answer = await client.receipt(
                rollout_id, attempt, deadline_ts=time.time() + p.receipt_s
            )
        except (GymUnavailable, GymError) as exc:
            raise _TryLost("receipt", exc) from exc
        receipt = answer.completion_receipt
        if receipt is None:
            raise ProtocolViolation(f"{rollout_id}/{attempt}: replied, yet no completion receipt")
        if receipt.result_digest != result.digest:
            raise ProtocolViolation(f"{rollout_id}/{attempt}: reply digest differs from receipt")
        return result.reply, receipt

    async def _ack(self, client: GymClient, receipt: CompletionReceipt) -> bool:
        try:
            await client.acknowledge(receipt, deadline_ts=time.time() + self.policy.control_s)
        except RlGymError as exc:
            logger.debug("as-is ACK of %s failed: %s", receipt.key, exc)
            return False
        self.stats.acked += 1
        return True

    # ------------------------------------------------------------ checkpoints

    async def _prepare(
        self, endpoint: GymEndpoint, checkpoint_id: str, deadline_ts: float
    ) -> StatusReport | None:
        """The prepare answer, or None when none came by the deadline (not ready either)."""
        try:
            return await self.client(endpoint).prepare(checkpoint_id, deadline_ts=deadline_ts)
        except GymUnavailable as exc:
            logger.debug("as-is prepare on %s: %s", endpoint.url, exc)
            return None

    async def checkpoint(
        self, checkpoint_id: str, checkpoint_dir: str | Path, *, prepare_s: float = 1.0
    ) -> AsIsCheckpoint:
        """Prepare every endpoint with a short deadline; all ready: commit and resume; any 409:
        resume everywhere (abort) and report the checkpoint blocked."""
        t0 = time.perf_counter()
        self.stats.checkpoints_tried += 1
        deadline = time.time() + prepare_s
        reports = await asyncio.gather(
            *(self._prepare(ep, checkpoint_id, deadline) for ep in self.endpoints)
        )
        by_url = {ep.url: r for ep, r in zip(self.endpoints, reports, strict=True)}
        ready = all(r is not None and r.ready_to_commit for r in reports)
        control = time.time() + self.policy.control_s
        if ready:
            for i, ep in enumerate(self.endpoints):
                await self.client(ep).commit(
                    checkpoint_id, str(Path(checkpoint_dir) / f"ep{i}"), deadline_ts=control
                )
        await asyncio.gather(
            *(self.client(ep).resume(checkpoint_id, deadline_ts=control) for ep in self.endpoints)
        )
        if ready:
            self.stats.checkpoints_committed += 1
        else:
            self.stats.checkpoints_blocked += 1
        return AsIsCheckpoint(checkpoint_id, ready, by_url, time.perf_counter() - t0)
