"""Soak: does memory stay flat over a long run? Rollouts in batches through the orchestrator
(``ack="at_checkpoint"``, the default) against one durable Gym server (a subprocess with
``--state-dir``), a checkpoint every few thousand rollouts, and 5 % of the rows faulty, spread
over every way a reply gets lost plus an agent that raises:

- ``deadline``: the first try works past ``rollout_s`` (retired, then a second try);
- ``receipt``: the receipt fetch after ``/run`` times out (retired, then adopted);
- ``drop``: the connection drops after Gym stored the reply (retired, then adopted);
- ``agent_fail``: the agent raises on every try (a 5xx: ``AgentFailed``, the row fails).

After every batch it samples the resident set size (psutil) of the driver (this process), the
ledger actor, the rollout actors (summed) and the Gym server, with the committed checkpoints,
the results Gym holds un-ACKed, and the rows counted twice (a row's second sealed outcome, kept
in a bitmap sized for the whole run so that counting costs no memory as it goes). The verdict is
the growth per rollout over the second half of the run (least squares on the samples): the goal
is under 50 bytes per rollout for every process; every checkpoint commits, nothing is left
un-ACKed after the last one, nothing is counted twice, and the agent ran no row's try twice.

    .venv/bin/python benchmarks/soak.py [--quick]
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import common
from common import MB, Result, bench_main, progress

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.protocol import ROLLOUT_ID_FIELD

# quick (`make bench`): the counts (checkpoints, un-ACKed, counted twice, agent runs twice) over
# the same faults; its memory slopes are shown unjudged: a run this short still climbs (the
# 20,000 rollouts quick mode once ran read 53 B/rollout for the ledger, 128 per rollout actor and
# 298 for the Gym server over their second half; the full 200,000 read 7.5, 16 and 36.7);
# 6,000 rollouts, six checkpoints, hold `make bench` under its 8 minutes
QUICK = dict(rollouts=6_000, batch=500, checkpoint_every=1_000, actors=4, per_actor=64)
FULL = dict(rollouts=200_000, batch=2_000, checkpoint_every=5_000, actors=4, per_actor=128)
FAULTY_EVERY = 20  # one row in 20 is faulty: 5 %
PATHS = ("deadline", "receipt", "drop", "agent_fail")
POLICY = TryPolicy(rollout_s=1.0, receipt_s=0.5, max_tries=2, control_s=10.0, admission_wait_s=60.0)
GOAL_BYTES = 50
PROCESSES = ("driver", "ledger", "rollout_actors", "gym_server")


def make_row(n: int) -> dict[str, Any]:
    row: dict[str, Any] = {ROLLOUT_ID_FIELD: f"soak-{n}", "reward": (n % 100) / 100}
    if n % FAULTY_EVERY == FAULTY_EVERY - 1:
        path = PATHS[(n // FAULTY_EVERY) % len(PATHS)]
        if path == "deadline":
            row["first_try_sleep_s"] = 1.5 * POLICY.rollout_s
        elif path == "receipt":
            row["receipt_delay_s"] = 2 * POLICY.receipt_s
        elif path == "drop":
            row["drop_reply"] = True
        else:
            row["fail"] = True
    return row


def rss(gym_pid: int) -> dict[str, int]:
    """Bytes resident per process group, ours only (this process's tree, and the Gym server)."""
    import psutil

    me = psutil.Process()
    out = dict.fromkeys(PROCESSES, 0)
    out["driver"] = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            cmd = " ".join(child.cmdline())
            if cmd.startswith("ray::LedgerActor"):
                out["ledger"] += child.memory_info().rss
            elif cmd.startswith("ray::RolloutActor"):
                out["rollout_actors"] += child.memory_info().rss
        except psutil.Error:
            continue
    try:
        out["gym_server"] = psutil.Process(gym_pid).memory_info().rss
    except psutil.Error:
        pass
    return out


def agent_fail_rows(total: int) -> int:
    """How many of the first ``total`` rows carry the agent_fail fault."""
    return sum(
        1
        for n in range(FAULTY_EVERY - 1, total, FAULTY_EVERY)
        if PATHS[(n // FAULTY_EVERY) % len(PATHS)] == "agent_fail"
    )


def per_process(growth: dict[str, float | None], actors: int) -> dict[str, float | None]:
    """Growth per process: the rollout actors' summed growth spread over the actors."""
    out = dict(growth)
    if out.get("rollout_actors") is not None:
        out["rollout_actors"] = out["rollout_actors"] / actors
    return out


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of ys over xs."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var


def body(result: Result, args: Any) -> None:
    import asyncio

    from metered_agent import METER_ENV, read_meter

    from rl_gym_actors.errors import CheckpointFailed
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient
    from rl_gym_actors.orchestrator import Orchestrator
    from rl_gym_actors.testing.gym_process import GymServerProcess
    from rl_gym_actors.testing.polling import wait_for

    p = QUICK if args.quick else FULL
    result.params.update(
        p, faulty_fraction=1 / FAULTY_EVERY, paths=list(PATHS), policy=POLICY.model_dump()
    )
    common.start_ray(num_cpus=2)
    tmp = Path(tempfile.mkdtemp(prefix="rlga-bench-soak-"))
    meter_path = tmp / "meter.jsonl"
    server = GymServerProcess(
        agent="benchmarks.metered_agent:agent",
        token="bench-token",
        state_dir=tmp / "state",
        allow_faults=True,
        env={**os.environ, METER_ENV: str(meter_path)},
    ).start()
    endpoint = server.endpoint
    total = p["rollouts"]
    sealed_bits = bytearray((total + 7) // 8)  # sized once: counting costs no memory
    counted_twice = sealed = failed = 0
    failures: dict[str, int] = {}
    committed = failed_checkpoints = 0
    samples: list[dict[str, Any]] = []
    loop = asyncio.new_event_loop()
    client = GymClient(endpoint)

    def gym_unacked() -> int:
        status = loop.run_until_complete(client.status("soak-probe", deadline_ts=time.time() + 30))
        return status.completed_unacknowledged

    orch = Orchestrator(
        [endpoint],
        policy=POLICY,
        pool_size=p["actors"],
        rollouts_per_actor=p["per_actor"],
        progress=False,
        orchestrator_id="bench-soak",
    )
    t0 = time.perf_counter()
    try:
        done = 0
        since_checkpoint = 0
        while done < total:
            n = min(p["batch"], total - done)
            outcomes = orch.run_batch([make_row(i) for i in range(done, done + n)])
            for o in outcomes:
                if o.status == "sealed" and not o.repeated:
                    i = int(o.rollout_id.rsplit("-", 1)[1])
                    if sealed_bits[i >> 3] & (1 << (i & 7)):
                        counted_twice += 1
                    sealed_bits[i >> 3] |= 1 << (i & 7)
                    sealed += 1
                elif o.status != "sealed":
                    failed += 1
                    kind = o.failure.value if o.failure is not None else o.status
                    failures[kind] = failures.get(kind, 0) + 1
            del outcomes
            done += n
            since_checkpoint += n
            if since_checkpoint >= p["checkpoint_every"] or done >= total:
                since_checkpoint = 0
                try:
                    orch.checkpoint(f"soak-{done}", str(tmp / "ckpt" / str(done)), deadline_s=120.0)
                    committed += 1
                except CheckpointFailed as exc:
                    failed_checkpoints += 1
                    progress(f"checkpoint at {done} failed: {str(exc)[:200]}")
            # a sample after every batch
            samples.append(
                {
                    "rollouts": done,
                    "s": round(time.perf_counter() - t0, 1),
                    **rss(server.pid),
                    "checkpoints": committed,
                    "unacked_on_gym": gym_unacked(),
                    "counted_twice": counted_twice,
                }
            )
            last = samples[-1]
            progress(
                f"{done:,} rollouts, {last['s']:.0f}s: "
                + ", ".join(f"{k} {last[k] / MB:.1f} MB" for k in PROCESSES)
                + f"; un-ACKed {last['unacked_on_gym']}"
            )
        elapsed = time.perf_counter() - t0
        snap = orch.snapshot()
    finally:
        orch.close()
        loop.run_until_complete(client.close())
        loop.close()
    wait_for(
        lambda: read_meter(meter_path).running == 0,
        timeout_s=60,
        interval_s=0.05,
        what="every agent run to end",
    )
    meter = read_meter(meter_path)
    server.stop()
    runs_twice = sum(
        1
        for (rid, att), runs in meter.runs.items()
        if sum(1 for _, end in runs if end == "completed") > 1
    )
    half = [s for s in samples if s["rollouts"] > total / 2]
    growth = {k: slope([s["rollouts"] for s in half], [s[k] for s in half]) for k in PROCESSES}
    result.rows = samples
    result.extra.update(
        growth_bytes_per_rollout={k: None if v is None else round(v, 1) for k, v in growth.items()},
        goal_bytes_per_rollout=GOAL_BYTES,
        rollouts=total,
        sealed=sealed,
        failed=failed,
        failures_by_kind=failures,
        agent_fail_rows=agent_fail_rows(total),
        actors=p["actors"],
        rollout_actor_each_bytes_per_rollout=None
        if growth["rollout_actors"] is None
        else round(growth["rollout_actors"] / p["actors"], 1),
        counted_twice=counted_twice,
        key_runs_completed_twice=runs_twice,
        checkpoints_committed=committed,
        checkpoints_failed=failed_checkpoints,
        unacked_at_end=samples[-1]["unacked_on_gym"] if samples else None,
        rollouts_per_s=round(total / elapsed, 1),
        ledger_attempts_kept=snap.ledger.attempts,
        ledger_pruned=snap.ledger.pruned,
        known_rollouts_kept=snap.known_rollouts,
        invariant_ok=snap.ledger.invariant_ok,
        memory_judged=not args.quick,
        # per process: the rollout actors' sum divided over the actors (quick: the counts only)
        held=(
            args.quick
            or all(
                v is not None and v < GOAL_BYTES for v in per_process(growth, p["actors"]).values()
            )
        )
        and failed_checkpoints == 0
        and counted_twice == 0
        and runs_twice == 0
        and bool(samples)
        and samples[-1]["unacked_on_gym"] == 0,
    )
    result.add_table(
        "RSS (MB) after each batch; un-ACKed = completed results Gym holds then (a checkpoint "
        f"every {p['checkpoint_every']:,} rollouts releases them)",
        [
            "rollouts",
            "s",
            "driver",
            "ledger",
            "rollout actors",
            "Gym server",
            "checkpoints",
            "un-ACKed",
            "counted twice",
        ],
        [
            [
                s["rollouts"],
                s["s"],
                s["driver"] / MB,
                s["ledger"] / MB,
                s["rollout_actors"] / MB,
                s["gym_server"] / MB,
                s["checkpoints"],
                s["unacked_on_gym"],
                s["counted_twice"],
            ]
            for s in samples
        ],
    )
    each = per_process(growth, p["actors"])
    result.add_table(
        f"Growth over the second half ({len(half)} samples, least squares), bytes per rollout; "
        f"goal < {GOAL_BYTES}",
        [
            "process",
            "bytes / rollout (all its processes)",
            "bytes / rollout per process",
            "under the goal",
        ],
        [
            [
                k,
                growth[k],
                each[k],
                "not judged (quick)"
                if args.quick
                else each[k] is not None and each[k] < GOAL_BYTES,
            ]
            for k in PROCESSES
        ],
    )
    ex = result.extra
    result.notes += [
        f"{total:,} rollouts at {ex['rollouts_per_s']} /s: {sealed:,} sealed, {failed:,} failed "
        f"(by kind {failures}; {ex['agent_fail_rows']:,} are agent_fail rows, which fail by "
        f"design); "
        f"{committed} checkpoints committed, {failed_checkpoints} failed; un-ACKed on Gym after "
        f"the last: {ex['unacked_at_end']}; counted twice: {counted_twice}; keys whose agent "
        f"completed twice: {runs_twice}.",
        f"At the end the ledger's book keeps {ex['ledger_attempts_kept']} attempts "
        f"({ex['ledger_pruned']:,} pruned at committed checkpoints, counters intact: invariant "
        f"{ex['invariant_ok']}); the orchestrator remembers {ex['known_rollouts_kept']} "
        "rollout ids.",
    ]


def say(res: dict) -> str:
    ex = res.get("extra", {})
    g = ex.get("growth_bytes_per_rollout", {})
    each = per_process(g, ex.get("actors", 1)) if g else {}
    parts = ", ".join(
        f"{k} {common.fmt(v)}"
        + (
            f" ({ex.get('actors')} processes: {common.fmt(each[k])} each)"
            if k == "rollout_actors" and v is not None
            else ""
        )
        for k, v in g.items()
    )
    judged = ex.get("memory_judged", True)
    verdict = ("held" if ex.get("held") else "NOT held") if judged else "not judged in quick mode"
    return (
        f"Over {ex.get('rollouts', 0):,} rollouts (5 % faulty), memory growth in the second "
        f"half, bytes per rollout: {parts} (goal < {GOAL_BYTES}: {verdict}"
        + (
            ""
            if judged
            else ": a run this short still climbs; the full run's 200,000 rollouts are the "
            "verdict" + ("" if ex.get("held") else "; and a count below is wrong")
        )
        + f"); {ex.get('checkpoints_committed')} "
        f"checkpoints committed, {ex.get('checkpoints_failed')} failed, un-ACKed at the end "
        f"{ex.get('unacked_at_end')}, counted twice {ex.get('counted_twice')}."
    )


def plot(res: dict, ax: Any) -> None:
    rows = res.get("rows") or []
    xs = [r["rollouts"] for r in rows]
    for k, label in zip(
        PROCESSES, ("driver", "ledger", "rollout actors", "Gym server"), strict=True
    ):
        ax.plot(xs, [r[k] / MB for r in rows], "o-", ms=3, label=label)
    ax.set_xlabel("rollouts")
    ax.set_ylabel("RSS (MB)")
    ax.set_title("Soak: resident memory over the run")


if __name__ == "__main__":
    bench_main("soak", "Soak: memory over a long run with checkpoints and faults", body)
