"""What the checkpoint gate deals with on one endpoint: the owners it asks
(:class:`Owners`, answering :class:`OwnerAnswer`), its tally (:class:`EndpointTally`), and the
folder the endpoint commits into (:func:`dir_labels`, :func:`endpoint_dir`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.core.prepare_plan import blockers
from rl_gym_actors.listing import GymListing
from rl_gym_actors.protocol import CommitAnswer


class OwnerAnswer(Enum):
    """An owner's answer to the gate's adopt (or what its silence means)."""

    ADOPTED = "adopted"  # the owner says the attempt is now sealed and ACKed
    REFUSED = "refused"  # the owner does not own it: an orphan
    GONE = "gone"  # the owner is dead or unknown: an orphan
    UNSURE = "unsure"  # no answer in time, or the owner may still be alive: ask again


class Owners(Protocol):
    """The rollout actors, as the gate sees them."""

    def live(self) -> frozenset[str]:
        """Names of the registered owners not known to be dead."""

    async def adopt(
        self, owner: str, rollout_id: str, attempt_index: int, deadline_ts: float
    ) -> OwnerAnswer:
        """Ask ``owner`` to make sure the attempt ends sealed and ACKed."""

    async def flush(self, deadline_ts: float, checkpoint_id: str | None = None) -> int:
        """Ask every live owner to send its pending reports; how many confirmed in time. With
        ``checkpoint_id`` (a checkpoint's first flush) the owners also turn over what they keep
        for a restarted ledger, once per checkpoint id."""


@dataclass
class EndpointTally:
    """What the gate did and learned on one endpoint during one checkpoint."""

    endpoint: GymEndpoint
    label: str
    adopted: int = 0
    orphans_acked: int = 0
    sealed_acked: int = 0
    retired: int = 0
    receipt_mismatches: int = 0  # receipts listed that do not prove the sealed reply (not ACKed)
    rounds: int = 0
    last: GymListing | None = None
    ready: bool = False
    error: str | None = None
    commit: CommitAnswer | None = None
    resumed: bool = False
    may_hold: bool = False  # a prepare was sent that the server did not refuse
    conflict: str | None = None  # the checkpoint id that held the server at our last prepare
    held: list[Any] = field(default_factory=list)  # plan steps: completed results to release
    held_ready: bool = False  # ready but for ``held``: nothing runs, admission is closed
    lost: list[tuple[str, int]] = field(default_factory=list)  # sealed results Gym lost
    epoch: tuple[str, str] | None = None  # (ext) the store epoch first seen, and now: changed
    drain_since: float | None = None  # when a prepare first found runs going, admission closed
    drain_s: float = 0.0  # how long admission stayed closed waiting for them to end
    drain_logged: float | None = None  # when the last progress line about it was written

    def failure(self, foreign: Callable[[str], bool]) -> dict[str, Any]:
        """What :class:`CheckpointFailed` says about this endpoint; attempts of another run on
        the same server are marked ``"foreign": True``."""
        out: dict[str, Any] = {"endpoint": self.endpoint.url, "prepare_rounds": self.rounds}
        if self.conflict is not None:
            out["active_checkpoint_id"] = self.conflict
        if self.last is not None:
            out["summary"] = self.last.summary()
            out["attempts"] = [
                {**b, "foreign": True} if foreign(str(b["rollout_id"])) else b
                for b in blockers(self.last)
            ]
        if self.error:
            out["error"] = self.error
        if not self.resumed:
            out["resumed"] = False
        return out


def dir_labels(endpoints: Sequence[GymEndpoint]) -> list[str]:
    """Sub-folder names for a checkpoint of several endpoints: the endpoint's name when it is a
    plain, unique folder name, else its index."""
    names = [e.name or "" for e in endpoints]
    safe = [
        n
        if n and n not in (".", "..") and os.sep not in n and "/" not in n and names.count(n) == 1
        else ""
        for n in names
    ]
    return [n or str(i) for i, n in enumerate(safe)]


def endpoint_dir(checkpoint_dir: str, label: str) -> str:
    """The folder one endpoint commits into (its label's sub-folder when there are several)."""
    return os.path.join(checkpoint_dir, label) if label else checkpoint_dir
