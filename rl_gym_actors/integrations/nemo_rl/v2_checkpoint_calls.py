"""The drop-in's Gym v2 checkpoint calls, as NeMo RL's newest coordinator calls its ``NemoGym``
actors (``gym_checkpoint_coordinator``: one ``.remote`` per actor, a ``deadline_ts`` on each).

``initialize_checkpoint_adapter`` discovers the v2 participant of every endpoint (its kind, from
``GET .../checkpoint/status``) and answers the participant summary (``instance_id``, ``members``:
``(server_name, kind)``). Then, each over every participant in Gym's order
(:mod:`rl_gym_actors.gym.v2.coordinate`):

- ``checkpoint_prepare(id, *, deadline_ts)`` -> ``prepared`` and the blockers per server (a
  prepare that is not ready leaves admission closed; the coordinator resumes);
- ``checkpoint_renew``, ``checkpoint_resume``, ``checkpoint_retire(id, episodes, *,
  deadline_ts)``, ``checkpoint_forget(id, rollout_ids, *, deadline_ts)``;
- ``checkpoint_commit(id, checkpoint_root, episodes, *, deadline_ts)``: files under
  ``<root>/gym-instances/<instance_id>/`` (a server whose kind another server shares gets a
  sub-folder named after it), and the commit summary NeMo RL's adapter builds:
  every participant's phase ``committed``, exports within the scope, a valid manifest, and the
  owned episodes: those an agent participant's records mark as sessions (a non-null
  ``episode``), the ones it exported but does not own listed as unowned;
- ``checkpoint_restore(id, checkpoint_root, episodes, *, source_checkpoint_id, deadline_ts)``:
  all or nothing; every participant must name ``source_checkpoint_id``.

The answers are NeMo RL's own types when NeMo RL is installed
(``nemo_rl.environments.gym_checkpoint_adapter``), else :mod:`.v2_shapes`' twins (same fields).
Episodes are taken as any objects with ``rollout_id`` and ``attempt``. Admission refusals of
``run_rollouts`` are :func:`.v2_shapes.admission_closed`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.gym.v2 import coordinate
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.coordinate import Participant
from rl_gym_actors.gym.v2.records import participant_dir
from rl_gym_actors.gym.v2.wire import CommitAnswer, EpisodeId
from rl_gym_actors.integrations.nemo_rl import v2_shapes
from rl_gym_actors.integrations.nemo_rl.participants import server_name


class V2CheckpointCalls:
    """Mixed into the drop-in, which provides ``endpoints`` and ``checkpoint_instance`` (NeMo
    RL's ``cfg["checkpoint_instance"]``, a ``GymCheckpointInstance`` or a mapping; None: the
    unsharded default)."""

    endpoints: list[GymEndpoint]
    checkpoint_instance: Any = None
    _v2_members: list[tuple[str, str, GymEndpoint]] | None = None  # (server, kind, endpoint)

    def _v2_instance_id(self) -> str:
        return v2_shapes.instance_id(self.checkpoint_instance)

    def _v2_require(self) -> list[tuple[str, str, GymEndpoint]]:
        if self._v2_members is None:
            raise RuntimeError("Gym checkpoint adapter has not been initialized")
        return self._v2_members

    async def _v2_call(self, work: Any) -> Any:
        """Run ``work(participants)`` over fresh clients of every discovered server."""
        from rl_gym_actors.gym.agent_checkpoint.client import GymClient

        members = self._v2_require()
        clients = [GymClient(ep) for _, _, ep in members]
        try:
            parts = [
                Participant(name, kind, V2Client(c))
                for (name, kind, _), c in zip(members, clients, strict=True)
            ]
            return await work(coordinate.ordered(parts))
        finally:
            await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)

    async def initialize_checkpoint_adapter(self) -> Any:
        """Discover every endpoint's v2 participant once; the participant summary."""
        from rl_gym_actors.gym.agent_checkpoint.client import GymClient

        if self._v2_members is None:
            named = {server_name(e, i): e for i, e in enumerate(self.endpoints)}
            clients = {name: GymClient(ep) for name, ep in named.items()}
            try:
                found = await coordinate.discover_participants(clients, deadline_ts=_soon(30.0))
            finally:
                await asyncio.gather(*(c.close() for c in clients.values()))
            self._v2_members = [(p.name, p.kind, named[p.name]) for p in found]
        return v2_shapes.participant_summary(
            self._v2_instance_id(), tuple((n, k) for n, k, _ in self._v2_members)
        )

    async def checkpoint_prepare(self, checkpoint_id: str, *, deadline_ts: float) -> Any:
        result = await self._v2_call(
            lambda parts: coordinate.prepare(parts, checkpoint_id, deadline_ts=deadline_ts)
        )
        blockers = {
            name: tuple(answer.report.blockers)
            for name, answer in result.replies.items()
            if not answer.prepared
        }
        return v2_shapes.prepare_summary(result.prepared, blockers)

    async def checkpoint_renew(self, checkpoint_id: str, *, deadline_ts: float) -> None:
        await self._v2_call(
            lambda parts: coordinate.renew(parts, checkpoint_id, deadline_ts=deadline_ts)
        )

    async def checkpoint_retire(
        self, checkpoint_id: str, episodes: Iterable[Any], *, deadline_ts: float
    ) -> None:
        ids = _episode_ids(episodes)
        await self._v2_call(
            lambda parts: coordinate.retire(parts, checkpoint_id, ids, deadline_ts=deadline_ts)
        )

    async def checkpoint_forget(
        self, checkpoint_id: str, rollout_ids: Iterable[str], *, deadline_ts: float
    ) -> None:
        ids = list(rollout_ids)
        await self._v2_call(
            lambda parts: coordinate.forget(parts, checkpoint_id, ids, deadline_ts=deadline_ts)
        )

    async def checkpoint_resume(self, checkpoint_id: str, *, deadline_ts: float) -> None:
        await self._v2_call(
            lambda parts: coordinate.resume(parts, checkpoint_id, deadline_ts=deadline_ts)
        )

    def _v2_dirs(self, checkpoint_root: str | Path) -> dict[str, str]:
        """Each server's checkpoint directory: the instance's, or a sub-folder of it named
        after the server when another server has the same kind (their files would meet)."""
        base = Path(checkpoint_root) / "gym-instances" / self._v2_instance_id()
        members = self._v2_require()
        kinds = [kind for _, kind, _ in members]
        return {
            name: str(base if kinds.count(kind) == 1 else base / name) for name, kind, _ in members
        }

    async def checkpoint_commit(
        self,
        checkpoint_id: str,
        checkpoint_root: str,
        episodes: Iterable[Any],
        *,
        deadline_ts: float,
    ) -> Any:
        ids = _episode_ids(episodes)
        dirs = self._v2_dirs(checkpoint_root)
        replies: dict[str, CommitAnswer] = await self._v2_call(
            lambda parts: coordinate.commit(
                parts, checkpoint_id, dirs, ids, deadline_ts=deadline_ts
            )
        )
        return await asyncio.to_thread(
            _commit_summary, self._v2_require(), checkpoint_id, ids, replies, dirs
        )

    async def checkpoint_restore(
        self,
        checkpoint_id: str,
        checkpoint_root: str,
        episodes: Iterable[Any],
        *,
        source_checkpoint_id: str,
        deadline_ts: float,
    ) -> None:
        ids = _episode_ids(episodes)
        dirs = self._v2_dirs(checkpoint_root)
        replies = await self._v2_call(
            lambda parts: coordinate.restore(
                parts, checkpoint_id, dirs, ids, deadline_ts=deadline_ts
            )
        )
        wrong = {
            name: answer.source_checkpoint_id
            for name, answer in replies.items()
            if answer.source_checkpoint_id != source_checkpoint_id
        }
        if wrong:
            raise RuntimeError(
                f"Gym restore {checkpoint_id} loaded another checkpoint than "
                f"{source_checkpoint_id!r}: {wrong}"
            )


