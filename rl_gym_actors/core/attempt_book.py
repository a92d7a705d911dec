"""The ledger's book of attempts, :class:`AttemptBook`: every attempt any rollout actor
reported, folded in any order.

Pure and synchronous: no Ray, no sockets, no clock reads. Reports arrive in batches from many
rollout actors and may arrive out of order, so the fold is commutative and idempotent:

- an attempt's state only moves up :attr:`AttemptState.rank` (``running < sealed < tombstoned <
  acked``: ``acked`` is the stronger fact);
- a rollout's current try is the highest attempt index reported for it, and its owner is the owner
  of that attempt (should two reports of one attempt ever name different owners, the greater name
  wins, so that the order does not matter);
- ``released`` on a report for attempt ``a`` means the owner let go of the rollout at try ``a``; a
  later try (a higher index) takes the rollout again.

Per endpoint counters are kept incrementally so that :meth:`AttemptBook.snapshot` costs
O(endpoints + owners), not O(attempts). Each attempt sits in exactly one state bucket, so
``dispatched = running + completed_unacked + acked + tombstoned`` holds after every fold.

At each committed checkpoint :meth:`AttemptBook.prune` drops the rollouts that are settled (every
attempt ACKed or tombstoned, no owner holding the rollout): the counters keep them, the book's
memory stays one checkpoint interval deep.
"""

from __future__ import annotations

from collections.abc import Iterable, Set
from dataclasses import dataclass
from enum import Enum

from pydantic import BaseModel, ConfigDict

from rl_gym_actors.core.attempt_reports import AttemptReport, AttemptState
from rl_gym_actors.core.attempt_reports import merge_reports as merge_reports  # (it was here)

_BUCKET = {
    AttemptState.RUNNING: "running",
    AttemptState.SEALED: "completed_unacked",
    AttemptState.ACKED: "acked",
    AttemptState.TOMBSTONED: "tombstoned",
}


class GateAck(Enum):
    """What an ACK by the checkpoint gate was, as the book saw it."""

    SEALED = "sealed"  # a rollout had sealed it: its result is the trainer's
    ORPHAN = "orphan"  # nobody had sealed it: an orphan
    KNOWN = "known"  # the book knew it ACKed already (its owner got there first): not counted


class EndpointSnapshot(BaseModel):
    """Counters for one Gym endpoint (by URL). ``completed_unacked`` = sealed, not yet ACKed."""

    model_config = ConfigDict(frozen=True)

    endpoint: str
    dispatched: int = 0
    running: int = 0
    completed_unacked: int = 0
    acked: int = 0
    tombstoned: int = 0
    adopted: int = 0
    invariant_ok: bool = True


class LedgerSnapshot(BaseModel):
    """A frozen view of the book. ``owners`` maps an owner to the rollouts it holds (not released);
    ``orphans_acked``, ``sealed_acked``, ``adoptions`` and ``retired`` count what the checkpoint
    gate did itself (``sealed_acked``: results a rollout had sealed, released with the checkpoint);
    ``pruned`` counts attempts dropped from the book at committed checkpoints."""

    model_config = ConfigDict(frozen=True)

    endpoints: dict[str, EndpointSnapshot]
    rollouts: int
    attempts: int
    reports: int
    owners: dict[str, int]
    live_owners: list[str] = []
    orphans_acked: int = 0
    sealed_acked: int = 0
    adoptions: int = 0
    retired: int = 0
    pruned: int = 0
    checkpoints_committed: int = 0
    checkpoints_failed: int = 0
    last_checkpoint_id: str | None = None
    invariant_ok: bool = True


