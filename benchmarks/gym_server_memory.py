"""Gym server memory over a long run, without Ray: does the durable server stay flat?

One durable Gym server (``--state-dir``) driven by a plain asyncio loop of this process's
GymClient, as the orchestrator drives it with ``ack="at_checkpoint"``: ``/run`` (the receipt from
the answer's header), results ACKed in ``acknowledge-completed`` batches right before prepare,
then prepare/commit/resume every ``checkpoint_every`` rollouts. The server runs with
``--allow-faults`` as in the soak, and one row in 20 takes another path, in turn: the agent raises
(tombstoned), the key is retired after its run (``completed_unacknowledged``, then ACKed), the
receipt is withheld and its fetch delayed (``receipt_delay_s``), or the reply is dropped after it
was stored (``drop_reply``: the receipt is fetched). After each checkpoint it samples the server's
resident set size (psutil). The verdict is a growth per rollout over the second half (least
squares), goal under 50 bytes, and the script exits 1 when it is over (``make bench`` fails):

- full mode (200,000 rollouts): the server's RSS, the server untraced;
- quick mode (10,000, `make bench`): too short for the RSS (it still climbs in steps this
  early), so the server runs under tracemalloc (traced_gym.py, in the server process) and the
  verdict is its Python heap's slope, which a thing kept per rollout moves from the start.

``--trace`` also takes tracemalloc snapshots in the server process at the middle and the end and
writes what grew between them, by line (``results/gym_server_memory_trace.md``): the tool to
find what is kept; ``--rollouts N`` another size.

    .venv/bin/python benchmarks/gym_server_memory.py [--quick] [--trace] [--rollouts N]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common import MB, Result, bench_main, fmt, progress
from soak import slope

# quick (`make bench`): the same load, too short for the RSS's verdict (it still climbs early in
# a run: 50,000 rollouts once read 250 B/rollout over their second half where the full 200,000
# read 18.6), so quick mode judges the traced Python heap of the server instead
QUICK = dict(rollouts=10_000, checkpoint_every=500, concurrency=16)
FULL = dict(rollouts=200_000, checkpoint_every=5_000, concurrency=16)
GOAL_BYTES = 50  # RSS growth per rollout over the second half, the full run's verdict
# the server's Python heap (tracemalloc in the server process) per rollout over the second half,
# the quick run's verdict: 8 B a settled key's hash, the rest noise (issue 30: a start time kept
# per key ever run read ~200)
GOAL_HEAP_BYTES = 50
TRACE_FRAMES = 8
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


class TracedServer:
    """The durable server in a subprocess run by traced_gym.py (tracemalloc on in the server
    process): :meth:`traced` asks it for its traced bytes, and a snapshot when ``snapshot``."""

    def __init__(self, tmp: Path, frames: int) -> None:
        from rl_gym_actors.testing.gym_process import GymServerProcess

        self.dir = tmp / "trace"
        self.dir.mkdir(parents=True)
        self._n = 0
        env = dict(os.environ, RLGA_TRACE_DIR=str(self.dir), RLGA_TRACE_FRAMES=str(frames))

        class Launched(GymServerProcess):
            def command(self, port: int) -> list[str]:
                cmd = super().command(port)  # [python, -m, rl_gym_actors.cli, gym, serve, ...]
                return [cmd[0], str(Path(__file__).with_name("traced_gym.py")), *cmd[3:]]

        self.server = Launched(
            token="bench-token", state_dir=tmp / "state", allow_faults=True, env=env
        )

    def traced(self, snapshot: bool = False) -> tuple[int, Any]:
        """The server's traced bytes now (and its tracemalloc snapshot, when asked)."""
        import tracemalloc

        from rl_gym_actors.testing.polling import wait_for

        n, self._n = self._n, self._n + 1
        (self.dir / f"want-{n}").write_text("snapshot" if snapshot else "")
        answer = self.dir / f"traced-{n}.json"
        wait_for(answer.exists, timeout_s=120, interval_s=0.01, what=f"the server's {answer.name}")
        current = json.loads(answer.read_text())["current"]
        snap = tracemalloc.Snapshot.load(str(self.dir / f"snapshot-{n}")) if snapshot else None
        return current, snap


