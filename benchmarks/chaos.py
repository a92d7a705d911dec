"""Chaos: one fault per row, on real processes, and whether the system came back as a user
expects (issue 9). The scenarios live in :mod:`rl_gym_actors.testing.chaos`, where the tests
(``tests/test_chaos.py`` and the issue-9 tests) use them too.

Rows: Gym SIGKILL + restart mid-batch (state dir), Gym dead, Gym frozen (SIGSTOP), ledger killed
mid-batch and mid-checkpoint, a rollout actor killed, the driver SIGKILLed mid-checkpoint then a
new driver (``abort_checkpoint``; and with the server's checkpoint lease, no step at all, when
the server has leases), two runs on one Gym checkpointing at once, a 3-node cluster losing a node
(in a process of its own: it makes its own Ray cluster); issue 16: Gym restarted on an empty
state dir with results held, a partition during a checkpoint that heals (with and without a
lease), a trainer SIGKILLed between its checkpoint's ACKs and a commit and restored; issue 18:
each scenario that applies to Gym v2 again against ``gym serve --protocol v2`` (``v2_<name>``;
``chaos.NOT_ON_V2`` names the others and why).

    .venv/bin/python benchmarks/chaos.py [--quick] [--only NAME ... [--append]]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import common  # noqa: F401  (puts the repository on sys.path)
from common import REPO, RESULTS_DIR, Result, bench_main, progress

COLUMNS = [
    "scenario",
    "what a user expects",
    "rows",
    "sealed",
    "failed (reason)",
    "failed (no reason)",
    "Gym running / un-ACKed after",
    "checkpoint committed",
    "time to recover s",
    "rewards counted twice",
    "as expected",
    "what happened",
]


V2_NOTE = (
    "Rows named v2: the same scenario against gym serve --protocol v2 (Gym running / "
    "un-ACKed: its episodes / kept replies; every retired mark must be forgotten too). Not on "
    "v2: gym_state_lost (the agent-checkpoint store epoch and held receipts; v2 has no "
    "receipts), ack_crash_restore (v2 has no ACK)."
)


def _in_own_process(name: str, quick: bool) -> dict[str, Any]:
    code = (
        "import json, sys; from rl_gym_actors.testing import chaos; "
        f"row = chaos.run({name!r}, chaos.{'QUICK' if quick else 'FULL'}); "
        "print('CHAOS-ROW ' + json.dumps(row.as_dict()))"
    )
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    for line in out.stdout.splitlines():
        if line.startswith("CHAOS-ROW "):
            return json.loads(line[len("CHAOS-ROW ") :])
    raise RuntimeError(f"{name} in its own process failed ({out.returncode}): {out.stderr[-2000:]}")


def body(result: Result, args: Any) -> None:
    from rl_gym_actors.actors.runtime import ensure_ray
    from rl_gym_actors.testing import chaos

    sizes = chaos.QUICK if args.quick else chaos.FULL
    result.params.update(sizes.__dict__)
    names = args.only or [
        n
        for n in chaos.SCENARIOS
        if not n.endswith("driver_killed_lease") or chaos.server_has_leases()
    ]
    if not args.only and "driver_killed_lease" not in names:
        result.notes.append(
            "The Gym server has no checkpoint lease yet (`gym serve "
            "--checkpoint-lease-s`): the driver row shows abort_checkpoint only."
        )
    ensure_ray(num_cpus=4)
    rows: list[dict[str, Any]] = []
    for name in names:
        progress(f"chaos: {name} ...")
        t0 = time.perf_counter()
        try:
            if name in chaos.OWN_PROCESS:
                row = _in_own_process(name, args.quick)
            else:
                row = chaos.run(name, sizes).as_dict()
        except Exception as exc:  # a scenario that breaks is a row that says so
            row = chaos.ChaosRow(name, "-", happened=f"scenario raised {exc!r}"[:400]).as_dict()
        row["name"] = name
        row["seconds"] = round(time.perf_counter() - t0, 1)
        progress(
            f"chaos: {name} {'as expected' if row['ok'] else 'NOT as expected'} in "
            f"{row['seconds']}s: {row['happened']}"
        )
        rows.append(row)
    if args.append:  # the rows of the last run stay, those run now replace theirs
        previous = RESULTS_DIR / "chaos.json"
        kept = json.loads(previous.read_text())["rows"] if previous.exists() else []
        kept = [r for r in kept if r.get("name") not in names]
        if kept:
            result.notes.append(
                f"--append: {len(kept)} rows kept from the previous run "
                f"({', '.join(str(r.get('name')) for r in kept)}); run now: {', '.join(names)}"
            )
        rows = kept + rows
    result.rows = rows
    if any(str(r.get("name", "")).startswith("v2_") for r in rows):
        result.notes.append(V2_NOTE)

    def gym(r: dict[str, Any]) -> str:
        return "-" if r["gym_running"] is None else f"{r['gym_running']} / {r['gym_unacked']}"

    result.add_table(
        "One fault per row (the scenario's own sizes; quick: 16 rows on 2 actors x 2 "
        "slots unless the row says otherwise):",
        COLUMNS,
        [
            [
                r["scenario"],
                r["expected"],
                r["rows"],
                r["sealed"],
                r["failed_reason"],
                r["failed_silent"],
                gym(r),
                r["committed"],
                r["recover_s"],
                r["rewards_twice"],
                r["ok"],
                r["happened"],
            ]
            for r in rows
        ],
    )
    result.notes.append(
        "Time to recover: from the fault to the first checkpoint that committed "
        "after it (Gym dead: to the end of the batch, every row failed with its "
        "cause); 'checkpoint committed' is 'no' where none can (Gym dead)."
    )
    bad = [r["name"] for r in rows if not r["ok"]]
    result.extra["headline"] = (
        f"{len(rows) - len(bad)} of {len(rows)} chaos scenarios as "
        f"expected" + (f"; not: {', '.join(bad)}" if bad else "")
    )
    if bad:  # the table is written all the same
        progress(f"chaos: NOT as expected: {bad}")


def extra_args(parser: Any) -> None:
    parser.add_argument("--only", nargs="*", help="run only these scenarios")
    parser.add_argument(
        "--append",
        action="store_true",
        help="keep the rows of results/chaos.json; the scenarios run now replace theirs",
    )


if __name__ == "__main__":
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    bench_main("chaos", "Chaos: one fault per row", body, extra_args=extra_args)
