"""Fixtures for the Gym server tests: a real server on loopback (in a thread of this process) and
:class:`Wire`, plain aiohttp calls that hand back status, headers and body exactly as they came.

Each call opens its own aiohttp session, so a Wire works in whichever event loop a test runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.protocol import (
    ATTEMPT_INDEX_FIELD,
    CAPABILITIES_PATH,
    CONTROL_PREFIX,
    ROLLOUT_ID_FIELD,
)
from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import soon, until
from rl_gym_actors.testing.v2_server import V2ServerThread

_DEFAULT = object()


@dataclass(frozen=True)
class Answer:
    status: int
    raw: bytes
    headers: dict[str, str]

    @property
    def json(self) -> Any:
        return json.loads(self.raw) if self.raw else None

    @property
    def code(self) -> str | None:
        body = self.json
        return body["error"]["code"] if isinstance(body, dict) and "error" in body else None

    @property
    def replayed(self) -> bool:
        return self.headers.get("x-gym-replayed") == "1"


class Wire:
    """The server's routes as plain HTTP calls (no client module on purpose)."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url
        self.token = token

    @classmethod
    def of(cls, server: Any) -> Wire:
        return cls(server.url, server.token)

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = _DEFAULT,
        data: Any = None,
        params: dict[str, str] | None = None,
        token: Any = _DEFAULT,
        headers: dict[str, str] | None = None,
        timeout_s: float = 30.0,
    ) -> Answer:
        hdrs = dict(headers or {})
        token = self.token if token is _DEFAULT else token
        if token is not None:
            hdrs["Authorization"] = f"Bearer {token}"
        if body is not _DEFAULT:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as s,
            s.request(method, self.url + path, data=data, params=params, headers=hdrs) as resp,
        ):
            raw = await resp.read()
            return Answer(resp.status, raw, {k.lower(): v for k, v in resp.headers.items()})

    # ------------------------------------------------------------ routes

    async def run(
        self, rollout_id: str, attempt: int = 0, *, timeout_s: float = 30.0, **fields: Any
    ) -> Answer:
        row = {ROLLOUT_ID_FIELD: rollout_id, ATTEMPT_INDEX_FIELD: attempt, **fields}
        return await self.request("POST", "/run", body=row, token=None, timeout_s=timeout_s)

    async def receipt(self, rollout_id: str, attempt: int = 0, **kw: Any) -> Answer:
        return await self.request(
            "GET",
            CONTROL_PREFIX + "/receipt",
            params={"rollout_id": rollout_id, "attempt_index": str(attempt)},
            **kw,
        )

    async def ack(self, receipt: dict[str, Any], **kw: Any) -> Answer:
        return await self.request("POST", CONTROL_PREFIX + "/acknowledge", body=receipt, **kw)

    async def ack_batch(self, receipts: list[dict[str, Any]], **kw: Any) -> Answer:
        return await self.request(
            "POST",
            CONTROL_PREFIX + "/acknowledge-completed",
            body={"schema_version": 1, "executions": receipts},
            **kw,
        )

    async def retire(
        self, rollout_id: str, attempt: int = 0, *, checkpoint_id: str = "rl-retire", **kw: Any
    ) -> Answer:
        return await self.request(
            "POST",
            CONTROL_PREFIX + "/retire",
            body={
                "checkpoint_id": checkpoint_id,
                "deadline_ts": soon(10),
                "rollout_id": rollout_id,
                "attempt_index": attempt,
            },
            **kw,
        )

    async def status(self, checkpoint_id: str | None = "rl-status", **kw: Any) -> Answer:
        params = {} if checkpoint_id is None else {"checkpoint_id": checkpoint_id}
        return await self.request("GET", CONTROL_PREFIX + "/status", params=params, **kw)

    async def prepare(self, checkpoint_id: str, *, deadline_s: float = 5.0, **kw: Any) -> Answer:
        return await self.request(
            "POST",
            CONTROL_PREFIX + "/prepare",
            body={"checkpoint_id": checkpoint_id, "deadline_ts": time.time() + deadline_s},
            **kw,
        )

    async def commit(self, checkpoint_id: str, checkpoint_dir: str, **kw: Any) -> Answer:
        return await self.request(
            "POST",
            CONTROL_PREFIX + "/commit",
            body={
                "checkpoint_id": checkpoint_id,
                "deadline_ts": soon(10),
                "checkpoint_dir": str(checkpoint_dir),
            },
            **kw,
        )

    async def resume(self, checkpoint_id: str, **kw: Any) -> Answer:
        return await self.request(
            "POST",
            CONTROL_PREFIX + "/resume",
            body={"checkpoint_id": checkpoint_id, "deadline_ts": soon(10)},
            **kw,
        )

    async def capabilities(self, **kw: Any) -> Answer:
        return await self.request("GET", CAPABILITIES_PATH, **kw)

    async def lease(self, **kw: Any) -> Answer:
        """(ext) The fence: phase, active checkpoint id and the lease."""
        return await self.request("GET", CONTROL_PREFIX + "/lease", **kw)

    async def restore(self, checkpoint_id: str, checkpoint_dir: Any, **kw: Any) -> Answer:
        return await self.request(
            "POST",
            CONTROL_PREFIX + "/restore",
            body={
                "checkpoint_id": checkpoint_id,
                "deadline_ts": soon(10),
                "checkpoint_dir": str(checkpoint_dir),
            },
            **kw,
        )

    # ------------------------------------------------------------ compound steps

    async def complete(self, rollout_id: str, attempt: int = 0, **fields: Any) -> dict[str, Any]:
        """Run a key to completion and return its receipt."""
        ran = await self.run(rollout_id, attempt, **fields)
        assert ran.status == 200, ran.raw
        got = await self.receipt(rollout_id, attempt)
        assert got.status == 200, got.raw
        return got.json["completion_receipt"]

    async def until(
        self, predicate, *, timeout_s: float = 10.0, what: str = "status condition"
    ) -> dict[str, Any]:
        """Poll status until ``predicate(status)`` holds and return that status."""

        async def holding() -> dict[str, Any] | None:
            st = (await self.status()).json
            return st if predicate({**st, **(await self.lease()).json}) else None

        return await until(holding, timeout_s=timeout_s, what=what)


@pytest.fixture
def agent() -> CountingAgent:
    return CountingAgent()


@pytest.fixture
def gym(agent: CountingAgent):
    """A fresh server (faults allowed, in memory) in a thread, with a counting simulated agent."""
    with GymServerThread(agent=agent) as server:
        yield server


@pytest.fixture
def wire(gym: GymServerThread) -> Wire:
    return Wire.of(gym)


@pytest.fixture
def wire_for():
    """``wire_for(server)``: a Wire for a server a test starts itself."""
    return Wire.of


@pytest.fixture
def v2_server() -> Iterator[V2ServerThread]:
    """A fresh v2 server (``gym serve --protocol v2``, the simulated stepped agent) in a thread."""
    with V2ServerThread(token="test-token") as server:
        yield server


@pytest_asyncio.fixture(loop_scope="session")
async def v2_client(v2_server: V2ServerThread) -> AsyncIterator[GymClient]:
    """The data-plane client of :func:`v2_server` (``run``); :func:`v2` speaks its control."""
    async with GymClient(v2_server.endpoint) as client:
        yield client


@pytest.fixture
def v2(v2_client: GymClient) -> V2Client:
    return V2Client(v2_client)