def run_process(
    p: dict[str, Any], tmp: Path, *, traced: bool, snapshots: bool
) -> tuple[list[dict[str, Any]], dict[int, Any]]:
    """The load against the durable server in a subprocess; after each checkpoint its RSS (and,
    ``traced``, its tracemalloc-traced bytes; ``snapshots``: a snapshot at the middle and end)."""
    import psutil

    from rl_gym_actors.testing.gym_process import GymServerProcess

    tracer = TracedServer(tmp, frames=TRACE_FRAMES if snapshots else 1) if traced else None
    server = (
        tracer.server
        if tracer is not None
        else GymServerProcess(token="bench-token", state_dir=tmp / "state", allow_faults=True)
    )
    server.start()
    proc = psutil.Process(server.pid)
    samples: list[dict[str, Any]] = []
    snaps: dict[int, Any] = {}
    total = p["rollouts"]
    t0 = time.perf_counter()

    async def sample(done: int) -> None:
        row = {"rollouts": done, "s": round(time.perf_counter() - t0, 1)}
        if tracer is not None:
            want = snapshots and done in (total // 2, total)
            row["gym_server_traced"], snap = await asyncio.to_thread(tracer.traced, want)
            if snap is not None:
                snaps[done] = snap
        row["gym_server_rss"] = proc.memory_info().rss
        samples.append(row)
        progress(
            f"{done:,} rollouts, {row['s']:.0f}s: server {row['gym_server_rss'] / MB:.1f} MB"
            + (f", traced {row['gym_server_traced'] / MB:.2f} MB" if tracer is not None else "")
        )

    try:
        asyncio.run(drive(server.endpoint, p, tmp / "ckpt", sample))
    finally:
        server.stop()
    return samples, snaps


def growth_by_line(a: Any, b: Any, total: int, top: int = 12) -> list[list[Any]]:
    """What grew between snapshots ``a`` (middle) and ``b`` (end), by line, per rollout."""
    per = total - total // 2
    rows = []
    for stat in b.compare_to(a, "lineno")[:top]:
        frame = stat.traceback[0]
        where = f"{_short(frame.filename)}:{frame.lineno}"
        rows.append([where, stat.size_diff, stat.count_diff, stat.size_diff / per])
    return rows


def _short(path: str) -> str:
    for marker in ("/rl_gym_actors/", "/site-packages/", "/lib/python"):
        if marker in path:
            return path[path.index(marker) + 1 :]
    return path


def body(result: Result, args: Any) -> None:
    p = dict(QUICK if args.quick else FULL)
    if args.rollouts:
        p["rollouts"] = args.rollouts
    tmp = Path(tempfile.mkdtemp(prefix="rlga-bench-gym-memory-"))
    # quick: the server traced (its Python heap's slope is the verdict, RSS shown unjudged);
    # full: untraced (tracemalloc's own bookkeeping would grow the RSS), the RSS is the verdict
    traced = args.quick or args.trace
    if args.trace:
        result.name += "_trace"  # never overwrites the figures
    result.params.update(p, odd_every=ODD_EVERY, paths=list(PATHS), traced=traced)
    samples, snaps = run_process(p, tmp, traced=traced, snapshots=args.trace)
    total = p["rollouts"]
    half = [s for s in samples if s["rollouts"] > total / 2]
    xs = [s["rollouts"] for s in half]
    growth = slope(xs, [s["gym_server_rss"] for s in half])
    heap = slope(xs, [s["gym_server_traced"] for s in half]) if traced else None
    result.rows = samples
    judged, goal = (heap, GOAL_HEAP_BYTES) if args.quick else (growth, GOAL_BYTES)
    verdict = "flat" if judged is not None and judged < goal else "grows"
    result.extra.update(
        growth_bytes_per_rollout_second_half=growth,
        heap_growth_bytes_per_rollout_second_half=heap,
        judged="heap" if args.quick else "rss",
        goal_bytes=goal,
        verdict=verdict,
        headline=(
            f"The durable Gym server alone (no Ray), {total:,} rollouts through /run + ACK at "
            f"checkpoint: its RSS grew {fmt(growth)} B per rollout over the second half"
            + (
                f", its Python heap (tracemalloc, in the server) {fmt(heap)} B; the verdict is "
                f"the heap's (goal < {GOAL_HEAP_BYTES}): a run this short still climbs in RSS, "
                "the full run (200,000 rollouts, untraced, `gym_server_memory_full.md`) judges "
                f"the RSS (goal < {GOAL_BYTES})"
                if args.quick
                else f" (goal < {GOAL_BYTES})"
            )
            + "; the settled keys the server must keep cost 8 B each."
        ),
    )
    result.add_table(
        f"Gym server (durable), {total:,} rollouts, a checkpoint every "
        f"{p['checkpoint_every']:,}; growth = least-squares slope over the second half",
        [
            "rollouts",
            "RSS start MB",
            "RSS middle MB",
            "RSS end MB",
            "RSS growth B/rollout",
            "heap growth B/rollout",
            f"verdict ({'heap' if args.quick else 'RSS'} < {goal} B)",
        ],
        [
            [
                total,
                samples[0]["gym_server_rss"] / MB,
                half[0]["gym_server_rss"] / MB,
                samples[-1]["gym_server_rss"] / MB,
                growth,
                heap if traced else "untraced",
                verdict,
            ]
        ],
    )
    if snaps:
        result.add_table(
            f"What grew in the server between {total // 2:,} and {total:,} rollouts "
            "(tracemalloc, by line)",
            ["where", "bytes", "blocks", "B/rollout"],
            growth_by_line(snaps[total // 2], snaps[total], total),
        )


def add_args(parser: Any) -> None:
    parser.add_argument(
        "--trace",
        action="store_true",
        help=f"tracemalloc snapshots ({TRACE_FRAMES} frames) in the server at the middle and "
        "the end: what grew, by line (results/gym_server_memory_trace.md)",
    )
    parser.add_argument("--rollouts", type=int, default=0, help="another size than the mode's")


if __name__ == "__main__":
    done = bench_main(
        "gym_server_memory", "Gym server memory over a long run (no Ray)", body, extra_args=add_args
    )
    x = done.extra
    if x["verdict"] != "flat":
        grew = x[
            "heap_growth_bytes_per_rollout_second_half"
            if x["judged"] == "heap"
            else "growth_bytes_per_rollout_second_half"
        ]
        print(
            f"gym_server_memory: FAILED: the server's {x['judged']} grew {fmt(grew)} B per "
            f"rollout (goal < {x['goal_bytes']}): something is kept per rollout",
            file=sys.stderr,
        )
        sys.exit(1)
