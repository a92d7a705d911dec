"""Checkpoint latency: from checkpoint() to committed, with attempts left behind on Gym.

For 0 and 1,000 (full mode: also 100 and 10,000) attempts spread over 1 and over 4 Gym servers:

- ``finished``: attempts that finished and were never ACKed (their replies were lost): the
  checkpoint must ACK them as orphans;
- ``running``: attempts still running whose owners are gone (started straight through the client
  with a long ``sleep_s``, then abandoned): the checkpoint must retire them;
- ``sealed``: results the orchestrator's own rollouts sealed and left un-ACKed for the checkpoint
  (``ack="at_checkpoint"``, the default): the checkpoint must ACK them (one server only).

Each configuration starts on fresh servers (quick mode: on the same ones, clean after each
checkpoint); its trials alternate ours and the baseline, each after leaving the same number of new
attempts. The baseline is the least the protocol needs, hand-written with the client and no Ray:
status, one acknowledge-completed per 500 receipts or one retire per running attempt (32 at once, as
the gate does), prepare, commit, resume. The as-is policy cannot commit any of these checkpoints at
all (it never ACKs or retires what it did not receive), so it has no row here; see fault_storm.py.

    .venv/bin/python benchmarks/checkpoint.py [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import common
from common import Result, bench_main, progress, ratio
from fleet import Fleet, gym_counts, leave_finished, leave_running

from rl_gym_actors.config import GymEndpoint

# quick (`make bench`): the empty checkpoint and 1,000 left behind (the figures RESULTS.md and
# the issues quote); the 100s and 10,000s are full mode's
QUICK = dict(
    sizes=[0, 1000],
    servers=[1, 4],
    kinds=["finished", "running", "sealed"],
    small_trials=3,
    large_trials=1,  # one trial each way at 1,000 (each leaves 1,000 first): noisier, said so
    large_from=1000,
    # the same servers throughout (a restart is ~2 s of CPU a server): every checkpoint leaves
    # them with nothing running or un-ACKed, which _check_clean verifies after each
    restart=False,
)
FULL = dict(
    sizes=[0, 100, 1000, 10_000],
    servers=[1, 4],
    kinds=["finished", "running", "sealed"],
    small_trials=3,
    large_trials=1,
    large_from=10_000,
    restart=True,  # fresh, empty servers for each configuration
)
SEALED_SERVERS = 1  # sealed results are left by real rollouts: one server is enough
DEADLINE_S = 300.0
GATE_CONCURRENCY = 32  # what the checkpoint gate uses per endpoint
ACK_CHUNK = 500


# ---------------------------------------------------------------- the baseline


async def direct_checkpoint(endpoints: Sequence[GymEndpoint], cid: str, cdir: str) -> dict:
    """The hand-written minimum, per endpoint at once: status, ACK / retire, prepare, commit,
    resume."""
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient

    async def one(i: int, ep: GymEndpoint) -> dict:
        deadline = time.time() + DEADLINE_S
        async with GymClient(ep, control_limit=GATE_CONCURRENCY) as client:
            st = await client.status(cid, deadline_ts=deadline)
            receipts = [
                a.completion_receipt
                for a in st.completed_unacknowledged_attempts
                if a.completion_receipt is not None
            ]
            for k in range(0, len(receipts), ACK_CHUNK):
                await client.acknowledge_completed(
                    receipts[k : k + ACK_CHUNK], deadline_ts=deadline
                )
            running = [a for a in st.blocking_attempts if a.state == "running"]
            sem = asyncio.Semaphore(GATE_CONCURRENCY)

            async def retire(a: Any) -> None:
                async with sem:
                    await client.retire(
                        a.rollout_id, a.attempt_index, checkpoint_id=cid, deadline_ts=deadline
                    )

            await asyncio.gather(*(retire(a) for a in running))
            report = await client.prepare(cid, deadline_ts=deadline)
            if not report.ready_to_commit:
                raise RuntimeError(f"direct checkpoint not ready on {ep.url}: {report.summary()}")
            await client.commit(cid, str(Path(cdir) / str(i)), deadline_ts=deadline)
            await client.resume(cid, deadline_ts=deadline)
            return {"acked": len(receipts), "retired": len(running)}

    parts = await asyncio.gather(*(one(i, ep) for i, ep in enumerate(endpoints)))
    return {"acked": sum(p["acked"] for p in parts), "retired": sum(p["retired"] for p in parts)}


# ---------------------------------------------------------------- ours


class Gate:
    """This project's checkpoint, as a trainer calls it: ``Orchestrator.checkpoint``."""

    def __init__(self, endpoints: Sequence[GymEndpoint], tag: str) -> None:
        from rl_gym_actors.config import PoolConfig
        from rl_gym_actors.orchestrator import Orchestrator

        # one actor, many rollouts each: enough to leave thousands of sealed results quickly
        self.orch = Orchestrator(
            list(endpoints),
            pool=PoolConfig(size=1, rollouts_per_actor=64),
            orchestrator_id=f"bench-ckpt-{tag}",
            progress=False,
        )

    def checkpoint(self, cid: str, cdir: str) -> Any:
        return self.orch.checkpoint(cid, cdir, deadline_s=DEADLINE_S)

    def close(self) -> None:
        self.orch.close()


