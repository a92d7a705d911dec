"""What a rollout actor keeps of the rollouts it finished sealed but not ACKed, for a restarted
ledger (:meth:`RolloutWorker.rereport`).

With ``ack="at_checkpoint"`` a finished rollout's sealed result stays on Gym, un-ACKed, until the
next checkpoint; the actor has forgotten the rollout, so a ledger that restarts meanwhile would
find the result in Gym's listing with no report and count it an orphan. The actor keeps the last
report of each such sealed try, in two generations turned over once per checkpoint id, at its
first flush (the gate's first call to every owner; later flushes of the same checkpoint, and a
restarted ledger's gate sent the same id again, do not turn them): a result sealed before the
previous checkpoint's flush was released by that checkpoint (or it failed, and the result, still
on Gym, is ACKed as an orphan by the next). A restarted ledger's gate that finds a sealed result
ACKed on Gym while the server is still held counts it released (by the gate before it).
Memory: one report per rollout sealed within the last two checkpoint intervals.
"""

from __future__ import annotations

from typing import Any


class SealedFinals:
    """Last reports of sealed, un-ACKed tries of finished rollouts, by rollout id."""

    def __init__(self) -> None:
        self._current: dict[str, Any] = {}
        self._previous: dict[str, Any] = {}

    def keep(self, rollout_id: str, report: Any) -> None:
        self._previous.pop(rollout_id, None)
        self._current[rollout_id] = report

    def turn(self) -> None:
        """A checkpoint's flush: what was sealed before the previous one is let go."""
        self._previous, self._current = self._current, {}

    def reports(self) -> list[Any]:
        return [*self._previous.values(), *self._current.values()]

    def __len__(self) -> int:
        return len(self._current) + len(self._previous)
