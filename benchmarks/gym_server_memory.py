"""Gym server memory over a long run, without Ray: does the durable server stay flat?

One durable Gym server (``--state-dir``) driven by a plain asyncio loop of this process's
GymClient, as the orchestrator drives it with ``ack="at_checkpoint"``: ``/run`` (the receipt from
the answer's header), results ACKed in ``acknowledge-completed`` batches right before prepare,
then prepare/commit/resume every ``checkpoint_every`` rollouts. The server runs with
``--allow-faults`` as in the soak, and one row in 20 takes another path, in turn: the agent raises
(tombstoned), the key is retired after its run (``completed_unacknowledged``, then ACKed), the
receipt is withheld and its fetch delayed (``receipt_delay_s``), or the reply is dropped after it
was stored (``drop_reply``: the receipt is fetched). After each checkpoint it samples the server's
resident set size (psutil); the verdict is the growth per rollout over the second half (least
squares), goal under 50 bytes.

``--trace`` runs the server in a thread of this process instead and prints what tracemalloc
says grew between the middle and the end of the run (by line), with the participant's own
counts (records kept, settled hashes, spent checkpoint ids): the tool to find a leak, not a
figure to compare (tracemalloc slows everything and the client shares the process).

    .venv/bin/python benchmarks/gym_server_memory.py [--quick] [--trace]
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import MB, Result, bench_main, fmt, progress
from soak import slope

# quick (`make bench`): a smoke run of the same load, too short for the verdict (the RSS still
# climbs early in a run: the 50,000 rollouts quick mode once ran read 250 B/rollout over their
# second half where the full 200,000 read 18.6), so quick mode reports its slope unjudged
QUICK = dict(rollouts=10_000, checkpoint_every=500, concurrency=16)
FULL = dict(rollouts=200_000, checkpoint_every=5_000, concurrency=16)
GOAL_BYTES = 50
ODD_EVERY = 20  # one row in 20 takes one of the PATHS, in turn
PATHS = ("fail", "retire", "receipt", "drop")


async def drive(endpoint: Any, p: dict[str, Any], ckpt_root: Path, sample) -> None:
    """The load: batches of ``checkpoint_every`` rollouts, each ended by a checkpoint."""
    from rl_gym_actors.errors import AgentFailed, ConnectionLost
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient

    total, every = p["rollouts"], p["checkpoint_every"]
    async with GymClient(endpoint, limit=p["concurrency"]) as client:
        done = 0
        while done < total:
            n = min(every, total - done)
            cid = f"mem-{done + n}"
            todo = iter(range(done, done + n))
            receipts: list[Any] = []
            retire: list[tuple[str, int]] = []

            async def worker(
                todo: Iterator[int], receipts: list[Any], retire: list[tuple[str, int]]
            ) -> None:
                for i in todo:
                    rid = f"mem-{i}"
                    row: dict[str, Any] = {"reward": 1.0}
                    path = (i // ODD_EVERY) % len(PATHS) if i % ODD_EVERY == ODD_EVERY - 1 else None
                    if path is not None and PATHS[path] == "fail":
                        row["fail"] = True
                    elif path is not None and PATHS[path] == "receipt":
                        row["receipt_delay_s"] = 0.01
                    elif path is not None and PATHS[path] == "drop":
                        row["drop_reply"] = True
                    deadline = time.time() + 60
                    try:
                        res = await client.run(
                            row, rollout_id=rid, attempt_index=0, deadline_ts=deadline
                        )
                        receipt = res.receipt
                    except AgentFailed:
                        continue  # tombstoned on the server
                    except ConnectionLost:
                        receipt = None  # stored, the answer lost: fetch
                    if receipt is None:
                        receipt = (
                            await client.receipt(rid, 0, deadline_ts=deadline)
                        ).completion_receipt
                    receipts.append(receipt)
                    if path is not None and PATHS[path] == "retire":
                        retire.append((rid, 0))

            await asyncio.gather(*(worker(todo, receipts, retire) for _ in range(p["concurrency"])))
            deadline = time.time() + 120
            for rid, att in retire:  # a completed key: retire answers completed_unacknowledged
                await client.retire(rid, att, checkpoint_id=cid, deadline_ts=deadline)
            for k in range(0, len(receipts), 500):
                await client.acknowledge_completed(receipts[k : k + 500], deadline_ts=deadline)
            report = await client.prepare(cid, deadline_ts=deadline)
            assert report.ready_to_commit, report
            await client.commit(cid, str(ckpt_root / cid), deadline_ts=deadline)
            await client.resume(cid, deadline_ts=deadline)
            done += n
            await sample(done)


def run_process(result: Result, p: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    import psutil

    from rl_gym_actors.testing.gym_process import GymServerProcess

    server = GymServerProcess(
        token="bench-token", state_dir=tmp / "state", allow_faults=True
    ).start()
    proc = psutil.Process(server.pid)
    samples: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    async def sample(done: int) -> None:
        samples.append(
            {
                "rollouts": done,
                "s": round(time.perf_counter() - t0, 1),
                "gym_server_rss": proc.memory_info().rss,
            }
        )
        progress(
            f"{done:,} rollouts, {samples[-1]['s']:.0f}s: "
            f"server {samples[-1]['gym_server_rss'] / MB:.1f} MB"
        )

    try:
        asyncio.run(drive(server.endpoint, p, tmp / "ckpt", sample))
    finally:
        server.stop()
    return samples


def run_traced(p: dict[str, Any], tmp: Path) -> None:
    """The server in a thread, tracemalloc snapshots at the middle and the end."""
    import tracemalloc

    from rl_gym_actors.testing.gym_process import GymServerThread

    tracemalloc.start(8)
    server = GymServerThread(
        token="bench-token", state_dir=tmp / "state", allow_faults=True
    ).start()
    snaps: dict[str, Any] = {}
    total = p["rollouts"]

    def counts() -> dict[str, int]:
        core = server.participant.core
        return {
            "records_in_memory": len(core._all),
            "active": len(core._active),
            "settled_hashes": len(core._settled),
            "settling": len(core._settling),
            "to_compact": len(core._to_compact),
            "spent_ids": len(core.fence.spent),
            "runs": len(server.participant._runs),
            "store_waiters": len(getattr(server.participant.store, "_waiters", ())),
            "fault_keys": sum(
                len(v) for v in vars(server.faults).values() if isinstance(v, (set, dict, list))
            ),
        }

    async def sample(done: int) -> None:
        if done in (total // 2, total):
            snaps[done] = tracemalloc.take_snapshot()
            progress(f"{done:,}: {counts()}")

    try:
        asyncio.run(drive(server.endpoint, p, tmp / "ckpt", sample))
    finally:
        server.stop()
    a, b = snaps[total // 2], snaps[total]
    for key in ("lineno", "traceback"):
        print(f"--- grew between {total // 2:,} and {total:,} rollouts, by {key}")
        for stat in b.compare_to(a, key)[:12]:
            print(
                f"{stat.size_diff:+10,d} B {stat.count_diff:+7d} blocks  "
                + "\n        ".join(
                    stat.traceback.format()[-6:]
                    if key == "traceback"
                    else stat.traceback.format()[:1]
                )
            )


def body(result: Result, args: Any) -> None:
    p = QUICK if args.quick else FULL
    tmp = Path(tempfile.mkdtemp(prefix="rlga-bench-gym-memory-"))
    if args.trace:
        result.name += "_trace"  # never overwrites the figures
        run_traced(p, tmp)
        return
    result.params.update(p, odd_every=ODD_EVERY, paths=list(PATHS))
    samples = run_process(result, p, tmp)
    total = p["rollouts"]
    half = [s for s in samples if s["rollouts"] > total / 2]
    growth = slope([s["rollouts"] for s in half], [s["gym_server_rss"] for s in half])
    result.rows = samples
    verdict = "flat" if growth is not None and growth < GOAL_BYTES else "grows"
    if args.quick:
        verdict = "not judged (quick)"
    result.extra.update(
        growth_bytes_per_rollout_second_half=growth,
        verdict=verdict,
        headline=(
            f"The durable Gym server alone (no Ray), {total:,} rollouts through /run + ACK at "
            f"checkpoint: its RSS grew {fmt(growth)} B per rollout over the second half (goal < "
            f"{GOAL_BYTES}); the settled keys it must keep cost 8 B each."
            + (
                " Quick mode is a smoke run: too short for the verdict (the RSS still grows in "
                "steps this early), which is the full run's (200,000 rollouts, "
                "`gym_server_memory_full.md`)."
                if args.quick
                else ""
            )
        ),
    )
    result.add_table(
        f"Gym server (durable), {total:,} rollouts, a checkpoint every "
        f"{p['checkpoint_every']:,}; growth = least-squares slope of RSS over the second half",
        [
            "rollouts",
            "RSS start MB",
            "RSS middle MB",
            "RSS end MB",
            "growth B/rollout (2nd half)",
            f"goal < {GOAL_BYTES} B",
        ],
        [
            [
                total,
                samples[0]["gym_server_rss"] / MB,
                half[0]["gym_server_rss"] / MB,
                samples[-1]["gym_server_rss"] / MB,
                growth,
                verdict,
            ]
        ],
    )


def add_args(parser: Any) -> None:
    parser.add_argument(
        "--trace",
        action="store_true",
        help="server in a thread; print tracemalloc's growth by line",
    )


if __name__ == "__main__":
    bench_main(
        "gym_server_memory", "Gym server memory over a long run (no Ray)", body, extra_args=add_args
    )
