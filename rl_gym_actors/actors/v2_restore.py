"""A trainer restored from a checkpoint continues the Gym v2 episodes it exported.

A checkpoint's part names, per v2 server, the attempts the commit exported (parked at a
boundary) and those this run had in flight there that it did not export (restarts)
(:class:`~rl_gym_actors.core.checkpoint_report.V2EndpointScope`). :func:`restore` brings the
servers back to that cut for a new trainer of the same run, before it sends any row:

1. on every v2 server, this run's attempts are retired: each attempt the checkpoint names
   (exported or not; the dead trainer may have run it on past its boundary, or finished it) and
   every episode the server reports running that is this run's (``own``) and that no live owner
   of the new trainer holds (a dead trainer's, started after the checkpoint). Gym restores only
   into a participant with no live episode, and nothing of them may run on;
2. the servers with exported episodes restore them, all or nothing: each installs its episodes
   under their next attempt (checked: each answer names the checkpoint and exactly those
   replacements) and is resumed. If any fails, the replacement attempts are retired on every one
   of them, each is resumed, and those rollouts start over from their inputs;
3. the report says which attempt each rollout's next row runs: a restored one continues as its
   replacement on the server that holds it; every other one starts over as the attempt after the
   last one retired. Restored episodes stay in the next commits' scope until their replacement
   starts (:class:`~rl_gym_actors.actors.v2_gate.RestoredPending`).

An interrupted restore is finished, not repeated: a restorer of this run killed after its
restore (and its resume, which the next trainer's start does for it otherwise: see
:mod:`.checkpoint_abort`) left its replacement attempts installed on the server, pending
(``restored_pending`` in the status). On a server where this run has such episodes, nothing is
installed again (Gym restores only into a participant without them): those the checkpoint
exported are taken over as they are (their replacement ``/run`` continues from the boundary),
and any other is retired (it starts over). A server whose status does not list
``restored_pending`` at all (NeMo Gym's agent participant: its status has ``accepting`` only)
cannot say whether a dead restorer installed anything, so before its restore the replacement
attempts of the episodes it is about to restore are cleared there: retired (which frees any such
install) and then forgotten (so the replacement the restore installs again is not refused). A
restore then finds the participant without them and installs them afresh from the checkpoint.

Every retire is recorded in the book, so the rollouts are forgotten once finished for good.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence

from rl_gym_actors.actors.v2_gate import RestoredPending
from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.core.attempt_book import AttemptBook
from rl_gym_actors.core.checkpoint_report import EndpointRestore, RestoreReport, V2EndpointScope
from rl_gym_actors.errors import RlGymError
from rl_gym_actors.gym.v2 import coordinate
from rl_gym_actors.gym.v2.coordinate import Participant
from rl_gym_actors.gym.v2.wire import EpisodeId

logger = logging.getLogger(__name__)

STATUS_ROUNDS = 20  # status reads per server while it still reports this run's episodes


async def restore(
    book: AttemptBook,
    targets: Sequence[tuple[GymEndpoint, Participant]],
    scopes: Sequence[V2EndpointScope],
    *,
    restore_id: str,
    source_checkpoint_id: str,
    deadline_ts: float,
    own: Callable[[str], bool] | None,
    pending: RestoredPending,
    clock: Callable[[], float] = time.time,
) -> RestoreReport:
    """See the module docstring. ``targets``: every v2 server of the trainer; ``scopes``: the
    checkpoint's (a scope naming a server not among them is not restored: its rollouts start
    over)."""
    by_url = {s.endpoint: s for s in scopes}
    urls = {ep.url for ep, _ in targets}
    next_attempts: dict[str, int] = {}

    def start_over(rid: str, attempt: int) -> None:
        next_attempts[rid] = max(next_attempts.get(rid, 0), attempt)

    for scope in scopes:
        if scope.endpoint not in urls:
            logger.warning("restore %s: %s is not a v2 server now", restore_id, scope.endpoint)
        for key in (*scope.exported, *scope.start_over):
            e = EpisodeId.from_capture_key(key)
            start_over(e.rollout_id, e.attempt + 1)
    left = await asyncio.gather(
        *(_left_pending(part, restore_id, deadline_ts, own) for _, part in targets)
    )
    taken: dict[str, list[EpisodeId]] = {}  # url -> replacements taken over as they are
    drop: dict[str, list[EpisodeId]] = {}  # url -> this run's other pending ones: retired
    unlisted: dict[str, list[EpisodeId]] = {}  # url -> replacements to clear (status lists none)
    for (ep, _), pending_there in zip(targets, left, strict=True):
        if pending_there is None:
            found = by_url.get(ep.url)
            if found is not None and found.exported:
                unlisted[ep.url] = sorted({_next(k) for k in found.exported}, key=_key)
            continue
        if not pending_there:
            continue
        found = by_url.get(ep.url)
        continued = set() if found is None else {_next(k) for k in found.exported}
        taken[ep.url] = sorted((e for e in pending_there if e in continued), key=_key)
        drop[ep.url] = sorted((e for e in pending_there if e not in continued), key=_key)
    retired = await asyncio.gather(
        *(
            _retire_own(
                book, ep, part, by_url.get(ep.url), restore_id, deadline_ts, own, drop.get(ep.url)
            )
            for ep, part in targets
        )
    )
    for done in retired:
        for rid, att in done:
            start_over(rid, att + 1)
    await asyncio.gather(
        *(
            _clear_replacements(part, restore_id, unlisted[ep.url], deadline_ts)
            for ep, part in targets
            if ep.url in unlisted
        )
    )
    asked = [(ep, part, by_url[ep.url]) for ep, part in targets if by_url.get(ep.url)]
    asked = [(ep, part, scope) for ep, part, scope in asked if scope.exported]
    asked = [(ep, part, scope) for ep, part, scope in asked if ep.url not in taken]
    entries = {
        ep.url: EndpointRestore(
            endpoint=ep.url,
            label=ep.label,
            retired=len(done),
            taken_over=[e.capture_key for e in taken.get(ep.url, [])],
        )
        for (ep, _), done in zip(targets, retired, strict=True)
    }
    placed: dict[str, str] = {}
    for url, replacements in taken.items():
        for e in replacements:
            pending.add(url, e.rollout_id, e.attempt)
            placed[e.rollout_id] = url
            start_over(e.rollout_id, e.attempt)
        if replacements:
            logger.warning(
                "restore %s: %d episodes an interrupted restore installed on %s continue",
                restore_id,
                len(replacements),
                url,
            )
    if not asked:
        return RestoreReport(
            restore_id=restore_id,
            source_checkpoint_id=source_checkpoint_id,
            restored=True,
            endpoints=list(entries.values()),
            next_attempts=next_attempts,
            placed=placed,
        )
    episodes = [EpisodeId.from_capture_key(k) for _, _, s in asked for k in s.exported]
    parts = [part for _, part, _ in asked]
    error: str | None = None
    try:
        answers = await coordinate.restore(
            parts,
            restore_id,
            {part.name: scope.checkpoint_dir for _, part, scope in asked},
            episodes,
            deadline_ts=deadline_ts,
            clock=clock,
        )
    except RlGymError as exc:  # coordinate retired the replacements and resumed
        error = f"{type(exc).__name__}: {exc}"
    else:
        for ep, part, scope in asked:
            answer = answers[part.name]
            want = sorted(
                EpisodeId.from_capture_key(k).next_attempt().capture_key for k in scope.exported
            )
            entries[ep.url] = entries[ep.url].model_copy(
                update={
                    "restored": list(answer.restored),
                    "source_checkpoint_id": answer.source_checkpoint_id,
                }
            )
            if answer.source_checkpoint_id != source_checkpoint_id:
                error = (
                    f"{part.name} restored from checkpoint {answer.source_checkpoint_id!r}, "
                    f"not {source_checkpoint_id!r}"
                )
            elif sorted(answer.restored) != want:
                error = f"{part.name} restored {answer.restored}, expected {want}"
        if error is None:
            try:
                await coordinate.resume(parts, restore_id, deadline_ts=max(deadline_ts, clock()))
            except RlGymError as exc:
                error = f"resume after the restore failed: {exc}"
        if error is not None:
            await _discard(parts, restore_id, episodes, deadline_ts, clock)
    replacements = [e.next_attempt() for e in episodes]
    if error is None:
        for ep, _, scope in asked:
            for key in scope.exported:
                nxt = EpisodeId.from_capture_key(key).next_attempt()
                pending.add(ep.url, nxt.rollout_id, nxt.attempt)
                placed[nxt.rollout_id] = ep.url
    else:
        logger.warning(
            "restore %s failed, %d rollouts start over: %s", restore_id, len(episodes), error
        )
        for ep, _, scope in asked:  # freed on Gym: those attempts are retired there
            for key in scope.exported:
                nxt = EpisodeId.from_capture_key(key).next_attempt()
                book.record_retired(ep.url, nxt.rollout_id, nxt.attempt)
        for e in replacements:
            start_over(e.rollout_id, e.attempt + 1)
    return RestoreReport(
        restore_id=restore_id,
        source_checkpoint_id=source_checkpoint_id,
        restored=error is None,
        error=error,
        endpoints=list(entries.values()),
        next_attempts=next_attempts,
        placed=placed,
    )


async def _discard(
    parts: list[Participant],
    restore_id: str,
    episodes: list[EpisodeId],
    deadline_ts: float,
    clock: Callable[[], float],
) -> None:
    """A restore that every server answered but that cannot stand: retire the replacements
    everywhere (freeing what was installed) and resume, as Gym's own failed restore does."""
    cleanup_by = max(deadline_ts, clock() + coordinate.CLEANUP_MIN_S)
    replacements = [e.next_attempt() for e in episodes]
    try:
        await coordinate.retire(parts, restore_id, replacements, deadline_ts=cleanup_by)
    except RlGymError as exc:
        logger.warning("restore %s: retiring the replacements failed: %s", restore_id, exc)
    try:
        await coordinate.resume(parts, restore_id, deadline_ts=cleanup_by)
    except RlGymError as exc:
        logger.warning("restore %s: resume after the failure failed: %s", restore_id, exc)


