"""Looking at a running system: a Gym server's checkpoint status and the ledgers' snapshots.

:func:`fetch_status` asks one Gym server for its status object, :func:`fetch_ledgers` every ledger
actor of a running Ray cluster for its snapshot (checking the cluster first:
:mod:`rl_gym_actors.ray_attach`); :func:`status_table`, :func:`snapshot_table` and
:func:`snapshot_summary` turn them into plain-text tables. The ``status`` and ``ledger``
commands that print them are :mod:`rl_gym_actors.cli_observe`'s.

Nothing here reads private state (status objects and snapshots only).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from rl_gym_actors.actors.runtime import LEDGER_PREFIX, RAY_NAMESPACE
from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.core.attempt_book import LedgerSnapshot
from rl_gym_actors.protocol import AttemptInfo, StatusReport

STATUS_CHECKPOINT_ID = "rlga-status"


# ---------------------------------------------------------------- tables


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces; numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [
        all(_is_number(r[i]) for r in cells[1:]) and len(cells) > 1 for i in range(len(headers))
    ]
    lines = []
    for r in cells:
        parts = [
            c.rjust(w) if num else c.ljust(w) for c, w, num in zip(r, widths, numeric, strict=True)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _attempt_rows(infos: Sequence[AttemptInfo]) -> list[list[Any]]:
    return [
        [
            i.rollout_id,
            i.attempt_index,
            i.state,
            i.completion_receipt.result_identity if i.completion_receipt else "",
        ]
        for i in infos
    ]


def status_table(
    report: StatusReport, *, url: str, checkpoint_id: str = STATUS_CHECKPOINT_ID, limit: int = 20
) -> str:
    """A Gym status object as text: the counts, then the attempts standing in a checkpoint's way
    (running or parked without a boundary, and completed but not ACKed), at most ``limit``."""
    head: list[list[Any]] = [
        ["state", report.state],
        ["ready_to_commit", _yes(report.ready_to_commit)],
        ["running", report.running],
        ["parked", report.parked],
        ["  with boundary", report.parked_with_boundary],
        ["  without boundary", report.parked_without_boundary],
        ["completed_unacknowledged", report.completed_unacknowledged],
        ["acknowledged_completed", report.acknowledged_completed],
        ["active", report.active],
    ]
    if report.checkpoint_id and report.state != "accepting":
        phase = f", {report.phase}" if report.phase else ""
        head.insert(1, ["held by checkpoint", f"{report.checkpoint_id} ({report.state}{phase})"])
    asked = (
        "" if checkpoint_id == STATUS_CHECKPOINT_ID else f"  (asked as checkpoint {checkpoint_id})"
    )
    out = [f"Gym {url}{asked}", table(["FIELD", "VALUE"], head)]
    seen: set[tuple[str, int]] = set()
    blocking: list[AttemptInfo] = []
    for info in [*report.blocking_attempts, *report.completed_unacknowledged_attempts]:
        if info.key not in seen:
            seen.add(info.key)
            blocking.append(info)
    if blocking:
        out.append("")
        out.append(f"attempts in a checkpoint's way: {len(blocking)}")
        out.append(
            table(["ROLLOUT_ID", "ATTEMPT", "STATE", "RESULT"], _attempt_rows(blocking[:limit]))
        )
        if len(blocking) > limit:
            out.append(f"... and {len(blocking) - limit} more (--limit, or --json for all)")
    if report.executions:
        by_state: dict[str, int] = {}
        for info in report.executions:
            by_state[info.state] = by_state.get(info.state, 0) + 1
        out.append("")
        out.append(
            "executions by state: " + ", ".join(f"{k} {v}" for k, v in sorted(by_state.items()))
        )
    return "\n".join(out)


def snapshot_table(name: str, snap: LedgerSnapshot) -> str:
    """A ledger snapshot as text: one row per endpoint, then the totals."""
    rows = [
        [
            e.endpoint,
            e.dispatched,
            e.running,
            e.completed_unacked,
            e.acked,
            e.tombstoned,
            e.adopted,
            "ok" if e.invariant_ok else "BROKEN",
        ]
        for e in snap.endpoints.values()
    ]
    out = [
        f"Ledger {name}",
        table(
            [
                "ENDPOINT",
                "DISPATCHED",
                "RUNNING",
                "UNACKED",
                "ACKED",
                "TOMBSTONED",
                "ADOPTED",
                "INVARIANT",
            ],
            rows,
        )
        if rows
        else "(no attempts reported yet)",
        "",
        table(
            ["TOTAL", "VALUE"],
            [
                ["rollouts", snap.rollouts],
                ["attempts", snap.attempts],
                ["reports", snap.reports],
                ["owners holding rollouts", len(snap.owners)],
                ["live owners", len(snap.live_owners)],
                ["adoptions (gate)", snap.adoptions],
                ["orphans ACKed", snap.orphans_acked],
                ["retired (gate)", snap.retired],
                ["checkpoints committed", snap.checkpoints_committed],
                ["checkpoints failed", snap.checkpoints_failed],
                ["last checkpoint", snap.last_checkpoint_id or "-"],
                ["invariant", "ok" if snap.invariant_ok else "BROKEN"],
            ],
        ),
    ]
    return "\n".join(out)


def snapshot_summary(snap: Any) -> str:
    """An orchestrator's snapshot in a few lines: the pool, the rollouts, the ledger and each
    endpoint (actor names and leases stay in ``snap.pool``)."""
    p, led, a = snap.pool, snap.ledger, snap.actors
    lines = [
        f"orchestrator {snap.orchestrator_id}: {len(p.actors)} rollout actor(s) x "
        f"{p.rollouts_per_actor} slot(s), {p.leased} leased, {p.replaced} replaced, "
        f"started in {p.startup_s:.1f} s; {snap.known_rollouts} rollouts known, "
        f"{snap.in_flight} in flight",
        f"  rollouts: {a.sealed} sealed, {a.failed} failed, {a.abandoned} abandoned; "
        f"{a.tries} tries, {a.adoptions} adopted, {a.acks} ACKed",
        f"  ledger: {led.rollouts} rollouts, {led.attempts} attempts; checkpoints "
        f"{led.checkpoints_committed} committed, {led.checkpoints_failed} failed "
        f"(last: {led.last_checkpoint_id or '-'}); book "
        f"{'consistent' if led.invariant_ok else 'BROKEN'}",
    ]
    for e in led.endpoints.values():
        lines.append(
            f"  {e.endpoint}: {e.dispatched} dispatched = {e.running} running + "
            f"{e.completed_unacked} un-ACKed + {e.acked} ACKed + {e.tombstoned} tombstoned "
            f"({e.adopted} adopted)"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- fetching


async def fetch_status(
    endpoint: GymEndpoint, checkpoint_id: str = STATUS_CHECKPOINT_ID, *, timeout_s: float = 10.0
) -> StatusReport:
    """One status call, bounded by ``timeout_s`` (retried inside it when the answer is lost),
    with the checkpoint holding the server (its id and phase) from capabilities: a status
    answer names only the id it was asked for."""
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient

    deadline_ts = time.time() + timeout_s
    async with GymClient(endpoint) as client:
        report = await client.status(checkpoint_id, deadline_ts=deadline_ts)
        caps = await client.capabilities(deadline_ts=deadline_ts)
    if caps is None:
        return report
    return report.model_copy(
        update={"checkpoint_id": caps.active_checkpoint_id, "phase": caps.phase}
    )


def fetch_ledgers(address: str | None = None, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """Every ledger actor's snapshot on the Ray cluster at ``address`` (``auto`` when None and
    RAY_ADDRESS is unset), by actor name. A ledger that does not answer maps to its error text.

    Uses the Ray connection this process already has, if any.
    """
    import ray

    if not ray.is_initialized():
        from rl_gym_actors.ray_attach import check_ray_address

        target = address or os.environ.get("RAY_ADDRESS") or "auto"
        check_ray_address(target, timeout_s)  # ray.init would retry, logging, for ~20 s
        ray.init(
            address=address or "auto",
            namespace=RAY_NAMESPACE,
            log_to_driver=False,
            logging_level=logging.ERROR,
            configure_logging=False,
        )
    names = sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a.get("namespace") == RAY_NAMESPACE and a.get("name", "").startswith(LEDGER_PREFIX)
    )
    found: dict[str, Any] = {}
    refs: dict[str, Any] = {}  # ledger name -> its snapshot's ObjectRef
    for name in names:
        try:
            refs[name] = ray.get_actor(name, namespace=RAY_NAMESPACE).snapshot.remote()
        except Exception as exc:  # gone between listing and lookup
            found[name] = f"{type(exc).__name__}: {exc}"
    deadline = time.monotonic() + timeout_s
    for name, ref in refs.items():
        try:
            found[name] = ray.get(ref, timeout=max(deadline - time.monotonic(), 0.01))
        except Exception as exc:
            found[name] = f"{type(exc).__name__}: {exc}"
    return dict(sorted(found.items()))
