"""The checkpoint gate on the Gym servers that speak v2 (``/ng-control/v1/checkpoint/*``).

The book says what this run still has on each server; :mod:`rl_gym_actors.gym.v2.coordinate`
performs the protocol. One :class:`V2Gate` runs one checkpoint:

0. while another checkpoint id holds a server (another run's checkpoint or restore, read from
   its status: ``phase`` and ``checkpoint_id``), the gate waits for it to resume, polling, so two
   runs that checkpoint at once take turns; still held at the deadline, the checkpoint fails
   before it sends anything, ``CheckpointFailed`` naming the holder per server
   (``blockers[name]["active_checkpoint_id"]``). A v2 participant answers a prepare under another
   id with a bare ``checkpoint_conflict`` (NeMo Gym's says the id only in its text), and the
   resume that follows a failed prepare fences the id, so the gate does not prepare and retry;
1. every owner flushes its reports (as on the agent-checkpoint gate);
2. attempts the book has as running that no live owner holds (its owner died, or let go) are
   retired, each on its own server, before prepare (a v2 participant takes a retire only while
   no checkpoint is open); so are the episodes the server's status reported running that are this
   run's (``own``: its run id's prefix, or every one without a run id) and that the book, once
   every live owner has flushed its reports, does not know at all (a dead driver's, whose book
   died with it; read before the flush, so a run a live owner starts meanwhile is never taken);
   and so are the kept replies ((ext), our server's ``GET .../kept``) of this run's attempts the
   book does not know after the flush (a run that finished for a dead driver or an owner that
   died before reporting it), and those it has as running whose owner, asked to adopt, is gone
   or does not hold them (an owner on a lost node may still count as live): no trainer would
   ever forget them (``orphans_acked`` counts them, as the agent-checkpoint gate's orphan ACKs);
3. one v2 checkpoint over every v2 server: prepare stage by stage, the lease renewed while it is
   open, commit scoped to the attempts live owners hold (less every restart a server reports),
   resume whatever happened (a resume that fails goes on in the background, by the ledger's
   :class:`~rl_gym_actors.actors.heal.Healer`); :class:`~rl_gym_actors.errors.CheckpointFailed`
   names the blockers;
4. after the commit, the rollouts finished for good (no owner holds them, nothing of theirs
   runs), and the orphans' rollouts the book holds nothing of, are forgotten on every server in
   batches of :data:`FORGET_BATCH`: their retired marks
   (and our server's kept replies, (ext)) go away, and the book counts their sealed attempts as
   released so it prunes them. A forget that fails leaves them for the next checkpoint, and so
   does a sealed rollout whose result the checkpoint's part does not hold (``recorded``: it
   finished while the gate ran; the orchestrator records it, and the next part holds it).

Episodes a restore installed (:class:`RestoredPending`, see :mod:`.v2_restore`) whose
replacement ``/run`` has not started are in every commit's scope, named by that replacement
attempt (else Gym deletes them), and their rollouts are never forgotten, until the book knows
that attempt (or a later one). Each commit answer says which attempts of this run were in flight
on its server (``in_flight``, capture keys): what a restore starts over when not exported;
and which of those finished before the cut (``ended``: sealed in the book once the owners
flushed after the commit), whose results the orchestrator adds to the part.

v2 has no ACK: a sealed reply is released by ``forget`` after a committed checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from rl_gym_actors.actors.gate_endpoint import OwnerAnswer, Owners, endpoint_dir
from rl_gym_actors.actors.heal import Healer
from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.core.attempt_book import AttemptBook, AttemptView
from rl_gym_actors.core.attempt_reports import AttemptState
from rl_gym_actors.core.checkpoint_report import EndpointCheckpoint
from rl_gym_actors.errors import CheckpointFailed, RlGymError
from rl_gym_actors.gym.v2 import coordinate
from rl_gym_actors.gym.v2.coordinate import Participant
from rl_gym_actors.gym.v2.wire import EpisodeId, Phase
from rl_gym_actors.protocol import CommitAnswer

logger = logging.getLogger(__name__)

FORGET_BATCH = 500  # rollout ids per forget call
HELD_POLL_S = (0.05, 1.0)  # status reads while another checkpoint holds a server: first, most


class RestoredPending:
    """Episodes a restore installed on each server (by URL: rollout id -> replacement attempt)
    whose replacement has not started yet, as far as the book knows."""

    def __init__(self) -> None:
        self._by_url: dict[str, dict[str, int]] = {}

    def add(self, endpoint: str, rollout_id: str, attempt: int) -> None:
        self._by_url.setdefault(endpoint, {})[rollout_id] = attempt

    def on(self, book: AttemptBook, endpoint: str) -> list[tuple[str, int]]:
        """Those still pending on ``endpoint``; the ones whose replacement (or a later attempt)
        the book knows are dropped."""
        pending = self._by_url.get(endpoint, {})
        for rid, att in list(pending.items()):
            current = book.current_attempt(rid)
            if current is not None and current >= att:
                del pending[rid]
        return sorted(pending.items())

    def rollouts(self) -> set[str]:
        return {rid for pending in self._by_url.values() for rid in pending}

    def __len__(self) -> int:
        return sum(len(p) for p in self._by_url.values())


class V2Gate:
    """One checkpoint over the v2 servers ``endpoints`` (``labels``: their sub-folders,
    ``participants``: their v2 clients, same order)."""

    def __init__(
        self,
        book: AttemptBook,
        endpoints: Sequence[GymEndpoint],
        labels: Sequence[str],
        participants: Sequence[Participant],
        owners: Owners,
        *,
        control_s: float,
        forget_batch: int = FORGET_BATCH,
        own: Callable[[str], bool] | None = None,
        restored: RestoredPending | None = None,
        clock: Callable[[], float] = time.time,
        healer: Healer | None = None,
        recorded: frozenset[str] | None = None,
    ) -> None:
        if not len(endpoints) == len(labels) == len(participants):
            raise ValueError("endpoints, labels and participants must line up")
        self._book = book
        self._endpoints = list(endpoints)
        self._labels = list(labels)
        self._parts = list(participants)
        self._owners = owners
        self._control_s = control_s
        self._batch = max(1, forget_batch)
        self._own = own  # which rollout ids are this run's (None: every one)
        self._restored = restored or RestoredPending()
        self._clock = clock
        self._healer = healer  # resumes a partition swallowed go on in the background
        self._recorded = recorded  # rollouts whose results the part holds (None: no part)

    async def run(
        self, checkpoint_id: str, checkpoint_dir: str, deadline_ts: float
    ) -> list[EndpointCheckpoint]:
        await self._wait_unheld(checkpoint_id, deadline_ts)
        seen = [await self._running_on_server(part, deadline_ts) for part in self._parts]
        kept = [await self._kept_unsettled(part, deadline_ts) for part in self._parts]
        if any(seen) or any(kept):  # every run a live owner started before is reported now
            await self._owners.flush(
                min(deadline_ts, self._clock() + self._control_s), checkpoint_id
            )
        live = self._owners.live()
        retired = [
            await self._retire_unheld(ep, part, checkpoint_id, live, deadline_ts, running)
            for ep, part, running in zip(self._endpoints, self._parts, seen, strict=True)
        ]
        orphans = [
            await self._retire_orphans(ep, part, checkpoint_id, deadline_ts, found)
            for ep, part, found in zip(self._endpoints, self._parts, kept, strict=True)
        ]
        live = self._owners.live()
        in_flight = {
            ep.url: [
                EpisodeId(rollout_id=rid, attempt=att)
                for rid, att in self._book.running_on(ep.url)
                if self._book.claimant(rid, att, ep.url, live) is not None
            ]
            + [
                EpisodeId(rollout_id=rid, attempt=att)
                for rid, att in self._restored.on(self._book, ep.url)
            ]
            for ep in self._endpoints
        }
        continued = [e for ep in self._endpoints for e in in_flight[ep.url]]
        dirs = {
            p.name: endpoint_dir(checkpoint_dir, label)
            for p, label in zip(self._parts, self._labels, strict=True)
        }
        outcome = await coordinate.checkpoint(
            self._parts,
            checkpoint_id,
            dirs,
            continued,
            timeout_s=self._control_s,
            deadline_ts=deadline_ts,
            clock=self._clock,
            unresumed=self._resume_later(checkpoint_id),
        )
        ended = await self._ended_in_gate(in_flight, deadline_ts)
        pending = self._restored.rollouts()  # never forgotten before their replacement starts
        unknown = sorted(
            {rid for found in orphans for rid, _ in found if self._unknown(rid)} - pending
        )
        forgotten = await self._forget_finished(checkpoint_id, unknown)
        out: list[EndpointCheckpoint] = []
        for ep, part, n_retired, found in zip(
            self._endpoints, self._parts, retired, orphans, strict=True
        ):
            answer = outcome.commits[part.name]
            out.append(
                EndpointCheckpoint(
                    endpoint=ep.url,
                    label=ep.label,
                    checkpoint_dir=dirs[part.name],
                    retired=n_retired,
                    orphans_acked=len(found),
                    prepare_rounds=1,
                    commit=CommitAnswer(
                        records=answer.manifest.record_count,
                        manifest_digest=answer.manifest.records_sha256,
                        episode_ids=list(answer.episode_ids),
                        restarts=list(outcome.restarts),
                        in_flight=sorted(e.capture_key for e in in_flight[ep.url]),
                        ended=ended.get(ep.url, []),
                    ),
                    protocol="v2",
                    renewals=outcome.renewals,
                    forgotten=forgotten,
                )
            )
        return out

    async def _holders(self, checkpoint_id: str, deadline_ts: float) -> dict[str, str]:
        """Participant name -> the other checkpoint id that holds it now (from its status; a
        server that cannot be asked is left to the checkpoint, which fails on it by name)."""
        out: dict[str, str] = {}
        for part in self._parts:
            try:
                status = await part.client.status(
                    deadline_ts=min(deadline_ts, self._clock() + self._control_s)
                )
            except RlGymError:
                continue
            held_by = status.checkpoint_id
            if status.phase is not Phase.IDLE and held_by and held_by != checkpoint_id:
                out[part.name] = held_by
        return out

    async def _wait_unheld(self, checkpoint_id: str, deadline_ts: float) -> None:
        """Step 0 of the module docstring: wait while another checkpoint id holds a server."""
        every, most = HELD_POLL_S
        holders = await self._holders(checkpoint_id, deadline_ts)
        if not holders:
            return
        logger.info("checkpoint %s waits: %s hold the servers", checkpoint_id, holders)
        room = min(1.0, 0.1 * self._control_s)  # left at least to prepare and commit
        while holders:
            left = deadline_ts - self._clock()
            if left <= room:
                raise CheckpointFailed(
                    f"checkpoint {checkpoint_id}: another checkpoint holds "
                    + ", ".join(f"{name} ({held})" for name, held in holders.items())
                    + " until the deadline",
                    checkpoint_id=checkpoint_id,
                    blockers={n: {"active_checkpoint_id": h} for n, h in holders.items()},
                )
            await asyncio.sleep(min(every, max(left - room, 0.01)))
            every = min(every * 2, most)
            holders = await self._holders(checkpoint_id, deadline_ts)

    async def _retire_unheld(
        self,
        endpoint: GymEndpoint,
        part: Participant,
        checkpoint_id: str,
        live: frozenset[str],
        deadline_ts: float,
        on_server: list[tuple[str, int]],
    ) -> int:
        """Retire what the book has as running on ``endpoint`` that no live owner holds, and
        what the server reported running (``on_server``, read before the owners' flush) that
        is this run's and that the book does not know at all (its owner's book died)."""
        stale = [
            (rid, att)
            for rid, att in self._book.running_on(endpoint.url)
            if self._book.claimant(rid, att, endpoint.url, live) is None
        ]
        stale += [
            key
            for key in on_server
            if key not in stale
            and (self._own is None or self._own(key[0]))
            and self._book.attempt(*key) is None
        ]
        if not stale:
            return 0
        episodes = [EpisodeId(rollout_id=rid, attempt=att) for rid, att in stale]
        try:
            await coordinate.retire(
                [part],
                checkpoint_id,
                episodes,
                deadline_ts=min(deadline_ts, self._clock() + self._control_s),
            )
        except RlGymError as exc:  # prepare will name them as blockers if they still run
            logger.warning("%s: retiring %d unheld attempts failed: %s", part.name, len(stale), exc)
            return 0
        for rid, att in stale:
            self._book.record_retired(endpoint.url, rid, att)
        return len(stale)

    def _resume_later(self, checkpoint_id: str) -> Callable[[list[Participant]], None] | None:
        healer = self._healer
        if healer is None:
            return None

        def later(parts: list[Participant]) -> None:
            for part in parts:
                healer.resume_later(part.client, checkpoint_id)

        return later

    async def _ended_in_gate(
        self, in_flight: dict[str, list[EpisodeId]], deadline_ts: float
    ) -> dict[str, list[str]]:
        """Per endpoint URL, the attempts in flight when the gate started that the book has as
        sealed once every owner flushed after the commit (capture keys): runs that finished
        before the cut, whose results the orchestrator waits for and adds to the part. Nothing
        without a part (``recorded`` None) or with nothing in flight."""
        if self._recorded is None or not any(in_flight.values()):
            return {}
        left = max(1.0, deadline_ts - self._clock())
        await self._owners.flush(self._clock() + min(self._control_s, left))
        out: dict[str, list[str]] = {}
        for url, episodes in in_flight.items():
            keys = []
            for e in episodes:
                view = self._book.attempt(e.rollout_id, e.attempt)
                if view is not None and view.state is AttemptState.SEALED:
                    keys.append(e.capture_key)
            out[url] = sorted(keys)
        return out

    def _unrecorded(self, rollouts: list[str]) -> set[str]:
        """The sealed ones of ``rollouts`` whose results the part does not hold (they finished
        while the gate ran): not forgotten yet; the next checkpoint's part holds them."""
        if self._recorded is None:
            return set()
        out = set()
        for rid in rollouts:
            if rid in self._recorded:
                continue
            current = self._book.current_attempt(rid)
            view = None if current is None else self._book.attempt(rid, current)
            if view is not None and view.state is AttemptState.SEALED:
                out.add(rid)
        return out

    def _unknown(self, rollout_id: str) -> bool:
        """The book holds no attempt of the rollout (so forgetting it drops nothing it needs)."""
        return self._book.current_attempt(rollout_id) is None

    async def _kept_unsettled(self, part: Participant, deadline_ts: float) -> list[tuple[str, int]]:
        """(ext) The kept replies ``part`` lists that are this run's and that the book does not
        know or has as running (read before the owners' flush, so the flush reports every run a
        live owner started before it); none from a server that keeps no reply (a real Gym)."""
        try:
            answer = await part.client.kept(
                deadline_ts=min(deadline_ts, self._clock() + self._control_s)
            )
        except RlGymError as exc:
            logger.warning("%s: listing kept replies failed: %s", part.name, exc)
            return []
        if answer is None:
            return []
        found = [EpisodeId.from_capture_key(key) for key in answer.kept]
        return [
            (e.rollout_id, e.attempt)
            for e in found
            if (self._own is None or self._own(e.rollout_id))
            and _unsettled(self._book.attempt(e.rollout_id, e.attempt))
        ]

    async def _retire_orphans(
        self,
        endpoint: GymEndpoint,
        part: Participant,
        checkpoint_id: str,
        deadline_ts: float,
        candidates: list[tuple[str, int]],
    ) -> list[tuple[str, int]]:
        """Retire the kept replies of runs no owner reported, even after the flush (a dead
        driver's, or a dead owner's that never reported it), and of runs the book has as running
        whose owner, asked to adopt, is gone or does not hold it (an owner on a lost node that
        still counts as live): as the agent-checkpoint gate ACKs orphans, so that nothing stays
        kept for ever. The retired ones."""
        live = self._owners.live()
        orphans: list[tuple[str, int]] = []
        ask: list[tuple[tuple[str, int], str]] = []
        for key in candidates:
            view = self._book.attempt(*key)
            if view is None:
                orphans.append(key)
            elif view.state is AttemptState.RUNNING:
                owner = self._book.claimant(key[0], key[1], endpoint.url, live)
                if owner is None:
                    orphans.append(key)
                else:
                    ask.append((key, owner))
        by = min(deadline_ts, self._clock() + self._control_s)
        answers = await asyncio.gather(
            *(self._owners.adopt(owner, rid, att, by) for (rid, att), owner in ask)
        )
        orphans += [
            key
            for (key, _), answer in zip(ask, answers, strict=True)
            if answer in (OwnerAnswer.REFUSED, OwnerAnswer.GONE)
        ]
        if not orphans:
            return []
        episodes = [EpisodeId(rollout_id=rid, attempt=att) for rid, att in orphans]
        try:
            await coordinate.retire(
                [part],
                checkpoint_id,
                episodes,
                deadline_ts=min(deadline_ts, self._clock() + self._control_s),
            )
        except RlGymError as exc:  # left for the next checkpoint
            logger.warning(
                "%s: retiring %d orphan replies failed: %s", part.name, len(orphans), exc
            )
            return []
        logger.info("%s: retired %d kept replies no owner claims", part.name, len(orphans))
        for rid, att in orphans:
            if self._book.attempt(rid, att) is not None:  # the book follows: tombstoned
                self._book.record_retired(endpoint.url, rid, att)
        return orphans

    async def _running_on_server(
        self, part: Participant, deadline_ts: float
    ) -> list[tuple[str, int]]:
        """The episodes ``part``'s status reports running (its readiness blockers, at most
        100 of them); none when the status cannot be read (prepare names them then)."""
        try:
            status = await part.client.status(
                deadline_ts=min(deadline_ts, self._clock() + self._control_s)
            )
        except RlGymError as exc:
            logger.warning("%s: status for unheld episodes failed: %s", part.name, exc)
            return []
        found = [EpisodeId.from_capture_key(key) for key in status.report.blockers]
        return [(e.rollout_id, e.attempt) for e in found]

    async def _forget_finished(self, checkpoint_id: str, orphans: list[str]) -> int:
        """Forget the rollouts finished for good (and ``orphans``: rollouts the book never saw
        whose kept replies were retired), in batches; how many were forgotten."""
        finished = self._book.finished_on({ep.url for ep in self._endpoints}, self._owners.live())
        pending = self._restored.rollouts()  # a replacement may still come: not finished
        finished = sorted(set(finished).union(orphans) - pending - self._unrecorded(finished))
        done = 0
        for i in range(0, len(finished), self._batch):
            chunk = finished[i : i + self._batch]
            try:
                await coordinate.forget(
                    self._parts,
                    checkpoint_id,
                    chunk,
                    deadline_ts=self._clock() + self._control_s,
                )
            except RlGymError as exc:
                logger.info("forget of %d rollouts deferred: %s", len(finished) - done, exc)
                break
            self._book.record_forgotten(chunk)
            done += len(chunk)
        return done


def _unsettled(view: AttemptView | None) -> bool:
    """An attempt the book does not know, or has as running (its owner may be gone)."""
    return view is None or view.state is AttemptState.RUNNING
