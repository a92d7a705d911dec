"""What rollout actors report to the ledger: one small record per attempt transition.

Reports travel in batches and may arrive out of order (an async Ray actor can run one caller's
calls out of order), so the ledger folds them monotonically: an attempt's state only moves up the
ranks below, and the current try of a rollout is the highest attempt index reported for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class AttemptState(str, Enum):
    RUNNING = "running"  # dispatched to Gym; /run may still be working
    SEALED = "sealed"  # reply received, digest checked, result recorded; not yet ACKed
    ACKED = "acked"  # Gym released it
    TOMBSTONED = "tombstoned"  # retired (cancelled), failed, or refused as stale

    @property
    def rank(self) -> int:
        return _RANK[self]

    @property
    def terminal(self) -> bool:
        return self in (AttemptState.ACKED, AttemptState.TOMBSTONED)


_RANK = {
    AttemptState.RUNNING: 0,
    AttemptState.SEALED: 1,
    AttemptState.ACKED: 2,
    AttemptState.TOMBSTONED: 2,
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
