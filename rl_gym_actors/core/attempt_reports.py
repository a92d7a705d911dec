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

from dataclasses import dataclass
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