def _soon(seconds: float) -> float:
    import time

    return time.time() + seconds


def _episode_ids(episodes: Iterable[Any]) -> list[EpisodeId]:
    return [EpisodeId(rollout_id=e.rollout_id, attempt=e.attempt) for e in episodes]


def _session_keys(checkpoint_dir: str, answer: CommitAnswer) -> set[str]:
    """The capture keys an agent participant's records mark as sessions (non-null
    ``episode``), read back from its files; the records' digest must be the manifest's."""
    import hashlib

    manifest = answer.manifest
    folder = participant_dir(checkpoint_dir, manifest.kind, manifest.instance)
    raw = (folder / manifest.records_file).read_bytes()
    if hashlib.sha256(raw).hexdigest() != manifest.records_sha256:
        raise RuntimeError(f"Gym agent records in {folder} do not match the commit reply")
    keys = set()
    for line in raw.splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("episode") is not None:
                keys.add(EpisodeId.model_validate(record["episode_id"]).capture_key)
    return keys


def _commit_summary(
    members: Sequence[tuple[str, str, GymEndpoint]],
    checkpoint_id: str,
    scope: Sequence[EpisodeId],
    replies: dict[str, CommitAnswer],
    dirs: dict[str, str],
) -> Any:
    """The commit summary, by the checks NeMo RL's adapter makes of Gym's replies."""
    expected = {name for name, _, _ in members}
    if set(replies) != expected:
        raise RuntimeError(f"Gym commit answered {sorted(replies)}, expected {sorted(expected)}")
    requested = {e.capture_key for e in scope}
    owned: set[str] = set()
    sessions: set[str] = set()
    environment: set[str] = set()
    parts = []
    for name, kind, _ in members:
        answer = replies[name]
        keys = tuple(sorted(set(answer.episode_ids)))
        if answer.phase.value != "committed" or len(keys) != len(answer.episode_ids):
            raise RuntimeError(f"Gym participant {name!r}: phase {answer.phase.value}, or dup ids")
        if set(keys) - requested:
            raise RuntimeError(f"Gym participant {name!r} exported outside the scope")
        m = answer.manifest
        if m.kind != kind or m.checkpoint_id != checkpoint_id or m.record_count < 0:
            raise RuntimeError(f"Gym participant {name!r}: manifest {m.kind}/{m.checkpoint_id}")
        if kind == "agent" and keys:
            sessions.update(keys)
            legacy = _session_keys(dirs[name], answer)
            if legacy - set(keys) or legacy & owned:
                raise RuntimeError(f"Gym participant {name!r}: records and reply disagree")
            owned |= legacy
        if kind == "environment":
            if environment & set(keys):
                raise RuntimeError(
                    f"Gym episodes exported twice: {sorted(environment & set(keys))}"
                )
            environment.update(keys)
        parts.append(v2_shapes.participant_commit(name, kind, keys, m.model_dump()))
    owned |= environment
    return v2_shapes.commit_summary(
        exported=sorted(owned), participants=parts, unowned=sorted(sessions - owned)
    )
