"""A 3-node Ray cluster on one machine; one node removed in the middle of a batch.

``ray.cluster_utils.Cluster`` starts a head and two worker nodes, every one on 127.0.0.1
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``). The warm pool spreads its rollout actors over the nodes
(SPREAD scheduling). While a batch runs, a worker node that hosts rollout actors, but not the
ledger, is killed (no graceful shutdown). Rows: three in four sleep 2 s; one in four sleeps 30 s
with ``rollout_s`` 5 s, so that on the surviving nodes it fails by its deadline (its owner
retires it) while on the lost node it is still running, with nobody left to retire it, when the
checkpoint comes.

Reported: that every rollout ended sealed, or failed with a reason; what the checkpoint taken
right after the batch did with the lost node's attempts (orphans ACKed, retired); Gym's state
after it (nothing running, nothing un-ACKed); the time to recover (from the kill to that
checkpoint committed); and the batches after it until one runs clean on a whole pool.

It starts its own Ray cluster, so it runs in a process of its own.

    .venv/bin/python benchmarks/cluster.py [--quick]
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts the repository on sys.path)
from common import Result, bench_main, progress
from fleet import Fleet, gym_counts

QUICK = dict(rows=60, actors=6, per_actor=10, kill_after_s=1.0)
FULL = dict(rows=300, actors=9, per_actor=34, kill_after_s=1.0)
SHORT_S, LONG_S, ROLLOUT_S = 2.0, 30.0, 5.0
PLACEMENT_TRIES = 4


def _rows(prefix: str, n: int) -> list[dict[str, Any]]:
    return [
        {"_ng_rollout_id": f"{prefix}-{i}", "sleep_s": LONG_S if i % 4 == 3 else SHORT_S}
        for i in range(n)
    ]


def _node_of(ray: Any, handle: Any) -> str:
    return ray.get(
        handle.__ray_call__.remote(
            lambda self: __import__("ray").get_runtime_context().get_node_id()
        ),
        timeout=60,
    )


def body(result: Result, args: Any) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from rl_gym_actors.config import PoolConfig, TryPolicy
    from rl_gym_actors.orchestrator import Orchestrator

    p = QUICK if args.quick else FULL
    result.params.update(p, short_s=SHORT_S, long_s=LONG_S, rollout_s=ROLLOUT_S)
    loopback = dict(node_ip_address="127.0.0.1")
    t0 = time.perf_counter()
    cluster = Cluster(
        initialize_head=True, head_node_args=dict(num_cpus=1, include_dashboard=False, **loopback)
    )
    workers = [cluster.add_node(num_cpus=1, **loopback) for _ in range(2)]
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    cluster.wait_for_nodes()
    result.extra["cluster_start_s"] = round(time.perf_counter() - t0, 2)
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    progress(
        f"cluster of {len(nodes)} nodes up in {result.extra['cluster_start_s']}s "
        f"(addresses {sorted(set(nodes.values()))})"
    )
    tmp = Path(tempfile.mkdtemp(prefix="rlga-bench-cluster-"))
    fleet = Fleet(1).start()
    orch = None
    try:
        # SPREAD is a preference for 0-CPU actors, not a rule: a pool that lands on a single
        # node (or shares the only candidate node with the ledger) is made again, and the
        # number of tries is reported
        for attempt in range(1, PLACEMENT_TRIES + 1):
            orch = Orchestrator(
                fleet.endpoints,
                policy=TryPolicy(rollout_s=ROLLOUT_S, max_tries=1, receipt_s=5.0),
                pool=PoolConfig(size=p["actors"], rollouts_per_actor=p["per_actor"], spread=True),
                progress=False,
                orchestrator_id=f"bench-cluster{attempt}",
            )
            snap = orch.snapshot()
            handles = {
                name: ray.get_actor(name, namespace="rl_gym_actors") for name in snap.pool.actors
            }
            placement = {name: _node_of(ray, h) for name, h in handles.items()}
            ledger_node = _node_of(ray, orch.ledger)
            per_node = Counter(placement.values())
            victims = [w for w in workers if w.node_id != ledger_node and per_node.get(w.node_id)]
            if victims and len(per_node) >= 2:
                break
            progress(
                f"placement try {attempt}: actors per node "
                f"{ {k[:8]: v for k, v in per_node.items()} }, ledger on "
                f"{ledger_node[:8]}: not spread, making the pool again"
            )
            orch.close()
            orch = None
        if orch is None:
            raise RuntimeError(f"SPREAD placed the pool on one node in {PLACEMENT_TRIES} tries")
        result.extra["placement"] = {nid[:8]: per_node.get(nid, 0) for nid in nodes}
        result.extra["placement_tries"] = attempt
        result.extra["ledger_node"] = ledger_node[:8]
        victim = max(victims, key=lambda w: per_node[w.node_id])
        lost_actors = sorted(n for n, nid in placement.items() if nid == victim.node_id)
        progress(
            f"actors per node {result.extra['placement']}, ledger on {ledger_node[:8]}; "
            f"will kill {victim.node_id[:8]} ({len(lost_actors)} actors)"
        )

        rows = _rows("c1", p["rows"])
        killed_at: dict[str, float] = {}

        def kill() -> None:
            time.sleep(p["kill_after_s"])
            killed_at["t"] = time.perf_counter()
            cluster.remove_node(victim, allow_graceful=False)
            killed_at["done"] = time.perf_counter()

        killer = threading.Thread(target=kill, name="node-killer")
        t_batch = time.perf_counter()
        killer.start()
        outcomes = orch.run_batch(rows)
        t_batch_end = time.perf_counter()
        killer.join()
        by_status = Counter(o.status for o in outcomes)
        # tallied by the outcome's typed failure kind, never by its reason's text
        reasons = Counter(
            o.failure.value if o.failure else "none" for o in outcomes if o.status != "sealed"
        )
        unexplained = [o for o in outcomes if o.status != "sealed" and o.failure is None]
        progress(
            f"batch: {dict(by_status)} in {t_batch_end - t_batch:.1f}s; reasons {dict(reasons)}"
        )

        # the trainer's next step: a checkpoint right away
        before = asyncio.run(gym_counts(fleet.endpoints))
        t_ck = time.perf_counter()
        report = orch.checkpoint("after-node-loss", str(tmp / "ck1"), deadline_s=180)
        t_committed = time.perf_counter()
        after = asyncio.run(gym_counts(fleet.endpoints))
        led = orch.snapshot().ledger
        progress(
            f"checkpoint: adopted {report.adopted}, orphans ACKed {report.orphans_acked}, "
            f"retired {report.retired} in {t_committed - t_ck:.2f}s"
        )

        # then the next batches: the pool replaces a lost actor when one of its slots is used
        later: list[dict[str, Any]] = []
        t_whole = None
        for k in range(2, 6):
            rows_k = [{"_ng_rollout_id": f"c{k}-{i}", "sleep_s": 0.5} for i in range(p["rows"])]
            tk = time.perf_counter()
            outs = orch.run_batch(rows_k)
            snap_k = orch.snapshot()
            st = Counter(o.status for o in outs)
            later.append(
                {
                    "batch": k,
                    "sealed": st["sealed"],
                    "failed": st["failed"],
                    "abandoned": st["abandoned"],
                    "seconds": time.perf_counter() - tk,
                    "replaced": snap_k.pool.replaced,
                    "alive": snap_k.actors.actors,
                    "without_reason": sum(
                        1 for o in outs if o.status != "sealed" and o.failure is None
                    ),
                }
            )
            progress(
                f"batch {k}: {dict(st)}; pool replaced {snap_k.pool.replaced}, alive "
                f"{snap_k.actors.actors}"
            )
            if snap_k.actors.actors >= p["actors"] and st["sealed"] == p["rows"]:
                t_whole = time.perf_counter()
                break
        t_ck2 = time.perf_counter()
        report2 = orch.checkpoint("after-recovery", str(tmp / "ck2"), deadline_s=60)
        checkpoint2_s = time.perf_counter() - t_ck2
        after2 = asyncio.run(gym_counts(fleet.endpoints))
    finally:
        if orch is not None:
            orch.close()
        fleet.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        ray.shutdown()
        cluster.shutdown()

    u = next(iter(before))
    clean_batch = next((b["batch"] for b in later if b["sealed"] == p["rows"]), None)
    row = {
        "rows": p["rows"],
        "actors": p["actors"],
        "rollouts_per_actor": p["per_actor"],
        "lost_actors": len(lost_actors),
        "sealed": by_status["sealed"],
        "failed": by_status["failed"],
        "abandoned": by_status["abandoned"],
        "failed_reasons": dict(reasons),
        "without_reason": len(unexplained),
        "batch_s": t_batch_end - t_batch,
        "kill_s": killed_at["done"] - killed_at["t"],
        "gym_before_checkpoint": before[u],
        "gym_after_checkpoint": after[u],
        "checkpoint_s": t_committed - t_ck,
        "adopted": report.adopted,
        "orphans_acked": report.orphans_acked,
        "retired": report.retired,
        "prepare_rounds": max(e.prepare_rounds for e in report.endpoints),
        "committed_after_kill_s": t_committed - killed_at["t"],
        "ledger_invariant_ok": led.invariant_ok,
        "later_batches": later,
        "first_clean_batch": clean_batch,
        "pool_whole_after_kill_s": (t_whole - killed_at["t"]) if t_whole else None,
        "gym_after_second_checkpoint": after2[u],
        "second_checkpoint_retired_or_acked": report2.retired + report2.orphans_acked,
        "second_checkpoint_s": checkpoint2_s,
    }
    result.rows = [row]
    silent = row["without_reason"] + sum(b["without_reason"] for b in later)
    ok = (
        silent == 0
        and after[u]["running"] == 0
        and after[u]["completed_unacknowledged"] == 0
        and after2[u]["running"] == 0
        and after2[u]["completed_unacknowledged"] == 0
        and clean_batch is not None
    )
    result.extra["all_accounted_for"] = ok
    result.add_table(
        f"3 nodes on 127.0.0.1 ({result.extra['placement']} rollout actors per node, placement "
        f"try {result.extra['placement_tries']}; ledger on {result.extra['ledger_node']}); one "
        f"worker node killed {p['kill_after_s']:.0f} s into a "
        f"batch of {p['rows']} rows, then a checkpoint at once:",
        [
            "actors lost",
            "sealed",
            "failed (with a reason)",
            "failed without a reason",
            "Gym before checkpoint: running / un-ACKed",
            "orphans ACKed",
            "retired",
            "adopted",
            "checkpoint s",
            "baseline: checkpoint on the whole pool s",
            "committed after kill s",
            "Gym after: running / un-ACKed",
        ],
        [
            [
                row["lost_actors"],
                row["sealed"],
                row["failed"],
                row["without_reason"],
                f"{before[u]['running']} / {before[u]['completed_unacknowledged']}",
                row["orphans_acked"],
                row["retired"],
                row["adopted"],
                row["checkpoint_s"],
                row["second_checkpoint_s"],
                row["committed_after_kill_s"],
                f"{after[u]['running']} / {after[u]['completed_unacknowledged']}",
            ]
        ],
    )
    result.add_table(
        "The batches after it (0.5 s agents) until one runs clean on a whole pool:",
        [
            "batch",
            "sealed",
            "failed (with a reason)",
            "failed without a reason",
            "actors replaced so far",
            "actors alive",
            "seconds",
        ],
        [
            [
                b["batch"],
                b["sealed"],
                b["failed"],
                b["without_reason"],
                b["replaced"],
                b["alive"],
                b["seconds"],
            ]
            for b in later
        ],
    )
    result.notes.append(
        "Failure reasons: " + ", ".join(f"{k or '?'} x{v}" for k, v in reasons.items())
    )
    result.notes.append(
        f"Gym after the checkpoint: {after[u]['running']} running, "
        f"{after[u]['completed_unacknowledged']} un-ACKed; ledger invariant "
        f"{'holds' if led.invariant_ok else 'BROKEN'}; every rollout accounted for: "
        f"{'yes' if ok else 'NO'}."
    )
    result.notes.append(
        "Rows in flight on the lost node's actors fail with a reason. After that, an actor that "
        "Ray reports as unavailable (ActorUnavailableError) has its slots taken out of rotation "
        "until it answers again or is declared dead and replaced, so the batches after the loss "
        "run on the surviving actors (see the batches after it)."
    )
    result.extra["headline"] = (
        f"node with {row['lost_actors']} of {p['actors']} actors killed mid-batch: "
        f"{row['sealed']} sealed, {row['failed']} failed with a reason, {silent} silent; the "
        f"next checkpoint ACKed {row['orphans_acked']} orphans and retired {row['retired']}, "
        f"committed {row['committed_after_kill_s']:.1f} s after the kill"
    )
    if not ok:
        raise RuntimeError(f"cluster run left something unaccounted for: {row}")


if __name__ == "__main__":
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    bench_main("cluster", "3-node cluster: a node lost mid-batch", body)
