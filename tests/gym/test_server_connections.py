"""What one connection may hold of a real server on loopback: bodies over the limit refused on
their declared length before any read (every route, the hot ASGI ones and the fault extension's
included), chunked bodies cut at the limit, slow-loris headers and slow bodies cut by their
timeouts while ``/run`` and the control plane answer on, idle connections closed, a connection
cap with a named refusal, and a long ``/run`` that no timeout cuts. Raw sockets (asyncio
streams): no client library between the test and the bytes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import pytest
from conftest import Wire
from gym_test_helpers import rid

from rl_gym_actors.protocol import CONTROL_PREFIX
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import scaled, until
from rl_gym_actors.testing.raw_http import until_closed
from rl_gym_actors.testing.v2_server import V2ServerThread

aio = pytest.mark.asyncio(loop_scope="session")
MIB = 1 << 20
V2_PREFIX = "/ng-control/v1/checkpoint"


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    return host, int(port)


async def _connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*_host_port(url))


def _head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test", "Authorization: Bearer test-token"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _answer(raw: bytes) -> tuple[int, dict[str, Any] | None]:
    """Status and JSON body of the first answer in ``raw``."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    try:
        return status, json.loads(body)
    except ValueError:
        return status, None


def _code(body: dict[str, Any] | None) -> str | None:
    return body["error"]["code"] if isinstance(body, dict) and "error" in body else None


# ---------------------------------------------------------------- bodies over the limit

AGENT_ROUTES = (
    "/run",  # hot, behind the fault extension (it reads the whole body itself)
    CONTROL_PREFIX + "/acknowledge",  # hot
    CONTROL_PREFIX + "/acknowledge-completed",
    CONTROL_PREFIX + "/retire-batch",
    CONTROL_PREFIX + "/prepare",
    "/no-such-route",
)
V2_ROUTES = ("/run", V2_PREFIX + "/prepare", V2_PREFIX + "/retire")


async def _announce_64_mib(url: str, path: str) -> None:
    reader, writer = await _connect(url)
    try:
        length = 64 * MIB
        writer.write(_head("POST", path, {"Content-Length": str(length)}))
        writer.write(b"x" * (64 * 1024))  # 64 KiB of it, then the test waits
        await writer.drain()
        started = time.monotonic()
        raw = await until_closed(reader, scaled(5))
        status, body = _answer(raw)
        assert (status, _code(body)) == (413, "payload_too_large"), (path, raw[:300])
        assert time.monotonic() - started < scaled(2), path  # answered at once, then closed
    finally:
        writer.close()


@aio
@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_a_body_announced_over_the_limit_is_413_before_any_read_on_every_route(http):
    with GymServerThread(allow_faults=True, args=["--http", http]) as srv:
        for path in AGENT_ROUTES:
            await _announce_64_mib(srv.url, path)
        assert (await Wire.of(srv).run(rid())).status == 200
    with V2ServerThread(allow_faults=True) as v2:
        for path in V2_ROUTES:
            await _announce_64_mib(v2.url, path)


@aio
async def test_an_unreadable_content_length_is_400():
    with GymServerThread() as srv:
        reader, writer = await _connect(srv.url)
        writer.write(_head("POST", "/run", {"Content-Length": "12abc"}) + b"{}")
        await writer.drain()
        raw = await until_closed(reader, scaled(5))
        writer.close()
        assert _answer(raw)[0] == 400


async def _send_chunked(writer: asyncio.StreamWriter, total: int, chunk: int) -> int:
    """Write a chunked body of up to ``total`` bytes; how many went out before the server
    stopped taking them (or all of them)."""
    sent = 0
    block = b"%x\r\n" % chunk + b"x" * chunk + b"\r\n"
    try:
        while sent < total:
            writer.write(block)
            await writer.drain()
            sent += chunk
        writer.write(b"0\r\n\r\n")
        await writer.drain()
    except ConnectionError:
        pass
    return sent


@aio
@pytest.mark.parametrize("faults", [False, True])
async def test_a_chunked_body_is_cut_at_the_limit_and_nothing_more_is_read(faults):
    total = 64 * MIB
    with GymServerThread(allow_faults=faults) as srv:
        reader, writer = await _connect(srv.url)
        writer.write(_head("POST", "/run", {"Transfer-Encoding": "chunked"}))
        sender = asyncio.ensure_future(_send_chunked(writer, total, 256 * 1024))
        raw = await until_closed(reader, scaled(10))
        status, body = _answer(raw)
        assert (status, _code(body)) == (413, "payload_too_large"), raw[:300]
        sent = await asyncio.wait_for(sender, scaled(10))
        writer.close()
        # the server stopped reading at the limit: only what the sockets' buffers hold went
        # out after it (on main, the whole body was read, or held until it was all in)
        assert sent < total // 2, f"{sent} of {total} bytes were taken"
        assert (await Wire.of(srv).run(rid())).status == 200


# ---------------------------------------------------------------- read timeouts


