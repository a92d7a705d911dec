"""A trainer's rows checked and planned into dispatchable items: :class:`RowPlanner`.

A row's rollout id is ``_ng_rollout_id`` (minted ``<run_id>-<hex>`` when absent),
``_ng_attempt_index`` the first try's index, ``_ng_endpoint`` (an endpoint name or URL) its
endpoint; without it the endpoint is the one a restore left the rollout's episode on
(:attr:`RowPlanner.placed`), else chosen by a stable hash of the rollout id
(:func:`endpoint_index_for`). The rest of the row is what Gym's ``/run`` gets, and must be JSON.

How a rollout is dispatched is the rollout memory's answer
(:meth:`~rl_gym_actors.core.rollout_memory.RolloutMemory.plan`): a rollout that comes again after
ending without a sealed result starts by retiring its current try (and adopts it if it finished),
as does a row that names try k > 0 of a rollout it has not seen (try k-1 is retired first); one
whose abandoned rollout had adopted a result gets that result back without running the agent
again (:attr:`RowItem.ready`). A planned row changes nothing until its stream takes it
(:meth:`~rl_gym_actors.core.rollout_memory.RolloutMemory.take`).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.core.rollout_memory import Dispatch, RolloutMemory
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.protocol import (
    ATTEMPT_INDEX_FIELD,
    MAX_JSON_DEPTH,
    ROLLOUT_ID_FIELD,
    WIRE_INT_MAX,
    is_valid_attempt_index,
    is_valid_rollout_id,
    too_deep,
)

ENDPOINT_FIELD = "_ng_endpoint"


@dataclass
class RowItem:
    """One checked row and its plan from the rollout memory (answered already when the plan is
    ``ready``), then what came of its dispatch."""

    index: int
    rollout_id: str
    row: dict[str, Any]
    endpoint_index: int
    plan: Dispatch
    previous_attempt: int | None = None  # the plan's, or the ledger's answer for a lost rollout
    news: Outcome | None = None  # what its rollout actor answered (None: nothing new)
    lost: bool = False  # its rollout actor died, or the row was given up while it ran

    def __post_init__(self) -> None:
        self.previous_attempt = self.plan.previous_attempt

    @property
    def first_attempt(self) -> int:
        return self.plan.first_attempt

    @property
    def ready(self) -> Outcome | None:
        """A result that answers the row without a dispatch."""
        return self.plan.ready


class RowPlanner:
    """Checks rows and plans each from ``memory``. Rollout ids of the trainer's own (without
    ``<run_id>-``) are added to ``claims``: the gate learns with the next checkpoint that they are
    this run's, even if the actor that ran one died before reporting it."""

    def __init__(
        self,
        endpoints: Sequence[GymEndpoint],
        run_id: str,
        memory: RolloutMemory,
        claims: set[str],
    ) -> None:
        self.endpoints = endpoints
        self.run_id = run_id
        self._run_prefix = run_id + "-"
        self._memory = memory
        self._claims = claims
        self.placed: dict[str, int] = {}  # rollout -> endpoint a restore left its episode on

    def plan(self, rows: list[Mapping[str, Any]]) -> list[RowItem]:
        """Every row checked (ConfigError names the first bad one) before any is taken."""
        seen: set[str] = set()
        return [self.plan_row(i, row, seen) for i, row in enumerate(rows)]

    def plan_one(self, i: int, row: Any) -> RowItem:
        """One row of an open stream, checked."""
        return self.plan_row(i, row, set())

    def plan_row(self, i: int, row: Any, seen: set[str]) -> RowItem:
        if not isinstance(row, Mapping):
            raise ConfigError(f"row {i} must be a mapping, got {type(row).__name__}")
        rid = row.get(ROLLOUT_ID_FIELD)
        if rid is None:
            rid = f"{self.run_id}-{uuid.uuid4().hex}"
        if not is_valid_rollout_id(rid):
            raise ConfigError(f"row {i}: invalid {ROLLOUT_ID_FIELD} {rid!r}")
        if not rid.startswith(self._run_prefix):
            self._claims.add(rid)
        if rid in seen or self._memory.running(rid):
            raise ConfigError(f"row {i}: rollout {rid} is already in this or a running batch")
        seen.add(rid)
        first = row.get(ATTEMPT_INDEX_FIELD, 0)
        if not is_valid_attempt_index(first):
            raise ConfigError(
                f"row {i}: {ATTEMPT_INDEX_FIELD} must be an int from 0 to "
                f"{WIRE_INT_MAX}, got {first!r}"
            )
        gym_row = {
            k: v
            for k, v in row.items()
            if k not in (ENDPOINT_FIELD, ROLLOUT_ID_FIELD, ATTEMPT_INDEX_FIELD)
        }
        try:
            text = json.dumps(gym_row, allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ConfigError(f"row {i} ({rid}) is not JSON: {exc!r}"[:500]) from exc
        if too_deep(text):
            raise ConfigError(f"row {i} ({rid}) nests deeper than {MAX_JSON_DEPTH} levels")
        return RowItem(
            i, rid, gym_row, self._endpoint_for(row, rid, i), self._memory.plan(rid, first)
        )

    def _endpoint_for(self, row: Mapping[str, Any], rid: str, i: int) -> int:
        wanted = row.get(ENDPOINT_FIELD)
        if wanted is not None:
            for n, ep in enumerate(self.endpoints):
                if wanted in (ep.name, ep.url) or (
                    isinstance(wanted, str) and wanted.rstrip("/") == ep.url
                ):
                    return n
            raise ConfigError(f"row {i}: {ENDPOINT_FIELD} {wanted!r} names no endpoint")
        placed = self.placed.get(rid)
        return endpoint_index_for(rid, len(self.endpoints)) if placed is None else placed


def endpoint_index_for(rollout_id: str, n_endpoints: int) -> int:
    """The endpoint a rollout goes to when its row names none: a hash of its id that is the
    same in every process and run (SHA-256, not ``hash()``)."""
    digest = hashlib.sha256(rollout_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % n_endpoints


def row_list(rows: Any) -> list[Mapping[str, Any]]:
    """``rows`` as a list; ConfigError for a single row or a non-iterable."""
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, Iterable):
        raise ConfigError("rows must be a list (or other iterable) of row mappings")
    return list(rows)


def endpoint_list(endpoints: Sequence[GymEndpoint | str]) -> list[GymEndpoint]:
    """The orchestrator's endpoints checked: a non-empty list, URLs unique."""
    if isinstance(endpoints, (str, GymEndpoint)) or not endpoints:
        raise ConfigError("endpoints must be a non-empty list of GymEndpoint (or URLs)")
    out: list[GymEndpoint] = []
    for ep in endpoints:
        if isinstance(ep, str):
            try:
                ep = GymEndpoint(url=ep)
            except ValueError as exc:
                raise ConfigError(f"invalid endpoint {ep!r}: {exc}") from exc
        if not isinstance(ep, GymEndpoint):
            raise ConfigError(f"not a GymEndpoint: {ep!r}")
        out.append(ep)
    if len({ep.url for ep in out}) != len(out):
        raise ConfigError("endpoint URLs must be unique")
    return out
