"""What a result costs in the layer's checkpoint part: bytes on disk per handed result, with its
reply (``keep_results=True``, the default) and without (``keep_results=False``, the baseline:
id, try, receipt and reward only), and the time to write the part.

For 1,000 handed results (``--quick``; full mode also 10,000) and three reply sizes: the
simulated agent's (``{"id", "reward"}``), a 2 KB reply and a 32 KB reply (a tokenized response
with its log-probs is tens of KB). Each part is written with the real writer
(:func:`rl_gym_actors.checkpoint_part.write_part`: temp file, fsync, rename) into a temporary dir.
Reported per result: ``part.json`` bytes over the number of results, and the ratio of the two
settings.

    .venv/bin/python benchmarks/part_size.py [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rl_gym_actors.checkpoint_part import PART_DIR, PART_FILE, write_part
from rl_gym_actors.core.sealed_ids import SealedIds
from rl_gym_actors.listing import CompletionReceipt
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.protocol import result_digest


def _reply(rid: str, size: int) -> dict:
    reply: dict = {"id": f"r-{rid}", "reward": 0.5}
    if size:
        reply["output"] = "x" * size
    return reply


def _outcome(i: int, size: int) -> Outcome:
    rid = f"bench-run-step-12-row-{i:06d}"
    reply = _reply(rid, size)
    digest = result_digest(reply)
    receipt = CompletionReceipt(
        rollout_id=rid,
        attempt_index=0,
        execution_generation=1,
        result_identity=reply["id"],
        result_digest=digest,
    )
    return Outcome(
        rollout_id=rid,
        status="sealed",
        attempt_index=0,
        reply=reply,
        reward=0.5,
        receipt=receipt,
        result_digest=digest,
        acked=False,
        tries=1,
        endpoint="http://127.0.0.1:8000",
    )


def measure(n: int, size: int, keep_results: bool) -> tuple[float, float]:
    """Bytes per result of ``part.json`` and seconds to write the part."""
    handed = [_outcome(i, size) for i in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        write_part(
            tmp,
            run_id="bench-run",
            checkpoint_id="bench-ck",
            handed=handed,
            undelivered=[],
            sealed=SealedIds(),
            keep_results=keep_results,
        )
        elapsed = time.perf_counter() - start
        size_bytes = (Path(tmp) / PART_DIR / PART_FILE).stat().st_size
    return size_bytes / n, elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    counts = [1_000] if args.quick else [1_000, 10_000]
    print(
        f"{'results':>8} {'reply':>14} {'B/result, reply':>16} {'B/result, id only':>18} "
        f"{'ratio':>6} {'write s, reply':>15} {'write s, id only':>17}"
    )
    for n in counts:
        for label, size in (("simulated", 0), ("2 KB", 2048), ("32 KB", 32768)):
            full, t_full = measure(n, size, True)
            bare, t_bare = measure(n, size, False)
            print(
                f"{n:>8} {label:>14} {full:>16.0f} {bare:>18.0f} {full / bare:>6.1f} "
                f"{t_full:>15.3f} {t_bare:>17.3f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
