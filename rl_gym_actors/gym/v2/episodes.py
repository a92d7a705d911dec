"""The v2 agent participant's episodes, pure (no clock, no I/O, no asyncio).

An episode is one ``/run`` attempt, keyed by its rollout id (one live attempt per rollout):

    (admitted) --step--> running --boundary--> running (or parked while admission is closed)
    running | parked --agent returns--> finished (the reply is kept: (ext))
    running | parked --agent raises / retire--> gone

- A *boundary* is the progress the agent reported after a step; an episode parks at its next
  boundary once admission closes and counts as at that boundary from then on. The start of a
  run is a boundary too (progress ``None``: it starts over from its input, or from its restored
  progress).
- A *restart* episode (a restart-only server's) never parks and never blocks; prepare reports it
  in ``restarts`` so the controller leaves it out of the commit; it is never exported.
- A *restored* episode is a checkpoint record installed under its next attempt, pending until
  the replacement ``/run`` of exactly that attempt claims it and continues from its boundary.
- (ext) A finished episode's reply is kept, keyed by its capture key, until the controller
  ``forget``s the rollout or retires the attempt, so a ``/run`` of the same attempt whose reply
  was lost is answered from it (replayed) instead of running again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rl_gym_actors.errors import AdmissionClosed, DuplicateExecution, StaleAttempt
from rl_gym_actors.gym.v2.machine import RetiredMarks
from rl_gym_actors.gym.v2.wire import ADMISSION_CLOSED, EpisodeId, PrepareReport

RUNNING, PARKED, RESTART = "running", "parked", "restart"
CLOSED = "agent admission is closed for a checkpoint"  # 409 admission_closed, as Gym's agent


@dataclass
class Episode:
    episode_id: EpisodeId
    state: str = RUNNING
    boundary: Any = None  # the latest progress the agent reported (None: its start)
    continuation: Any = None  # restored progress this attempt continues from
    retiring: bool = False  # retire is stopping it: blocks prepare until it is gone


@dataclass(frozen=True, slots=True)
class Replay:
    reply: bytes  # the kept reply of the same attempt: answer it, run nothing


@dataclass(frozen=True, slots=True)
class Start:
    episode: Episode


@dataclass
class EpisodeTable:
    """Every episode of one participant (see the module docstring)."""

    restart_only: bool = False
    keep_replies: bool = True  # (ext) False when an owner behind keeps them (``--protocol both``)
    export_every_session: bool = False  # as NeMo Gym's agent: the scope limits restored ones only
    accepting: bool = True
    retired: RetiredMarks = field(default_factory=RetiredMarks)
    live: dict[str, Episode] = field(default_factory=dict)
    restored: dict[str, Episode] = field(default_factory=dict)  # by rollout id, next attempt
    kept: dict[str, dict[int, bytes]] = field(default_factory=dict)  # (ext) rollout -> attempt

    # ------------------------------------------------------------ data plane

    def admit(self, episode_id: EpisodeId, *, replacement_open: bool) -> Replay | Start:
        """Admit a ``/run`` of ``episode_id``. ``replacement_open``: a restored episode's
        replacement may start while admission is closed (the phase is ``restored``); it parks
        at its first boundary until resume."""
        self.retired.check(episode_id)
        kept = self.kept.get(episode_id.rollout_id, {}).get(episode_id.attempt)
        if kept is not None:
            return Replay(kept)
        rollout = episode_id.rollout_id
        current = self.live.get(rollout)
        if current is not None:
            if current.episode_id == episode_id:
                raise DuplicateExecution(f"{episode_id} is running", status=409)
            if current.episode_id.attempt > episode_id.attempt:
                raise StaleAttempt(f"{current.episode_id} is running", status=409)
            raise DuplicateExecution(f"{current.episode_id} is still running", status=409)
        restored = self.restored.get(rollout)
        if restored is not None:
            if restored.episode_id.attempt > episode_id.attempt:
                raise StaleAttempt(f"{rollout} continues as {restored.episode_id}", status=409)
            if restored.episode_id == episode_id:
                if not (self.accepting or replacement_open):
                    raise AdmissionClosed(CLOSED, status=409, code=ADMISSION_CLOSED)
                del self.restored[rollout]
                restored.boundary = restored.continuation
                self.live[rollout] = restored
                return Start(restored)
            del self.restored[rollout]  # a later attempt starts over: the restored one is moot
        if not self.accepting and not self.restart_only:
            raise AdmissionClosed(CLOSED, status=409, code=ADMISSION_CLOSED)
        episode = Episode(episode_id, state=RESTART if self.restart_only else RUNNING)
        self.live[rollout] = episode
        return Start(episode)

    def is_current(self, episode: Episode) -> bool:
        return self.live.get(episode.episode_id.rollout_id) is episode

    def at_boundary(self, episode: Episode, progress: Any) -> bool:
        """Record ``progress``; True when the episode must park now."""
        episode.boundary = progress
        if episode.state == RESTART or self.accepting:
            return False
        episode.state = PARKED
        return True

    def unpark(self, episode: Episode) -> bool:
        """After a wake-up: True when it may run on (else it stays parked)."""
        if self.accepting and episode.state == PARKED:
            episode.state = RUNNING
        return episode.state != PARKED

    def finish(self, episode: Episode, reply: bytes | None) -> None:
        """The run ended: with its reply (kept), or without one (the agent failed)."""
        if self.is_current(episode):
            del self.live[episode.episode_id.rollout_id]
            if (
                reply is not None
                and self.keep_replies
                and not self.retired.refused(episode.episode_id)
            ):
                e = episode.episode_id
                self.kept.setdefault(e.rollout_id, {})[e.attempt] = reply

    # ------------------------------------------------------------ control plane

    def close(self) -> None:
        self.accepting = False

    def open(self) -> None:
        self.accepting = True
        for episode in self.live.values():
            if episode.state == PARKED:
                episode.state = RUNNING

    def readiness(self) -> PrepareReport:
        blockers = sorted(
            e.episode_id.capture_key for e in self.live.values() if e.retiring or e.state == RUNNING
        )
        restarts = sorted(
            e.episode_id.capture_key for e in self.live.values() if e.state == RESTART
        )
        parked = sum(e.state == PARKED for e in self.live.values())
        return PrepareReport.model_validate(
            {
                "ready": not blockers,
                "blockers": blockers,
                "counts": {
                    "episodes": len(self.live),
                    "parked": parked,
                    "restored_pending": len(self.restored),
                    "kept_replies": sum(len(k) for k in self.kept.values()),
                },
                "restarts": restarts,
            }
        )

    def ready(self) -> bool:
        return not any(e.retiring or e.state == RUNNING for e in self.live.values())

    def retire(self, episode_id: EpisodeId) -> list[Episode]:
        """Drop what is not running of ``episode_id`` and earlier attempts (restored state,
        kept replies); return the live episodes to stop (marked as retiring)."""
        rollout, attempt = episode_id.rollout_id, episode_id.attempt
        restored = self.restored.get(rollout)
        if restored is not None and restored.episode_id.attempt <= attempt:
            del self.restored[rollout]
        kept = self.kept.get(rollout)
        if kept is not None:
            for a in [a for a in kept if a <= attempt]:
                del kept[a]
            if not kept:
                del self.kept[rollout]
        live = self.live.get(rollout)
        if live is None or live.episode_id.attempt > attempt:
            return []
        live.retiring = True
        return [live]

    def gone(self, episode: Episode) -> None:
        """A retired episode's task has ended."""
        if self.is_current(episode):
            del self.live[episode.episode_id.rollout_id]

    def forget(self, rollout_ids: Iterable[str]) -> None:
        ids = set(rollout_ids)
        self.retired.forget(ids)
        for rollout_id in ids:
            self.kept.pop(rollout_id, None)

    def export(self, scope: set[EpisodeId] | None) -> list[dict[str, Any]]:
        """Records of every parked episode the scope names (all without a scope: Gym exports
        within the commit's scope, and NeMo RL's adapter refuses an export outside it), and of
        restored ones still pending that the scope continues (under their replacement attempt,
        the one the scope names). With ``export_every_session`` every parked episode is
        exported, as NeMo Gym's agent participant exports every live session: on a shared
        server the answer names other runs' episodes too."""
        live_scope = None if self.export_every_session else scope
        records = [
            record(e.episode_id, e.boundary)
            for e in self.live.values()
            if e.state == PARKED
            and not e.retiring
            and (live_scope is None or e.episode_id in live_scope)
        ]
        for e in self.restored.values():
            if scope is None or e.episode_id in scope:
                records.append(record(e.episode_id, e.continuation))
        return sorted(records, key=lambda r: r["episode_id"]["rollout_id"])

    def restored_pending(self) -> list[EpisodeId]:
        return [e.episode_id for e in self.restored.values()]

    def delete_restored(self, episode_id: EpisodeId) -> None:
        e = self.restored.get(episode_id.rollout_id)
        if e is not None and e.episode_id == episode_id:
            del self.restored[episode_id.rollout_id]

    def install(self, records: list[tuple[EpisodeId, Any]]) -> list[str]:
        """Install checkpointed attempts under their next attempt; their capture keys."""
        for episode_id, boundary in records:
            nxt = episode_id.next_attempt()
            self.restored[nxt.rollout_id] = Episode(nxt, continuation=boundary)
        return sorted(e.next_attempt().capture_key for e, _ in records)


def record(episode_id: EpisodeId, progress: Any) -> dict[str, Any]:
    """One exported episode, in the fields of Gym's agent session record: a ``/run`` episode
    (``episode`` not null, so it owns itself) with its progress as ``boundary``."""
    return {
        "episode_id": {"rollout_id": episode_id.rollout_id, "attempt": episode_id.attempt},
        "session_key": episode_id.rollout_id,
        "session": {},
        "boundary": progress,
        "episode": {"progress": progress},
        "owner": None,
        "session_id": None,
    }
