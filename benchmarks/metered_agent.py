"""The simulated agent with a meter, for Gym server subprocesses in the benchmarks.

``rl-gym-actors gym serve --agent benchmarks.metered_agent:agent`` (run from the repository root)
serves it. It replies like the simulated agent (``{"id": "r-<rollout_id>", "reward": ...}``; reads
``sleep_s``, ``reward``, ``fail``), also reads ``first_try_sleep_s`` (extra sleep for attempt 0
only: a first try that outlives its deadline while the next one is quick), and appends one JSON
line per run start and per run end (``completed``, ``failed`` or ``cancelled`` by retire, with the
seconds it worked) to the file named by ``RLGA_METER_FILE``. :func:`read_meter` reads it back.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METER_ENV = "RLGA_METER_FILE"
_ID, _ATT = "_ng_rollout_id", "_ng_attempt_index"
_out: Any = None


def _write(event: dict[str, Any]) -> None:
    global _out
    if _out is None:
        # line-buffered appends, one file for the agent process's life (closed at its exit)
        _out = open(os.environ[METER_ENV], "a", buffering=1)  # noqa: SIM115
    _out.write(json.dumps(event, separators=(",", ":")) + "\n")


async def agent(row: dict[str, Any]) -> dict[str, Any]:
    rid, att = str(row.get(_ID)), int(row.get(_ATT, 0))
    sleep_s = float(row.get("sleep_s", 0) or 0)
    if att == 0:
        sleep_s += float(row.get("first_try_sleep_s", 0) or 0)
    _write({"e": "start", "r": rid, "a": att})
    t0 = time.perf_counter()
    end = "cancelled"
    try:
        if sleep_s > 0:
            await asyncio.sleep(sleep_s)
        if row.get("fail"):
            end = "failed"
            raise RuntimeError("the row asked the agent to fail")
        end = "completed"
        return {"id": f"r-{rid}", "reward": row.get("reward", 1.0)}
    finally:
        _write(
            {"e": "end", "r": rid, "a": att, "s": round(time.perf_counter() - t0, 6), "end": end}
        )


@dataclass
class Meter:
    """What the meter file says: runs per key (seconds worked, how each ended) and how many
    runs have started but not ended."""

    runs: dict[tuple[str, int], list[tuple[float, str]]] = field(default_factory=dict)
    starts: int = 0
    ends: int = 0

    @property
    def running(self) -> int:
        return self.starts - self.ends


def read_meter(path: str | Path) -> Meter:
    meter = Meter()
    p = Path(path)
    if not p.exists():
        return meter
    for line in p.read_text().splitlines():
        if not line.endswith("}"):
            continue  # a line still being written
        ev = json.loads(line)
        if ev["e"] == "start":
            meter.starts += 1
        else:
            meter.ends += 1
            meter.runs.setdefault((ev["r"], ev["a"]), []).append((ev["s"], ev["end"]))
    return meter
