"""What crosses Ray between the orchestrator and a rollout actor, as typed messages.

A row goes out as a :class:`RolloutTask` (``RolloutActor.run`` takes one, ``run_chunk`` a list);
each rollout of a chunk comes back as a :class:`ChunkResult` that names the task's position in
the chunk and holds its outcome or the error it raised. Frozen, slotted, picklable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rl_gym_actors.outcome import Outcome


@dataclass(frozen=True, slots=True)
class RolloutTask:
    """One rollout to play: its Gym row (without the identity fields, which the client sets per
    try), its id, the index of its endpoint, its first fresh try, and the earlier try to retire
    first (and adopt if it finished), if any."""

    row: Mapping[str, Any]
    rollout_id: str
    endpoint_index: int = 0
    first_attempt: int = 0
    previous_attempt: int | None = None


@dataclass(frozen=True, slots=True)
class ChunkResult:
    """How one task of a chunk ended: its ``outcome``, or the ``error`` it raised instead."""

    position: int
    outcome: Outcome | None = None
    error: BaseException | None = None