class _Counts:
    __slots__ = ("acked", "adopted", "completed_unacked", "dispatched", "running", "tombstoned")

    def __init__(self) -> None:
        self.dispatched = self.running = self.completed_unacked = 0
        self.acked = self.tombstoned = self.adopted = 0

    def add(self, state: AttemptState, adopted: bool, sign: int) -> None:
        self.dispatched += sign
        bucket = _BUCKET[state]
        setattr(self, bucket, getattr(self, bucket) + sign)
        if adopted:
            self.adopted += sign

    def snapshot(self, endpoint: str) -> EndpointSnapshot:
        ok = self.dispatched == (
            self.running + self.completed_unacked + self.acked + self.tombstoned
        )
        return EndpointSnapshot(
            endpoint=endpoint,
            dispatched=self.dispatched,
            running=self.running,
            completed_unacked=self.completed_unacked,
            acked=self.acked,
            tombstoned=self.tombstoned,
            adopted=self.adopted,
            invariant_ok=ok,
        )


class _Attempt:
    __slots__ = ("adopted", "endpoint", "owner", "state")

    def __init__(self, endpoint: str, state: AttemptState, owner: str, adopted: bool) -> None:
        self.endpoint = endpoint
        self.state = state
        self.owner = owner
        self.adopted = adopted


class _Rollout:
    __slots__ = ("current", "released_at")

    def __init__(self, current: int) -> None:
        self.current = current
        self.released_at = -1


@dataclass(frozen=True, slots=True)
class AttemptView:
    """What the book knows of one attempt."""

    rollout_id: str
    attempt_index: int
    endpoint: str
    state: AttemptState
    owner: str
    adopted: bool
    current: bool  # the highest attempt index reported for its rollout
    released: bool  # its owner let go of the rollout at this try or later


