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
import time
from collections.abc import Sequence
from typing import Any

from rl_gym_actors.actors.runtime import LEDGER_PREFIX, RAY_NAMESPACE
from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.core.attempt_book import LedgerSnapshot
from rl_gym_actors.gym.v2.wire import StatusAnswer as V2StatusAnswer
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
    """An orchestrator's snapshot in a few lines: the pool, what the driver received, the live
    rollout actors' counters, the ledger and each endpoint (actor names and leases stay in
    ``snap.pool``). ACKs are named where they happen: the actors' own (``ack="on_seal"``) on
    their line, every ACK of an endpoint on its line; a v2 endpoint, which has no ACK, counts
    results kept until a checkpoint and results forgotten at one instead."""
    p, led, a, got = snap.pool, snap.ledger, snap.actors, snap.received
    lines = [
        f"orchestrator {snap.orchestrator_id}: {len(p.actors)} rollout actor(s) x "
        f"{p.rollouts_per_actor} slot(s), {p.leased} leased, {p.replaced} replaced, "
        f"started in {p.startup_s:.1f} s; {snap.known_rollouts} rollouts known, "
        f"{snap.in_flight} in flight",
        f"  received by the driver: {got.sealed} sealed, {got.failed} failed, "
        f"{got.abandoned} abandoned",
        f"  rollout actors ({a.actors} alive; a dead one's counts go with it): {a.sealed} "
        f"sealed, {a.failed} failed, {a.abandoned} abandoned; {a.tries} tries, "
        f"{a.adoptions} adopted, {a.acks} ACKed by the actors themselves",
        f"  ledger: {led.rollouts} rollouts, {led.attempts} attempts; checkpoints "
        f"{led.checkpoints_committed} committed, {led.checkpoints_failed} failed "
        f"(last: {led.last_checkpoint_id or '-'}); book "
        f"{'consistent' if led.invariant_ok else 'BROKEN'}",
    ]
    protocols = getattr(snap, "protocols", {}) or {}
    for e in led.endpoints.values():
        if protocols.get(e.endpoint) == "v2":
            lines.append(
                f"  {e.endpoint} (v2, no ACK): {e.dispatched} dispatched = {e.running} running "
                f"+ {e.completed_unacked} sealed, kept until a checkpoint + {e.acked} forgotten "
                f"at a checkpoint + {e.tombstoned} tombstoned ({e.adopted} adopted)"
            )
        else:
            lines.append(
                f"  {e.endpoint}: {e.dispatched} dispatched = {e.running} running + "
                f"{e.completed_unacked} un-ACKed + {e.acked} ACKed (by the actors or a "
                f"checkpoint) + {e.tombstoned} tombstoned ({e.adopted} adopted)"
            )
    return "\n".join(lines)


# ---------------------------------------------------------------- fetching


async def fetch_status(
    endpoint: GymEndpoint, checkpoint_id: str = STATUS_CHECKPOINT_ID, *, timeout_s: float = 10.0
) -> StatusReport:
    """One agent-checkpoint status call, bounded by ``timeout_s`` (retried inside it when the
    answer is lost), with the checkpoint holding the server (its id and phase) from
    capabilities: a status answer names only the id it was asked for."""
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient

    deadline_ts = time.time() + timeout_s
    async with GymClient(endpoint) as client:
        return await _agent_status(client, checkpoint_id, deadline_ts)


async def fetch_any_status(
    endpoint: GymEndpoint, checkpoint_id: str = STATUS_CHECKPOINT_ID, *, timeout_s: float = 10.0
) -> StatusReport | V2StatusAnswer:
    """The status of a server of either protocol (``rl-gym-actors status``): what
    :func:`fetch_status` answers from a server with the agent-checkpoint routes, the v2 status
    (:class:`~rl_gym_actors.gym.v2.wire.StatusAnswer`, which names the checkpoint holding it)
    from a v2-only server (``gym serve --protocol v2``), where ``checkpoint_id`` is not used."""
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient
    from rl_gym_actors.gym.v2.discover import CheckpointProtocol, discover_protocol

    deadline_ts = time.time() + timeout_s
    async with GymClient(endpoint) as client:
        found = await discover_protocol(client, deadline_ts=deadline_ts)
        if found.protocol is CheckpointProtocol.V2 and found.status is not None:
            return found.status
        return await _agent_status(client, checkpoint_id, deadline_ts)


async def _agent_status(client: Any, checkpoint_id: str, deadline_ts: float) -> StatusReport:
    report: StatusReport = await client.status(checkpoint_id, deadline_ts=deadline_ts)
    caps = await client.capabilities(deadline_ts=deadline_ts)
    if caps is None:
        return report
    return report.model_copy(
        update={"checkpoint_id": caps.active_checkpoint_id, "phase": caps.phase}
    )


def v2_status_table(answer: V2StatusAnswer, *, url: str, limit: int = 20) -> str:
    """A v2 participant's status as text: its phase, the checkpoint holding it, its episodes,
    then the episodes in a checkpoint's way (running), at most ``limit``. v2 has no ACK."""
    extra = answer.model_extra or {}
    counts = answer.report.counts
    head: list[list[Any]] = [
        ["protocol", "v2"],
        ["kind", answer.kind],
        ["phase", answer.phase.value],
        ["ready_to_commit", _yes(answer.report.ready)],
        ["episodes", counts.get("episodes", 0)],
        ["  running (in a checkpoint's way)", answer.report.blocker_count],
        ["  parked", counts.get("parked", 0)],
        ["kept_replies", counts.get("kept_replies", extra.get("kept_replies", 0))],
        ["restored_pending", counts.get("restored_pending", 0)],
        ["retired_rollouts", answer.retired_rollouts],
    ]
    if answer.checkpoint_id:
        head.insert(3, ["held by checkpoint", f"{answer.checkpoint_id} ({answer.phase.value})"])
    out = [f"Gym {url}", table(["FIELD", "VALUE"], head)]
    blockers = answer.report.blockers
    if blockers:
        out.append("")
        out.append(f"episodes in a checkpoint's way: {answer.report.blocker_count}")
        out.append(table(["EPISODE"], [[b] for b in blockers[:limit]]))
        if answer.report.blocker_count > min(limit, len(blockers)):
            more = answer.report.blocker_count - min(limit, len(blockers))
            out.append(f"... and {more} more (--limit, or --json for the first 100)")
    return "\n".join(out)


def fetch_ledgers(address: str | None = None, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """Every ledger actor's snapshot on the Ray cluster at ``address`` (else
    ``$RAY_ADDRESS``), by actor name. A ledger that does not answer maps to its error text.

    Uses the Ray connection this process already has, if any; without one and without an
    address it raises ``RayAttachFailed`` (``no_address``) rather than take whatever Ray
    this machine runs (Ray's ``auto``), which may be another user's.
    """
    import ray

    if not ray.is_initialized():
        from rl_gym_actors.ray_attach import check_ray_address, require_address

        target = require_address(address)
        check_ray_address(target, timeout_s)  # ray.init would retry, logging, for ~20 s
        ray.init(
            address=target,
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
