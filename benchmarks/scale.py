"""At scale on one machine: N raylets, 16 Gym servers, checkpoints with 100,000 attempts left.

A Ray cluster of raylets on 127.0.0.1 (``ray.cluster_utils.Cluster``,
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), each node with its own resources (``num_cpus`` =
rollout actors per node, and a custom resource naming it); the rollout actors ask for one CPU
each and are placed with the SPREAD strategy, so every node carries the same number. 16 Gym
servers (``rl-gym-actors gym serve --state-dir``, durable, one subprocess each); the
orchestrator spreads rows over all of them.

1. Throughput as nodes go 1, 2, 4 (nodes are added to the running cluster; each node brings
   its own actors, so rollouts in flight grow with the nodes): the same rows, 100 ms agents,
   at every size, for 4 and for 16 rollouts per actor (a node's slots below the two cores'
   bound, and above it); rollouts/s, CPU per rollout over every process (driver, ledger,
   rollout actors, Ray's GCS/raylets/agents, Gym servers) by part, cores busy (CPU seconds /
   wall / cores) running and idle. Baseline: 1 node, same rollouts per actor, same run.
2. Checkpoint latency with finished, un-ACKed attempts left over the 16 servers (1k, 10k, 100k;
   100k are written into the servers' state dirs through the server's own store while they
   are stopped, the others through ``/run``) and with running attempts whose owners are gone
   (1k, 10k, started through ``/run`` and abandoned). Baseline: the hand-written minimum with
   the client and no Ray (one listing, ACK in the gate's batches, retire-batch, prepare,
   commit, resume, every server at once), same fleet, same sizes, same run.
3. A worker node killed (no graceful shutdown) one second into a batch of 2 s rows: what
   happened to the rows, and the recovery time (kill to the next checkpoint committed).

    .venv/bin/python benchmarks/scale.py [--quick [--big]] [--phases checkpoint loss]
    .venv/bin/python benchmarks/scale.py --quick --phases    # throughput alone: scale_throughput.*
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import common
from common import Result, bench_main, progress, ratio
from fleet import gym_counts, leave_finished, leave_running

from rl_gym_actors.config import GymEndpoint

QUICK = dict(  # under 3 minutes on a quiet machine: the goals' sizes but 100k
    # (--big adds it: about a minute more, most of it seeding the state dirs)
    nodes=[1, 2, 4],
    actors_per_node=2,
    # rollouts per actor: 4 (a node's 8 slots ask ~0.4 of the two cores: room to scale) and
    # 16 (a node's 32 slots ask more than the two cores give: the cores' ceiling at 1 node)
    per_actor=[4, 16],
    rows=320,  # the same rows at every cluster size
    idle_s=1.0,
    trials=1,
    unacked=[1000, 10_000],
    running=[10_000],
    seed_from=10_000,
    kill_rows=32,
)
FULL = dict(
    nodes=[1, 2, 4],
    actors_per_node=2,
    per_actor=[4, 16],
    rows=1280,
    idle_s=2.0,
    trials=3,
    unacked=[1000, 10_000, 100_000],
    running=[1000, 10_000],
    seed_from=10_000,
    kill_rows=128,
)
SERVERS = 16
# a CPU per node beyond its actors: room for the replacements of a lost node's actors (with none,
# they wait for a node that never comes and the pool's calls on them time out)
SPARE_CPUS = 1
PER_HOST = 4  # Gym servers per process
TOKEN = "bench-token"
AGENT_S = 0.1
DEADLINE_S = 300.0
RETIRE_CHUNK = 2000
# node death is declared after period x threshold without an answer (Ray's defaults: 3 s x 5)
HEALTH = dict(health_check_period_ms=1000, health_check_failure_threshold=5)
LOOPBACK = dict(node_ip_address="127.0.0.1")


# ---------------------------------------------------------------- the Gym fleet


class DurableFleet:
    """16 durable Gym servers, :data:`PER_HOST` to a process (``gym_host.py``: each server a
    thread with its own event loop, port and state dir). ``fresh()`` restarts them on new,
    empty state dirs (same ports), optionally with finished attempts already written."""

    def __init__(self, n: int, root: Path) -> None:
        self.n = n
        self.root = root
        self.generation = 0
        self.hosts: list[subprocess.Popen] = []
        self.urls: list[str] = []

    def start(self) -> DurableFleet:
        for first in range(0, self.n, PER_HOST):
            self.hosts.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(Path(__file__).with_name("gym_host.py")),
                        str(first),
                        str(min(PER_HOST, self.n - first)),
                        str(self.n),
                        str(self.root),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        self._read_urls()
        return self

    def _read_urls(self) -> None:
        urls = []
        for h in self.hosts:
            assert h.stdout is not None
            line = h.stdout.readline()
            if not line:
                raise RuntimeError(f"gym host {h.pid} exited ({h.wait()})")
            urls += json.loads(line)["urls"]
        self.urls = urls

    def _send(self, cmd: dict[str, Any]) -> None:
        for h in self.hosts:
            assert h.stdin is not None
            h.stdin.write(json.dumps(cmd) + "\n")
            h.stdin.flush()

    def stop(self) -> None:
        for h in self.hosts:
            if h.poll() is None:
                with contextlib.suppress(OSError):
                    self._send_one(h, {"stop": True})
        for h in self.hosts:
            try:
                h.wait(timeout=30)
            except subprocess.TimeoutExpired:
                h.kill()
                h.wait()
        self.hosts = []

    @staticmethod
    def _send_one(h: subprocess.Popen, cmd: dict[str, Any]) -> None:
        assert h.stdin is not None
        h.stdin.write(json.dumps(cmd) + "\n")
        h.stdin.flush()

    def fresh(self, prefix: str = "", n: int = 0) -> float:
        """Restart every server on a new, empty state dir; with ``n``, the finished, un-ACKed
        attempts ``prefix-i`` (``i < n``, round-robin over the servers) written to them first.
        Returns the seconds taken."""
        t0 = time.perf_counter()
        self.generation += 1
        self._send({"fresh": self.generation, "prefix": prefix, "n": n})
        self._read_urls()
        shutil.rmtree(self.root / f"g{self.generation - 1}", ignore_errors=True)
        return time.perf_counter() - t0

    @property
    def endpoints(self) -> list[GymEndpoint]:
        return [GymEndpoint(url=u, token=TOKEN, name=f"gym{i}") for i, u in enumerate(self.urls)]

    @property
    def pids(self) -> list[int]:
        return [h.pid for h in self.hosts]


# ---------------------------------------------------------------- the baseline


async def direct_checkpoint(endpoints: Sequence[GymEndpoint], cid: str, cdir: str) -> dict:
    """The least the protocol needs, every server at once: one listing (the compact one our
    server offers), ACK the receipts it lists as they came (the gate's batches: ACK_CHUNK a
    call, ACKS_IN_FLIGHT at once), retire-batch the running attempts, prepare, commit, resume."""
    from rl_gym_actors.actors.gate_steps import ACK_CHUNK, ACKS_IN_FLIGHT
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient

    async def one(i: int, ep: GymEndpoint) -> tuple[int, int]:
        deadline = time.time() + DEADLINE_S
        async with GymClient(ep, control_limit=32) as client:
            st = await client.listing(cid, deadline_ts=deadline)
            receipts = [  # as the listing gave them (JSON text from our server)
                (k, a.completion_receipt)
                for k, a in st.attempts.items()
                if a.completion_receipt is not None
            ]
            running = [k for k, a in st.attempts.items() if a.state == "running"]
            acks = asyncio.Semaphore(ACKS_IN_FLIGHT)

            async def ack(chunk: list) -> None:
                async with acks:
                    await client.acknowledge_wire(
                        [r for _, r in chunk], keys=[k for k, _ in chunk], deadline_ts=deadline
                    )

            await asyncio.gather(
                *(ack(receipts[k : k + ACK_CHUNK]) for k in range(0, len(receipts), ACK_CHUNK)),
                *(
                    client.retire_batch(
                        running[k : k + RETIRE_CHUNK], checkpoint_id=cid, deadline_ts=deadline
                    )
                    for k in range(0, len(running), RETIRE_CHUNK)
                ),
            )
            report = await client.prepare(cid, deadline_ts=deadline)
            if not report.ready_to_commit:
                raise RuntimeError(f"direct checkpoint not ready on {ep.url}: {report.summary()}")
            await client.commit(cid, str(Path(cdir) / str(i)), deadline_ts=deadline)
            await client.resume(cid, deadline_ts=deadline)
            return len(receipts), len(running)

    parts = await asyncio.gather(*(one(i, ep) for i, ep in enumerate(endpoints)))
    return {"acked": sum(p[0] for p in parts), "retired": sum(p[1] for p in parts)}


# ---------------------------------------------------------------- phases


def _rows(prefix: str, n: int, sleep_s: float = AGENT_S) -> list[dict[str, Any]]:
    return [{"_ng_rollout_id": f"{prefix}-{i}", "sleep_s": sleep_s} for i in range(n)]


def _orchestrator(fleet: DurableFleet, actors: int, per_actor: int, tag: str) -> Any:
    from rl_gym_actors.config import PoolConfig, TryPolicy
    from rl_gym_actors.orchestrator import Orchestrator

    return Orchestrator(
        fleet.endpoints,
        policy=TryPolicy(rollout_s=30.0, receipt_s=10.0, max_tries=1),
        pool=PoolConfig(size=actors, rollouts_per_actor=per_actor, num_cpus=1, spread=True),
        progress=False,
        orchestrator_id=f"bench-scale-{tag}",
    )


def _placement(ray: Any, orch: Any) -> dict[str, int]:
    """Rollout actors per node (node id prefix); an actor the pool is replacing (killed, gone,
    or not placed within 60 s) counts under ``"replacing"`` instead of failing the phase."""
    counts: Counter[str] = Counter()
    for name in orch.snapshot().pool.actors:
        try:
            handle = ray.get_actor(name, namespace="rl_gym_actors")
            node = ray.get(
                handle.__ray_call__.remote(
                    lambda self: __import__("ray").get_runtime_context().get_node_id()
                ),
                timeout=60,
            )
        except (ValueError, ray.exceptions.RayError) as exc:
            progress(f"placement: {name} is being replaced ({type(exc).__name__})")
            counts["replacing"] += 1
            continue
        counts[node[:8]] += 1
    return dict(counts)


def _checkpoint(orch: Any, cid: str, tmp: Path) -> Any:
    report = orch.checkpoint(cid, str(tmp / cid), deadline_s=DEADLINE_S)
    if not all(e.commit.manifest_digest for e in report.endpoints):
        raise RuntimeError(f"checkpoint {cid} did not commit everywhere")
    return report


def _clean(fleet: DurableFleet, what: str) -> None:
    counts = asyncio.run(gym_counts(fleet.endpoints))
    left = {u: c for u, c in counts.items() if c["running"] or c["completed_unacknowledged"]}
    if left:
        raise RuntimeError(f"{what}: attempts left on Gym: {left}")


def _cpu_parts(st: Any, gym_cpu_s: float) -> dict[str, float]:
    """CPU seconds by part of the cluster: the driver, the ledger actor, the rollout actors,
    Ray's own processes (GCS, raylets, their agents, idle workers) and the Gym servers."""
    parts = {
        "driver": st.kind("driver")["cpu_s"],
        "ledger": st.kind("worker:LedgerActor")["cpu_s"],
        "rollout_actors": st.kind("worker:RolloutActor")["cpu_s"],
        "gym": gym_cpu_s,
    }
    parts["ray"] = max(0.0, st.cpu_s_total - sum(parts.values()) + gym_cpu_s)
    return parts


