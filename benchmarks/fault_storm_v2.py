"""Fault storm on Gym v2: the fault storm's batches (:mod:`fault_storm`) through this project's
orchestrator against ``gym serve --protocol v2``, with a checkpoint after every batch.

A reply is lost on each of three paths (v2 has no receipt, so the receipt path of the
agent-checkpoint storm does not exist here):

- ``deadline``: the first try works past ``rollout_s``; it is retired with v2's ``retire`` and
  the next try runs;
- ``fail_fast``: the batch is abandoned because another row failed; the tries still working are
  retired (or adopted when they had finished);
- ``drop``: the connection drops after Gym finished (``drop_reply``); our server keeps the reply
  ((ext)), so it is adopted through ``/run?replay_only=1``, not rerun.

Fractions 1 %, 5 % and 20 % of the rows (quick mode: 1 % and 20 %). The server (in a thread of this
process, honouring ``drop_reply``) runs ``benchmarks/metered_agent.py``, which logs every run and
how it ended. The server's truth is read from its own v2 status after each checkpoint: episodes
held, kept replies and retired marks (all three must come back to 0: the gate forgets what is
finished for good).

    .venv/bin/python benchmarks/fault_storm_v2.py [--quick]
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import common
from common import Result, bench_main, progress
from fault_storm import OURS_CHECKPOINT_S, POLICY, _wait_quiet, make_rows

PATHS = ["deadline", "fail_fast", "drop"]
QUICK = dict(rows=100, fractions=[0.01, 0.2], paths=PATHS, actors=4)  # full adds 5 %
FULL = dict(rows=400, fractions=[0.01, 0.05, 0.2], paths=PATHS, actors=8)


def _truth(server: Any) -> dict[str, int]:
    status = server.participant.status()
    return {
        "episodes": status["report"]["counts"]["episodes"],
        "kept_replies": status["kept_replies"],
        "retired_marks": status["retired_rollouts"],
    }


def _batch_metrics(prefix: str, rows: list[dict], outcomes: list[Any], meter: Any) -> dict:
    runs = {k: v for k, v in meter.runs.items() if k[0].startswith(prefix + "-")}
    sealed_keys = Counter((o.rollout_id, o.attempt_index) for o in outcomes if o.status == "sealed")
    completed = {k for k, v in runs.items() if any(end == "completed" for _, end in v)}
    # a finished run rerun: a rollout with a completed try and another run after it
    rerun_finished = sum(
        1 for k in completed if len(runs[k]) > 1 or any(r == k[0] and a > k[1] for r, a in runs)
    )
    status = Counter(o.status for o in outcomes)
    starts = sum(len(v) for v in runs.values())
    return {
        "sealed": status["sealed"],
        "failed": status["failed"],
        "abandoned": status["abandoned"],
        "failed_without_reason": sum(1 for o in outcomes if o.status == "failed" and not o.reason),
        "adopted": sum(1 for o in outcomes if o.adopted),
        "agent_runs": starts,
        "reruns": starts - len({k[0] for k in runs}),
        "finished_runs_rerun": rerun_finished,
        "counted_twice": sum(1 for c in Counter(k[0] for k in sealed_keys).values() if c > 1)
        + sum(1 for k in sealed_keys if len(runs.get(k, [])) > 1),
    }


def _run(p: dict, scenarios: list[tuple[str, float]], tmp: Path) -> dict:
    from metered_agent import METER_ENV
    from metered_agent import agent as metered

    from rl_gym_actors.errors import CheckpointFailed
    from rl_gym_actors.orchestrator import Orchestrator
    from rl_gym_actors.testing.v2_server import V2ServerThread

    meter_path = tmp / "meter-v2.jsonl"
    os.environ[METER_ENV] = str(meter_path)
    n = p["rows"]
    batches: list[dict[str, Any]] = []
    with (
        V2ServerThread(agent=metered, token="bench-token", allow_faults=True) as server,
        Orchestrator(
            [server.endpoint],
            policy=POLICY,
            pool_size=p["actors"],
            rollouts_per_actor=math.ceil(n / p["actors"]),
            progress=False,
            orchestrator_id="bench-storm-v2",
        ) as orch,
    ):
        for b, (path, fraction) in enumerate(scenarios):
            prefix = f"v2s{b}"
            rows, fail_fast, k = make_rows(prefix, path, fraction, n)
            t0 = time.perf_counter()
            outcomes = orch.run_batch(rows, fail_fast=fail_fast)
            batch_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            try:
                report = orch.checkpoint(
                    f"{prefix}-ckpt", str(tmp / f"{prefix}-ckpt"), deadline_s=OURS_CHECKPOINT_S
                )
                committed, detail = True, {"records": report.endpoints[0].commit.records}
            except CheckpointFailed as exc:
                committed, detail = False, {"error": str(exc)[:300]}
            ckpt_s = time.perf_counter() - t1
            truth = _truth(server)
            batches.append(
                {
                    "path": path,
                    "fraction": fraction,
                    "faulty_rows": k,
                    "batch_s": batch_s,
                    "checkpoint_s": ckpt_s,
                    "committed": committed,
                    "checkpoint_detail": detail,
                    **{f"left_{key}": v for key, v in truth.items()},
                    "_prefix": prefix,
                    "_rows": rows,
                    "_outcomes": outcomes,
                }
            )
            progress(
                f"v2 {path} {fraction:.0%}: batch {batch_s:.2f}s, checkpoint "
                f"{'committed' if committed else 'BLOCKED'}, left {truth}"
            )
        meter = _wait_quiet(meter_path)
        for bt in batches:
            bt.update(
                _batch_metrics(bt.pop("_prefix"), bt.pop("_rows"), bt.pop("_outcomes"), meter)
            )
        final = _truth(server)
    return {"batches": batches, "final": final}


def body(result: Result, args: Any) -> None:
    p, scenarios = common.storm_plan(result, args, QUICK, FULL, POLICY)
    with common.ray_and_tmp("rlga-bench-storm-v2-") as tmp:
        run = _run(p, scenarios, tmp)
    bs = run["batches"]
    result.rows = bs
    result.extra["final_server_state"] = run["final"]
    summary = [
        f"{sum(b['committed'] for b in bs)} of {len(bs)}",
        run["final"]["episodes"],
        run["final"]["kept_replies"],
        run["final"]["retired_marks"],
        sum(b["agent_runs"] for b in bs) / (len(bs) * p["rows"]),
        sum(b["reruns"] for b in bs),
        sum(b["finished_runs_rerun"] for b in bs),
        sum(b["counted_twice"] for b in bs),
        sum(b["failed_without_reason"] for b in bs),
        sum(b["adopted"] for b in bs),
    ]
    result.extra["summary"] = summary
    result.add_table(
        f"{len(scenarios)} batches of {p['rows']} rows against gym serve --protocol v2, a "
        f"checkpoint after each (TryPolicy rollout_s={POLICY.rollout_s}, "
        f"max_tries={POLICY.max_tries}); Gym's state read from its v2 status at the end:",
        [
            "checkpoints committed",
            "episodes left",
            "kept replies left",
            "retired marks left",
            "agent runs / rollout",
            "reruns",
            "finished runs rerun",
            "counted twice",
            "failed without a reason",
            "adopted",
        ],
        [summary],
    )
    result.add_table(
        "Per batch (episodes / kept replies / retired marks: right after that batch's checkpoint):",
        [
            "path",
            "faulty rows",
            "committed",
            "episodes",
            "kept",
            "retired marks",
            "reruns",
            "finished rerun",
            "twice counted",
            "sealed",
            "failed",
            "abandoned",
            "adopted",
            "batch s",
        ],
        [
            [
                b["path"],
                b["faulty_rows"],
                b["committed"],
                b["left_episodes"],
                b["left_kept_replies"],
                b["left_retired_marks"],
                b["reruns"],
                b["finished_runs_rerun"],
                b["counted_twice"],
                b["sealed"],
                b["failed"],
                b["abandoned"],
                b["adopted"],
                b["batch_s"],
            ]
            for b in bs
        ],
    )
    result.extra["headline"] = (
        f"v2: committed {summary[0]} checkpoints, left {summary[1]} episodes, {summary[2]} kept "
        f"replies and {summary[3]} retired marks; {summary[6]} finished runs rerun, "
        f"{summary[7]} counted twice, {summary[9]} adopted"
    )
    result.notes.append(
        "Reruns are the deadline path's retired first tries (cancelled, not finished) and the "
        "fail_fast path's abandoned rows sent again in no later batch; a finished run is never "
        "rerun: a lost reply is adopted from the reply our server keeps until forget."
    )


if __name__ == "__main__":
    bench_main("fault_storm_v2", "Fault storm on Gym v2 (gym serve --protocol v2)", body)
