"""The pure half of the NeMo RL drop-in: typed failures, rollout identity, message logs.

Nothing here imports Ray or NeMo RL, and nothing reads a clock it was not handed.

- Failures cross Ray as exceptions with one string argument. NeMo RL re-dispatches what it
  classifies as infrastructure (``TimeoutError``, ``ConnectionError`` and their subclasses) and
  counts anything else against a prompt's small data budget; :func:`failure_for` picks the class
  from the outcomes' :class:`~rl_gym_actors.failures.FailureKind` (``is_data`` or not).
- :class:`RolloutBook` gives every row a rollout id and remembers what became of it, so that RL's
  re-dispatch of a row whose earlier try finished is answered with that result (adopted) and
  not rerun, and so that no result is ever handed to RL twice. Each rollout's state moves through
  the one rollout table (:mod:`rl_gym_actors.core.rollout_record`): RUNNING, KEPT (a result
  waiting for RL), SEALED (RL had it), UNSETTLED (no result; the next claim tries again).
- :class:`StreamTimer` sums a stream's phases into RL's timing metrics. (A reply becomes a
  result in :mod:`rl_gym_actors.integrations.nemo_rl.results`.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rl_gym_actors.core.rollout_record import RolloutEvent, RolloutState, next_state
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.protocol import ATTEMPT_INDEX_FIELD, ROLLOUT_ID_FIELD, is_valid_rollout_id

ROWIDX_FIELD = "_rowidx"
# Fields that change between RL's dispatches of the same row, so they never enter its digest.
VOLATILE_FIELDS = frozenset({ROWIDX_FIELD, ROLLOUT_ID_FIELD, ATTEMPT_INDEX_FIELD})
PREFIX_MAX = 96  # leaves room for "-c<call>-r<rowidx>-<digest>" within a rollout id
DIGEST_CHARS = 12  # of the row's digest in a derived id: a changed row never reuses an id


# ---------------------------------------------------------------- failures RL understands


class RolloutFailure(Exception):
    """Base of the failures the drop-in raises to NeMo RL. Always one string argument."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)


class RolloutTransportError(RolloutFailure, ConnectionError):
    """Gym could not be reached or lost the answer: infrastructure, RL re-dispatches the row."""


class RolloutTimeoutError(RolloutFailure, TimeoutError):
    """A try ran out of its deadline: infrastructure, RL re-dispatches the row."""


class RolloutDataError(RolloutFailure):
    """Deterministic and row-specific (the agent raised, the row is invalid): a data failure."""


def failure_class(kind: FailureKind | None) -> type[RolloutFailure]:
    """The RL-facing class for an outcome's failure kind: data when the kind describes the row,
    timeout when a deadline ran out, transport otherwise (also for no kind at all)."""
    if kind is not None and kind.is_data:
        return RolloutDataError
    if kind is not None and kind.is_timeout:
        return RolloutTimeoutError
    return RolloutTransportError


def failure_for(
    failures: Sequence[tuple[int, FailureKind | None, str]], total: int
) -> RolloutFailure:
    """One exception for a stream's failed rows ``[(rowidx, kind, reason), ...]``.

    A data failure wins: repeating the batch would fail the same way on that row, so calling
    the whole stream infrastructure would spend RL's re-dispatch budget for nothing. Among
    infrastructure failures a transport error wins over a timeout (both are re-dispatched).
    """
    classes = [failure_class(kind) for _, kind, _ in failures]
    if RolloutDataError in classes:
        cls: type[RolloutFailure] = RolloutDataError
    elif RolloutTransportError in classes:
        cls = RolloutTransportError
    else:
        cls = RolloutTimeoutError
    shown = "; ".join(f"row {idx}: {reason}" for idx, _, reason in failures[:5])
    more = f"; and {len(failures) - 5} more" if len(failures) > 5 else ""
    return cls(f"{len(failures)} of {total} rollouts failed: {shown}{more}")


# ---------------------------------------------------------------- identity


