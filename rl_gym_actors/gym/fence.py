"""The checkpoint fence: which checkpoint id holds a participant, in which phase, and for how long.

Phases go ``idle -> preparing -> prepared -> committed_paused -> (resume) idle`` and
``idle -> restored_paused -> (resume) idle``. The rules, for any
participant that takes part in checkpoints (our Gym server, and anything on the RL side that
stands in for one):

- A repeated successful call with the active id and the same operation gets the answer recorded
  the first time (:meth:`CheckpointFence.recorded`).
- A prepare that was refused (not ready) leaves the phase at ``preparing``; it may be called
  again with its id.
- A call with another id while one is active: :class:`~rl_gym_actors.errors.CheckpointConflict`,
  whose ``active_checkpoint_id`` names the id in the way.
- ``resume`` spends its id: a later call with it gets
  :class:`~rl_gym_actors.errors.StaleCheckpoint`, except a repeated ``resume``, which gets
  resume's recorded answer (a resume whose answer was lost may be sent again). A resume while
  idle spends a fresh id too, which fences off a prepare that arrives late.
- ``release`` gives up a checkpoint that is preparing or prepared without spending its id: back
  to idle, and the id may be prepared again (a participant whose prepare missed its deadline
  and that reopens admission rather than holding it).
- ``status`` is lenient (:meth:`CheckpointFence.check_lenient`): any id that is not spent, in
  every phase. ``retire`` is fenced as a real Gym fences it (:meth:`CheckpointFence.check_retire`):
  while a checkpoint is active, only under its id, and only while idle, preparing or prepared.
- ``restore`` (from idle) leaves the phase ``restored_paused`` until ``resume``.
- **Lease** (optional, ``lease_s``): an active id holds the fence only until ``lease_until``,
  which every call for it moves to ``max(deadline_ts, now) + lease_s`` (:meth:`renew`). Past it,
  :meth:`expire` aborts the checkpoint as a resume would (the id is spent) and reports it.

Pure and synchronous: no clock (``now`` is passed in), no I/O. Answers are recorded as given;
keep them JSON-able if the fence is made durable (:meth:`state` / :meth:`restore`).

Use::

    fence = CheckpointFence(lease_s=60)
    answer = fence.recorded(cid, "prepare")        # a repeat? (raises on conflict / spent)
    if answer is None:
        fence.advance(cid, "prepare")              # ... wait until ready, then:
        fence.advance(cid, "prepared", report)     # records the ready answer
    fence.renew(cid, deadline_ts, now)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from rl_gym_actors.errors import CheckpointConflict, CheckpointNotReady, StaleCheckpoint

Operation = Literal["prepare", "prepared", "commit", "restore", "resume", "release"]

#: resume's answer, also recorded for an id that a lease expiry aborted
RESUMED = {"state": "accepting", "released": 0}


class CheckpointPhase(str, Enum):
    IDLE = "idle"
    PREPARING = "preparing"
    PREPARED = "prepared"
    COMMITTED = "committed_paused"  # the name a real Gym and NeMo RL's client use
    RESTORED = "restored_paused"  # after a restore, admission closed until resume (as real Gym)


#: the phases in which a real Gym takes a retire (for the active id, or any id when idle)
RETIRE_PHASES = frozenset(
    {CheckpointPhase.IDLE, CheckpointPhase.PREPARING, CheckpointPhase.PREPARED}
)


# (operation, phase before) -> phase after; a pair not in the table is an illegal transition
_TRANSITIONS: dict[tuple[str, CheckpointPhase], CheckpointPhase] = {
    ("prepare", CheckpointPhase.IDLE): CheckpointPhase.PREPARING,
    ("prepare", CheckpointPhase.PREPARING): CheckpointPhase.PREPARING,
    ("prepared", CheckpointPhase.PREPARING): CheckpointPhase.PREPARED,
    ("commit", CheckpointPhase.PREPARED): CheckpointPhase.COMMITTED,
    ("restore", CheckpointPhase.IDLE): CheckpointPhase.RESTORED,
    **{("resume", p): CheckpointPhase.IDLE for p in CheckpointPhase},
    ("release", CheckpointPhase.PREPARING): CheckpointPhase.IDLE,
    ("release", CheckpointPhase.PREPARED): CheckpointPhase.IDLE,
}


@dataclass
class FenceState:
    """Everything a fence needs to come back after a restart (spent ids apart)."""

    phase: CheckpointPhase = CheckpointPhase.IDLE
    active: str | None = None
    answers: dict[str, Any] = field(default_factory=dict)  # operation -> recorded answer
    lease_until: float | None = None


@dataclass(frozen=True)
class Expired:
    """A checkpoint that :meth:`CheckpointFence.expire` aborted."""

    checkpoint_id: str
    phase: CheckpointPhase
    lease_until: float
    at: float


class CheckpointFence:
    """The phase machine of one participant.

    ``spent`` maps spent ids to resume's answer; ``lease_s`` (None: no lease) bounds how long an
    active id may hold the fence without a call.
    """

    def __init__(
        self, spent: dict[str, Any] | None = None, *, lease_s: float | None = None
    ) -> None:
        self.phase = CheckpointPhase.IDLE
        self.active: str | None = None
        self.spent: dict[str, Any] = dict(spent or {})
        self.lease_s = lease_s
        self.lease_until: float | None = None
        self.last_expired: Expired | None = None
        self._answers: dict[str, Any] = {}

    # ------------------------------------------------------------ reading

    @property
    def admission_open(self) -> bool:
        return self.phase is CheckpointPhase.IDLE

    def conflict(self, checkpoint_id: str, what: str) -> CheckpointConflict:
        """The error for a call with ``checkpoint_id`` while another id is active."""
        return CheckpointConflict(
            f"checkpoint {self.active!r} is {self.phase.value}; {what} of {checkpoint_id!r} "
            f"must wait for its resume (or its abort)",
            status=409,
            body={"active_checkpoint_id": self.active, "phase": self.phase.value},
        )

    def check_lenient(self, checkpoint_id: str | None) -> None:
        """``status`` and ``retire``: any id not spent, in every phase."""
        if checkpoint_id is not None and checkpoint_id in self.spent:
            raise StaleCheckpoint(f"checkpoint {checkpoint_id!r} is spent (resumed)", status=409)

    def check_retire(self, checkpoint_id: str) -> None:
        """``retire``, as a real Gym fences it: not a spent id, only the active id while a
        checkpoint is active (``CheckpointConflict`` naming it otherwise), and only while idle,
        preparing or prepared."""
        self.check_lenient(checkpoint_id)
        if self.active is not None and self.active != checkpoint_id:
            raise self.conflict(checkpoint_id, "retire")
        if self.phase not in RETIRE_PHASES:
            raise CheckpointConflict(
                f"retire of {checkpoint_id!r} is not allowed while {self.phase.value}",
                status=409,
                body={"active_checkpoint_id": self.active, "phase": self.phase.value},
            )

    def recorded(self, checkpoint_id: str, operation: Operation) -> Any | None:
        """Fence a call: the recorded answer of a repeated call, else None when it may proceed.
        Raises ``StaleCheckpoint`` or ``CheckpointConflict``."""
        if checkpoint_id in self.spent:
            if operation == "resume":
                return self.spent[checkpoint_id]
            raise StaleCheckpoint(f"checkpoint {checkpoint_id!r} is spent (resumed)", status=409)
        if self.active is not None and self.active != checkpoint_id:
            raise self.conflict(checkpoint_id, operation)
        return self._answers.get(operation) if self.active == checkpoint_id else None

    def check(self, checkpoint_id: str, operation: Operation) -> CheckpointPhase:
        """The phase ``operation`` would lead to; raises ``CheckpointNotReady`` (a commit) or
        ``CheckpointConflict`` (anything else) when the table does not allow it."""
        after = _TRANSITIONS.get((operation, self.phase))
        if after is None or self.active not in (None, checkpoint_id):
            if operation == "commit":
                raise CheckpointNotReady(
                    f"commit of {checkpoint_id!r} needs a ready prepare; "
                    f"the phase is {self.phase.value}",
                    status=409,
                )
            if self.active not in (None, checkpoint_id):
                raise self.conflict(checkpoint_id, operation)
            raise CheckpointConflict(
                f"{operation} of {checkpoint_id!r} is not allowed while {self.phase.value}",
                status=409,
                body={"active_checkpoint_id": self.active, "phase": self.phase.value},
            )
        return after

    # ------------------------------------------------------------ moving

    def advance(self, checkpoint_id: str, operation: Operation, answer: Any = None) -> None:
        """Move along the table for ``operation`` and record its answer. The caller has fenced
        the call with :meth:`recorded` first."""
        after = self.check(checkpoint_id, operation)
        if after is CheckpointPhase.IDLE:
            self.active = None
            self.lease_until = None
            self._answers.clear()
            if operation != "release":
                self.spent[checkpoint_id] = answer
        else:
            self.active = checkpoint_id
            if answer is not None:
                self._answers["prepare" if operation == "prepared" else operation] = answer
        self.phase = after

    def renew(self, checkpoint_id: str | None, deadline_ts: float | None, now: float) -> bool:
        """A call for ``checkpoint_id`` arrived: when it is the active id and leases are on,
        move the lease to ``max(deadline_ts, now) + lease_s``. Whether the lease moved."""
        if self.lease_s is None or checkpoint_id is None or checkpoint_id != self.active:
            return False
        self.lease_until = max(deadline_ts if deadline_ts is not None else now, now) + self.lease_s
        return True

    def expire(self, now: float) -> Expired | None:
        """Abort the active checkpoint if its lease ran out: admission reopens and its id is
        spent (a later resume of it gets :data:`RESUMED`). What was aborted, or None."""
        if self.active is None or self.lease_until is None or now <= self.lease_until:
            return None
        expired = Expired(self.active, self.phase, self.lease_until, now)
        self.advance(self.active, "resume", dict(RESUMED))
        self.last_expired = expired
        return expired

    # ------------------------------------------------------------ durability

    def state(self) -> FenceState:
        return FenceState(self.phase, self.active, dict(self._answers), self.lease_until)

    def restore(self, state: FenceState) -> None:
        """Come back in ``state`` (after a restart). A lease from before the restart holds."""
        self.phase, self.active = state.phase, state.active
        self._answers = dict(state.answers)
        self.lease_until = state.lease_until