async def _slow_loris(url: str, stop: asyncio.Event) -> float:
    """A request whose headers come a byte at a time; when the server closed it."""
    reader, writer = await _connect(url)

    async def drip() -> None:
        writer.write(b"POST /run HTTP/1.1\r\nHost: test\r\nX-Slow: ")
        while not stop.is_set():
            await asyncio.sleep(0.2)
            writer.write(b"a")
            try:
                await writer.drain()
            except ConnectionError:
                return

    dripping = asyncio.ensure_future(drip())
    try:
        raw = await until_closed(reader, scaled(30))
        closed = time.monotonic()
        if raw:
            status, body = _answer(raw)
            assert (status, _code(body)) == (408, "request_header_timeout"), raw[:300]
        return closed
    finally:
        dripping.cancel()
        writer.close()


async def _serves_meanwhile(server: Any, until_done: Sequence[asyncio.Future]) -> int:
    """``/run`` and the control plane answer, each within a load-scaled second, while
    ``until_done`` are not all done; how many rounds answered."""
    wire = Wire.of(server)
    rounds = 0
    while not all(f.done() for f in until_done) or rounds == 0:
        started = time.monotonic()
        assert (await wire.run(rid(), timeout_s=scaled(5))).status == 200
        assert (await wire.status(timeout_s=scaled(5))).status == 200
        assert time.monotonic() - started < scaled(2)
        rounds += 1
        await asyncio.sleep(0.05)
    return rounds


@aio
@pytest.mark.parametrize("http", ["httptools", "h11"])
async def test_150_slow_loris_connections_are_closed_within_the_header_timeout(http):
    header_s = 1.0
    with GymServerThread(args=["--http", http, "--header-timeout-s", str(header_s)]) as srv:
        stop = asyncio.Event()
        started = time.monotonic()
        loris = [asyncio.ensure_future(_slow_loris(srv.url, stop)) for _ in range(150)]
        try:
            rounds = await _serves_meanwhile(srv, loris)
            closed = await asyncio.gather(*loris)
        finally:
            stop.set()
        assert rounds >= 1
        # each closed once its headers ran past the timeout, not before, and not much after
        assert min(closed) - started >= header_s * 0.9
        assert max(closed) - started < header_s + scaled(3)


@aio
async def test_a_body_that_stalls_is_408_and_closed():
    with GymServerThread(args=["--body-timeout-s", "1"]) as srv:
        reader, writer = await _connect(srv.url)
        writer.write(_head("POST", "/run", {"Content-Length": "100"}) + b'{"_ng_rollout')
        await writer.drain()
        started = time.monotonic()
        raw = await until_closed(reader, scaled(10))
        writer.close()
        status, body = _answer(raw)
        assert (status, _code(body)) == (408, "request_body_timeout"), raw[:300]
        assert 0.9 <= time.monotonic() - started < 1 + scaled(3)
        assert (await Wire.of(srv).run(rid())).status == 200


@aio
@pytest.mark.parametrize("protocol", ["agent", "v2"])
async def test_a_long_run_read_in_full_outlives_every_timeout(protocol):
    args = ["--header-timeout-s", "0.5", "--body-timeout-s", "0.5", "--idle-timeout-s", "0.5"]
    server = GymServerThread(args=args) if protocol == "agent" else V2ServerThread(args=args)
    with server as srv:
        started = time.monotonic()
        got = await Wire.of(srv).run(rid(), sleep_s=2.0, timeout_s=scaled(30))
        assert got.status == 200, got.raw
        assert time.monotonic() - started >= 2.0


# ---------------------------------------------------------------- idle connections and the cap


def _open_connections(srv: Any) -> int:
    return len(srv.server._uvicorn.server_state.connections)


@aio
async def test_idle_connections_are_closed_by_the_idle_limit():
    with GymServerThread(args=["--idle-timeout-s", "1"]) as srv:
        started = time.monotonic()
        held = [await _connect(srv.url) for _ in range(300)]
        closed = await asyncio.gather(*(until_closed(r, scaled(15)) for r, _ in held))
        elapsed = time.monotonic() - started
        assert closed == [b""] * 300  # closed without a word: they asked nothing
        assert 1.0 <= elapsed < 1 + scaled(5)
        await until(lambda: _open_connections(srv) == 0, what="the server to let them go")
        for _, writer in held:
            writer.close()
        assert (await Wire.of(srv).run(rid())).status == 200


@aio
async def test_a_connection_past_the_cap_is_refused_by_name_and_the_server_recovers():
    with GymServerThread(args=["--max-connections", "20", "--idle-timeout-s", "60"]) as srv:
        held = [await _connect(srv.url) for _ in range(20)]
        await until(lambda: _open_connections(srv) >= 20, what="20 connections open")
        got = await Wire.of(srv).run(rid(), timeout_s=scaled(5))
        assert (got.status, got.code) == (503, "too_many_connections"), got.raw
        for _, writer in held:
            writer.close()
        await until(lambda: _open_connections(srv) == 0, what="the held connections to close")
        assert (await Wire.of(srv).run(rid())).status == 200
