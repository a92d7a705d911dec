"""What the driver received: the outcomes its streams and batches handed to the trainer, by
status. :meth:`Orchestrator.snapshot <rl_gym_actors.orchestrator.Orchestrator.snapshot>` reports
them (the rollout actors' own counters lose what a dead actor counted, and miss the failures the
driver made for rows whose actor died)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict

from rl_gym_actors.outcome import Outcome


class ReceivedCounts(BaseModel):
    """Outcomes handed to the trainer, by status (a row answered again counts again)."""

    model_config = ConfigDict(frozen=True)

    sealed: int = 0
    failed: int = 0
    abandoned: int = 0


class Received:
    """The orchestrator's running tally of the outcomes it handed out."""

    def __init__(self) -> None:
        self._counts = {"sealed": 0, "failed": 0, "abandoned": 0}

    def add(self, outcomes: Iterable[Outcome], sign: int = 1) -> None:
        for outcome in outcomes:
            self._counts[outcome.status] += sign

    def counts(self) -> ReceivedCounts:
        return ReceivedCounts(**self._counts)
