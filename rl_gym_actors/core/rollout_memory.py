"""What is known about each rollout, kept in one place: :class:`RolloutMemory`.

Pure and synchronous: no Ray, no sockets, no clock. Per rollout id it holds one record
(:mod:`rl_gym_actors.core.rollout_record`), whose state moves only through that module's table.
The orchestrator plans a row (:meth:`RolloutMemory.plan`, which changes nothing), takes it
(:meth:`RolloutMemory.take`: answered from a result, or dispatched) and ends its dispatch
(:meth:`RolloutMemory.end`); a rollout actor keeps the smaller view (``RolloutMemory(view=True)``)
and asks whether a finished try is its released result (:meth:`RolloutMemory.holds_result`) and
whether an abandon came first (:meth:`RolloutMemory.take_abandon`).

A dispatch whose rollout actor died leaves the rollout LOST: every try of it lies within
``[first, first + max_tries)`` and which one is current is unknown. The next dispatch's plan
says so (:attr:`Dispatch.lost_from`) and picks the try to retire once the ledger named the
current one (:meth:`Dispatch.retire_given`); until then the lost dispatch's first try stands in.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from rl_gym_actors.core.rollout_record import (
    WITH_RESULT,
    RolloutEvent,
    RolloutRecord,
    RolloutState,
    RolloutView,
)
from rl_gym_actors.core.sealed_ids import SealedIds
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.outcome import Outcome

_AS_READY = dict(status="sealed", reason=None, failure=None, tries=0)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """How to take a row of a rollout: its first fresh try, the earlier try to retire first (and
    adopt if it finished), or a result that answers the row without a dispatch (``ready``).
    ``lost_from`` (a LOST rollout) is the first try of the dispatch whose actor died:
    ``previous_attempt`` is then a guess that the ledger may correct."""

    first_attempt: int
    previous_attempt: int | None
    ready: Outcome | None = None
    lost_from: int | None = None

    def retire_given(self, ledger_current: int | None) -> int | None:
        """The try to retire once the ledger named the highest try any owner reported: that
        one when it belongs to the lost dispatch (or a later one); a try before it (an earlier,
        settled dispatch) or none tells nothing new, and the guess stands."""
        if (
            self.lost_from is not None
            and ledger_current is not None
            and ledger_current >= self.lost_from
        ):
            return ledger_current
        return self.previous_attempt


def forgotten(rollout_id: str) -> Outcome:
    """The answer to a rollout id that sealed and was forgotten at a commit: no result, no run."""
    return Outcome(
        rollout_id=rollout_id,
        status="failed",
        reason=f"rollout id {rollout_id} sealed before and was forgotten at a checkpoint",
        failure=FailureKind.FORGOTTEN,
    )


class RolloutMemory:
    """One record per rollout id, at most ``capacity`` of them (the least recently touched that
    are not running go first). ``view``: keep the rollout actor's :class:`RolloutView` only;
    ``max_tries`` bounds the tries of a lost dispatch."""

    def __init__(self, capacity: int = 1_000_000, *, view: bool = False, max_tries: int = 1):
        self.capacity = capacity
        self.max_tries = max_tries
        self._record: type[RolloutView] = RolloutView if view else RolloutRecord
        self._records: OrderedDict[str, RolloutView] = OrderedDict()
        self._running = 0
        # ids that sealed and were forgotten at a commit: never run again (orchestrator only)
        self.sealed: SealedIds | None = None

    def __len__(self) -> int:
        return len(self._records)

    @property
    def in_flight(self) -> int:
        """How many rollouts have a dispatch in flight."""
        return self._running

    def record(self, rollout_id: str) -> RolloutView | None:
        return self._records.get(rollout_id)

    def state(self, rollout_id: str) -> RolloutState:
        rec = self._records.get(rollout_id)
        return RolloutState.NEW if rec is None else rec.state

    def running(self, rollout_id: str) -> bool:
        return self.state(rollout_id) is RolloutState.RUNNING

    # ------------------------------------------------------------ the orchestrator's rows

    def plan(self, rollout_id: str, named_attempt: int = 0) -> Dispatch:
        """How to take a row of this rollout that names ``named_attempt`` as its first try
        (changes nothing). A rollout never tried before that is named at try k > 0 retires try
        k-1 first: it may have finished on Gym before a restart."""
        rec = self._full(rollout_id)
        first = max(named_attempt, rec.next_fresh if rec else 0)
        if rec is None and self.sealed is not None and rollout_id in self.sealed:
            return Dispatch(first, None, forgotten(rollout_id))
        if rec is None or rec.current is None:
            return Dispatch(first, named_attempt - 1 if named_attempt > 0 else None)
        if rec.state is RolloutState.KEPT:
            assert rec.kept is not None
            ready = rec.kept.model_copy(update=dict(_AS_READY, adopted=True))
            return Dispatch(first, None, ready)
        if rec.state is RolloutState.SEALED:
            # sealed before: never played again; the same result, not a new one
            assert rec.result is not None
            return Dispatch(
                first, None, rec.result.model_copy(update=dict(_AS_READY, repeated=True))
            )
        lost = rec.dispatched_from if rec.state is RolloutState.LOST else None
        return Dispatch(first, rec.current, lost_from=lost)

    def take(self, rollout_id: str, plan: Dispatch) -> None:
        """A planned row goes ahead: answered by its ready result (a kept result is handed out
        and from now on repeated), or dispatched (running until :meth:`end`)."""
        if plan.ready is None:
            self.begin(rollout_id)
            return
        rec = self._full(rollout_id)
        if rec is None:  # sealed and forgotten: answered FORGOTTEN, nothing to record
            assert plan.ready.failure is FailureKind.FORGOTTEN
            return
        kept = rec.kept
        rec.move(RolloutEvent.HAND_OUT, rollout_id)
        if kept is not None:
            rec.kept = None
            rec.result = kept.model_copy(
                update=dict(status="sealed", adopted=True, reason=None, failure=None)
            )

    def end(
        self, rollout_id: str, plan: Dispatch, outcome: Outcome | None = None, *, lost: bool = False
    ) -> None:
        """The dispatch taken with ``plan`` is over: its actor died or was given up on
        (``lost``), it came back with ``outcome``, or it ended with neither (not dispatched, or
        the actor refused it): then what was known before it holds again."""
        rec = self._running_record(rollout_id)
        first = plan.first_attempt
        if lost:
            self._lose(rec, rollout_id, first)
        elif outcome is None or outcome.attempt_index is None:
            if plan.lost_from is not None:
                self._lose(rec, rollout_id, plan.lost_from)
            else:
                self._ended(rec, rollout_id, first, None, None)
        elif not outcome.has_result:
            self._ended(rec, rollout_id, first, outcome.attempt_index, RolloutEvent.NO_RESULT)
        else:
            if outcome.status == "sealed":
                event = RolloutEvent.RESULT_OUT
            else:  # abandoned with an adopted result: kept for the rollout's next row
                event = RolloutEvent.RESULT_KEPT
            self._ended(rec, rollout_id, first, outcome.attempt_index, event, outcome.acked)
            if isinstance(rec, RolloutRecord):
                rec.kept = outcome if event is RolloutEvent.RESULT_KEPT else None
                rec.result = outcome if event is RolloutEvent.RESULT_OUT else None

    def keep(self, outcome: Outcome) -> None:
        """An outcome with a result the trainer never took: the rollout's next row gets it."""
        rec = self._full(outcome.rollout_id)
        if outcome.has_result and rec is not None and rec.state in WITH_RESULT:
            rec.move(RolloutEvent.UNTAKEN, outcome.rollout_id)
            rec.kept, rec.result = outcome, None

    def running_ids(self) -> set[str]:
        """The rollouts with a dispatch in flight."""
        return {rid for rid, rec in self._records.items() if rec.state is RolloutState.RUNNING}

    def result_of(self, rollout_id: str) -> Outcome | None:
        """The rollout's result this memory holds: handed out (sealed) or not yet (kept)."""
        rec = self._records.get(rollout_id)
        if not isinstance(rec, RolloutRecord):
            return None
        if rec.state is RolloutState.SEALED:
            return rec.result
        return rec.kept if rec.state is RolloutState.KEPT else None

    def handed(self) -> set[str]:
        """The rollouts whose sealed result was handed out and not yet forgotten."""
        return {rid for rid, rec in self._records.items() if rec.state is RolloutState.SEALED}

    def forget_settled(self, consumed: set[str] | None = None) -> int:
        """Forget every rollout whose sealed result was handed out (a committed checkpoint holds
        it now) and that waits for no abandon; with ``consumed``, only those among it (the
        trainer keeps the others: they stay, and go into every later part). Rollouts that failed
        stay (their current try and next fresh index matter to their next row). Returns how
        many went."""
        keep = OrderedDict(
            (rid, rec)
            for rid, rec in self._records.items()
            if rec.state is not RolloutState.SEALED
            or rec.abandons
            or (consumed is not None and rid not in consumed)
        )
        gone = len(self._records) - len(keep)
        if self.sealed is not None:  # what outlives the record: 8 bytes per id
            self.sealed.add(rid for rid in self._records if rid not in keep)
            self.sealed.seal_generation()
        self._records = keep  # rebuilt: a dict never shrinks its table on deletes
        return gone

    def results(self) -> tuple[list[Outcome], list[Outcome]]:
        """What a checkpoint part holds: the sealed results handed out and not yet forgotten
        (since the last commit, and those the trainer keeps), and the results nobody took yet
        (kept for their rollouts' next rows)."""
        handed: list[Outcome] = []
        undelivered: list[Outcome] = []
        for rec in self._records.values():
            if isinstance(rec, RolloutRecord):
                if rec.state is RolloutState.SEALED and rec.result is not None:
                    handed.append(rec.result)
                elif rec.state is RolloutState.KEPT and rec.kept is not None:
                    undelivered.append(rec.kept)
        return handed, undelivered

    def restore(self, outcome: Outcome, *, delivered: bool) -> None:
        """A result from a checkpoint part: handed out before (sent again, it is ``repeated``)
        or not yet delivered (the rollout's next row gets it), through the table's own moves."""
        rid = outcome.rollout_id
        if self.state(rid) is not RolloutState.NEW or outcome.attempt_index is None:
            return
        plan = Dispatch(outcome.attempt_index, None)
        self.begin(rid)
        self.end(rid, plan, outcome.model_copy(update={"status": "sealed", "acked": False}))
        if not delivered:
            self.keep(outcome)

    def restart_at(self, rollout_id: str, attempt: int) -> bool:
        """A restore left this rollout's next row to run as try ``attempt`` (a Gym v2 episode
        continued as its replacement, or started over after the tries before it were retired):
        its next row dispatches that try first and retires nothing. Only for a rollout this
        memory does not know (a new trainer's); whether it was recorded."""
        if self.state(rollout_id) is not RolloutState.NEW or attempt < 0:
            return False
        rec = self._touch(rollout_id)
        if isinstance(rec, RolloutRecord):
            rec.next_fresh = max(rec.next_fresh, attempt)
        return True

    def adopt_handed(self, outcome: Outcome) -> bool:
        """A try this rollout handed to the ledger unsettled finished on Gym after all, and the
        checkpoint gate adopted its result: kept for the rollout's next row (no agent run). Only
        for a rollout that waits without a result (UNSETTLED, LOST) at that try, or one this
        memory does not know (restored); whether it was kept."""
        rid, att = outcome.rollout_id, outcome.attempt_index
        state = self.state(rid)
        if att is None or not outcome.has_result:
            return False
        if state is RolloutState.NEW:
            self.restore(outcome, delivered=False)
            return self.state(rid) is RolloutState.KEPT
        rec = self._full(rid)
        if rec is None or state not in (RolloutState.UNSETTLED, RolloutState.LOST):
            return False
        if rec.current is not None and rec.current > att:
            return False  # a later try was made since: that one counts
        self.begin(rid)
        kept = outcome.model_copy(update={"status": "abandoned", "acked": False})
        self.end(rid, Dispatch(att, None), kept)
        return True

    # ------------------------------------------------------------ a rollout actor's questions

    def begin(self, rollout_id: str) -> None:
        """A dispatch of the rollout starts."""
        self._touch(rollout_id).move(RolloutEvent.DISPATCH, rollout_id)
        self._running += 1

    def end_run(
        self, rollout_id: str, first_attempt: int, attempt: int | None, *, sealed: bool, acked: bool
    ) -> None:
        """A rollout actor's dispatch that began at ``first_attempt`` ended at try ``attempt``
        (None: it made no try), sealed (its result went back with its outcome) or not."""
        rec = self._running_record(rollout_id)
        event = (
            None
            if attempt is None
            else (RolloutEvent.RESULT_OUT if sealed else RolloutEvent.NO_RESULT)
        )
        self._ended(rec, rollout_id, first_attempt, attempt, event, acked)

    def holds_result(self, rollout_id: str, attempt: int) -> bool:
        """Whether ``attempt`` is the rollout's sealed try, released on Gym."""
        rec = self._records.get(rollout_id)
        return rec is not None and rec.state in WITH_RESULT and rec.current == attempt and rec.acked

    def request_abandon(self, rollout_id: str, first_attempt: int) -> None:
        """An abandon for the dispatch that begins at ``first_attempt``, which is not running:
        remembered for when it starts, unless that dispatch (or a later one) already ended."""
        rec = self._records.get(rollout_id)
        if (
            rec is not None
            and rec.dispatched_from is not None
            and rec.dispatched_from >= first_attempt
        ):
            return
        rec = self._touch(rollout_id)
        rec.abandons = rec.abandons | {first_attempt}

    def take_abandon(self, rollout_id: str, first_attempt: int) -> bool:
        """Whether the dispatch starting now at ``first_attempt`` was abandoned before it
        started; abandons of earlier dispatches are dropped."""
        rec = self._records.get(rollout_id)
        if rec is None or not rec.abandons:
            return False
        hit = first_attempt in rec.abandons
        rec.abandons = frozenset(f for f in rec.abandons if f > first_attempt)
        return hit

    # ------------------------------------------------------------ transitions

    def _ended(
        self,
        rec: RolloutView,
        rollout_id: str,
        first_attempt: int,
        attempt: int | None,
        event: RolloutEvent | None,
        acked: bool = False,
    ) -> None:
        """RUNNING -> the state ``event`` leads to; None: no try made, and what was known
        holds (a known current try stays UNSETTLED, none known is NEW again)."""
        if event is None:
            event = RolloutEvent.NO_TRY if rec.current is None else RolloutEvent.NO_RESULT
        else:
            rec.current = attempt
        rec.move(event, rollout_id)
        self._running -= 1
        rec.dispatched_from = first_attempt
        rec.acked = acked and event in (RolloutEvent.RESULT_OUT, RolloutEvent.RESULT_KEPT)
        if rec.abandons:
            rec.abandons = frozenset(f for f in rec.abandons if f > first_attempt)
        if isinstance(rec, RolloutRecord):
            if attempt is not None:
                rec.next_fresh = max(rec.next_fresh, attempt + 1, first_attempt)
            rec.kept = rec.result = None

    def _lose(self, rec: RolloutView, rollout_id: str, first_attempt: int) -> None:
        rec.move(RolloutEvent.LOSE, rollout_id)
        self._running -= 1
        rec.dispatched_from = rec.current = first_attempt
        rec.acked = False
        if isinstance(rec, RolloutRecord):
            rec.next_fresh = max(rec.next_fresh, first_attempt + self.max_tries)
            rec.kept = rec.result = None

    def _full(self, rollout_id: str) -> RolloutRecord | None:
        rec = self._records.get(rollout_id)
        assert rec is None or isinstance(rec, RolloutRecord), "a view keeps no results"
        return rec

    def _running_record(self, rollout_id: str) -> RolloutView:
        rec = self._records.get(rollout_id)
        if rec is None:
            return self._record()  # NEW: the table refuses the end of a dispatch never begun
        self._records.move_to_end(rollout_id)
        return rec

    def _touch(self, rollout_id: str) -> RolloutView:
        rec = self._records.get(rollout_id)
        if rec is not None:
            self._records.move_to_end(rollout_id)
            return rec
        rec = self._records[rollout_id] = self._record()
        skipped = 0
        while len(self._records) > self.capacity and skipped < len(self._records):
            rid, old = self._records.popitem(last=False)
            if old.state is RolloutState.RUNNING:  # in flight: its end comes; keep it
                self._records[rid] = old
                skipped += 1
        return rec
