"""What a committed checkpoint did on every endpoint: :class:`CheckpointReport`.

The pure parts of the ledger live beside it: the book of attempts
(:mod:`rl_gym_actors.core.attempt_book`) and the prepare plan
(:mod:`rl_gym_actors.core.prepare_plan`); the ledger actor (``rl_gym_actors.actors.ledger_actor``)
performs what they decide, and the checkpoint gate returns this report.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from rl_gym_actors.outcome import Outcome
from rl_gym_actors.protocol import CommitAnswer


class EndpointCheckpoint(BaseModel):
    """What the gate did on one endpoint: ``adopted`` (owners asked, answered True),
    ``orphans_acked``, ``sealed_acked`` (results rollouts sealed, ACKed with this checkpoint:
    ``ack="at_checkpoint"``), ``retired``, ``prepare_rounds``, ``drain_s`` (agent-checkpoint
    protocol: seconds admission stayed closed while the gate waited for runs in flight to end)
    and Gym's commit answer. On a v2 server (``protocol="v2"``) ``commit`` holds the manifest's
    record count and records digest (and the exported ``episode_ids``); ``renewals`` and
    ``forgotten`` say what the v2 gate did."""

    model_config = ConfigDict(frozen=True)

    endpoint: str
    label: str
    checkpoint_dir: str
    adopted: int = 0
    orphans_acked: int = 0
    sealed_acked: int = 0
    retired: int = 0
    prepare_rounds: int = 0
    drain_s: float = 0.0  # agent-checkpoint: admission closed while runs in flight ended
    commit: CommitAnswer
    protocol: str = "agent"  # the server's checkpoint protocol: "agent" or "v2"
    renewals: int = 0  # v2: lease renewals while the checkpoint was open
    forgotten: int = 0  # v2: finished rollouts forgotten after the commit


class CheckpointReport(BaseModel):
    """A committed checkpoint: one entry per endpoint, in the order the endpoints were given."""

    model_config = ConfigDict(frozen=True)

    checkpoint_id: str
    checkpoint_dir: str
    owners_flushed: int = 0
    elapsed_s: float = 0.0
    endpoints: list[EndpointCheckpoint]
    # handed-over tries the gate adopted (actors/handover.py): in the part's ``undelivered``,
    # kept by the orchestrator for their rollouts' next rows
    kept: list[Outcome] = []

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


class EndpointRestore(BaseModel):
    """What a restore did on one v2 endpoint: this run's attempts it ``retired`` first (those a
    dead trainer left running, and each checkpointed attempt), the replacement attempts Gym
    installed (``restored``: capture keys) and the checkpoint Gym says it read them from.
    ``taken_over``: replacement attempts an earlier restore of this run had installed there and
    no replacement claimed (its restorer died), continued as they are (``restored`` is then
    empty: nothing was installed again)."""

    model_config = ConfigDict(frozen=True)

    endpoint: str
    label: str
    retired: int = 0
    restored: list[str] = []
    source_checkpoint_id: str | None = None
    taken_over: list[str] = []


class RestoreReport(BaseModel):
    """A restore of the Gym v2 episodes a checkpoint exported (``Orchestrator.arestore``).

    ``restored``: every endpoint installed its episodes (all or nothing); else ``error`` says why,
    the replacements were retired everywhere and those rollouts start over from their inputs.
    ``next_attempts``: the attempt each rollout's next row runs (a restored one continues from
    its boundary as that attempt; the others start over as it); ``placed``: the endpoint (URL)
    each restored rollout's replacement must run on."""

    model_config = ConfigDict(frozen=True)

    restore_id: str
    source_checkpoint_id: str
    restored: bool
    error: str | None = None
    endpoints: list[EndpointRestore] = []
    next_attempts: dict[str, int] = {}
    placed: dict[str, str] = {}

    @property
    def continued(self) -> int:
        """How many episodes continue from their boundary."""
        return len(self.placed)


class V2EndpointScope(BaseModel):
    """What a committed checkpoint left on one v2 endpoint for a restore (kept in the layer's
    checkpoint part): the attempts it ``exported`` (capture keys: they continue from their
    boundary as the next attempt) and the attempts this run had in flight there that it did not
    export (``start_over``: restarts, which run again from their inputs after a crash)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint: str
    label: str
    checkpoint_dir: str
    exported: list[str] = []
    start_over: list[str] = []