class AttemptBook:
    """The cluster-wide book of attempts. One writer: the ledger actor."""

    def __init__(self, endpoints: Iterable[str] = ()) -> None:
        self._attempts: dict[tuple[str, int], _Attempt] = {}
        self._rollouts: dict[str, _Rollout] = {}
        # the given endpoints always show in a snapshot, others once they hold an attempt
        self._counts: dict[str, _Counts] = {ep: _Counts() for ep in endpoints}
        self._listed = frozenset(self._counts)
        self._held: dict[str, int] = {}
        # the digest each sealed, not yet ACKed attempt was sealed on: the gate checks a receipt
        # from a status listing against it before it ACKs (a receipt deferred to the checkpoint)
        self._digests: dict[tuple[str, int], str] = {}
        self.reports = 0
        self.orphans_acked = 0
        self.sealed_acked = 0
        self.adoptions = 0
        self.retired = 0
        self.pruned = 0
        self.checkpoints_committed = 0
        self.checkpoints_failed = 0
        self.last_checkpoint_id: str | None = None

    # ------------------------------------------------------------------ folding

    def apply(self, report: AttemptReport) -> None:
        """Fold one report. Order and repetition do not change the result."""
        self.reports += 1
        key = (report.rollout_id, report.attempt_index)
        if report.state is AttemptState.SEALED and report.result_digest is not None:
            self._digests[key] = report.result_digest
        elif report.state is AttemptState.ACKED:
            self._digests.pop(key, None)
        self._fold(
            report.rollout_id,
            report.attempt_index,
            report.endpoint,
            report.state,
            report.owner,
            report.adopted,
            report.released,
        )

    def apply_all(self, reports: Iterable[AttemptReport]) -> None:
        for report in reports:
            self.apply(report)

    def record(
        self, endpoint: str, rollout_id: str, attempt_index: int, state: AttemptState
    ) -> None:
        """Fold what the ledger itself learned from Gym (no owner, never releases)."""
        self._fold(rollout_id, attempt_index, endpoint, state, "", False, False)

    def record_adopted(self, endpoint: str, rollout_id: str, attempt_index: int) -> None:
        """Its owner, asked by the gate, says the attempt is sealed and ACKed."""
        self.adoptions += 1
        self.record(endpoint, rollout_id, attempt_index, AttemptState.ACKED)

    def record_retired(self, endpoint: str, rollout_id: str, attempt_index: int) -> None:
        """The gate retired the attempt on Gym (cancelled, or tombstoned unknown)."""
        self.retired += 1
        self.record(endpoint, rollout_id, attempt_index, AttemptState.TOMBSTONED)

    def record_orphan_acked(self, endpoint: str, rollout_id: str, attempt_index: int) -> bool:
        """The gate ACKed the attempt (an orphan, or a result a rollout sealed and left to the
        checkpoint). False (and not counted) when the book already knew it as ACKed: its owner
        got there first and Gym answered idempotently."""
        return self.record_gate_acked(endpoint, rollout_id, attempt_index) is not GateAck.KNOWN

    def record_gate_acked(self, endpoint: str, rollout_id: str, attempt_index: int) -> GateAck:
        """The gate ACKed the attempt: what it was (see :class:`GateAck`); counted unless
        ``KNOWN``."""
        attempt = self._attempts.get((rollout_id, attempt_index))
        self._digests.pop((rollout_id, attempt_index), None)
        if attempt is None and rollout_id not in self._rollouts:
            return self._unknown_acked(endpoint, 1)
        if attempt is not None and attempt.state is AttemptState.ACKED:
            kind = GateAck.KNOWN
        elif attempt is not None and attempt.state is AttemptState.SEALED:
            kind = GateAck.SEALED
            self.sealed_acked += 1
        else:
            kind = GateAck.ORPHAN
            self.orphans_acked += 1
        self.record(endpoint, rollout_id, attempt_index, AttemptState.ACKED)
        return kind

    def record_gate_acks(self, endpoint: str, keys: list[tuple[str, int]]) -> tuple[int, int]:
        """:meth:`record_gate_acked` of each key, those of rollouts the book never heard of
        counted at once (by the thousand); how many were orphans, and how many sealed."""
        known = [k for k in keys if k in self._attempts or k[0] in self._rollouts]
        if len(known) < len(keys):
            self._unknown_acked(endpoint, len(keys) - len(known))
        kinds = [self.record_gate_acked(endpoint, rid, att) for rid, att in known]
        return len(keys) - len(known) + kinds.count(GateAck.ORPHAN), kinds.count(GateAck.SEALED)

    def _unknown_acked(self, endpoint: str, n: int) -> GateAck:
        # rollouts the book never heard of (orphans by the thousand): counted, not kept; a
        # committed checkpoint would prune them at once (see prune)
        self.orphans_acked += n
        counts = self._counts_for(endpoint)
        counts.dispatched += n
        counts.acked += n
        return GateAck.ORPHAN

    def record_checkpoint(self, checkpoint_id: str, committed: bool) -> None:
        """Count a checkpoint; a committed one also prunes the book."""
        if committed:
            self.checkpoints_committed += 1
            self.last_checkpoint_id = checkpoint_id
            self.prune()
        else:
            self.checkpoints_failed += 1

    def prune(self) -> int:
        """Drop every settled rollout: all its attempts ACKed or tombstoned and no owner holding
        it. The counters, the owners' holdings and the invariant are unchanged; returns how many
        attempts were dropped."""
        final = (AttemptState.ACKED, AttemptState.TOMBSTONED)
        unsettled = {rid for (rid, _), a in self._attempts.items() if a.state not in final}
        drop = [
            rid
            for rid, rollout in self._rollouts.items()
            if rid not in unsettled and not self._holder(rid, rollout)
        ]
        if not drop:
            return 0
        gone = set(drop)
        before = len(self._attempts)
        # rebuilt, not deleted from: a dict never shrinks its table on deletes
        self._attempts = {k: a for k, a in self._attempts.items() if k[0] not in gone}
        self._rollouts = {r: v for r, v in self._rollouts.items() if r not in gone}
        self._digests = {k: d for k, d in self._digests.items() if k[0] not in gone}
        dropped = before - len(self._attempts)
        self.pruned += dropped
        return dropped

    def _fold(
        self,
        rid: str,
        att: int,
        endpoint: str,
        state: AttemptState,
        owner: str,
        adopted: bool,
        released: bool,
    ) -> None:
        rollout = self._rollouts.get(rid)
        before = self._holder(rid, rollout)
        attempt = self._attempts.get((rid, att))
        if attempt is None:
            self._attempts[(rid, att)] = _Attempt(endpoint, state, owner, adopted)
            self._counts_for(endpoint).add(state, adopted, +1)
        else:
            new_endpoint = min(attempt.endpoint, endpoint)  # a tie-break that ignores order
            new_state = state if state.rank > attempt.state.rank else attempt.state
            new_adopted = attempt.adopted or adopted
            if (new_endpoint, new_state, new_adopted) != (
                attempt.endpoint,
                attempt.state,
                attempt.adopted,
            ):
                self._counts_for(attempt.endpoint).add(attempt.state, attempt.adopted, -1)
                self._counts_for(new_endpoint).add(new_state, new_adopted, +1)
                attempt.endpoint, attempt.state, attempt.adopted = (
                    new_endpoint,
                    new_state,
                    new_adopted,
                )
            if owner > attempt.owner:
                attempt.owner = owner
        if rollout is None:
            rollout = self._rollouts[rid] = _Rollout(att)
        elif att > rollout.current:
            rollout.current = att
        if released and att > rollout.released_at:
            rollout.released_at = att
        after = self._holder(rid, rollout)
        if after != before:
            if before:
                self._held[before] -= 1
                if not self._held[before]:
                    del self._held[before]
            if after:
                self._held[after] = self._held.get(after, 0) + 1

    def _counts_for(self, endpoint: str) -> _Counts:
        counts = self._counts.get(endpoint)
        if counts is None:
            counts = self._counts[endpoint] = _Counts()
        return counts

    def _holder(self, rid: str, rollout: _Rollout | None) -> str:
        if rollout is None or rollout.released_at >= rollout.current:
            return ""
        return self._attempts[(rid, rollout.current)].owner

    # ------------------------------------------------------------------ reading

    def attempt(self, rollout_id: str, attempt_index: int) -> AttemptView | None:
        attempt = self._attempts.get((rollout_id, attempt_index))
        if attempt is None:
            return None
        rollout = self._rollouts[rollout_id]
        return AttemptView(
            rollout_id,
            attempt_index,
            attempt.endpoint,
            attempt.state,
            attempt.owner,
            attempt.adopted,
            rollout.current == attempt_index,
            rollout.released_at >= attempt_index,
        )

    def knows(self, rollout_id: str, attempt_index: int) -> bool:
        return (rollout_id, attempt_index) in self._attempts

    def sealed_digest(self, rollout_id: str, attempt_index: int) -> str | None:
        """The digest a rollout sealed this attempt on, while it is sealed and not ACKed."""
        attempt = self._attempts.get((rollout_id, attempt_index))
        if attempt is None or attempt.state is not AttemptState.SEALED:
            return None
        return self._digests.get((rollout_id, attempt_index))

    def current_attempt(self, rollout_id: str) -> int | None:
        rollout = self._rollouts.get(rollout_id)
        return None if rollout is None else rollout.current

    def claimant(
        self, rollout_id: str, attempt_index: int, endpoint: str, live_owners: Set[str]
    ) -> str | None:
        """The live owner that holds this attempt as its rollout's current try on ``endpoint``,
        or None when nobody does (the attempt is forgotten)."""
        rollout = self._rollouts.get(rollout_id)
        if rollout is None or rollout.current != attempt_index:
            return None
        if rollout.released_at >= attempt_index:
            return None
        attempt = self._attempts[(rollout_id, attempt_index)]
        if attempt.endpoint != endpoint or attempt.owner not in live_owners:
            return None
        return attempt.owner

    def sealed_unacked(self, endpoint: str) -> list[tuple[str, int]]:
        """Attempts sealed by a rollout on ``endpoint`` and not yet ACKed: Gym must hold them."""
        return [
            key
            for key, a in self._attempts.items()
            if a.state is AttemptState.SEALED and a.endpoint == endpoint
        ]

    def settle_unlisted(
        self, endpoint: str, listed: Set[tuple[str, int]], live_owners: Set[str]
    ) -> int:
        """The book follows Gym: every attempt the book has as running on ``endpoint`` that no
        live owner holds and that Gym does not list among its active attempts (``listed``: it
        tombstoned it, or no longer knows it) is tombstoned here too. How many."""
        counts = self._counts.get(endpoint)
        if counts is None or counts.running == 0:  # (the scan below reads the whole book)
            return 0
        stale = [
            key
            for key, a in self._attempts.items()
            if a.state is AttemptState.RUNNING
            and a.endpoint == endpoint
            and key not in listed
            and self.claimant(key[0], key[1], endpoint, live_owners) is None
        ]
        for rid, att in stale:
            self.record(endpoint, rid, att, AttemptState.TOMBSTONED)
        return len(stale)

    def running_on(self, endpoint: str) -> list[tuple[str, int]]:
        """(rollout id, attempt index) of every attempt the book has as running on ``endpoint``,
        sorted."""
        return sorted(
            key
            for key, a in self._attempts.items()
            if a.state is AttemptState.RUNNING and a.endpoint == endpoint
        )

    def finished_on(self, endpoints: Set[str], live_owners: Set[str]) -> list[str]:
        """Rollouts finished for good that touched ``endpoints``: no live owner holds them and
        no attempt of theirs is running (each sealed, ACKed or tombstoned). Sorted ids; what a
        protocol without ACKs (Gym v2) forgets after a committed checkpoint."""
        running = {rid for (rid, _), a in self._attempts.items() if a.state is AttemptState.RUNNING}
        touched = {rid for (rid, _), a in self._attempts.items() if a.endpoint in endpoints}
        return sorted(
            rid
            for rid in touched
            if rid not in running and self._holder(rid, self._rollouts.get(rid)) not in live_owners
        )

    def record_forgotten(self, rollout_ids: Iterable[str]) -> int:
        """Gym forgot these finished rollouts: their sealed attempts count as ACKed (released on
        Gym), so the next prune drops them. How many attempts changed."""
        ids = set(rollout_ids)
        sealed = [
            (a.endpoint, rid, att)
            for (rid, att), a in self._attempts.items()
            if rid in ids and a.state is AttemptState.SEALED
        ]
        for endpoint, rid, att in sealed:
            self.record(endpoint, rid, att, AttemptState.ACKED)
        return len(sealed)

    def owners(self) -> dict[str, int]:
        """Owner name -> how many rollouts it holds (current try reported, not released)."""
        return dict(self._held)

    def snapshot(self, live_owners: Iterable[str] = ()) -> LedgerSnapshot:
        endpoints = {
            ep: c.snapshot(ep)
            for ep, c in sorted(self._counts.items())
            if c.dispatched or ep in self._listed
        }
        return LedgerSnapshot(
            endpoints=endpoints,
            rollouts=len(self._rollouts),
            attempts=len(self._attempts),
            reports=self.reports,
            owners=dict(sorted(self._held.items())),
            live_owners=sorted(live_owners),
            orphans_acked=self.orphans_acked,
            sealed_acked=self.sealed_acked,
            adoptions=self.adoptions,
            retired=self.retired,
            pruned=self.pruned,
            checkpoints_committed=self.checkpoints_committed,
            checkpoints_failed=self.checkpoints_failed,
            last_checkpoint_id=self.last_checkpoint_id,
            invariant_ok=all(e.invariant_ok for e in endpoints.values()),
        )
