"""``rl-gym-actors gym serve`` with tracemalloc on, for gym_server_memory.py: the memory profile
of the server process itself (not of a thread beside the client).

The same arguments as ``python -m rl_gym_actors.cli``. ``$RLGA_TRACE_DIR`` is where requests
come in and answers go out: the benchmark writes ``want-N`` (empty: the traced bytes only;
``snapshot``: a tracemalloc snapshot too), and a thread of this process answers with
``traced-N.json`` (``{"current": bytes, "peak": bytes}``) and, when asked, ``snapshot-N``
(``tracemalloc.Snapshot.dump``). ``$RLGA_TRACE_FRAMES`` frames are kept per allocation
(default 1: enough for growth by line, and the cheapest).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import tracemalloc
from pathlib import Path

POLL_S = 0.02


def answer_requests(trace_dir: Path) -> None:
    n = 0
    while True:
        want = trace_dir / f"want-{n}"
        if not want.exists():
            time.sleep(POLL_S)
            continue
        kind = want.read_text().strip()
        if kind == "snapshot":
            tracemalloc.take_snapshot().dump(str(trace_dir / f"snapshot-{n}.tmp"))
            os.replace(trace_dir / f"snapshot-{n}.tmp", trace_dir / f"snapshot-{n}")
        current, peak = tracemalloc.get_traced_memory()
        tmp = trace_dir / f"traced-{n}.tmp"
        tmp.write_text(json.dumps({"current": current, "peak": peak}))
        os.replace(tmp, trace_dir / f"traced-{n}.json")
        n += 1


def main() -> int:
    from rl_gym_actors.cli import main as cli_main
    from rl_gym_actors.gym import server  # noqa: F401  (imported untraced: a faster start)

    tracemalloc.start(int(os.environ.get("RLGA_TRACE_FRAMES", "1")))
    trace_dir = Path(os.environ["RLGA_TRACE_DIR"])
    threading.Thread(target=answer_requests, args=(trace_dir,), daemon=True).start()
    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
