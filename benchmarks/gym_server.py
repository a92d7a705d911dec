"""The Gym server's own speed: ``/run`` + receipt + ACK cycles per second for a zero-latency
simulated agent, at concurrency 1, 16 and 128, in memory and with a state dir (SQLite, fsync
before every answer), against an aiohttp hello-world server measured in the same run as the
ceiling of this machine (same three requests per cycle, answered with fixed bytes).

A fourth row runs the durable server as a client that takes the receipt from the (ext)
``x-gym-completion-receipt`` header of the ``/run`` answer (no receipt fetch: two requests per
cycle), still against the three-request ceiling.

Each server runs in a process of its own; the load comes from one asyncio process with plain
aiohttp (the same client code for every server), so the ratio to the ceiling is the price of
the participant, its store and FastAPI. Trials of the three servers are interleaved.

    .venv/bin/python benchmarks/gym_server.py --quick      # under a minute
    .venv/bin/python benchmarks/gym_server.py              # longer trials
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import common  # noqa: F401  (puts the repository on sys.path)
from common import Result, bench_main, process_cpu_s, progress, ratio, summarize

from rl_gym_actors.protocol import CONTROL_PREFIX, RECEIPT_HEADER
from rl_gym_actors.testing.gym_process import GymServerProcess

CONCURRENCY = (1, 16, 128)
TOKEN = "bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
RECEIPT_PATH = CONTROL_PREFIX + "/receipt"
ACK_PATH = CONTROL_PREFIX + "/acknowledge"
HELLO_FLAG = "--serve-hello"


# ---------------------------------------------------------------- the ceiling: aiohttp hello world


def serve_hello() -> None:
    """An aiohttp server answering the cycle's three routes with fixed bytes (no state)."""
    from aiohttp import web

    reply = b'{"id":"r-x","reward":1.0}'
    receipt = (
        b'{"state":"completed","completion_receipt":{"attempt_index":0,'
        b'"execution_generation":1,"result_digest":"'
        + b"0" * 64
        + b'","result_identity":"r-x","rollout_id":"x"}}'
    )
    acked = b'{"acknowledged":true,"idempotent":false}'

    def fixed(body: bytes):
        async def handler(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(body=body, content_type="application/json")

        return handler

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/run", fixed(reply))
        app.router.add_get(RECEIPT_PATH, fixed(receipt))
        app.router.add_post(ACK_PATH, fixed(acked))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=2048)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        print(json.dumps({"url": f"http://127.0.0.1:{port}", "pid": os.getpid()}), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


class HelloProcess:
    """The hello-world server in a subprocess, with GymServerProcess's url/pid/stop."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, __file__, HELLO_FLAG], stdout=subprocess.PIPE, text=True
        )
        info = json.loads(self._proc.stdout.readline())
        self.url, self.pid = info["url"], info["pid"]

    def stop(self) -> None:
        self._proc.terminate()
        self._proc.wait(10)


# ---------------------------------------------------------------- the load


async def cycles(
    url: str, n: int, concurrency: int, prefix: str, receipt_header: bool = False
) -> dict[str, Any]:
    """``n`` cycles of run + receipt + ACK, ``concurrency`` at once. Latencies in seconds.
    ``receipt_header``: take the receipt from the /run answer's header when it has one."""
    latencies: list[float] = []
    errors = 0
    todo = iter(range(n))
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal errors
            for i in todo:
                rid = f"{prefix}-{i}"
                t0 = time.perf_counter()
                try:
                    async with session.post(
                        url + "/run",
                        data=json.dumps({"_ng_rollout_id": rid, "reward": 1.0}),
                        headers={"Content-Type": "application/json"},
                    ) as r:
                        await r.read()
                        assert r.status == 200, r.status
                        header = r.headers.get(RECEIPT_HEADER) if receipt_header else None
                    if header is not None:
                        receipt = json.loads(header)
                    else:
                        async with session.get(
                            url + RECEIPT_PATH,
                            headers=AUTH,
                            params={"rollout_id": rid, "attempt_index": "0"},
                        ) as r:
                            receipt = (await r.json())["completion_receipt"]
                    async with session.post(
                        url + ACK_PATH, data=json.dumps(receipt), headers=AUTH
                    ) as r:
                        await r.read()
                        assert r.status == 200, r.status
                except (AssertionError, aiohttp.ClientError, KeyError):
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - t0
    return {"seconds": seconds, "latencies": latencies, "errors": errors}


def measure(server: Any, name: str, concurrency: int, n: int, trial: int) -> dict[str, Any]:
    cpu0, me0 = process_cpu_s(server.pid), process_cpu_s(os.getpid())
    out = asyncio.run(
        cycles(
            server.url,
            n,
            concurrency,
            f"{name}-c{concurrency}-t{trial}",
            receipt_header=name in HEADER_ROWS,
        )
    )
    out["server_cpu_s"] = (process_cpu_s(server.pid) or 0) - (cpu0 or 0)
    out["client_cpu_s"] = (process_cpu_s(os.getpid()) or 0) - (me0 or 0)
    out["rate"] = (n - out["errors"]) / out["seconds"]
    return out


# ---------------------------------------------------------------- the benchmark


def py_spy_available() -> bool:
    return shutil.which("py-spy") is not None or os.path.exists(
        os.path.join(os.path.dirname(sys.executable), "py-spy")
    )


# frames that every request passes through (the loop, uvicorn's and Starlette's wrappers): left
# out of the "including callees" column so that it shows where the time goes
_WRAPPERS = (
    "runpy",
    "cli.py:",
    "runners.py:",
    "base_events.py:",
    "events.py:Handle._run",
    "applications.py:",
    "errors.py:ServerErrorMiddleware",
    "_asgi.py:",
    "_body_limit.py:",
    "exceptions.py:ExceptionMiddleware",
    "asyncexitstack.py:",
    "proxy_headers.py:",
    "_exception_handler.py:wrap_app_handling_exceptions.<locals>.wrapped_app",
    "uvloop",
)


def _profile(server: Any, n: int) -> tuple[int, list, list] | None:
    """py-spy's top functions on ``server`` while ``n`` cycles run at concurrency 16."""
    from profile_gym_server import profile_load, top_functions

    raw = Path(tempfile.mktemp(prefix="gym-server-profile-", suffix=".txt"))
    try:
        profile_load(server.pid, lambda: asyncio.run(cycles(server.url, n, 16, "profile")), raw)
        samples, own, total = top_functions(raw, 60)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        progress(f"py-spy profile skipped: {exc!r}")
        return None
    finally:
        raw.unlink(missing_ok=True)
    total = [t for t in total if not any(w in t[0] for w in _WRAPPERS)]
    return samples, own[:15], total[:15]


SERVERS = ("ceiling", "memory", "state-dir", "state-dir-header")
HEADER_ROWS = ("state-dir-header",)
LABEL = {
    "ceiling": "aiohttp hello world (ceiling)",
    "memory": "gym serve, in memory",
    "state-dir": "gym serve, --state-dir (SQLite, fsync)",
    "state-dir-header": "gym serve, --state-dir, receipt from the /run header",
}


def body(result: Result, args: Any) -> None:
    # quick (`make bench`): a few hundred cycles per trial, enough for the rates at 16 and 128
    n = {1: 75, 16: 300, 128: 400} if args.quick else {1: 600, 16: 3000, 128: 6000}
    trials = 3 if args.quick else 5
    result.params.update(
        {
            "cycles_per_trial": n,
            "trials": trials,
            "concurrency": CONCURRENCY,
            "requests_per_cycle": 3,
        }
    )
    state_dir = tempfile.mkdtemp(prefix="gym-bench-state-")
    servers = {
        "ceiling": HelloProcess(),
        "memory": GymServerProcess(token=TOKEN, allow_faults=False).start(),
        "state-dir": GymServerProcess(token=TOKEN, allow_faults=False, state_dir=state_dir).start(),
    }
    servers["state-dir-header"] = servers["state-dir"]  # the same server, other client
    try:
        for c in CONCURRENCY:
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SERVERS}
            for s in SERVERS:  # warm-up, untimed
                measure(servers[s], s, c, max(c, n[c] // 5), -1)
            for t in range(trials):  # interleaved trials
                for s in SERVERS:
                    runs[s].append(measure(servers[s], s, c, n[c], t))
            ceiling = sorted(r["rate"] for r in runs["ceiling"])[trials // 2]
            for s in SERVERS:
                rates = sorted(r["rate"] for r in runs[s])
                lat = summarize([x for r in runs[s] for x in r["latencies"]])
                done = sum(len(r["latencies"]) for r in runs[s])
                row = {
                    "server": s,
                    "concurrency": c,
                    "cycles_per_s": rates[trials // 2],
                    "requests_per_s": (2 if s in HEADER_ROWS else 3) * rates[trials // 2],
                    "ratio_to_ceiling": ratio(rates[trials // 2], ceiling),
                    "rates": rates,
                    "p50_ms": lat["p50"] * 1000,
                    "p99_ms": lat["p99"] * 1000,
                    "server_cpu_ms_per_cycle": 1000
                    * sum(r["server_cpu_s"] for r in runs[s])
                    / max(done, 1),
                    "client_cpu_ms_per_cycle": 1000
                    * sum(r["client_cpu_s"] for r in runs[s])
                    / max(done, 1),
                    "errors": sum(r["errors"] for r in runs[s]),
                }
                result.rows.append(row)
                progress(
                    f"c={c} {s}: {row['cycles_per_s']:.0f} cycles/s "
                    f"({row['ratio_to_ceiling']:.2f} of the ceiling)"
                )
        profile = _profile(servers["state-dir"], n[16]) if py_spy_available() else None
    finally:
        for name, server in servers.items():
            if name not in HEADER_ROWS:
                server.stop()
        shutil.rmtree(state_dir, ignore_errors=True)

    m = result.machine
    result.add_table(
        f"Cycles (POST /run + GET receipt + POST ACK) per second, median of {trials} "
        f"interleaved trials; zero-latency simulated agent; server and load generator are two "
        f"processes on {m['cores']} cores, {m['memory_gb']} GB:",
        [
            "server",
            "concurrency",
            "cycles/s",
            "requests/s",
            "x ceiling",
            "p50 ms",
            "p99 ms",
            "server CPU ms/cycle",
            "errors",
        ],
        [
            [
                LABEL[r["server"]],
                r["concurrency"],
                r["cycles_per_s"],
                r["requests_per_s"],
                r["ratio_to_ceiling"],
                r["p50_ms"],
                r["p99_ms"],
                r["server_cpu_ms_per_cycle"],
                r["errors"],
            ]
            for r in result.rows
        ],
    )
    if profile is not None:
        samples, own, total = profile
        result.add_table(
            f"py-spy on the --state-dir server during {n[16]} more cycles at concurrency 16 "
            f"({samples} samples): the functions with the most samples, own time and "
            f"including callees (`benchmarks/profile_gym_server.py` prints more):",
            ["own %", "function (own time)", "incl. %", "function (with callees)"],
            [
                [round(o[1], 1), o[0], round(t[1], 1), t[0]]
                for o, t in zip(own, total, strict=False)
            ],
        )
    result.notes.append(
        "The ceiling does no work per request: its ratio shows what HTTP itself "
        "costs here; the rest of a gym row's gap is FastAPI routing, the "
        "participant's decisions and (state-dir) the fsync before each answer."
    )
    result.notes.append(
        "The load generator shares the 2 cores: at high concurrency it is part "
        "of what limits every row, the ceiling's included."
    )


if __name__ == "__main__":
    if HELLO_FLAG in sys.argv:
        serve_hello()
    else:
        bench_main("gym_server", "Gym server: /run + receipt + ACK per second", body)