def _key(e: EpisodeId) -> str:
    return e.capture_key


def _next(capture_key: str) -> EpisodeId:
    return EpisodeId.from_capture_key(capture_key).next_attempt()


async def _left_pending(
    part: Participant, restore_id: str, deadline_ts: float, own: Callable[[str], bool] | None
) -> list[EpisodeId] | None:
    """This run's replacement attempts an earlier restore installed on ``part`` that no
    replacement claimed (its status's ``restored_pending``); None where the status has no such
    field (NeMo Gym's agent participant), none where it cannot be read."""
    try:
        status = await part.client.status(deadline_ts=deadline_ts)
    except RlGymError as exc:
        logger.warning("restore %s: status of %s failed: %s", restore_id, part.name, exc)
        return []
    extra = status.model_extra or {}
    if "restored_pending" not in extra:
        return None
    keys = extra.get("restored_pending") or []
    found = [EpisodeId.from_capture_key(k) for k in keys if isinstance(k, str)]
    return [e for e in found if own is None or own(e.rollout_id)]


async def _clear_replacements(
    part: Participant, restore_id: str, replacements: list[EpisodeId], deadline_ts: float
) -> None:
    """Retire ``replacements`` on ``part`` (freeing whatever a dead restorer of this run
    installed for them, if anything), then forget their rollouts, so the restore installs them
    afresh and their ``/run`` is admitted. Not recorded in the book: the restore installs these
    same attempts again. A failure is logged; the restore then finds them installed, fails, and
    they start over."""
    try:
        await coordinate.retire([part], restore_id, replacements, deadline_ts=deadline_ts)
        await coordinate.forget(
            [part], restore_id, {e.rollout_id for e in replacements}, deadline_ts=deadline_ts
        )
    except RlGymError as exc:
        logger.warning(
            "restore %s: clearing %d replacements on %s failed: %s",
            restore_id,
            len(replacements),
            part.name,
            exc,
        )