def _leave(kind: str, endpoints: Sequence[GymEndpoint], n: int, prefix: str, gate: Gate) -> None:
    if n == 0:
        return
    if kind == "sealed":
        outcomes = gate.orch.run_batch(
            [{"_ng_rollout_id": f"{prefix}-{i}", "reward": 0.5} for i in range(n)]
        )
        if any(o.status != "sealed" or o.acked for o in outcomes):
            raise RuntimeError("sealed: a rollout did not end sealed and un-ACKed")
        return
    if kind == "finished":
        asyncio.run(leave_finished(endpoints, n, prefix))
        return
    reached = asyncio.run(leave_running(endpoints, n, prefix))
    if reached < n:
        raise RuntimeError(f"running: {reached} of {n} abandoned runs reached Gym")


def _state_lost_seen(gate: Gate, cid: str, tmp: Path) -> None:
    """After ``fleet.restart()`` each restarted server has a new store epoch: the gate's next
    checkpoint says GymStateLost (what a Gym restarted without its state is) and remembers the
    new epoch (a gate that had not met the servers yet just commits). That checkpoint runs here,
    untimed, so the timed one is not it."""
    from rl_gym_actors.errors import GymStateLost

    with contextlib.suppress(GymStateLost):
        gate.checkpoint(cid, str(tmp / cid))


def _check_clean(endpoints: Sequence[GymEndpoint], what: str) -> None:
    counts = asyncio.run(gym_counts(endpoints))
    left = {u: c for u, c in counts.items() if c["running"] or c["completed_unacknowledged"]}
    if left:
        raise RuntimeError(f"{what}: attempts left on Gym after the checkpoint: {left}")


