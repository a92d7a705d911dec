"""What is known about each rollout, kept in one place: :class:`RolloutMemory`.

Pure and synchronous: no Ray, no sockets, no clock. Per rollout id it holds the try last known to
be current, whether that try settled (ended with a result: nothing left to retire), whether its
result was released on Gym, the lowest attempt index never used, a result kept for the
rollout's next row, whether a dispatch of it is in flight, and dispatches abandoned before they
started. The orchestrator asks it how to dispatch a row (:meth:`RolloutMemory.plan`), the rollout
actor whether a finished try is its settled result (:meth:`RolloutMemory.holds_result`) and
whether an abandon came first (:meth:`RolloutMemory.take_abandon`).

A dispatch whose rollout actor died leaves the current try unknown (:meth:`RolloutMemory.lose`):
every try of it lies within ``[first, first + max_tries)``. Until the ledger's answer is learned
(:meth:`RolloutMemory.learn_current`), the dispatch's first try stands in for the current one.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from rl_gym_actors.outcome import Outcome


@dataclass(slots=True)
class RolloutFacts:
    """What is known of one rollout id."""

    current: int | None = None  # the try last known current (None: no try made)
    settled: bool = False  # ``current`` ended with a result: nothing to retire
    acked: bool = False  # ... and whoever sealed it released it on Gym
    next_fresh: int = 0  # the lowest attempt index never used
    dispatched_from: int | None = None  # first try of the latest dispatch that ended
    current_known: bool = True  # False while a dead actor's last try is unknown
    kept: Outcome | None = None  # a result nobody took; the rollout's next row gets it
    result: Outcome | None = None  # its sealed result, handed out: a row sent again gets
    # it back (repeated), until a checkpoint forgets it
    running: bool = False  # a dispatch is in flight
    abandons: frozenset[int] = frozenset()  # dispatches (by first try) abandoned early


@dataclass(frozen=True, slots=True)
class Dispatch:
    """How to dispatch a rollout: its first fresh try, the earlier try to retire first (and
    adopt if it finished), or a kept result that answers the row without a dispatch."""

    first_attempt: int
    previous_attempt: int | None
    ready: Outcome | None = None


class RolloutMemory:
    """Facts per rollout id, at most ``capacity`` of them (the least recently touched go)."""

    def __init__(self, capacity: int = 1_000_000) -> None:
        self.capacity = capacity
        self._facts: OrderedDict[str, RolloutFacts] = OrderedDict()
        self._running = 0

    def __len__(self) -> int:
        return len(self._facts)

    @property
    def in_flight(self) -> int:
        """How many rollouts have a dispatch in flight."""
        return self._running

    def facts(self, rollout_id: str) -> RolloutFacts | None:
        return self._facts.get(rollout_id)

    def running(self, rollout_id: str) -> bool:
        facts = self._facts.get(rollout_id)
        return facts is not None and facts.running

    # ------------------------------------------------------------ dispatching

    def plan(self, rollout_id: str, named_attempt: int = 0) -> Dispatch:
        """How to dispatch a row of this rollout that names ``named_attempt`` as its first try
        (changes nothing). A rollout never tried before that is named at try k > 0 retires try
        k-1 first: it may have finished on Gym before a restart."""
        facts = self._facts.get(rollout_id)
        if facts is None or facts.current is None:
            first = max(named_attempt, facts.next_fresh if facts else 0)
            return Dispatch(first, named_attempt - 1 if named_attempt > 0 else None)
        ready = None
        if facts.kept is not None:
            ready = facts.kept.model_copy(
                update=dict(status="sealed", adopted=True, reason=None, failure=None, tries=0)
            )
        elif facts.settled and facts.result is not None:
            # sealed before: never played again; the same result, not a new one
            ready = facts.result.model_copy(
                update=dict(status="sealed", reason=None, failure=None, tries=0, repeated=True)
            )
        return Dispatch(
            max(named_attempt, facts.next_fresh), None if facts.settled else facts.current, ready
        )

    def hand_out(self, rollout_id: str) -> None:
        """The kept result went to a row: it is not kept any more."""
        facts = self._facts.get(rollout_id)
        if facts is not None and facts.kept is not None:
            facts.result, facts.kept = (
                facts.kept.model_copy(
                    update=dict(status="sealed", adopted=True, reason=None, failure=None)
                ),
                None,
            )

    def begin(self, rollout_id: str) -> None:
        """A dispatch of the rollout is in flight."""
        facts = self._touch(rollout_id)
        if not facts.running:
            facts.running = True
            self._running += 1

    def end(self, rollout_id: str) -> None:
        """The rollout's dispatch is over (whatever came of it)."""
        facts = self._facts.get(rollout_id)
        if facts is not None and facts.running:
            facts.running = False
            self._running -= 1

    # ------------------------------------------------------------ what came of a dispatch

    def finish(
        self,
        rollout_id: str,
        first_attempt: int,
        attempt: int | None,
        *,
        result: bool,
        acked: bool = False,
        kept: Outcome | None = None,
        sealed: Outcome | None = None,
    ) -> None:
        """A dispatch that began at ``first_attempt`` ended at try ``attempt`` (None: it made no
        try, and what was known still holds), with a result or without one; ``sealed`` is the
        result handed out (remembered for a row that sends the rollout again)."""
        facts = self._touch(rollout_id)
        facts.dispatched_from = first_attempt
        if facts.abandons:
            facts.abandons = frozenset(f for f in facts.abandons if f > first_attempt)
        if attempt is None:
            return
        facts.current, facts.current_known = attempt, True
        facts.settled, facts.acked = result, result and acked
        facts.next_fresh = max(facts.next_fresh, attempt + 1, first_attempt)
        facts.kept = kept if result else None
        facts.result = sealed if result else None

    def finish_outcome(self, rollout_id: str, first_attempt: int, outcome: Outcome) -> None:
        """:meth:`finish` from the dispatch's outcome; an abandoned result is kept."""
        self.finish(
            rollout_id,
            first_attempt,
            outcome.attempt_index,
            result=outcome.has_result,
            acked=outcome.acked,
            kept=outcome if outcome.status == "abandoned" else None,
            sealed=outcome if outcome.status == "sealed" else None,
        )

    def keep(self, outcome: Outcome) -> None:
        """An outcome with a result the trainer never took: the rollout's next row gets it."""
        facts = self._facts.get(outcome.rollout_id)
        if outcome.has_result and facts is not None and facts.settled:
            facts.kept, facts.result = outcome, None

    def lose(self, rollout_id: str, first_attempt: int, max_tries: int) -> None:
        """The dispatch's rollout actor died (or the caller gave up on it): its tries lie within
        ``[first_attempt, first_attempt + max_tries)`` and which one is current is unknown."""
        facts = self._touch(rollout_id)
        facts.dispatched_from = first_attempt
        facts.current, facts.current_known = first_attempt, False
        facts.settled = facts.acked = False
        facts.next_fresh = max(facts.next_fresh, first_attempt + max_tries)
        facts.kept = None

    def unsure(self, rollout_id: str) -> bool:
        """Whether the current try is a guess (see :meth:`lose`) that the ledger may correct."""
        facts = self._facts.get(rollout_id)
        return facts is not None and not facts.current_known

    def learn_current(self, rollout_id: str, current: int | None) -> None:
        """The ledger's answer for an unsure rollout: the highest try any owner reported. A try
        before the lost dispatch's first (an earlier, settled dispatch) tells nothing new."""
        facts = self._facts.get(rollout_id)
        if facts is None or facts.current_known:
            return
        if (
            current is not None
            and facts.dispatched_from is not None
            and current >= facts.dispatched_from
        ):
            facts.current = current
            facts.next_fresh = max(facts.next_fresh, current + 1)
        facts.current_known = True

    # ------------------------------------------------------------ a rollout actor's questions

    def holds_result(self, rollout_id: str, attempt: int) -> bool:
        """Whether ``attempt`` is the rollout's settled try, sealed and released on Gym."""
        facts = self._facts.get(rollout_id)
        return facts is not None and facts.current == attempt and facts.acked

    def request_abandon(self, rollout_id: str, first_attempt: int) -> None:
        """An abandon for the dispatch that begins at ``first_attempt``, which is not running:
        remembered for when it starts, unless that dispatch (or a later one) already ended."""
        facts = self._facts.get(rollout_id)
        if (
            facts is not None
            and facts.dispatched_from is not None
            and facts.dispatched_from >= first_attempt
        ):
            return
        facts = self._touch(rollout_id)
        facts.abandons = facts.abandons | {first_attempt}

    def take_abandon(self, rollout_id: str, first_attempt: int) -> bool:
        """Whether the dispatch starting now at ``first_attempt`` was abandoned before it
        started; abandons of earlier dispatches are dropped."""
        facts = self._facts.get(rollout_id)
        if facts is None or not facts.abandons:
            return False
        hit = first_attempt in facts.abandons
        facts.abandons = frozenset(f for f in facts.abandons if f > first_attempt)
        return hit

    # ------------------------------------------------------------ bounds

    def forget_settled(self) -> int:
        """Forget every rollout that sealed and whose result was handed out (a committed
        checkpoint holds it now): not in flight, nothing kept. Rollouts that failed stay (their
        current try and next fresh index matter to their next row). Returns how many went."""
        keep = OrderedDict(
            (rid, f)
            for rid, f in self._facts.items()
            if f.running
            or f.kept is not None
            or f.abandons
            or not (f.settled and f.result is not None)
        )
        gone = len(self._facts) - len(keep)
        self._facts = keep  # rebuilt: a dict never shrinks its table on deletes
        return gone

    def _touch(self, rollout_id: str) -> RolloutFacts:
        facts = self._facts.get(rollout_id)
        if facts is None:
            facts = self._facts[rollout_id] = RolloutFacts()
            while len(self._facts) > self.capacity:
                _, old = self._facts.popitem(last=False)
                if old.running:
                    self._running -= 1
        else:
            self._facts.move_to_end(rollout_id)
        return facts
