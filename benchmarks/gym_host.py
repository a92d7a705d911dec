"""Several durable Gym servers in one process (each in a thread of its own, with its own event
loop, port and state dir), driven over stdin: a fleet of 16 costs 4 interpreters, not 16.

    python benchmarks/gym_host.py FIRST COUNT TOTAL ROOT

prints one JSON line ``{"urls": [...], "pid": ...}`` once the servers ``FIRST .. FIRST+COUNT-1``
(of ``TOTAL``) answer; then reads one JSON command per line and answers each with one line:

- ``{"fresh": GENERATION, "prefix": P, "n": N}``: stop the servers, start them again on the same
  ports with new, empty state dirs; with ``n``, server ``g`` first gets the finished, un-ACKed
  attempts ``P-i`` for every ``i < N`` with ``i % TOTAL == g``, written with the server's own
  store and reply encoding (as a ``/run`` whose reply was lost leaves them);
- ``{"stop": true}``: stop the servers and exit.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import common  # noqa: F401  (puts the repository on sys.path)

from rl_gym_actors.testing.gym_process import GymServerThread

TOKEN = "bench-token"


def write_finished(state_dir: str, ids: Sequence[str]) -> None:
    from rl_gym_actors.gym.agent_checkpoint.core import encode_reply
    from rl_gym_actors.gym.store import Execution, SqliteStore
    from rl_gym_actors.protocol import ExecutionState

    store = SqliteStore(state_dir)
    records = []
    for rid in ids:
        raw, receipt = encode_reply((rid, 0), 1, {"id": f"r-{rid}", "reward": 0.5})
        records.append(
            Execution(rid, 0, ExecutionState.COMPLETED, generation=1, reply=raw, receipt=receipt)
        )
    store.submit(records)
    store.close()  # writes everything submitted first


def main(argv: Sequence[str]) -> None:
    first, count, total, root = int(argv[0]), int(argv[1]), int(argv[2]), Path(argv[3])
    globals_ = list(range(first, first + count))

    def state_dir(generation: int, g: int) -> str:
        return str(root / f"g{generation}" / f"s{g}")

    servers = [
        GymServerThread(token=TOKEN, state_dir=state_dir(0, g), allow_faults=False)
        for g in globals_
    ]
    for s in servers:
        s.start(timeout_s=120)
    print(json.dumps({"urls": [s.url for s in servers]}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        for s in servers:
            s.stop()
        if cmd.get("stop"):
            break
        gen = int(cmd["fresh"])
        for g, s in zip(globals_, servers, strict=True):
            s.state_dir = state_dir(gen, g)
            n = int(cmd.get("n") or 0)
            if n:
                write_finished(s.state_dir, [f"{cmd['prefix']}-{i}" for i in range(g, n, total)])
            s.start(timeout_s=120)
        print(json.dumps({"urls": [s.url for s in servers]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