def row_digest(row: Mapping[str, Any], volatile: Iterable[str] = VOLATILE_FIELDS) -> str:
    """SHA-256 of the row's canonical JSON without its volatile fields (``_rowidx`` and the
    identity fields). Values JSON cannot encode are digested by their ``repr``."""
    skip = frozenset(volatile)
    content = {k: v for k, v in row.items() if k not in skip}
    text = json.dumps(
        content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=repr
    )
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def check_prefix(prefix: str) -> str:
    if not (is_valid_rollout_id(prefix) and len(prefix) <= PREFIX_MAX):
        raise ConfigError(
            f"rollout id prefix {prefix!r} must be a valid rollout id of at most "
            f"{PREFIX_MAX} characters"
        )
    return prefix


class ClaimAction(StrEnum):
    START = "start"  # dispatch the rollout (the orchestrator picks its tries)
    REUSE = "reuse"  # a task for this rollout exists (running or finished): await it


@dataclass(frozen=True, slots=True)
class Claim:
    """What to do for one row of a stream. Which try a START begins with is not the book's to
    know: the orchestrator's rollout memory decides (it retires and adopts the last try first)."""

    rowidx: int
    rollout_id: str
    action: ClaimAction


@dataclass(slots=True)
class _Entry:
    rollout_id: str
    digest: str | None
    state: RolloutState  # moved only through the rollout table (core/rollout_record.py)
    touched: float
    watchers: set[int] = field(default_factory=set)  # streams waiting on this rollout


@dataclass(slots=True)
class BookStats:
    started: int = 0
    reused: int = 0  # rows answered by an earlier, still held rollout
    delivered: int = 0
    lost_races: int = 0  # a shared rollout another stream handed out first
    expired: int = 0  # finished results nobody claimed in time


# which rollout of the same content a row takes: one with a result held (KEPT: handed over,
# adopted), then one running (awaited), then one without a result (its next try starts); one
# whose result RL had (SEALED) is never matched again
_RANK = {
    RolloutState.KEPT: 0,
    RolloutState.RUNNING: 1,
    RolloutState.UNSETTLED: 2,
    RolloutState.NEW: 2,
}