def _sampled(
    fleet: DurableFleet, work: Any, exclude: Sequence[int] = ()
) -> tuple[Any, float, dict[str, float]]:
    """``work()``'s result, its wall seconds and CPU seconds by part (:func:`_cpu_parts`):
    every process of the cluster (this one's process tree but ``exclude``; the Gym hosts read
    apart)."""
    gym0 = sum(common.process_cpu_s(pid) or 0.0 for pid in fleet.pids)
    with common.ProcessSampler(exclude=[*fleet.pids, *exclude]) as s:
        t0 = time.perf_counter()
        out = work()
        wall = time.perf_counter() - t0
    gym = sum(common.process_cpu_s(pid) or 0.0 for pid in fleet.pids) - gym0
    return out, wall, _cpu_parts(s.stats, gym)


def throughput(
    ray: Any, cluster: Any, fleet: DurableFleet, p: dict, tmp: Path, nodes_up: list[Any]
) -> tuple[list[dict[str, Any]], Any]:
    """The same rows (``p["rows"]``, 100 ms agents) at each cluster size, for each
    ``rollouts_per_actor`` of ``p["per_actor"]``: each node brings ``actors_per_node`` actors
    with that many rollouts each; the cluster's cores busy while idle (its raylets alone) and
    while the rows run."""
    rows_out: list[dict[str, Any]] = []
    orch = None
    for n_nodes in p["nodes"]:
        while len(nodes_up) < n_nodes:
            nodes_up.append(_add_node(cluster, p, len(nodes_up)))
        cluster.wait_for_nodes()
        for per_actor in p["per_actor"]:
            if orch is not None:
                orch.close()
            orch = _orchestrator(
                fleet, n_nodes * p["actors_per_node"], per_actor, f"n{n_nodes}x{per_actor}"
            )
            rows_out.append(_throughput_row(ray, orch, fleet, p, tmp, n_nodes, per_actor))
    for r in rows_out:
        base = next(b for b in rows_out if b["rollouts_per_actor"] == r["rollouts_per_actor"])
        r["vs_1_node"] = ratio(r["per_s"], base["per_s"])
    return rows_out, orch


