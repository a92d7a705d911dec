"""The v2 participant's control state, pure (no clock, no I/O, no asyncio): phases, checkpoint-id
fencing, replay of recorded answers, the lease, and retired marks.

::

    idle --prepare--> preparing --(ready)--> prepared --commit--> committed
    idle --restore--> restored
    preparing | prepared | committed | restored --resume or lease expiry--> idle

:data:`ALLOWED` is the transition table: the phases each operation is admitted in. Before the
table is read, an id resumed lately (the last 64) is refused ``stale_checkpoint`` and an id other
than the active one ``checkpoint_conflict``; a recorded answer (prepare once ready, commit,
restore) is replayed for the same id and operation, until that id is resumed. Retire and forget
are admitted while idle (any id not resumed lately fences nothing) or restored (the active id).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from rl_gym_actors.errors import CheckpointConflict, InvalidPhase, StaleAttempt, StaleCheckpoint
from rl_gym_actors.gym.v2.wire import EpisodeId, Phase

RESUMED_IDS_KEPT = 64
_ALL = frozenset(Phase)
ALLOWED: dict[str, frozenset[Phase]] = {
    "prepare": frozenset({Phase.IDLE, Phase.PREPARING}),
    "renew": _ALL - {Phase.IDLE},
    "commit": frozenset({Phase.PREPARED}),
    "restore": frozenset({Phase.IDLE}),
    "resume": _ALL - {Phase.IDLE},
    "retire": frozenset({Phase.IDLE, Phase.RESTORED}),
    "forget": frozenset({Phase.IDLE, Phase.RESTORED}),
}
RECORDED = ("prepare", "commit", "restore")  # answers replayed for the same id


class RetiredMarks:
    """Per rollout, the highest retired attempt: that attempt and earlier ones are refused
    (``stale_attempt``) until ``forget``. A mark only rises."""

    def __init__(self) -> None:
        self._marks: dict[str, int] = {}

    def check(self, episode: EpisodeId) -> None:
        mark = self._marks.get(episode.rollout_id)
        if mark is not None and episode.attempt <= mark:
            raise StaleAttempt(
                f"rollout {episode.rollout_id!r} attempt {episode.attempt} was retired",
                status=409,
            )

    def refused(self, episode: EpisodeId) -> bool:
        mark = self._marks.get(episode.rollout_id)
        return mark is not None and episode.attempt <= mark

    def mark(self, episodes: Iterable[EpisodeId]) -> None:
        for e in episodes:
            self._marks[e.rollout_id] = max(self._marks.get(e.rollout_id, -1), e.attempt)

    def forget(self, rollout_ids: Iterable[str]) -> None:
        for rollout_id in rollout_ids:
            self._marks.pop(rollout_id, None)

    def __len__(self) -> int:
        return len(self._marks)


class Machine:
    """One participant's control state (see the module docstring)."""

    def __init__(self, *, lease_grace_s: float) -> None:
        if lease_grace_s <= 0:
            raise ValueError("lease_grace_s must be > 0")
        self.lease_grace_s = lease_grace_s
        self.phase = Phase.IDLE
        self.checkpoint_id: str | None = None
        self.lease_expires_at: float | None = None
        self.retired = RetiredMarks()
        self._resumed: OrderedDict[str, None] = OrderedDict()
        self._results: dict[tuple[str, str], dict[str, Any]] = {}

    # ------------------------------------------------------------ admission

    def admit(self, operation: str, checkpoint_id: str) -> dict[str, Any] | None:
        """Admit ``operation`` for ``checkpoint_id``: its recorded answer to replay, or None to
        run it; raises the typed rejection otherwise."""
        recorded = self._results.get((checkpoint_id, operation))
        if recorded is not None:
            return recorded
        if operation in ("retire", "forget"):
            self._admit_outside(checkpoint_id)
            return None
        if checkpoint_id in self._resumed:
            raise StaleCheckpoint(f"checkpoint {checkpoint_id!r} was already resumed", status=409)
        if self.checkpoint_id is not None and self.checkpoint_id != checkpoint_id:
            raise CheckpointConflict(
                f"checkpoint {self.checkpoint_id!r} is active in phase {self.phase.value}",
                status=409,
                body={"active_checkpoint_id": self.checkpoint_id},
            )
        if self.phase not in ALLOWED[operation]:
            raise InvalidPhase(f"{operation} is not valid in phase {self.phase.value}", status=409)
        return None

    def _admit_outside(self, checkpoint_id: str) -> None:
        if self.phase not in ALLOWED["retire"]:
            raise InvalidPhase(f"not valid in phase {self.phase.value}; resume first", status=409)
        if self.checkpoint_id is not None and self.checkpoint_id != checkpoint_id:
            raise CheckpointConflict(
                f"checkpoint {self.checkpoint_id!r} is active",
                status=409,
                body={"active_checkpoint_id": self.checkpoint_id},
            )

    def record(self, checkpoint_id: str, operation: str, answer: dict[str, Any]) -> None:
        self._results[(checkpoint_id, operation)] = answer

    # ------------------------------------------------------------ transitions

    def open_checkpoint(self, checkpoint_id: str, phase: Phase, deadline_ts: float) -> None:
        """idle -> preparing (prepare) or -> restored (a restore that installed)."""
        self.checkpoint_id = checkpoint_id
        self.phase = phase
        self.renew(deadline_ts)

    def to(self, phase: Phase) -> None:
        self.phase = phase

    def close_checkpoint(self, resume_id: str | None) -> None:
        """-> idle; ``resume_id`` (a resume or lease expiry) is fenced and its answers dropped."""
        if resume_id is not None:
            self._resumed[resume_id] = None
            while len(self._resumed) > RESUMED_IDS_KEPT:
                self._resumed.popitem(last=False)
            self._results = {k: v for k, v in self._results.items() if k[0] != resume_id}
        self.phase = Phase.IDLE
        self.checkpoint_id = None
        self.lease_expires_at = None

    def resume(self, checkpoint_id: str) -> tuple[dict[str, Any], bool]:
        """The resume answer and whether admission must reopen now."""
        if checkpoint_id in self._resumed:
            return {"phase": Phase.IDLE.value, "idempotent": True}, False
        if self.phase is Phase.IDLE and self.checkpoint_id is None:
            # never reached here (an earlier stage failed): fence the id anyway
            self.close_checkpoint(checkpoint_id)
            return {"phase": Phase.IDLE.value, "idempotent": True}, False
        self.admit("resume", checkpoint_id)
        self.close_checkpoint(checkpoint_id)
        return {"phase": Phase.IDLE.value, "idempotent": False}, True

    # ------------------------------------------------------------ lease

    def renew(self, deadline_ts: float) -> float:
        expires = deadline_ts + self.lease_grace_s
        self.lease_expires_at = max(self.lease_expires_at or 0.0, expires)
        return self.lease_expires_at

    def expired(self, now: float) -> str | None:
        """The active checkpoint id when its lease has run out at ``now`` (then close it)."""
        if self.checkpoint_id is None or self.lease_expires_at is None:
            return None
        if now < self.lease_expires_at:
            return None
        return self.checkpoint_id
