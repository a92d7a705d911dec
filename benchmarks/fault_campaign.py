"""A fault campaign: a trainer SIGKILLed at seeded instants spread over its checkpoints, restored
the documented way, checked from Gym's side and the trainer's.

Per instant (:mod:`rl_gym_actors.testing.campaign`): trainer A, a process of its own joining the
campaign's local Ray, runs steps of 6 rows with a checkpoint after every step and is killed
(kill -9; Ray ends the actors it owned) in checkpoint 2 or 3 at one phase: Gym performed prepare
/ the ACK batch (v2: forget) / the commit and A never heard; A's commit or resume never reached
Gym; A was inside its part write, or past the gate before ``checkpoint()`` returned; or between
two checkpoints. Trainer B restores from ``latest_checkpoint_dir``, sends the same rows and runs
two more steps and a final checkpoint. The checker says, per instant and in total: rows lost
(never trained from a reply), finished runs rerun (Gym's agent log: a rollout whose agent
finished twice), results trained twice, whether B's first checkpoint committed at its first try,
and the seconds from the kill and from B's start to Gym taking work, and from the kill to B's
first commit. The baseline, measured in the same run: trainer A's own start to its first commit,
unkilled.

Variants: ``keep-first`` (an async trainer: the next step's rows in flight across each
checkpoint, a buffer of handed results across 2 checkpoints passed as ``keep=``, its state
written before ``checkpoint()``, restored from ``latest_checkpoint_dir``), ``keep-after`` (the
same trainer writing its state once ``checkpoint()`` returned, restored from the dir of its newest
state: the layer reads the run's newer parts beside it), ``sync-first`` / ``sync-after`` (a
synchronous trainer). Both orders follow the README's one restore rule (the dir whose state the
trainer loads), and both must lose nothing.

    .venv/bin/python benchmarks/fault_campaign.py            # 20 instants per protocol, keep-first,
                                                             # 6 keep-after, 4 sync-first
    .venv/bin/python benchmarks/fault_campaign.py --quick    # 3 keep-first + 1 sync-first per
                                                             # protocol (make bench-chaos)
    .venv/bin/python benchmarks/fault_campaign.py --instants 6 --variants keep-after,sync-after
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import common
from common import Result, bench_main, progress

from rl_gym_actors.testing.campaign import (
    Instant,
    InstantResult,
    run_campaign,
    schedule,
    totals,
)

PROTOCOLS = ("agent", "v2")
FULL = {"keep-first": 20, "keep-after": 6, "sync-first": 4}
QUICK = {"keep-first": 3, "sync-first": 1}


def _instants(counts: dict[str, int], seed: int, protocols: list[str]) -> list[Instant]:
    out: list[Instant] = []
    for protocol in protocols:
        for variant, n in counts.items():
            keep, order = variant.split("-")
            out += schedule(protocol, n, seed, keep=keep == "keep", order=order)
    return out


def _variant(r: InstantResult) -> str:
    return f"{'keep' if r.instant.keep else 'sync'}-{r.instant.order}"


def _shared_ray() -> str:
    """One local Ray the trainers join (loopback): a Ray start per trainer took 40 s at load 37."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    from rl_gym_actors.actors.runtime import start_local_ray

    start_local_ray(
        num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    return str(ray.get_runtime_context().gcs_address)


def body(result: Result, args: Any) -> None:
    counts = dict(QUICK if args.quick else FULL)
    if args.variants:
        counts = {v: counts.get(v, FULL.get(v, 1)) for v in args.variants.split(",")}
    if args.instants:
        counts = dict.fromkeys(counts, args.instants)
    protocols = args.protocols.split(",")
    instants = _instants(counts, args.seed, protocols)
    result.params.update(counts=counts, seed=args.seed, protocols=protocols, rows_per_step=6)
    progress(f"fault_campaign: {len(instants)} instants, seed {args.seed}")

    def say(r: InstantResult) -> None:
        progress(
            f"  {r.instant.protocol} {_variant(r)} {r.instant.phase}@step-{r.instant.step}: "
            f"landed {r.landed or '-'}, lost {r.lost}, rerun {r.rerun} "
            f"(v2 tail {r.tail_rerun}), twice {r.twice}, "
            f"first try {r.first_commit_first_try}, kill->open {common.fmt(r.kill_to_open_s)} s, "
            f"start->open {common.fmt(r.start_to_open_s)} s, "
            f"kill->commit {common.fmt(r.kill_to_commit_s)} s ({r.seconds:.0f} s)"
            + (f"; errors: {r.errors}" if r.errors else "")
        )

    results = run_campaign(instants, ray_address=_shared_ray(), on_result=say)
    report(result, results)


def report(result: Result, results: list[InstantResult]) -> None:
    """The rows, both tables, the headline and the notes of ``results``."""
    result.rows = [r.row() for r in results]
    result.add_table(
        "Per instant (kill -9 of the trainer and its Ray; B = the restored trainer)",
        [
            "protocol",
            "trainer",
            "phase",
            "ckpt",
            "landed",
            "rows",
            "lost",
            "rerun",
            "v2 tail rerun",
            "twice",
            "B 1st ckpt 1st try",
            "Gym held at kill",
            "kill -> Gym open (s)",
            "B start -> Gym open (s)",
            "kill -> B commit (s)",
        ],
        [
            [
                r.instant.protocol,
                _variant(r),
                r.instant.phase
                + (f" +{r.instant.delay_s:g}s" if r.instant.phase == "between" else ""),
                r.instant.step,
                r.landed or "-",
                r.rows,
                r.lost,
                r.rerun,
                r.tail_rerun,
                r.twice,
                r.first_commit_first_try,
                r.gym_held_at_kill,
                r.kill_to_open_s,
                r.start_to_open_s,
                r.kill_to_commit_s,
            ]
            for r in results
        ],
    )
    groups: dict[tuple[str, str], list[InstantResult]] = {}
    for r in results:
        groups.setdefault((r.instant.protocol, _variant(r)), []).append(r)
    sums = []
    for (protocol, variant), rs in groups.items():
        t = totals(rs)
        base = [r.baseline_commit_s for r in rs if r.baseline_commit_s]
        median_base = statistics.median(base) if base else None
        ratio = (
            None
            if not median_base or t["max_kill_to_commit_s"] is None
            else t["max_kill_to_commit_s"] / median_base
        )
        sums.append(
            [
                protocol,
                variant,
                t["instants"],
                t["landed"],
                t["rows"],
                t["lost"],
                t["rerun"],
                t["tail_rerun"],
                t["twice"],
                f"{t['first_commit_first_try']}/{t['instants']}",
                t["max_start_to_open_s"],
                t["max_kill_to_commit_s"],
                median_base,
                ratio,
                t["errors"],
            ]
        )
        result.extra[f"{protocol}/{variant}"] = {**t, "median_baseline_commit_s": median_base}
    result.add_table(
        "In total (worst cases; baseline: an unkilled trainer's start to its first commit, "
        "same run)",
        [
            "protocol",
            "trainer",
            "instants",
            "landed",
            "rows",
            "lost",
            "rerun",
            "v2 tail rerun",
            "twice",
            "B 1st ckpt 1st try",
            "max B start -> Gym open (s)",
            "max kill -> B commit (s)",
            "baseline start -> commit (s)",
            "kill -> commit / baseline",
            "instants with errors",
        ],
        sums,
    )
    all_t = totals(results)
    result.extra["totals"] = all_t
    landed = [r for r in results if r.landed and not r.landed.startswith("missed")]
    unlanded = len(results) - len(landed)
    first = totals([r for r in landed if r.instant.order == "first"])
    after = totals([r for r in landed if r.instant.order == "after"])
    result.extra["totals_state_first"], result.extra["totals_state_after"] = first, after
    said = []
    for t, order in (
        (first, "State written before checkpoint() (restored from latest_checkpoint_dir)"),
        (after, "State written after checkpoint() returned (restored from its newest state's dir)"),
    ):
        if t["instants"]:
            said.append(
                f"{order}, {t['instants']} kill instants: {t['lost']} rows lost, {t['rerun']} "
                f"finished runs rerun from their input ({t['tail_rerun']} v2 runs that finished "
                f"after the commit continued from its boundary again), {t['twice']} trained "
                f"twice; the restored trainer's first checkpoint committed at its first try "
                f"{t['first_commit_first_try']}/{t['instants']}; Gym took work at most "
                f"{common.fmt(t['max_start_to_open_s'])} s after its start."
            )
    if unlanded:
        said.append(f"{unlanded} instants did not land (the trainer to kill failed first: notes).")
    result.extra["headline"] = " ".join(said)
    result.notes.append(
        "'B start' is the restored trainer's orchestrator start (its Ray was started while A "
        "ran); 'Gym open' is the server's own phase, read in its process every 20 ms. A "
        "negative 'B start -> Gym open' means Gym was open before B started (nothing held it)."
    )
    result.notes.append(
        "'v2 tail rerun': a v2 episode the commit exported (parked at a step boundary) that "
        "finished before the kill (the trainer died after the commit's resume), continued again "
        "from that boundary by the restore: a v2 restore puts Gym back at the checkpoint's cut "
        "(Gym's contract, NeMo Gym's too), so the steps after the boundary run twice; its "
        "result is trained once and no run starts over from its input."
    )
    result.notes.append(f"load average at the end: {os.getloadavg()[0]:.1f}")
    bad = [r for r in results if r.lost or r.rerun or r.tail_rerun or r.twice or r.errors]
    for r in bad:
        result.notes.append(
            f"{r.run_id} ({r.instant.phase}@step-{r.instant.step}): lost {r.lost_ids[:8]}, "
            f"rerun {r.rerun_ids[:8]}, tail {r.tail_rerun_ids[:8]}, twice {r.twice_ids[:8]}, "
            f"errors {r.errors[:2]}"
        )


def extra_args(p: Any) -> None:
    p.add_argument("--seed", type=int, default=27)
    p.add_argument("--instants", type=int, default=0, help="per protocol and variant")
    p.add_argument("--variants", default="", help="e.g. keep-first,keep-after,sync-first")
    p.add_argument("--protocols", default=",".join(PROTOCOLS))


def main(argv: list[str] | None = None) -> int:
    res = bench_main(
        "fault_campaign",
        "Fault campaign: a trainer killed at instants of its checkpoints",
        body,
        argv,
        extra_args=extra_args,
    )
    # either write order, restored by the README's rule, must lose nothing
    bad = [r for r in res.rows if r["lost"] or r["twice"] or r["rerun"] or r["errors"]]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
