"""Fault storm: the same batches with a fraction of tries losing their reply, through this project's
orchestrator and through the "as-is" policy (:mod:`rl_gym_actors.testing.asis`), with a
checkpoint after every batch.

A reply is lost on each of three paths and by a dropped connection:

- ``deadline``: the first try works past ``rollout_s`` (``first_try_sleep_s`` 3 s, ``rollout_s``
  2 s; later tries are quick);
- ``fail_fast``: the batch is abandoned because another row failed (one failing row, and the
  chosen rows still working when it fails);
- ``receipt``: the receipt fetch after ``/run`` times out (``receipt_delay_s`` above ``receipt_s``);
- ``drop``: the connection drops after Gym finished and stored the reply (``drop_reply``).

Fractions 0 %, 1 %, 5 % and 20 % of the rows (quick mode: 0 %, 1 % and 20 %). Each policy gets its
own fresh Gym server (a subprocess whose agent, ``benchmarks/metered_agent.py``, logs every run and
the seconds it worked); the batches run in the same order for both. The as-is policy
(``rl_gym_actors.testing.asis``) gets its kindest reading: ``drop_reply`` and ``receipt_delay_s``
hit the first try only. Its checkpoint prepares with a short deadline and, on a 409, resumes and
counts the checkpoint as blocked.

The server's truth is read through its own routes, never from either policy's account: its
status (running, completed and un-ACKed) and, per try, its receipt route (which tries ended
ACKed, completed, or tombstoned).

    .venv/bin/python benchmarks/fault_storm.py [--quick]
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import common
from common import Result, bench_main, progress

from rl_gym_actors.config import TryPolicy
from rl_gym_actors.protocol import ROLLOUT_ID_FIELD
from rl_gym_actors.testing.polling import wait_for

QUICK = dict(  # quick (`make bench`): the rarest and the densest fault; full adds 5 %
    rows=100,
    fractions=[0.01, 0.2],
    paths=["deadline", "fail_fast", "receipt", "drop"],
    actors=4,
)
FULL = dict(
    rows=400,
    fractions=[0.01, 0.05, 0.2],
    paths=["deadline", "fail_fast", "receipt", "drop"],
    actors=8,
)
POLICY = TryPolicy(rollout_s=2.0, receipt_s=1.0, max_tries=2, control_s=10.0, admission_wait_s=30.0)
BASE_SLEEP_S = 0.05
FIRST_TRY_SLEEP_S = 3.0  # > rollout_s, first try only
RECEIPT_DELAY_S = 2.0  # > receipt_s
FAIL_AT_S = 0.3  # the failing row fails after this long ...
SLOW_SLEEP_S = 1.5  # ... while the chosen rows are still working (< rollout_s)
ASIS_PREPARE_S = 0.5
OURS_CHECKPOINT_S = 20.0


def make_rows(prefix: str, path: str, fraction: float, n: int) -> tuple[list[dict], bool, int]:
    """The batch, whether it runs fail_fast, and how many rows carry the fault."""
    rows = [
        {
            ROLLOUT_ID_FIELD: f"{prefix}-{i}",
            "sleep_s": BASE_SLEEP_S,
            "reward": round(0.5 + i / (2 * n), 4),
        }
        for i in range(n)
    ]
    k = 0 if fraction == 0 else max(1, round(fraction * n))
    step = n / k if k else 0
    chosen = [int(j * step) for j in range(k)]
    for i in chosen:
        row = rows[i]
        if path == "deadline":
            row["first_try_sleep_s"] = FIRST_TRY_SLEEP_S
        elif path == "fail_fast":
            row["sleep_s"] = SLOW_SLEEP_S
        elif path == "receipt":
            row["receipt_delay_s"] = RECEIPT_DELAY_S
        elif path == "drop":
            row["drop_reply"] = True
    fail_fast = path == "fail_fast" and k > 0
    if fail_fast:
        # the failing row goes first among the unchosen, so that it is dispatched at once
        free = next(i for i in range(n) if i not in set(chosen))
        rows[free].update(fail=True, sleep_s=FAIL_AT_S)
    return rows, fail_fast, k


def _server_truth(endpoint: Any) -> dict[str, int]:
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient

    async def go() -> Any:
        async with GymClient(endpoint) as client:
            return await client.status("fault-storm-probe", deadline_ts=time.time() + 30)

    st = asyncio.run(go())
    return {"running": st.running, "completed_unacknowledged": st.completed_unacknowledged}


def _try_states(endpoint: Any, keys: list[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """Each try's state on Gym by its receipt route: acknowledged, completed, running,
    tombstoned or unknown."""
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient
    from rl_gym_actors.testing.inspect_gym import key_state

    async def go() -> dict[tuple[str, int], str]:
        out: dict[tuple[str, int], str] = {}
        sem = asyncio.Semaphore(32)
        async with GymClient(endpoint, control_limit=32) as client:

            async def one(key: tuple[str, int]) -> None:
                async with sem:
                    out[key] = await key_state(client, *key, timeout_s=30)

            await asyncio.gather(*(one(k) for k in keys))
        return out

    return asyncio.run(go())


def _batch_metrics(
    prefix: str,
    rows: list[dict],
    outcomes: list[Any],
    meter: Any,
    states: dict[tuple[str, int], str],
) -> dict[str, Any]:
    runs = {k: v for k, v in meter.runs.items() if k[0].startswith(prefix + "-")}
    used = {(o.rollout_id, o.attempt_index) for o in outcomes if o.receipt is not None}
    starts = sum(len(v) for v in runs.values())
    rollouts_run = len({k[0] for k in runs})
    wasted = sum(sec for key, v in runs.items() for sec, _ in v if key not in used)
    mine = {k: v for k, v in states.items() if k[0].startswith(prefix + "-")}
    acked = Counter(k[0] for k, v in mine.items() if v == "acknowledged")
    finished = Counter(k[0] for k, v in mine.items() if v in ("acknowledged", "completed"))
    status = Counter(o.status for o in outcomes)
    return {
        "sealed": status["sealed"],
        "failed": status["failed"],
        "abandoned": status["abandoned"],
        "with_result": sum(1 for o in outcomes if o.receipt is not None),
        "adopted": sum(1 for o in outcomes if o.adopted),
        "agent_runs": starts,
        "runs_per_rollout": starts / len(rows),
        "reruns": starts - rollouts_run,
        "agent_s_wasted": wasted,
        "rewards_counted_twice": sum(1 for c in acked.values() if c > 1),
        "finished_twice_on_gym": sum(1 for c in finished.values() if c > 1),
        "unacked_tries": sum(1 for v in mine.values() if v == "completed"),
    }


def _wait_quiet(meter_path: Path, timeout_s: float = 30.0) -> Any:
    from metered_agent import read_meter

    wait_for(
        lambda: read_meter(meter_path).running == 0,
        timeout_s=timeout_s,
        interval_s=0.05,
        what="every agent run to end",
    )
    return read_meter(meter_path)


def _run_policy(name: str, p: dict, scenarios: list[tuple[str, float]], tmp: Path) -> dict:
    import os

    from metered_agent import METER_ENV

    from rl_gym_actors.errors import CheckpointFailed
    from rl_gym_actors.testing.gym_process import GymServerProcess

    meter_path = tmp / f"meter-{name}.jsonl"
    server = GymServerProcess(
        agent="benchmarks.metered_agent:agent",
        token="bench-token",
        allow_faults=True,
        env={**os.environ, METER_ENV: str(meter_path)},
    ).start()
    endpoint = server.endpoint
    n = p["rows"]
    batches: list[dict[str, Any]] = []
    loop = asyncio.new_event_loop()
    orch = runner = None
    try:
        if name == "ours":
            from rl_gym_actors.orchestrator import Orchestrator

            orch = Orchestrator(
                [endpoint],
                policy=POLICY,
                pool_size=p["actors"],
                rollouts_per_actor=math.ceil(n / p["actors"]),
                progress=False,
                orchestrator_id="bench-storm",
            )
        else:
            from rl_gym_actors.testing.asis import AsIsRunner

            runner = AsIsRunner([endpoint], POLICY, concurrency=n, transient_faults=True)
        for b, (path, fraction) in enumerate(scenarios):
            prefix = f"{name}{b}"
            rows, fail_fast, k = make_rows(prefix, path, fraction, n)
            t0 = time.perf_counter()
            if orch is not None:
                outcomes = orch.run_batch(rows, fail_fast=fail_fast)
            else:
                outcomes = loop.run_until_complete(runner.run_batch(rows, fail_fast=fail_fast))
            batch_s = time.perf_counter() - t0
            cid, cdir = f"{prefix}-ckpt", str(tmp / f"{prefix}-ckpt")
            t1 = time.perf_counter()
            if orch is not None:
                try:
                    report = orch.checkpoint(cid, cdir, deadline_s=OURS_CHECKPOINT_S)
                    committed, detail = (
                        True,
                        {
                            "adopted": report.adopted,
                            "orphans_acked": report.orphans_acked,
                            "retired": report.retired,
                        },
                    )
                except CheckpointFailed as exc:
                    committed, detail = False, {"error": str(exc)[:300]}
            else:
                ck = loop.run_until_complete(runner.checkpoint(cid, cdir, prepare_s=ASIS_PREPARE_S))
                committed, detail = ck.committed, {}
            ckpt_s = time.perf_counter() - t1
            truth = _server_truth(endpoint)
            batches.append(
                {
                    "policy": name,
                    "path": path,
                    "fraction": fraction,
                    "faulty_rows": k,
                    "batch_s": batch_s,
                    "checkpoint_s": ckpt_s,
                    "committed": committed,
                    "checkpoint_detail": detail,
                    "left_unacked": truth["completed_unacknowledged"],
                    "left_running": truth["running"],
                    "_prefix": prefix,
                    "_rows": rows,
                    "_outcomes": outcomes,
                }
            )
            progress(
                f"{name} {path} {fraction:.0%}: batch {batch_s:.2f}s, checkpoint "
                f"{'committed' if committed else 'BLOCKED'}, un-ACKed left "
                f"{truth['completed_unacknowledged']}, running {truth['running']}"
            )
        meter = _wait_quiet(meter_path)
        keys = [
            (r[ROLLOUT_ID_FIELD], a)
            for b in batches
            for r in b["_rows"]
            for a in range(POLICY.max_tries)
        ]
        states = _try_states(endpoint, keys)
        for b in batches:
            b.update(
                _batch_metrics(b.pop("_prefix"), b.pop("_rows"), b.pop("_outcomes"), meter, states)
            )
        final = _server_truth(endpoint)
    finally:
        if orch is not None:
            orch.close()
        if runner is not None:
            loop.run_until_complete(runner.close())
        loop.close()
        server.stop()
    return {"batches": batches, "final": final}


def body(result: Result, args: Any) -> None:
    p, scenarios = common.storm_plan(result, args, QUICK, FULL, POLICY)
    with common.ray_and_tmp("rlga-bench-storm-") as tmp:
        runs = {name: _run_policy(name, p, scenarios, tmp) for name in ("ours", "as-is")}
    rows = [b for name in ("ours", "as-is") for b in runs[name]["batches"]]
    result.rows = rows
    result.extra["final_server_state"] = {k: v["final"] for k, v in runs.items()}
    summary = []
    for name in ("ours", "as-is"):
        bs = runs[name]["batches"]
        summary.append(
            [
                name,
                f"{sum(b['committed'] for b in bs)} of {len(bs)}",
                runs[name]["final"]["completed_unacknowledged"],
                runs[name]["final"]["running"],
                sum(b["agent_runs"] for b in bs) / (len(bs) * p["rows"]),
                sum(b["reruns"] for b in bs),
                sum(b["agent_s_wasted"] for b in bs),
                sum(b["rewards_counted_twice"] for b in bs),
                sum(b["finished_twice_on_gym"] for b in bs),
                sum(b["with_result"] for b in bs),
                sum(b["adopted"] for b in bs),
            ]
        )
    result.extra["summary"] = summary
    result.add_table(
        f"{len(scenarios)} batches of {p['rows']} rows per policy, a checkpoint after each "
        f"(TryPolicy rollout_s={POLICY.rollout_s}, receipt_s={POLICY.receipt_s}, "
        f"max_tries={POLICY.max_tries}); Gym's state read from its own status at the end:",
        [
            "policy",
            "checkpoints committed",
            "attempts left un-ACKed",
            "tries left running",
            "agent runs / rollout",
            "reruns",
            "agent-seconds wasted",
            "rewards counted twice",
            "rollouts finished twice on Gym",
            "rollouts with a result",
            "adopted",
        ],
        summary,
    )
    result.add_table(
        "Per batch (un-ACKed / running: Gym's count right after that batch's checkpoint, "
        "cumulative):",
        [
            "policy",
            "path",
            "faulty rows",
            "committed",
            "un-ACKed",
            "running",
            "runs/rollout",
            "reruns",
            "agent-s wasted",
            "twice counted",
            "sealed",
            "failed",
            "abandoned",
            "adopted",
            "batch s",
        ],
        [
            [
                b["policy"],
                b["path"],
                b["faulty_rows"],
                b["committed"],
                b["left_unacked"],
                b["left_running"],
                b["runs_per_rollout"],
                b["reruns"],
                b["agent_s_wasted"],
                b["rewards_counted_twice"],
                b["sealed"],
                b["failed"],
                b["abandoned"],
                b["adopted"],
                b["batch_s"],
            ]
            for b in rows
        ],
    )
    ours, asis = summary
    result.extra["headline"] = (
        f"ours committed {ours[1]} checkpoints, left {ours[2]} un-ACKed and {ours[3]} running, "
        f"{ours[7]} rewards counted twice; as-is committed {asis[1]}, left {asis[2]} un-ACKed, "
        f"reran {asis[5]} tries ({asis[6]:.1f} agent-s wasted vs {ours[6]:.1f})"
    )
    result.notes.append(
        "As-is: its first lost reply leaves a finished, un-ACKed try that no later prepare can "
        "get past, so every checkpoint after it is blocked; the finished work is rerun under the "
        "next try. Ours: a try given up on is retired first; a finished one is adopted (its "
        "stored reply replayed, sealed, ACKed: no rerun), a running one cancelled."
    )
    result.notes.append(
        "deadline path: the first try outlives rollout_s and the next one is quick; ours retires "
        "the first try at its deadline (cancelled: the agent stops), the as-is lets it run to the "
        "end and leaves it un-ACKed. fail_fast: rows still working when the failing row fails "
        "are abandoned; ours retires their tries (or adopts one that had finished), the as-is "
        "walks away from them."
    )
    result.notes.append(
        "The as-is gets its kindest reading: drop_reply and receipt_delay_s hit its first try "
        "only, so it gets its reward one try late; with persistent faults it would fail those "
        "rows and leave max_tries un-ACKed tries each."
    )


if __name__ == "__main__":
    bench_main("fault_storm", "Fault storm: this project vs the as-is policy", body)
