"""Retired marks and kept replies on a v2 server over a long run (issue 18): flat, not growing.

NeMo RL's coordinator never calls ``forget``, so every rollout its deadline drops leaves one
retired mark on every v2 participant for the life of the process (GYM_V2.md section 8). The
ledger's v2 gate forgets, after each committed checkpoint, every rollout finished for good. This
benchmark shows the count stays bounded: ``rollouts`` rollouts against a real ``gym serve
--protocol v2`` (a subprocess, simulated agent), 5 % of them dropped by the trainer's deadline
while the agent still works, a checkpoint every ``every`` rollouts; the server's own v2 status
(``retired_rollouts``, (ext) ``kept_replies``, episodes) is sampled before and after each
checkpoint.

What is driven: not Ray (100,000 rollouts through the rollout actors take hours on 2 cores), but
the very objects the ledger actor runs, in this process: an :class:`AttemptBook` fed the reports a
rollout actor would send (RUNNING when its ``/run`` goes out; SEALED and released when the reply
comes; RUNNING and released, handed over unsettled, when the trainer's deadline drops it), and the
ledger's :class:`~rl_gym_actors.actors.v2_gate.V2Gate` over a real :class:`V2Client`: it retires
the dropped episodes still running on the server (no live owner holds them), checkpoints (prepare,
commit, resume over HTTP), lists the kept replies ((ext) ``GET .../kept``), and forgets the
finished rollouts in batches of 500. ``/run`` goes over HTTP from ``concurrency`` tasks. A
baseline run without forget (the gate's forget step skipped, as NeMo RL does) shows the growth.

    .venv/bin/python benchmarks/retired_marks_v2.py [--quick]
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401  (puts the repository on sys.path)
from common import Result, bench_main, progress

QUICK = dict(rollouts=2_000, every=250, concurrency=32, baseline=2_000)
FULL = dict(rollouts=100_000, every=2_000, concurrency=32, baseline=10_000)
DROP_EVERY = 20  # 1 rollout in 20 (5 %) dropped by the trainer's deadline
DROP_DEADLINE_S = 0.3  # the trainer's deadline for the dropped ones (their agent sleeps 120 s)
SAMPLE_S = 0.05  # the status is also read this often all along (the peak inside a checkpoint)
OWNER = "bench-owner"


class _Owners:
    """The one live owner: this process (it has no reports to flush; it reports at once)."""

    def live(self) -> frozenset[str]:
        return frozenset({OWNER})

    async def adopt(self, owner: str, rollout_id: str, attempt_index: int, deadline_ts: float):
        raise AssertionError("the v2 gate never asks an owner to adopt")

    async def flush(self, deadline_ts: float) -> int:
        return 1


async def _status(v2: Any) -> dict[str, int]:
    s = await v2.status(deadline_ts=time.time() + 10)
    extra = s.model_extra or {}
    return {
        "retired_marks": s.retired_rollouts,
        "kept_replies": int(extra.get("kept_replies", 0)),
        "episodes": int(s.report.counts.get("episodes", 0)),
    }


async def _drive(endpoint: Any, p: dict[str, Any], tmp: Path, *, forget: bool) -> dict[str, Any]:
    from rl_gym_actors.actors.v2_gate import V2Gate
    from rl_gym_actors.core.attempt_book import AttemptBook
    from rl_gym_actors.core.attempt_reports import AttemptReport, AttemptState
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient
    from rl_gym_actors.gym.v2.client import V2Client
    from rl_gym_actors.gym.v2.coordinate import Participant
    from rl_gym_actors.protocol import result_digest

    class NoForget(V2Gate):  # NeMo RL's coordinator: no forget at all
        async def _forget_finished(self, checkpoint_id: str, orphans: list[str]) -> int:
            return 0

    prefix = "rm" if forget else "rm-nf"
    url = endpoint.url
    book = AttemptBook([url])
    n, every = p["rollouts"] if forget else p["baseline"], p["every"]
    samples: list[dict[str, Any]] = []
    counts = {"sealed": 0, "dropped": 0, "other": 0}
    async with GymClient(endpoint) as gym:
        v2 = V2Client(gym)
        part = Participant(endpoint.label, "agent", v2)
        gate_cls = V2Gate if forget else NoForget
        own_prefix = prefix + "-"

        async def one(i: int) -> None:
            rid = f"{prefix}-{i}"
            dropped = i % DROP_EVERY == DROP_EVERY // 2
            book.apply(AttemptReport(rid, 0, url, AttemptState.RUNNING, OWNER))
            row = {"reward": 1.0, "sleep_s": 120.0 if dropped else 0.0}
            deadline = time.time() + (DROP_DEADLINE_S if dropped else 30.0)
            try:
                result = await gym.run(row, rollout_id=rid, attempt_index=0, deadline_ts=deadline)
            except TimeoutError:  # the trainer's deadline: dropped, still running on Gym
                book.apply(AttemptReport(rid, 0, url, AttemptState.RUNNING, OWNER, released=True))
                counts["dropped" if dropped else "other"] += 1
                return
            book.apply(
                AttemptReport(
                    rid,
                    0,
                    url,
                    AttemptState.SEALED,
                    OWNER,
                    released=True,
                    reward=1.0,
                    result_digest=result_digest(result.reply),
                )
            )
            counts["sealed"] += 1

        peak = {"retired_marks": 0, "kept_replies": 0, "episodes": 0}
        stop = asyncio.Event()

        async def sampler() -> None:  # the highest counts seen since the last take
            while not stop.is_set():
                try:
                    now = await _status(v2)
                except Exception:  # a read that fails misses one sample, nothing more
                    now = {}
                for key, value in now.items():
                    peak[key] = max(peak[key], value)
                try:
                    await asyncio.wait_for(stop.wait(), SAMPLE_S)
                except TimeoutError:
                    pass

        def take() -> dict[str, int]:
            seen = dict(peak)
            for key in peak:
                peak[key] = 0
            return seen

        sampling = asyncio.ensure_future(sampler())
        t_start = time.perf_counter()
        ckpt_s: list[float] = []
        for wave, start in enumerate(range(0, n, every)):
            queue = iter(range(start, min(n, start + every)))

            async def worker(queue=queue) -> None:
                for i in queue:
                    await one(i)

            await asyncio.gather(*(worker() for _ in range(p["concurrency"])))
            before = await _status(v2)
            gate = gate_cls(
                book,
                [endpoint],
                ["gym"],
                [part],
                _Owners(),
                control_s=30.0,
                own=lambda rid: rid.startswith(own_prefix),
            )
            cid = f"{prefix}-ck{wave}"
            t0 = time.perf_counter()
            (entry,) = await gate.run(cid, str(tmp / cid), time.time() + 60.0)
            book.record_checkpoint(cid, committed=True)
            ckpt_s.append(time.perf_counter() - t0)
            shutil.rmtree(tmp / cid, ignore_errors=True)
            after = await _status(v2)
            seen = take()
            samples.append(
                {
                    "rollouts": min(n, start + every),
                    "before": before,
                    "after": after,
                    "peak": {k: max(v, before[k], after[k]) for k, v in seen.items()},
                    "retired": entry.retired,
                    "forgotten": entry.forgotten,
                    "orphans": entry.orphans_acked,
                    "checkpoint_s": ckpt_s[-1],
                    "book_attempts": book.snapshot().attempts,
                }
            )
            if wave % 10 == 0 or start + every >= n:
                progress(
                    f"{'forget' if forget else 'no forget'}: {min(n, start + every)} rollouts, "
                    f"marks {before['retired_marks']} -> {after['retired_marks']}, kept "
                    f"{before['kept_replies']} -> {after['kept_replies']}, "
                    f"{time.perf_counter() - t_start:.0f} s"
                )
        elapsed = time.perf_counter() - t_start
        stop.set()
        await sampling
    return {
        "rollouts": n,
        "counts": counts,
        "samples": samples,
        "elapsed_s": elapsed,
        "checkpoint_s": ckpt_s,
    }


def _summary(run: dict[str, Any]) -> dict[str, Any]:
    s = run["samples"]
    peak_marks = max(x["peak"]["retired_marks"] for x in s)
    peak_kept = max(x["peak"]["kept_replies"] for x in s)
    tenth = max(1, len(s) // 10)
    first = max(x["peak"]["retired_marks"] for x in s[:tenth])
    last = max(x["peak"]["retired_marks"] for x in s[-tenth:])
    return {
        "rollouts": run["rollouts"],
        "dropped": run["counts"]["dropped"],
        "sealed": run["counts"]["sealed"],
        "checkpoints": len(s),
        "peak_marks": peak_marks,
        "final_marks": s[-1]["after"]["retired_marks"],
        "peak_kept": peak_kept,
        "final_kept": s[-1]["after"]["kept_replies"],
        "final_episodes": s[-1]["after"]["episodes"],
        "marks_first_tenth": first,
        "marks_last_tenth": last,
        "max_book_attempts": max(x["book_attempts"] for x in s),
        "elapsed_s": run["elapsed_s"],
        "rollouts_per_s": run["rollouts"] / run["elapsed_s"],
        "checkpoint_s_median": sorted(run["checkpoint_s"])[len(run["checkpoint_s"]) // 2],
        "checkpoint_s_max": max(run["checkpoint_s"]),
    }


def body(result: Result, args: Any) -> None:
    from rl_gym_actors.testing.gym_process import GymServerProcess

    p = QUICK if args.quick else FULL
    result.params.update(p, drop_fraction=1 / DROP_EVERY, drop_deadline_s=DROP_DEADLINE_S)
    tmp = Path(tempfile.mkdtemp(prefix="rlga-bench-marks-"))
    runs: dict[str, dict[str, Any]] = {}
    try:
        for forget in (True, False):
            server = GymServerProcess(
                token="bench-token", allow_faults=False, args=["--protocol", "v2"]
            ).start()
            try:
                runs["forget" if forget else "baseline"] = asyncio.run(
                    _drive(server.endpoint, p, tmp, forget=forget)
                )
            finally:
                server.kill()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ours, base = _summary(runs["forget"]), _summary(runs["baseline"])
    result.rows = runs["forget"]["samples"]
    result.extra.update(summary=ours, baseline=base, baseline_samples=runs["baseline"]["samples"])
    cols = [
        "gate",
        "rollouts",
        "dropped by deadline",
        "checkpoints",
        "retired marks: peak",
        "final",
        "first tenth (max)",
        "last tenth (max)",
        "kept replies: peak",
        "final",
        "episodes left",
        "book attempts (max)",
        "rollouts/s",
        "checkpoint s (median / max)",
        "run s",
    ]

    def line(name: str, x: dict[str, Any]) -> list[Any]:
        return [
            name,
            x["rollouts"],
            x["dropped"],
            x["checkpoints"],
            x["peak_marks"],
            x["final_marks"],
            x["marks_first_tenth"],
            x["marks_last_tenth"],
            x["peak_kept"],
            x["final_kept"],
            x["final_episodes"],
            x["max_book_attempts"],
            round(x["rollouts_per_s"]),
            f"{x['checkpoint_s_median']:.2f} / {x['checkpoint_s_max']:.2f}",
            round(x["elapsed_s"], 1),
        ]

    result.add_table(
        f"A real gym serve --protocol v2 (subprocess), {1 / DROP_EVERY:.0%} of the rollouts "
        f"dropped by the trainer's deadline ({DROP_DEADLINE_S} s; the agent works on), a "
        f"checkpoint every {p['every']} rollouts by the ledger's V2Gate; counts from the server's "
        f"v2 status (peak: the highest read, every {SAMPLE_S} s all along; tenths: of the "
        "checkpoints):",
        cols,
        [line("V2Gate (forgets)", ours), line("no forget (NeMo RL)", base)],
    )
    s = runs["forget"]["samples"]
    step = max(1, len(s) // 10)
    picked = s[::step] + ([s[-1]] if (len(s) - 1) % step else [])
    result.add_table(
        f"Over the run (V2Gate; before -> after each sampled checkpoint, and the highest count "
        f"read since the previous one, the status read every {SAMPLE_S} s all along):",
        [
            "rollouts",
            "retired marks",
            "highest",
            "kept replies",
            "highest",
            "episodes",
            "retired",
            "forgotten",
        ],
        [
            [
                x["rollouts"],
                f"{x['before']['retired_marks']} -> {x['after']['retired_marks']}",
                x["peak"]["retired_marks"],
                f"{x['before']['kept_replies']} -> {x['after']['kept_replies']}",
                x["peak"]["kept_replies"],
                f"{x['before']['episodes']} -> {x['after']['episodes']}",
                x["retired"],
                x["forgotten"],
            ]
            for x in picked
        ],
    )
    drops_per_checkpoint = -(-p["every"] // DROP_EVERY)  # at most this many per checkpoint
    flat = ours["final_marks"] == 0 and ours["peak_marks"] <= drops_per_checkpoint
    result.extra["headline"] = (
        f"{ours['rollouts']:,} rollouts, {ours['dropped']:,} dropped by deadline: retired marks "
        f"peak {ours['peak_marks']} (one checkpoint's drops: {drops_per_checkpoint}), final "
        f"{ours['final_marks']}, "
        f"{'flat' if flat else 'NOT flat'} (first tenth {ours['marks_first_tenth']}, last "
        f"{ours['marks_last_tenth']}); kept replies peak {ours['peak_kept']}, final "
        f"{ours['final_kept']}; without forget {base['final_marks']} marks after "
        f"{base['rollouts']:,}"
    )
    result.notes.append(
        "Driven in this process without Ray: an AttemptBook fed a rollout actor's reports and the "
        "ledger's V2Gate over HTTP (retire of the dropped episodes before prepare, prepare, "
        "commit, resume, the kept-replies listing, forget in batches of 500); /run over HTTP "
        f"from {p['concurrency']} tasks. The baseline skips the gate's forget step, as NeMo RL's "
        "coordinator (it has no forget): its marks grow by one per dropped rollout."
    )


def plot(res: dict[str, Any], path: Path) -> bool:
    """Retired marks and kept replies (highest read per checkpoint interval) over the run,
    with the gate's forget and without it (run_all calls this for RESULTS.md)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours, base = res.get("rows") or [], res.get("extra", {}).get("baseline_samples") or []
    if not ours:
        return False
    fig, (marks, kept) = plt.subplots(1, 2, figsize=(10, 4))
    for samples, label, style in ((ours, "V2Gate (forgets)", "C0-"), (base, "no forget", "C3--")):
        if not samples:
            continue
        x = [s["rollouts"] for s in samples]
        marks.plot(x, [s["peak"]["retired_marks"] for s in samples], style, label=label)
        kept.plot(x, [s["peak"]["kept_replies"] for s in samples], style, label=label)
    marks.set_title("retired marks on the server (highest per interval)")
    kept.set_title("kept replies on the server (highest per interval)")
    for ax in (marks, kept):
        ax.set_xlabel("rollouts")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


if __name__ == "__main__":
    bench_main("retired_marks_v2", "Retired marks on Gym v2 over a long run", body)