class RolloutBook:
    """Rows to rollouts, for one drop-in actor. One writer: the actor's event loop.

    A row that carries ``_ng_rollout_id`` keeps it (and starts at ``_ng_attempt_index`` when it
    carries one). Otherwise (NeMo RL's own rows carry only ``_rowidx``) its rollout id is derived,
    deterministically: ``<prefix>-c<call>-r<rowidx>-<digest>``, ``call`` counting the
    :meth:`claim` calls of this run (:meth:`next_call`), ``digest`` the first characters of the
    row's digest. ``prefix`` (the run id) and the call counter are the book's durable state
    (:meth:`durable_state` / :meth:`restore`): a trainer restored to a checkpoint sends the same
    calls again and gets the same ids, so results its dead instance left on Gym are adopted, not
    rerun. Identical rows (a prompt sampled several times) differ by ``_rowidx``; a re-dispatched
    row is matched to an earlier rollout of the same content that RL has not received yet,
    preferring a finished one (its result is handed over: adopted, not rerun), then one still
    running (awaited), then a failed one (its next try starts). A rollout RL received is never
    matched again.

    Streams watch the rollouts of their rows. A rollout no stream watches is preferred; one that
    another stream watches is shared rather than rerun, because that stream may be on its way
    out (RL cancelled it, and the cancellation has not arrived yet). Whoever :meth:`deliver` s a
    shared result first hands it out; the other stream claims its row again (:meth:`reclaim`).
    So no result reaches RL twice and no row is lost.
    """

    def __init__(self, prefix: str, *, hold_s: float = 1800.0, max_entries: int = 100_000) -> None:
        self.prefix = check_prefix(prefix)
        self.hold_s = hold_s
        self.max_entries = max_entries
        self._entries: dict[str, _Entry] = {}
        self._by_digest: dict[str, list[str]] = {}
        self._watching: dict[int, set[str]] = {}
        self.calls = 0  # claim calls of this run so far (restored with the run id)
        self._stream_call: dict[int, int] = {}  # the call each live stream claimed in
        self.stats = BookStats()

    def __len__(self) -> int:
        return len(self._entries)

    def state(self, rollout_id: str) -> RolloutState | None:
        """The rollout's state in the book (None: not in it): RUNNING while its task runs, KEPT
        while its result waits for RL, SEALED once RL had it, UNSETTLED after a failure."""
        entry = self._entries.get(rollout_id)
        return None if entry is None else entry.state

    def durable_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the book: the run id (``prefix``) and the call counter."""
        return {"prefix": self.prefix, "calls": self.calls}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Take the run id and call counter a checkpoint kept (see :meth:`durable_state`)."""
        calls = state.get("calls")
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 0:
            raise ConfigError(f"checkpointed call counter {calls!r} is not a count")
        self.prefix = check_prefix(str(state.get("prefix")))
        self.calls = calls

    def next_call(self) -> int:
        self.calls += 1
        return self.calls

    def claim(self, rows: Sequence[Mapping[str, Any]], stream: int, now: float) -> list[Claim]:
        """Claims for every row, in row order; one call of the run (ids derived from it).
        Raises ``RolloutDataError`` for a row with a bad ``_rowidx`` or identity, or a batch
        that names one rollout twice; nothing is claimed then (and the call is not counted)."""
        indexes = [_rowidx(row) for row in rows]
        if len(set(indexes)) != len(indexes):
            raise RolloutDataError("duplicate _rowidx in one batch")
        named = [rid for rid, _ in map(_explicit_identity, rows) if rid is not None]
        if len(set(named)) != len(named):
            raise RolloutDataError(f"duplicate {ROLLOUT_ID_FIELD} in one batch")
        call = self._stream_call[stream] = self.next_call()
        return [
            self.reclaim(row, stream, now, rowidx=i, call=call)
            for i, row in zip(indexes, rows, strict=True)
        ]

    def reclaim(
        self,
        row: Mapping[str, Any],
        stream: int,
        now: float,
        *,
        rowidx: int | None = None,
        call: int | None = None,
    ) -> Claim:
        """One row's claim (again, after another stream took the rollout it was waiting on).
        ``call`` is the claim call a new derived id is minted in (default: the stream's)."""
        index = _rowidx(row) if rowidx is None else rowidx
        rid, _ = _explicit_identity(row)
        if rid is not None:
            entry = self._entries.get(rid)
            if entry is None:
                entry = self._entries[rid] = _Entry(rid, None, RolloutState.NEW, now)
            # RL asking again for one it had (SEALED) dispatches it again below
        else:
            minted = self._stream_call.get(stream, self.calls) if call is None else call
            entry = self._by_digest_entry(row_digest(row), stream, now, minted, index)
        entry.watchers.add(stream)
        self._watching.setdefault(stream, set()).add(entry.rollout_id)
        entry.touched = now
        if entry.state in (RolloutState.RUNNING, RolloutState.KEPT):
            self.stats.reused += 1
            return Claim(index, entry.rollout_id, ClaimAction.REUSE)
        entry.state = next_state(entry.state, RolloutEvent.DISPATCH, entry.rollout_id)
        self.stats.started += 1
        return Claim(index, entry.rollout_id, ClaimAction.START)

    def _by_digest_entry(
        self, digest: str, stream: int, now: float, call: int, rowidx: int
    ) -> _Entry:
        best: _Entry | None = None
        best_key: tuple[bool, int] | None = None
        for rid in self._by_digest.get(digest, ()):
            entry = self._entries[rid]
            if entry.state not in _RANK or stream in entry.watchers:
                continue
            key = (bool(entry.watchers), _RANK[entry.state])
            if best_key is None or key < best_key:
                best, best_key = entry, key
        if best is not None:
            return best
        base = rid = derived_id(self.prefix, call, rowidx, digest)
        n = 0
        known = self._entries.get(rid)
        while known is not None and known.state is RolloutState.SEALED:
            n += 1  # a reclaim in the call that minted this id, after it was handed out
            rid = f"{base}-{n}"
            known = self._entries.get(rid)
        if known is not None:
            return known
        entry = _Entry(rid, digest, RolloutState.NEW, now)
        self._entries[rid] = entry
        self._by_digest.setdefault(digest, []).append(rid)
        return entry

    def settle(self, rollout_id: str, *, ok: bool, now: float) -> None:
        """A rollout task ended: with a result (``ok``) or without one."""
        entry = self._entries.get(rollout_id)
        if entry is None or entry.state is not RolloutState.RUNNING:
            return
        event = RolloutEvent.RESULT_KEPT if ok else RolloutEvent.NO_RESULT
        entry.state = next_state(entry.state, event, rollout_id)
        entry.touched = now

    def available(self, rollout_id: str) -> bool:
        """Whether the rollout holds a result nobody handed out yet."""
        entry = self._entries.get(rollout_id)
        return entry is not None and entry.state is RolloutState.KEPT

    def deliver(self, rollout_id: str, now: float) -> bool:
        """Hand the result to RL, never again. False when it is not there to hand out (another
        stream delivered it first): the row must be claimed again."""
        entry = self._entries.get(rollout_id)
        if entry is None or entry.state is not RolloutState.KEPT:
            self.stats.lost_races += 1
            return False
        entry.state = next_state(entry.state, RolloutEvent.HAND_OUT, rollout_id)
        entry.touched = now
        self.stats.delivered += 1
        return True

    def release(self, stream: int) -> None:
        """A stream ended (done, raised or cancelled): what it did not deliver is free again."""
        self._stream_call.pop(stream, None)
        for rid in self._watching.pop(stream, ()):
            entry = self._entries.get(rid)
            if entry is not None:
                entry.watchers.discard(stream)

    def expire(self, now: float) -> list[str]:
        """Forget delivered rollouts and unwatched finished or failed ones older than
        ``hold_s``, and the oldest beyond ``max_entries``. Returns the forgotten ids whose
        results were never handed out (their tasks can be dropped)."""

        def idle(e: _Entry) -> bool:
            return not e.watchers and e.state is not RolloutState.RUNNING

        doomed = [e for e in self._entries.values() if idle(e) and now - e.touched > self.hold_s]
        overflow = len(self._entries) - len(doomed) - self.max_entries
        if overflow > 0:
            chosen = {id(e) for e in doomed}
            spare = sorted(
                (e for e in self._entries.values() if idle(e) and id(e) not in chosen),
                key=lambda e: (e.state is not RolloutState.SEALED, e.touched),
            )
            doomed += spare[:overflow]
        dropped: list[str] = []
        for entry in doomed:
            del self._entries[entry.rollout_id]
            if entry.digest is not None:
                ids = self._by_digest.get(entry.digest, [])
                if entry.rollout_id in ids:
                    ids.remove(entry.rollout_id)
                if not ids:
                    self._by_digest.pop(entry.digest, None)
            if entry.state is RolloutState.KEPT:
                self.stats.expired += 1
            if entry.state is not RolloutState.SEALED:
                dropped.append(entry.rollout_id)
        return dropped


