"""Checkpoint ids and phases on a Gym server: idle -> preparing -> prepared -> committed ->
(resume) idle, with id fencing.

- A repeated successful call with the active id and the same operation gets the recorded answer.
- A prepare that answered 409 leaves the phase at preparing; it may be called again with its id.
- A call with another id while one is active: 409 ``checkpoint_conflict``.
- ``resume`` spends its id: a later call with it gets 409 ``stale_checkpoint``, except a repeated
  ``resume``, which gets resume's recorded answer (so a resume whose answer was lost may be sent
  again). A resume while idle spends a fresh id too, which fences off a prepare that arrives late.
- ``status`` and ``retire`` are lenient: any id that is not spent, in every phase.

Pure and synchronous: no clock, no I/O.
"""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

from rl_gym_actors.errors import CheckpointConflict, CheckpointNotReady, StaleCheckpoint


class CheckpointPhase(str, Enum):
    IDLE = "idle"
    PREPARING = "preparing"
    PREPARED = "prepared"
    COMMITTED = "committed"


# (operation, phase before) -> phase after; a pair not in the table is an illegal transition
_TRANSITIONS: dict[tuple[str, CheckpointPhase], CheckpointPhase] = {
    ("prepare", CheckpointPhase.IDLE): CheckpointPhase.PREPARING,
    ("prepare", CheckpointPhase.PREPARING): CheckpointPhase.PREPARING,
    ("prepared", CheckpointPhase.PREPARING): CheckpointPhase.PREPARED,
    ("commit", CheckpointPhase.PREPARED): CheckpointPhase.COMMITTED,
    **{("resume", p): CheckpointPhase.IDLE for p in CheckpointPhase},
}


class CheckpointFence:
    """The phase machine of one participant. ``spent`` maps spent ids to resume's answer bytes."""

    def __init__(self, spent: dict[str, bytes] | None = None) -> None:
        self.phase = CheckpointPhase.IDLE
        self.active: str | None = None
        self.spent: dict[str, bytes] = dict(spent or {})
        self._answers: dict[str, Any] = {}       # operation -> recorded answer, for `active`

    @property
    def admission_open(self) -> bool:
        return self.phase is CheckpointPhase.IDLE

    def check_lenient(self, checkpoint_id: str | None) -> None:
        """``status`` and ``retire``: any id not spent, in every phase."""
        if checkpoint_id is not None and checkpoint_id in self.spent:
            raise StaleCheckpoint(f"checkpoint {checkpoint_id!r} is spent (resumed)", status=409)

    def recorded(self, checkpoint_id: str, operation: str) -> Any | None:
        """Fence a call: the recorded answer of a repeated call, else None when it may proceed.
        Raises ``StaleCheckpoint`` or ``CheckpointConflict``."""
        if checkpoint_id in self.spent:
            if operation == "resume":
                return json.loads(self.spent[checkpoint_id])
            raise StaleCheckpoint(f"checkpoint {checkpoint_id!r} is spent (resumed)", status=409)
        if self.active is not None and self.active != checkpoint_id:
            raise CheckpointConflict(
                f"checkpoint {self.active!r} is {self.phase.value}; {checkpoint_id!r} must wait "
                f"for its resume", status=409)
        return self._answers.get(operation) if self.active == checkpoint_id else None

    def check(self, checkpoint_id: str, operation: str) -> CheckpointPhase:
        """The phase ``operation`` would lead to; raises ``CheckpointNotReady`` (a commit) or
        ``CheckpointConflict`` (anything else) when the table does not allow it."""
        after = _TRANSITIONS.get((operation, self.phase))
        if after is None or self.active not in (None, checkpoint_id):
            if operation == "commit":
                raise CheckpointNotReady(f"commit of {checkpoint_id!r} needs a ready prepare; "
                                         f"the phase is {self.phase.value}", status=409)
            raise CheckpointConflict(f"{operation} of {checkpoint_id!r} is not allowed while "
                                     f"{self.phase.value}", status=409)
        return after

    def advance(self, checkpoint_id: str, operation: str, answer: Any = None) -> None:
        """Move along the table for ``operation`` and record its answer. The caller has fenced
        the call with :meth:`recorded` first."""
        after = self.check(checkpoint_id, operation)
        if after is CheckpointPhase.IDLE:
            self.active = None
            self._answers.clear()
            self.spent[checkpoint_id] = json.dumps(answer, separators=(",", ":")).encode()
        else:
            self.active = checkpoint_id
            if answer is not None:
                self._answers["prepare" if operation == "prepared" else operation] = answer
        self.phase = after
