"""What rollout actors report to the ledger: one small record per attempt transition.

Reports travel in batches and may arrive out of order (an async Ray actor can run one caller's
calls out of order), so the ledger folds them monotonically: an attempt's state only moves up its
:attr:`AttemptState.rank`, and the current try of a rollout is the highest attempt index reported
for it.

The ranks are a total order, ``running < sealed < tombstoned < acked``, the one order of these
states (the ledger's fold and every report use it). It must be total for the fold to be a join
(the same state whatever order reports arrive in). ``acked`` ranks above ``tombstoned`` because it
is the stronger fact: an ACK happens only to a sealed result, while a "tombstoned" report can
stand for an ACKed key (Gym answers a retire of an ACKed key ``tombstoned: true``); a key
tombstoned first is never ACKed after.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class AttemptState(StrEnum):
    RUNNING = "running"  # dispatched to Gym; /run may still be working
    SEALED = "sealed"  # reply received, digest checked, result recorded; not yet ACKed
    ACKED = "acked"  # Gym released it
    TOMBSTONED = "tombstoned"  # retired (cancelled), failed, or refused as stale

    @property
    def rank(self) -> int:
        """The state's place in the one order of attempt states (see the module docstring)."""
        return _RANK[self]

    @property
    def terminal(self) -> bool:
        return self in (AttemptState.ACKED, AttemptState.TOMBSTONED)


_RANK = {
    AttemptState.RUNNING: 0,
    AttemptState.SEALED: 1,
    AttemptState.TOMBSTONED: 2,
    AttemptState.ACKED: 3,
}


@dataclass(frozen=True, slots=True)
class AttemptReport:
    """One attempt's new state, as its owner saw it.

    ``owner`` names the rollout actor that owns the rollout's try (its Ray actor name);
    ``adopted`` marks a result taken from a finished try after retire (not rerun);
    ``released`` marks the owner's last report for the rollout: it no longer owns it.
    """

    rollout_id: str
    attempt_index: int
    endpoint: str
    state: AttemptState
    owner: str
    adopted: bool = False
    released: bool = False
    reward: float | None = None
    result_digest: str | None = None


class AttemptLog:
    """The reports one rollout's owner made, per attempt: the last state reported, the attempts
    it released (its last report for them) and those it handed over to the ledger unsettled."""

    def __init__(self, rollout_id: str, endpoint: str, owner: str) -> None:
        self.rollout_id, self.endpoint, self.owner = rollout_id, endpoint, owner
        self.handed_over: list[int] = []
        self._states: dict[int, AttemptState] = {}
        self._released: set[int] = set()

    def state(self, attempt_index: int) -> AttemptState | None:
        """The last state reported for the attempt (None: never reported)."""
        return self._states.get(attempt_index)

    def report(
        self,
        attempt_index: int,
        state: AttemptState,
        *,
        adopted: bool = False,
        released: bool = False,
        reward: float | None = None,
        result_digest: str | None = None,
    ) -> AttemptReport:
        self._states[attempt_index] = state
        if released:
            self._released.add(attempt_index)
        return AttemptReport(
            self.rollout_id,
            attempt_index,
            self.endpoint,
            state,
            self.owner,
            adopted=adopted,
            released=released,
            reward=reward,
            result_digest=result_digest,
        )

    def hand_over(self, attempt_index: int, state: AttemptState, adopted: bool) -> AttemptReport:
        """Give the attempt up to the ledger, which settles it at the next checkpoint."""
        self.handed_over.append(attempt_index)
        return self.report(attempt_index, state, adopted=adopted, released=True)

    def release(self, attempt_index: int | None, adopted: bool) -> AttemptReport | None:
        """The owner's last report of its current attempt, unless it was released already or
        never reported."""
        if attempt_index is None or attempt_index in self._released:
            return None
        state = self._states.get(attempt_index)
        if state is None:
            return None
        return self.report(attempt_index, state, adopted=adopted, released=True)


def merge_reports(first: AttemptReport, then: AttemptReport) -> AttemptReport | None:
    """One report whose fold equals folding ``first`` and then ``then`` (in either order: the
    fold is a join), or None when they are not of the same attempt, endpoint and owner. Lets an
    owner send one report where it has several of one attempt still waiting."""
    if (first.rollout_id, first.attempt_index, first.endpoint, first.owner) != (
        then.rollout_id,
        then.attempt_index,
        then.endpoint,
        then.owner,
    ):
        return None
    state = then.state if then.state.rank >= first.state.rank else first.state
    return replace(
        then,
        state=state,
        adopted=first.adopted or then.adopted,
        released=first.released or then.released,
        reward=then.reward if then.reward is not None else first.reward,
        result_digest=then.result_digest if then.result_digest is not None else first.result_digest,
    )