def _throughput_row(
    ray: Any, orch: Any, fleet: DurableFleet, p: dict, tmp: Path, n_nodes: int, per_actor: int
) -> dict[str, Any]:
    cores = os.cpu_count() or 1
    n = p["rows"]
    actors = n_nodes * p["actors_per_node"]
    tag = f"{orch.run_id}-{n_nodes}x{per_actor}"
    placement = _placement(ray, orch)
    in_flight = actors * per_actor
    orch.run_batch(_rows(f"{tag}-w", in_flight))  # warm-up
    _checkpoint(orch, f"tpw{n_nodes}x{per_actor}", tmp)
    _, idle_wall, idle = _sampled(fleet, functools.partial(time.sleep, p["idle_s"]))
    secs, parts_t, loads = [], [], []
    for t in range(p["trials"]):
        loads.append(os.getloadavg()[0])
        batch = _rows(f"{tag}-t{t}", n)
        outs, wall, parts = _sampled(fleet, functools.partial(orch.run_batch, batch))
        secs.append(wall)
        parts_t.append(parts)
        bad = [o for o in outs if o.status != "sealed"]
        if bad:
            raise RuntimeError(f"{len(bad)} rollouts not sealed, e.g. {bad[0]!r}")
        _checkpoint(orch, f"tp{n_nodes}x{per_actor}-{t}", tmp)  # ACKs the results, not timed
    mid = secs.index(sorted(secs)[len(secs) // 2])
    med, parts, load = secs[mid], parts_t[mid], loads[mid]
    cpu_s = sum(parts.values())
    row = {
        "nodes": n_nodes,
        "actors": actors,
        "rollouts_per_actor": per_actor,
        "in_flight": in_flight,
        "rollouts": n,
        "seconds": med,
        "seconds_trials": secs,
        "per_s": n / med,
        "ideal_per_s": in_flight / AGENT_S,
        "cpu_ms_per_rollout": cpu_s / n * 1e3,
        "cpu_ms_by_part": {k: round(v / n * 1e3, 3) for k, v in parts.items()},
        "gym_cpu_ms_per_rollout": parts["gym"] / n * 1e3,
        # the machine's share this cluster used: CPU seconds / wall / cores (1.0: all cores)
        "cores_busy": cpu_s / med / cores,
        # the driver, the ledger or one rollout actor: one process, so 1.0 would bound it
        "busiest_process_core": max(
            parts["driver"], parts["ledger"], parts["rollout_actors"] / actors
        )
        / med,
        "idle_cores_busy": sum(idle.values()) / idle_wall / cores,
        "idle_by_part": {k: round(v / idle_wall, 3) for k, v in idle.items()},
        # the rate all the cores could give at this CPU per rollout (nothing else running)
        "cores_bound_per_s": cores / (cpu_s / n),
        "load_1min": load,
        "placement": placement,
    }
    progress(
        f"{n_nodes} node(s), {actors} actors x {per_actor}: {row['per_s']:.0f}/s "
        f"({n} rows, ideal {row['ideal_per_s']:.0f}/s, the cores' bound "
        f"{row['cores_bound_per_s']:.0f}/s), {row['cpu_ms_per_rollout']:.2f} ms CPU/rollout "
        f"{row['cpu_ms_by_part']}, cores busy {row['cores_busy']:.2f} (idle "
        f"{row['idle_cores_busy']:.2f}), load {load:.1f}, placement {placement}"
    )
    return row


def checkpoints(orch: Any, fleet: DurableFleet, p: dict, tmp: Path) -> list[dict[str, Any]]:
    rows_out: list[dict[str, Any]] = []
    counter = 0
    plan = [("finished", n) for n in p["unacked"]] + [("running", n) for n in p["running"]]
    for kind, n in plan:
        times: dict[str, float] = {}
        report = None
        load = os.getloadavg()[0]
        fill_s: dict[str, float] = {}
        n_left: dict[str, int] = {"ours": n, "direct": n}
        for policy in ("ours", "direct"):
            counter += 1
            prefix = f"{orch.run_id}-{kind[0]}{counter}"
            t_fill = time.perf_counter()
            eps = fleet.endpoints
            if kind == "finished" and n >= p["seed_from"]:
                fleet.fresh(prefix, n)
                _state_lost_seen(orch, f"lost-{counter}", tmp)
            elif kind == "finished":
                asyncio.run(leave_finished(eps, n, prefix, concurrency=256))
            else:
                n_left[policy] = asyncio.run(leave_running(eps, n, prefix, concurrency=1024))
            fill_s[policy] = time.perf_counter() - t_fill
            cid = f"ck-{kind[0]}{counter}"
            t0 = time.perf_counter()
            if policy == "ours":
                report = _checkpoint(orch, cid, tmp)
            else:
                asyncio.run(direct_checkpoint(eps, cid, str(tmp / cid)))
            times[policy] = time.perf_counter() - t0
            _clean(fleet, f"{policy} {kind} n={n}")
        assert report is not None
        row = {
            "kind": kind,
            "attempts": n,
            "attempts_left": n_left,  # running: what Gym had running (a loaded machine drops some)
            "servers": SERVERS,
            "ours_s": times["ours"],
            "direct_s": times["direct"],
            "ratio": ratio(times["ours"], times["direct"]),
            "per_s_per_server": n / times["ours"] / SERVERS,
            "orphans_acked": report.orphans_acked,
            "retired": report.retired,
            "prepare_rounds": max(e.prepare_rounds for e in report.endpoints),
            "fill_s": fill_s,
            "seeded": kind == "finished" and n >= p["seed_from"],
            "load_1min": load,
        }
        rows_out.append(row)
        progress(
            f"{kind} {n:,} over {SERVERS}: ours {times['ours']:.2f}s, direct "
            f"{times['direct']:.2f}s (x{row['ratio']:.2f}); acked {report.orphans_acked}, "
            f"retired {report.retired}; load {load:.1f}"
        )
    return rows_out


def _state_lost_seen(orch: Any, cid: str, tmp: Path) -> None:
    """After ``fleet.fresh()`` every server has a new store epoch: the gate's next checkpoint
    says GymStateLost (what a Gym restarted on an empty state dir is) before it acts on anything,
    and remembers the new epoch. That checkpoint runs here, untimed, so the timed one is not it."""
    from rl_gym_actors.errors import GymStateLost

    try:
        orch.checkpoint(cid, str(tmp / cid), deadline_s=DEADLINE_S)
    except GymStateLost:
        return
    raise RuntimeError("a checkpoint after fresh state dirs did not say GymStateLost")


def node_loss(
    ray: Any, cluster: Any, orch: Any, fleet: DurableFleet, p: dict, tmp: Path, nodes_up: list
) -> dict[str, Any]:
    placement = _placement(ray, orch)
    head = nodes_up[0]
    victim = next(nd for nd in nodes_up[1:] if placement.get(nd.node_id[:8]))
    lost = placement[victim.node_id[:8]]
    killed: dict[str, float] = {}

    def kill() -> None:
        time.sleep(1.0)
        killed["t"] = time.perf_counter()
        cluster.remove_node(victim, allow_graceful=False)

    killer = threading.Thread(target=kill, name="node-killer")
    t0 = time.perf_counter()
    killer.start()
    outs = orch.run_batch(_rows(f"{orch.run_id}-kill", p["kill_rows"], 2.0))
    batch_s = time.perf_counter() - t0
    killer.join()
    nodes_up.remove(victim)
    status = Counter(o.status for o in outs)
    silent = sum(1 for o in outs if o.status != "sealed" and o.failure is None)
    t_ck = time.perf_counter()
    report = _checkpoint(orch, "after-node-loss", tmp)
    committed = time.perf_counter()
    _clean(fleet, "after the node loss")
    # the next batch: the pool replaces the lost actors on its next failed calls
    later = []
    clean_s = None  # kill to the end of the first batch with every row sealed
    for k in range(3):
        outs_k = orch.run_batch(_rows(f"{orch.run_id}-after{k}", p["kill_rows"], AGENT_S))
        st = Counter(o.status for o in outs_k)
        later.append({"batch": k + 1, **st})
        if st["sealed"] == len(outs_k):
            clean_s = time.perf_counter() - killed["t"]
            break
    _checkpoint(orch, "after-recovery", tmp)
    row = {
        "victim": victim.node_id[:8],
        "head": head.node_id[:8],
        "actors_lost": lost,
        "rows": p["kill_rows"],
        "sealed": status["sealed"],
        "failed": status["failed"],
        "abandoned": status["abandoned"],
        "without_reason": silent,
        "batch_s": batch_s,
        "checkpoint_s": committed - t_ck,
        "recovery_s": committed - killed["t"],
        "orphans_acked": report.orphans_acked,
        "retired": report.retired,
        "later_batches": later,
        "clean_batch_s": clean_s,
        "health_check": HEALTH,
    }
    progress(
        f"node {row['victim']} ({lost} actors) killed: {dict(status)}, {silent} without a "
        f"reason; checkpoint committed {row['recovery_s']:.1f}s after the kill, a clean "
        f"batch {clean_s if clean_s is None else round(clean_s, 1)}s after"
    )
    return row


def start_head(actors_per_node: int) -> tuple[Any, list[Any]]:
    """The cluster's head node (node 0: its actors' CPUs and a spare, no dashboard, Ray's
    health checks at HEALTH) and this driver attached to it: the cluster and its nodes up."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=False)
    head = dict(
        num_cpus=actors_per_node + SPARE_CPUS,
        resources={"rlga_node0": 1},
        include_dashboard=False,
        _system_config=HEALTH,
        **LOOPBACK,
    )
    nodes_up = [_started(lambda: cluster.add_node(**head))]
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    return cluster, nodes_up


def stop_all(orch: Any, fleet: Any, cluster: Any, tmp: Path) -> None:
    """What :func:`start_head` and a run started, stopped: the orchestrator (when one was
    made), the Gym servers, this driver's Ray, the cluster, and the run's files."""
    import ray

    if orch is not None:
        orch.close()
    fleet.stop()
    ray.shutdown()
    cluster.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


def _add_node(cluster: Any, p: dict, i: int) -> Any:
    return _started(
        lambda: cluster.add_node(
            num_cpus=p["actors_per_node"] + SPARE_CPUS, resources={f"rlga_node{i}": 1}, **LOOPBACK
        )
    )


def _started(start: Any, tries: int = 5) -> Any:
    """A node started, tried again when Ray gives up on it (its raylet must register within
    30 s, which a loaded machine misses); a failed try's processes (this process's own
    children) are killed first."""
    for attempt in range(1, tries + 1):
        before = {p.pid for p in common.process_tree()}
        try:
            return start()
        except Exception as exc:
            if attempt == tries:
                raise
            progress(f"node start failed ({exc}); again")
            for proc in common.process_tree():
                if proc.pid not in before and proc.kind == "ray_system":
                    with contextlib.suppress(OSError):
                        os.kill(proc.pid, 9)
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- the run


def body(result: Result, args: Any) -> None:
    import ray

    p = dict(QUICK if args.quick else FULL)
    for key in ("nodes", "actors_per_node", "per_actor", "rows"):
        if getattr(args, key) is not None:
            p[key] = getattr(args, key)
    if args.big and 100_000 not in p["unacked"]:  # the goal's size in quick mode too
        p["unacked"] = [*p["unacked"], 100_000]
    result.params.update(p, servers=SERVERS, agent_s=AGENT_S, health=HEALTH)
    tmp = Path(tempfile.mkdtemp(prefix="rlga-bench-scale-"))
    t0 = time.perf_counter()
    cluster, nodes_up = start_head(p["actors_per_node"])
    fleet = DurableFleet(SERVERS, tmp / "gym").start()
    result.extra["start_s"] = round(time.perf_counter() - t0, 1)
    progress(f"head node and {SERVERS} durable Gym servers up in {result.extra['start_s']}s")
    orch = None
    try:
        tp, orch = throughput(ray, cluster, fleet, p, tmp, nodes_up)
        ck, loss = [], {}
        try:  # a later phase that fails keeps the other figures, and says why
            if "checkpoint" in args.phases:
                ck = checkpoints(orch, fleet, p, tmp)
        except Exception as exc:
            result.notes.append(f"Checkpoint phase stopped: {type(exc).__name__}: {exc}"[:500])
            progress(f"checkpoint phase stopped: {exc!r}")
        try:
            if "loss" in args.phases:
                loss = node_loss(ray, cluster, orch, fleet, p, tmp, nodes_up)
        except Exception as exc:
            progress(traceback.format_exc())
            result.notes.append(f"Node-loss phase stopped: {type(exc).__name__}: {exc}"[:500])
            progress(f"node-loss phase stopped: {exc!r}")
    finally:
        stop_all(orch, fleet, cluster, tmp)
    result.rows = [{"part": "throughput", **r} for r in tp] + [
        {"part": "checkpoint", **r} for r in ck
    ]
    result.extra["node_loss"] = loss
    report(result, tp, ck, loss)


def report(result: Result, tp: list[dict], ck: list[dict], loss: dict) -> None:
    result.add_table(
        f"Rollouts/s as raylets are added: the same {tp[0]['rollouts']} rows ("
        f"{AGENT_S * 1e3:.0f} ms agents) at every size; each node brings its actors; rows "
        f"spread over {SERVERS} durable Gym servers. CPU over every process of the cluster "
        "(driver, ledger, rollout actors, Ray's GCS/raylets/agents/idle workers, Gym servers); "
        "cores busy = CPU seconds / wall / cores (1.0: both cores), idle = the same cluster with "
        "nothing running; the cores' bound = cores / CPU per rollout:",
        [
            "nodes",
            "actors x rollouts each",
            "rollouts/s",
            "vs 1 node",
            "ideal /s (slots / 100 ms)",
            "the cores' bound /s",
            "CPU ms/rollout",
            "driver / ledger / actors / Ray / Gym",
            "cores busy",
            "idle",
            "busiest process (cores)",
            "load (1 min)",
        ],
        [
            [
                r["nodes"],
                f"{r['actors']} x {r['rollouts_per_actor']}",
                r["per_s"],
                r["vs_1_node"],
                r["ideal_per_s"],
                r["cores_bound_per_s"],
                r["cpu_ms_per_rollout"],
                " / ".join(
                    f"{r['cpu_ms_by_part'][k]:.2f}"
                    for k in ("driver", "ledger", "rollout_actors", "ray", "gym")
                ),
                r["cores_busy"],
                r["idle_cores_busy"],
                r["busiest_process_core"],
                r["load_1min"],
            ]
            for r in tp
        ],
    )
    if ck:
        _checkpoint_table(result, ck)
    if loss:
        _loss_table(result, loss)
    _headline(result, tp, ck, loss)


def _checkpoint_table(result: Result, ck: list[dict]) -> None:
    result.add_table(
        f"Checkpoint, from checkpoint() to committed on all {SERVERS} servers, with attempts "
        "left behind (one trial each; every checkpoint verified clean on every server after). "
        "Baseline: the hand-written minimum with the client, no Ray:",
        [
            "left behind",
            "attempts",
            "ours (s)",
            "direct (s)",
            "ours / direct",
            "per s per server (ours)",
            "orphans ACKed",
            "retired",
            "prepare rounds",
            "load (1 min)",
        ],
        [
            [
                r["kind"] + (" (seeded)" if r["seeded"] else ""),
                r["attempts"],
                r["ours_s"],
                r["direct_s"],
                r["ratio"],
                r["per_s_per_server"],
                r["orphans_acked"],
                r["retired"],
                r["prepare_rounds"],
                r["load_1min"],
            ]
            for r in ck
        ],
    )


def _loss_table(result: Result, loss: dict) -> None:
    result.add_table(
        "A worker node killed 1 s into a batch of 2 s rows (4 nodes), then a checkpoint at once "
        "(recovery: kill to that checkpoint committed on every server):",
        [
            "actors lost",
            "rows",
            "sealed",
            "failed (with a reason)",
            "without a reason",
            "checkpoint s",
            "recovery s (kill to committed)",
            "orphans ACKed",
            "retired",
            "batches after until clean",
            "kill to a clean batch (s)",
        ],
        [
            [
                loss["actors_lost"],
                loss["rows"],
                loss["sealed"],
                loss["failed"],
                loss["without_reason"],
                loss["checkpoint_s"],
                loss["recovery_s"],
                loss["orphans_acked"],
                loss["retired"],
                len(loss["later_batches"]),
                loss.get("clean_batch_s"),
            ]
        ],
    )


def _headline(result: Result, tp: list[dict], ck: list[dict], loss: dict) -> None:
    if tp:
        _throughput_notes(result, tp)
    if ck:
        _checkpoint_notes(result)
    if loss:
        result.notes.append(
            f"Ray health checks: {HEALTH['health_check_period_ms']} ms x "
            f"{HEALTH['health_check_failure_threshold']} (Ray's default 3,000 ms x 5): the "
            "recovery time is mostly Ray declaring the node dead."
        )
    parts = []
    for per in sorted({r["rollouts_per_actor"] for r in tp}):
        four = max((r for r in tp if r["rollouts_per_actor"] == per), key=lambda r: r["nodes"])
        parts.append(
            f"{four['nodes']} raylets x {four['actors'] // four['nodes']} actors x {per}: "
            f"{four['per_s']:.0f} rollouts/s, {four['vs_1_node']:.2f}x 1 raylet "
            f"({four['cores_busy']:.2f} of the cores busy)"
        )
    big = {(r["kind"], r["attempts"]): r for r in ck}
    for kind, n in (("finished", 100_000), ("running", 10_000)):
        r = big.get((kind, n))
        if r:
            parts.append(
                f"{n:,} {kind} over {SERVERS} servers committed in {r['ours_s']:.2f} s "
                f"({r['ratio']:.2f}x the minimum)"
            )
    if loss:
        parts.append(f"a node lost mid-batch recovered in {loss['recovery_s']:.1f} s")
    result.extra["headline"] = "; ".join(parts)


def _throughput_notes(result: Result, tp: list[dict]) -> None:
    busiest = max(r["busiest_process_core"] for r in tp)
    for per in sorted({r["rollouts_per_actor"] for r in tp}):
        one = next(r for r in tp if r["rollouts_per_actor"] == per)
        bound = "its slots" if one["ideal_per_s"] < one["cores_bound_per_s"] else "the cores"
        result.notes.append(
            f"{per} rollouts per actor: 1 raylet offers {one['in_flight']} slots, "
            f"{one['ideal_per_s']:.0f}/s at 100 ms, against the cores' "
            f"{one['cores_bound_per_s']:.0f}/s at its {one['cpu_ms_per_rollout']:.1f} ms CPU per "
            f"rollout: {bound} bound 1 raylet. More raylets add slots, not cores: a ratio "
            "above 1 needs 1 raylet's slots below the cores' bound."
        )
    result.notes.append(
        f"No single process bounds it: the busiest (driver, ledger or one rollout actor) used "
        f"{busiest:.2f} of a core. Cores busy below 1.0 with the load average above the 2 cores "
        "is the share of the machine the other processes left this cluster: the rates and "
        "ratios then move with the load between rows (each row's load is beside it)."
    )
    result.notes.append(
        "Where the CPU goes with 4 raylets x 2 actors x 16 (py-spy on the driver, the ledger, a "
        "rollout actor and a Gym host): [profile_scale.md](results/profile_scale.md) "
        "(`benchmarks/profile_scale.py --quick`)."
    )


def _checkpoint_notes(result: Result) -> None:
    result.notes.append(
        "Finished attempts of the seeded size are written into each server's state dir with the "
        "server's own store and reply encoding while it is stopped (filling them through /run "
        "would take minutes); the smaller sizes are left by /run calls whose replies are "
        "dropped. Running attempts are /run calls abandoned after 3 s (1,024 at once)."
    )
    result.notes.append(
        "Where a big checkpoint's time goes (py-spy on the ledger actor, which runs the gate, and "
        "on a Gym host): [profile_checkpoint_finished.md](results/profile_checkpoint_finished.md) "
        "(`benchmarks/profile_checkpoint.py --quick --attempts 100000`: 100,000 finished over 16 "
        "servers; before the listing work, 10,000: "
        "[profile_checkpoint_finished_before.md](results/profile_checkpoint_finished_before.md)) "
        "and [profile_checkpoint_running.md](results/profile_checkpoint_running.md) "
        "(`--kind running`: 10,000 running)."
    )
    result.notes.append(
        "Each server lists its attempts once per status (the (ext) compact listing; a prepare "
        "asks for the keys only) and the gate ACKs 2,000 receipts a call, four calls at once per "
        "server; the minimum does the same with the client alone (one listing)."
    )


def plot(res: dict, path: Path) -> bool:
    """Two panels: rollouts/s and cores busy by nodes; checkpoint seconds by attempts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tp = [r for r in res.get("rows", []) if r.get("part") == "throughput"]
    ck = [r for r in res.get("rows", []) if r.get("part") == "checkpoint"]
    if not tp and not ck:
        return False
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    if tp:
        twin = a1.twinx()
        for j, per in enumerate(sorted({r.get("rollouts_per_actor", 0) for r in tp})):
            rs = [r for r in tp if r.get("rollouts_per_actor", 0) == per]
            xs = [r["nodes"] for r in rs]
            a1.plot(xs, [r["per_s"] for r in rs], "o-", color=f"C{j}", label=f"x {per}: /s")
            a1.plot(xs, [r["ideal_per_s"] for r in rs], ":", color=f"C{j}", label="ideal")
            twin.plot(xs, [r["cores_busy"] for r in rs], "s--", color=f"C{j}", alpha=0.5)
        a1.set_yscale("log")
        a1.set_xticks(sorted({r["nodes"] for r in tp}))
        a1.set_xlabel("raylets (each with 2 actors x rollouts each)")
        a1.set_ylabel(f"rollouts / s ({AGENT_S * 1e3:.0f} ms agents)")
        twin.set_ylabel("cores busy (dashed; 1.0 = both cores)")
        twin.set_ylim(0, 1.1)
        a1.legend(fontsize=7, loc="upper left")
        a1.set_title("Throughput by raylets")
    for j, kind in enumerate(("finished", "running")):
        rs = sorted((r for r in ck if r["kind"] == kind), key=lambda r: r["attempts"])
        if rs:
            xs = [r["attempts"] for r in rs]
            a2.plot(xs, [r["ours_s"] for r in rs], "o-", color=f"C{j}", label=f"ours, {kind}")
            a2.plot(xs, [r["direct_s"] for r in rs], "s:", color=f"C{j}", label=f"minimum, {kind}")
    a2.set_xscale("log")
    a2.set_yscale("log")
    a2.set_xlabel(f"attempts left over {SERVERS} servers")
    a2.set_ylabel("seconds to committed")
    a2.legend(fontsize=7)
    a2.set_title("Checkpoint latency")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _args(parser: Any) -> None:
    parser.add_argument(
        "--big",
        action="store_true",
        help="quick mode with the 100,000 finished case too (the full run always has it)",
    )
    parser.add_argument(
        "--phases",
        nargs="*",
        choices=("checkpoint", "loss"),
        default=["checkpoint", "loss"],
        help="after the throughput phase (always run: it builds the cluster)",
    )
    parser.add_argument("--nodes", type=int, nargs="+", help="cluster sizes (default 1 2 4)")
    parser.add_argument("--actors-per-node", type=int, help="rollout actors a node brings (2)")
    parser.add_argument("--per-actor", type=int, nargs="+", help="rollouts_per_actor (4 16)")
    parser.add_argument("--rows", type=int, help="rows at every cluster size (quick 384)")


if __name__ == "__main__":
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # the throughput phase alone (``--phases`` with none after it) writes results of its own,
    # results/scale_throughput.*, leaving the checkpoint and node-loss figures of scale.* as
    # they are
    alone = "--phases" in sys.argv and not {"checkpoint", "loss"} & set(sys.argv)
    bench_main(
        "scale_throughput" if alone else "scale",
        "At scale: rollouts/s by raylets"
        if alone
        else "At scale: raylets, 16 Gym servers, checkpoints of 100k",
        body,
        extra_args=_args,
    )
