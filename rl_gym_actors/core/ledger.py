"""The ledger, pure: the book of attempts, the prepare plan, and the checkpoint report.

- :mod:`rl_gym_actors.core.book`: :class:`Book` folds :class:`AttemptReport` records in any order
  and keeps per endpoint counters; :class:`LedgerSnapshot` is its frozen view.
- :mod:`rl_gym_actors.core.prepare_plan`: :func:`plan_endpoint` decides ADOPT / ORPHAN_ACK /
  RETIRE / WAIT per attempt from one endpoint's status.
- here: :class:`CheckpointReport`, what a committed checkpoint did on every endpoint.

The ledger actor (``rl_gym_actors.actors.ledger_actor``) performs what these decide.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from rl_gym_actors.core.book import AttemptView, Book, EndpointSnapshot, LedgerSnapshot
from rl_gym_actors.core.prepare_plan import (
    PrepareAction,
    Step,
    blockers,
    orphan_step,
    plan_endpoint,
)
from rl_gym_actors.protocol import CommitAnswer


class EndpointCheckpoint(BaseModel):
    """What the gate did on one endpoint: ``adopted`` (owners asked, answered True),
    ``orphans_acked``, ``sealed_acked`` (results rollouts sealed, ACKed with this checkpoint:
    ``ack="at_checkpoint"``), ``retired``, ``prepare_rounds`` and Gym's commit answer."""

    model_config = ConfigDict(frozen=True)

    endpoint: str
    label: str
    checkpoint_dir: str
    adopted: int = 0
    orphans_acked: int = 0
    sealed_acked: int = 0
    retired: int = 0
    prepare_rounds: int = 0
    commit: CommitAnswer


class CheckpointReport(BaseModel):
    """A committed checkpoint: one entry per endpoint, in the order the endpoints were given."""

    model_config = ConfigDict(frozen=True)

    checkpoint_id: str
    checkpoint_dir: str
    owners_flushed: int = 0
    elapsed_s: float = 0.0
    endpoints: list[EndpointCheckpoint]

    @property
    def adopted(self) -> int:
        return sum(e.adopted for e in self.endpoints)

    @property
    def orphans_acked(self) -> int:
        return sum(e.orphans_acked for e in self.endpoints)

    @property
    def sealed_acked(self) -> int:
        return sum(e.sealed_acked for e in self.endpoints)

    @property
    def retired(self) -> int:
        return sum(e.retired for e in self.endpoints)


__all__ = [
    "AttemptView",
    "Book",
    "CheckpointReport",
    "EndpointCheckpoint",
    "EndpointSnapshot",
    "LedgerSnapshot",
    "PrepareAction",
    "Step",
    "blockers",
    "orphan_step",
    "plan_endpoint",
]