async def _retire_own(
    book: AttemptBook,
    endpoint: GymEndpoint,
    part: Participant,
    scope: V2EndpointScope | None,
    restore_id: str,
    deadline_ts: float,
    own: Callable[[str], bool] | None,
    also: Sequence[EpisodeId] | None = None,
) -> list[tuple[str, int]]:
    """Retire this run's attempts on one server (step 1 of the module docstring), and ``also``
    (pending replacements not continued); the (rollout id, attempt) pairs retired."""
    named = [] if scope is None else [*scope.exported, *scope.start_over]
    wanted = {(e.rollout_id, e.attempt) for e in map(EpisodeId.from_capture_key, named)}
    wanted.update((e.rollout_id, e.attempt) for e in also or ())
    done: set[tuple[str, int]] = set()
    for _ in range(STATUS_ROUNDS):
        try:
            status = await part.client.status(deadline_ts=deadline_ts)
        except RlGymError as exc:
            logger.warning("restore %s: status of %s failed: %s", restore_id, part.name, exc)
            break
        live = [
            EpisodeId.from_capture_key(k)
            for k in (*status.report.blockers, *status.report.restarts)
        ]
        wanted.update(
            (e.rollout_id, e.attempt)
            for e in live
            if (own is None or own(e.rollout_id)) and book.attempt(e.rollout_id, e.attempt) is None
        )
        todo = sorted(wanted - done)
        if not todo:
            break
        try:
            await coordinate.retire(
                [part],
                restore_id,
                [EpisodeId(rollout_id=r, attempt=a) for r, a in todo],
                deadline_ts=deadline_ts,
            )
        except RlGymError as exc:  # the restore then finds them live and fails: they start over
            logger.warning("restore %s: retiring on %s failed: %s", restore_id, part.name, exc)
            break
        for rid, att in todo:
            book.record_retired(endpoint.url, rid, att)
        done.update(todo)
    return sorted(done)