def derived_id(prefix: str, call: int, rowidx: int, digest: str) -> str:
    """The rollout id of a row without one: run id, call of the run, row index, row digest."""
    return f"{prefix}-c{call}-r{rowidx}-{digest[:DIGEST_CHARS]}"


def _rowidx(row: Any) -> int:
    if not isinstance(row, Mapping):
        raise RolloutDataError(f"a rollout row must be a dict, not {type(row).__name__}")
    value = row.get(ROWIDX_FIELD)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RolloutDataError(f"every row needs an integer {ROWIDX_FIELD}, got {value!r}")
    return value


def _explicit_identity(row: Mapping[str, Any]) -> tuple[str | None, int | None]:
    rid = row.get(ROLLOUT_ID_FIELD)
    attempt = row.get(ATTEMPT_INDEX_FIELD)
    if rid is not None and not is_valid_rollout_id(rid):
        raise RolloutDataError(f"invalid {ROLLOUT_ID_FIELD} {rid!r}")
    if attempt is not None and (
        isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0
    ):
        raise RolloutDataError(f"invalid {ATTEMPT_INDEX_FIELD} {attempt!r}")
    return rid, attempt


@dataclass(slots=True)
class StreamTimer:
    """Seconds spent per phase of one stream, reported as RL's ``timing_metrics``."""

    prefix: str
    totals: dict[str, float] = field(default_factory=dict)

    def add(self, phase: str, seconds: float) -> None:
        key = f"{self.prefix}/{phase}" if self.prefix else phase
        self.totals[key] = self.totals.get(key, 0.0) + seconds

    def metrics(self, total_s: float) -> dict[str, float]:
        out = dict(self.totals)
        post = out.get(
            f"{self.prefix}/postprocess_results" if self.prefix else "postprocess_results", 0.0
        )
        key = f"{self.prefix}/postprocess_results_pct" if self.prefix else "postprocess_results_pct"
        out[key] = 100.0 * post / total_s if total_s > 0 else 0.0
        return out
