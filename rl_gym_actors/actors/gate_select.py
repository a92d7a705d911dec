"""Which checkpoint gate each Gym server gets: chosen per server by asking it.

:class:`GateSelect` discovers each server's protocol once (``GET .../checkpoint/status`` answers:
v2; 404/405, or a server with both route sets: the agent-checkpoint routes; see
:mod:`rl_gym_actors.gym.v2.discover`) and keeps it. A checkpoint then runs the agent-checkpoint
gate (:class:`CheckpointGate`, unchanged) over the agent-checkpoint servers and the v2 gate
(:class:`~rl_gym_actors.actors.v2_gate.V2Gate`) over the v2 ones, both at once, and merges their
reports in the order the endpoints were given. A server that cannot be asked is not guessed at:
the checkpoint fails naming it, and it is asked again at the next one. The trainer sees one
:class:`CheckpointReport` whatever its servers speak (each entry says its ``protocol``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from rl_gym_actors.actors.checkpoint_abort import AbortReport, EndpointAbort, abort_everywhere
from rl_gym_actors.actors.checkpoint_gate import CheckpointGate
from rl_gym_actors.actors.gate_endpoint import Owners, dir_labels
from rl_gym_actors.actors.heal import Healer
from rl_gym_actors.actors.v2_gate import RestoredPending, V2Gate
from rl_gym_actors.actors.v2_restore import restore as restore_v2
from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.core.attempt_book import AttemptBook
from rl_gym_actors.core.checkpoint_report import (
    CheckpointReport,
    EndpointCheckpoint,
    RestoreReport,
    V2EndpointScope,
)
from rl_gym_actors.errors import CheckpointFailed, RlGymError
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.coordinate import Participant
from rl_gym_actors.gym.v2.discover import CheckpointProtocol, discover_protocol
from rl_gym_actors.gym.v2.wire import Phase

logger = logging.getLogger(__name__)

DISCOVER_S = 10.0  # at most this long (and half the checkpoint's budget) to ask the servers


def own_rollouts(
    run_id: str | None, sweep_foreign: bool, claims: frozenset[str]
) -> Callable[[str], bool] | None:
    """Which rollout ids are this run's on a shared server, as the agent-checkpoint gate reads
    it: with a run id, those with its prefix and the ids it claims; None (every one) without a
    run id or when sweeping foreign ones."""
    if run_id is None or sweep_foreign:
        return None
    prefix = f"{run_id}-"
    return lambda rid: rid.startswith(prefix) or rid in claims


class GateSelect:
    """The per-server protocol choice of one ledger (``clients`` line up with ``endpoints``)."""

    def __init__(self, endpoints: Sequence[GymEndpoint], clients: Sequence[GymClient]) -> None:
        self._endpoints = list(endpoints)
        self._clients = list(clients)
        self._labels = dir_labels(self._endpoints) if len(self._endpoints) > 1 else [""]
        self._found: dict[int, Participant | None] = {}  # index -> v2 participant, or None: agent
        self.restored = RestoredPending()  # what restores installed and no replacement claimed

    def protocols(self) -> dict[str, str]:
        """What has been found so far: endpoint URL -> ``"v2"`` or ``"agent"``."""
        return {
            self._endpoints[i].url: (
                CheckpointProtocol.AGENT if p is None else CheckpointProtocol.V2
            ).value
            for i, p in sorted(self._found.items())
        }

    async def discover(self, deadline_ts: float) -> dict[int, BaseException]:
        """Ask every server not yet known; the errors of those that could not be asked."""
        missing = [i for i in range(len(self._endpoints)) if i not in self._found]
        answers = await asyncio.gather(
            *(discover_protocol(self._clients[i], deadline_ts=deadline_ts) for i in missing),
            return_exceptions=True,
        )
        failed: dict[int, BaseException] = {}
        for i, answer in zip(missing, answers, strict=True):
            if isinstance(answer, asyncio.CancelledError):
                raise answer
            if isinstance(answer, BaseException):
                failed[i] = answer
            elif answer.protocol is CheckpointProtocol.V2 and answer.kind is not None:
                client = V2Client(self._clients[i])
                self._found[i] = Participant(self._endpoints[i].label, answer.kind, client)
            else:
                self._found[i] = None
        return failed

    async def checkpoint(
        self,
        book: AttemptBook,
        owners: Owners,
        make_agent_gate: Callable[[Sequence[GymEndpoint], Sequence[GymClient]], CheckpointGate],
        checkpoint_id: str,
        checkpoint_dir: str,
        deadline_ts: float,
        *,
        control_s: float,
        forget_batch: int = 500,
        own: Callable[[str], bool] | None = None,
        healer: Healer | None = None,
        recorded: frozenset[str] | None = None,
    ) -> CheckpointReport:
        start = time.time()
        failed = await self.discover(min(deadline_ts, start + DISCOVER_S))
        if failed:
            raise CheckpointFailed(
                f"checkpoint {checkpoint_id}: could not ask "
                + ", ".join(
                    f"{self._endpoints[i].label} ({type(e).__name__}: {e})"
                    for i, e in failed.items()
                )
                + " which checkpoint protocol it speaks",
                checkpoint_id=checkpoint_id,
                blockers={
                    self._endpoints[i].label: {"error": f"discovery failed: {e}"}
                    for i, e in failed.items()
                },
            )
        agent = [i for i in range(len(self._endpoints)) if self._found[i] is None]
        v2 = [i for i in range(len(self._endpoints)) if self._found[i] is not None]
        if not v2:  # only agent-checkpoint servers: exactly the gate as it always was
            return await make_agent_gate(self._endpoints, self._clients).run(
                checkpoint_id, checkpoint_dir, deadline_ts
            )
        flushed = await owners.flush(
            min(deadline_ts, start + 0.2 * (deadline_ts - start) + 0.5), checkpoint_id
        )
        v2_gate = V2Gate(
            book,
            [self._endpoints[i] for i in v2],
            [self._labels[i] for i in v2],
            [p for i in v2 if (p := self._found[i]) is not None],
            owners,
            control_s=control_s,
            forget_batch=forget_batch,
            own=own,
            restored=self.restored,
            healer=healer,
            recorded=recorded,
        )
        jobs: list[asyncio.Future] = [
            asyncio.ensure_future(v2_gate.run(checkpoint_id, checkpoint_dir, deadline_ts))
        ]
        if agent:
            gate = make_agent_gate(
                [self._endpoints[i] for i in agent], [self._clients[i] for i in agent]
            )
            jobs.append(asyncio.ensure_future(gate.run(checkpoint_id, checkpoint_dir, deadline_ts)))
        results = await asyncio.gather(*jobs, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for r in errors:
                if not isinstance(r, CheckpointFailed):
                    raise r
            blockers: dict[str, object] = {}
            for r in errors:
                assert isinstance(r, CheckpointFailed)
                blockers.update(r.blockers)
            raise CheckpointFailed(
                "; ".join(str(r) for r in errors),
                checkpoint_id=checkpoint_id,
                blockers=blockers,
                # what the v2 gate forgot after its own commit counts as released too
                released=sum(r.released for r in errors if isinstance(r, CheckpointFailed))
                + sum(
                    e.forgotten
                    for r in results
                    if isinstance(r, list)
                    for e in r
                    if isinstance(e, EndpointCheckpoint)
                ),
            )
        by_url: dict[str, EndpointCheckpoint] = {}
        kept = []
        v2_entries = results[0]
        assert isinstance(v2_entries, list)
        for entry in v2_entries:
            by_url[entry.endpoint] = entry
        if agent:
            agent_report = results[1]
            assert isinstance(agent_report, CheckpointReport)
            flushed = max(flushed, agent_report.owners_flushed)
            kept = agent_report.kept
            for entry in agent_report.endpoints:
                by_url[entry.endpoint] = entry
        return CheckpointReport(
            checkpoint_id=checkpoint_id,
            checkpoint_dir=checkpoint_dir,
            owners_flushed=flushed,
            elapsed_s=time.time() - start,
            endpoints=[by_url[e.url] for e in self._endpoints],
            kept=kept,
        )

    async def restore(
        self,
        book: AttemptBook,
        scopes: Sequence[V2EndpointScope],
        *,
        restore_id: str,
        source_checkpoint_id: str,
        deadline_ts: float,
        own: Callable[[str], bool] | None,
    ) -> RestoreReport:
        """Restore a checkpoint's v2 episodes on the v2 servers (see :mod:`.v2_restore`); a
        server that cannot be asked is left out (its rollouts start over)."""
        failed = await self.discover(min(deadline_ts, time.time() + DISCOVER_S))
        for i, exc in failed.items():
            logger.warning("restore %s: cannot ask %s: %s", restore_id, self._endpoints[i], exc)
        targets = [(self._endpoints[i], p) for i, p in sorted(self._found.items()) if p is not None]
        return await restore_v2(
            book,
            targets,
            scopes,
            restore_id=restore_id,
            source_checkpoint_id=source_checkpoint_id,
            deadline_ts=deadline_ts,
            own=own,
            pending=self.restored,
        )

    async def abort(self, checkpoint_id: str, deadline_ts: float) -> AbortReport:
        """Resume ``checkpoint_id`` everywhere, each server by its own protocol (a server not
        yet asked is asked first; one that cannot be asked is tried as agent-checkpoint)."""
        await self.discover(min(deadline_ts, time.time() + DISCOVER_S))

        async def one(i: int) -> EndpointAbort:
            part = self._found.get(i)
            if part is None:
                report = await abort_everywhere([self._clients[i]], checkpoint_id, deadline_ts)
                return report.endpoints[0]
            url = self._endpoints[i].url
            try:
                await part.client.resume(checkpoint_id, deadline_ts=deadline_ts)
            except RlGymError as exc:
                return EndpointAbort.failed(url, exc)
            return EndpointAbort(endpoint=url, resumed=True)

        entries = await asyncio.gather(*(one(i) for i in range(len(self._endpoints))))
        return AbortReport(checkpoint_id=checkpoint_id, endpoints=list(entries))

    async def clear_own(
        self, own: Callable[[str], bool], deadline_ts: float
    ) -> list[EndpointAbort]:
        """Resume, on every server, the checkpoint (or v2 restore) id holding it that ``own``
        says is this run's: one a dead trainer of the run left open (see
        :mod:`.checkpoint_abort`). An id that is not this run's is left to its lease. One entry
        per server that an own id held (each naming that id); a server that cannot be asked is
        skipped (its checkpoint then names the id in the way)."""
        await self.discover(min(deadline_ts, time.time() + DISCOVER_S))

        async def one(i: int) -> EndpointAbort | None:
            part = self._found.get(i)
            url = self._endpoints[i].url
            try:
                if part is None:
                    holder = await self._clients[i].active_checkpoint_id(deadline_ts=deadline_ts)
                else:
                    status = await part.client.status(deadline_ts=deadline_ts)
                    holder = None if status.phase is Phase.IDLE else status.checkpoint_id
            except RlGymError as exc:
                logger.warning("cannot ask %s which checkpoint holds it: %s", url, exc)
                return None
            if holder is None or not own(holder):
                return None
            logger.warning("%s: resuming %s, left open by a dead trainer of this run", url, holder)
            try:
                if part is None:
                    answer = await self._clients[i].resume(holder, deadline_ts=deadline_ts)
                    released = answer.released
                else:
                    await part.client.resume(holder, deadline_ts=deadline_ts)
                    released = 0
            except RlGymError as exc:
                return EndpointAbort.failed(url, exc, holder)
            return EndpointAbort(
                endpoint=url, resumed=True, released=released, checkpoint_id=holder
            )

        entries = await asyncio.gather(*(one(i) for i in range(len(self._endpoints))))
        return [e for e in entries if e is not None]