def body(result: Result, args: Any) -> None:
    p = QUICK if args.quick else FULL
    result.params.update(p)
    common.start_ray(num_cpus=2)
    tmp = Path(tempfile.mkdtemp(prefix="rlga-bench-ckpt-"))
    fleet = Fleet(max(p["servers"])).start()
    gates: dict[int, Gate] = {}
    rows: list[dict[str, Any]] = []
    counter = 0
    try:
        for n_servers in p["servers"]:
            gates[n_servers] = Gate(fleet.endpoints[:n_servers], f"s{n_servers}")
        for kind in p["kinds"]:
            for n_servers in p["servers"]:
                eps = fleet.endpoints[:n_servers]
                if kind == "sealed" and n_servers != SEALED_SERVERS:
                    continue
                for n in p["sizes"]:
                    if n == 0 and kind != p["kinds"][0]:
                        continue  # nothing left behind is the same for both kinds
                    trials = p["large_trials"] if n >= p["large_from"] else p["small_trials"]
                    ours, base, report = [], [], None
                    if n and p["restart"]:
                        # fresh, empty servers for each configuration (the ones it uses)
                        fleet.restart(n_servers)
                        for tag, g in gates.items():
                            _state_lost_seen(g, f"bench-fresh-{counter}-{tag}", tmp)
                    for _ in range(trials):
                        for policy in ("ours", "direct"):
                            counter += 1
                            cid = f"bench-{counter}"
                            # ids of the gate's own run: another run's would be foreign, only
                            # waited for (a run that left attempts behind and restarted)
                            gate = gates[n_servers]
                            _leave(kind, eps, n, f"{gate.orch.run_id}-{kind[0]}{counter}", gate)
                            t0 = time.perf_counter()
                            if policy == "ours":
                                report = gates[n_servers].checkpoint(cid, str(tmp / cid))
                                ours.append(time.perf_counter() - t0)
                            else:
                                asyncio.run(direct_checkpoint(eps, cid, str(tmp / cid)))
                                base.append(time.perf_counter() - t0)
                            _check_clean(eps, f"{policy} {kind} n={n} servers={n_servers}")
                    row = {
                        "kind": kind if n else "none",
                        "attempts": n,
                        "servers": n_servers,
                        "trials": trials,
                        "ours_s": min(ours),
                        "ours_s_trials": ours,
                        "direct_s": min(base),
                        "direct_s_trials": base,
                        "ratio": ratio(min(ours), min(base)),
                        "ours_ms_per_attempt": (min(ours) / n * 1e3) if n else None,
                        "orphans_acked": report.orphans_acked if report else None,
                        "sealed_acked": report.sealed_acked if report else None,
                        "retired": report.retired if report else None,
                        "adopted": report.adopted if report else None,
                        "prepare_rounds": max(e.prepare_rounds for e in report.endpoints)
                        if report
                        else None,
                    }
                    rows.append(row)
                    progress(
                        f"{row['kind']} n={n} servers={n_servers}: ours {row['ours_s']:.3f}s"
                        f" direct {row['direct_s']:.3f}s"
                    )
    finally:
        for g in gates.values():
            g.close()
        fleet.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        common.stop_ray()
    result.rows = rows
    result.add_table(
        "Time from checkpoint() to committed (best of the trials; every checkpoint verified clean "
        "on every server afterwards). Baseline: the hand-written minimum with the client, no Ray:",
        [
            "left behind",
            "attempts",
            "servers",
            "ours (s)",
            "direct (s)",
            "ours / direct",
            "ms per attempt (ours)",
            "orphans ACKed",
            "sealed ACKed",
            "retired",
            "prepare rounds",
        ],
        [
            [
                r["kind"],
                r["attempts"],
                r["servers"],
                r["ours_s"],
                r["direct_s"],
                r["ratio"],
                r["ours_ms_per_attempt"],
                r["orphans_acked"],
                r.get("sealed_acked"),
                r["retired"],
                r["prepare_rounds"],
            ]
            for r in rows
        ],
    )
    result.notes.append(
        "finished: status lists the un-ACKed attempts with their receipts, so the gate ACKs the "
        "orphans in acknowledge-completed batches (2,000 a call, four at once per server; the "
        "baseline sends 500 a call); the difference is the owners' flush and one Ray call to the "
        "ledger actor."
    )
    result.notes.append(
        "running: the gate first closes admission with a short prepare slice (0.5 s, "
        "FIRST_SLICE_S in actors/checkpoint_gate.py) and flushes the owners again before it "
        "retires attempts nobody reported, because a live owner may have dispatched them after "
        "the last flush; the baseline knows there are no owners and retires at once. That slice "
        "is the fixed cost at small sizes; retires (32 at once per server) dominate at large ones."
    )
    result.notes.append(
        'sealed: what ack="at_checkpoint" (the default) leaves for each checkpoint: results the '
        "rollouts sealed and did not ACK; the gate ACKs them from the status's receipts in "
        "acknowledge-completed batches of 2,000, just before prepare. The rows left behind are "
        "run through the orchestrator before each trial and are not timed."
    )
    if args.quick:
        result.notes.append(
            f"Quick mode times one checkpoint each way at {p['large_from']:,} left behind "
            f"(best of {p['small_trials']} with none): a single trial, so those rows' ratios are "
            "noisier than full mode's (3 trials up to 1,000). And it keeps its servers from one "
            "configuration to the next (full mode restarts them empty): each checkpoint leaves "
            "nothing running or un-ACKed (verified), only the settled keys of the ones before."
        )
    result.notes.append(
        "The as-is policy commits none of these checkpoints (it never ACKs or retires what it "
        "did not receive); see the fault storm."
    )
    biggest = max((r for r in rows if r["kind"] == "finished"), key=lambda r: r["attempts"])
    result.extra["headline"] = (
        f"{biggest['attempts']:,} finished, un-ACKed attempts over {biggest['servers']} server(s) "
        f"cleared and committed in {biggest['ours_s']:.2f} s ({biggest['ratio']:.1f}x the "
        f"hand-written minimum)"
    )


if __name__ == "__main__":
    bench_main("checkpoint", "Checkpoint latency with attempts left behind", body)
