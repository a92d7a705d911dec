"""What a rollout actor counts, and the snapshot it answers with; the orchestrator sums them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class RolloutCounters(BaseModel):
    """Counters a rollout actor keeps; the orchestrator sums them over the pool."""

    model_config = ConfigDict(frozen=True)

    in_flight: int = 0
    started: int = 0
    sealed: int = 0
    failed: int = 0
    abandoned: int = 0
    tries: int = 0
    seals: int = 0
    adoptions: int = 0
    acks: int = 0
    cancelled: int = 0
    handed_over: int = 0
    adopt_requests: int = 0
    receipts_with_run: int = 0  # receipts the /run answer carried (no fetch)
    receipts_fetched: int = 0  # receipt requests (per key, or a status listing when no route)
    receipts_from_status: int = 0  # of them, status listings (a server without a per-key route)
    receipts_deferred: int = 0  # sealed on the reply's digest; the checkpoint gate's listing
    v2_kept_replies_found: int = 0  # Gym v2: lost replies found kept on our server (adopted)
    deadlines_paused: int = 0  # Gym v2: /runs whose deadline a checkpoint's parked time moved
    outage_waits: int = 0  # steps and /runs that waited out a Gym giving no answer (a restart)


class RolloutActorSnapshot(RolloutCounters):
    """A rollout actor's counters: rollouts in flight, tries, seals, adoptions and the rest."""

    name: str
    slots: int
    reports_sent: int = 0
    reports_pending: int = 0
