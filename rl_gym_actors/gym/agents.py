"""Agent adapters. An agent is an async callable ``row -> reply`` (a JSON object).

An agent may return :class:`LineagedReply` (the reply and its model lineage) to have the
completion receipt carry ``manifest_capture_key`` and ``terminal_model_call_id``.

- :func:`simulated_agent`: ``{"id": "r-<rollout_id>", "reward": <reward>}`` after ``sleep_s``;
  fails the row as data (:class:`SimulatedAgentError`, an ``AgentDataError``) when ``fail`` is
  true. Every other row field is ignored. A row past its bounds (:data:`MAX_SIMULATED_S`, a
  number that is no finite number) is :class:`SimulatedRowInvalid`.
- :func:`load_callable`: a Python callable named ``module:function`` (async, or sync and then run
  in a worker thread). An async agent runs on the server's event loop, as every route does: one
  that computes without awaiting holds up the control plane too, so CPU-bound work belongs in a
  sync function (a worker thread) or off the loop by the agent's own means.
- :class:`HttpAgent`: forwards the row to an existing Gym agent's ``/run`` URL, so that an agent
  without checkpoint participation gains it by standing behind our server. The identity fields
  are taken off the forwarded row: this server owns the key, and an upstream that tracked it too
  would keep a second, never-ACKed copy of every reply.

:func:`make_agent` turns a ``--agent`` value (``simulated``, ``module:function`` or an
``http(s)://`` URL) into an agent.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import json
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from rl_gym_actors.errors import AgentDataError, ConfigError, InvalidRequest
from rl_gym_actors.gym.transport import KEEPALIVE_S
from rl_gym_actors.protocol import ATTEMPT_INDEX_FIELD, ROLLOUT_ID_FIELD, ModelLineage

Agent = Callable[[dict[str, Any]], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class LineagedReply:
    """An agent's reply with the model lineage its receipt carries (the reply alone is sent)."""

    reply: Any
    lineage: ModelLineage


SIMULATED = "simulated"


class SimulatedAgentError(AgentDataError):
    """The simulated agent was asked to fail (row field ``fail``): a data failure of the row."""


class UpstreamAgentError(RuntimeError):
    """The upstream Gym agent answered with a non-2xx status (``status``; 5xx, 408 and 429 are
    transient, any other a data failure) or a body that is no JSON object (``status`` 0)."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


#: the longest a simulated agent works on one row (``sleep_s``; v2: ``steps * step_s``)
MAX_SIMULATED_S = 86_400.0
#: the most steps a simulated v2 row may ask for (each step yields the loop, even at step_s 0)
MAX_SIMULATED_STEPS = 100_000


class SimulatedRowInvalid(InvalidRequest):
    """A row asks the simulated agent for something past its bounds (a number that is no finite
    number, a sleep past :data:`MAX_SIMULATED_S`, steps past :data:`MAX_SIMULATED_STEPS`): refused
    before any work (v2: 422 ``invalid_request``)."""


def bounded_number(
    row: Mapping[str, Any], name: str, default: float, *, low: float, high: float
) -> float:
    """Row field ``name`` as a finite number in ``low..high``; else :class:`SimulatedRowInvalid`."""
    value = row.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SimulatedRowInvalid(f"row field {name!r} must be a number, got {value!r}", status=422)
    if not (math.isfinite(value) and low <= value <= high):
        raise SimulatedRowInvalid(
            f"row field {name!r} must be a finite number in {low:g}..{high:g}, got {value!r}",
            status=422,
        )
    return float(value)


async def simulated_agent(row: dict[str, Any]) -> dict[str, Any]:
    """Reads ``sleep_s`` (default 0, at most :data:`MAX_SIMULATED_S`), ``reward`` (default 1.0,
    finite) and ``fail`` (default false)."""
    sleep_s = bounded_number(row, "sleep_s", 0, low=0, high=MAX_SIMULATED_S)
    reward = bounded_number(row, "reward", 1.0, low=-math.inf, high=math.inf)
    if sleep_s > 0:
        await asyncio.sleep(sleep_s)
    if row.get("fail"):
        raise SimulatedAgentError("the row asked the simulated agent to fail")
    return {"id": f"r-{row.get(ROLLOUT_ID_FIELD)}", "reward": reward}


def load_callable(spec: str) -> Agent:
    """``module:function`` -> an async agent. A sync function runs in a worker thread."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"agent {spec!r}: expected 'module:function'")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"agent {spec!r}: {exc}") from exc
    if not callable(target):
        raise ConfigError(f"agent {spec!r} is not callable")
    # an instance whose class defines ``async def __call__`` is awaited as well
    if inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(type(target).__call__):
        return target

    async def threaded(row: dict[str, Any]) -> Any:
        result = await asyncio.to_thread(target, row)
        return await result if inspect.isawaitable(result) else result

    return functools.update_wrapper(threaded, target)


class HttpAgent:
    """Forwards each row to an upstream Gym agent's ``/run`` and returns its JSON reply.

    No timeout of its own: a run lasts as long as the agent works, and only ``retire`` (which
    cancels the call and so closes its connection) or shutdown ends it early.
    """

    def __init__(self, url: str, *, limit: int = 256, keep_identity: bool = False) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"upstream agent URL must start with http:// or https://: {url!r}")
        self.url = url
        self.limit = limit
        self.keep_identity = keep_identity
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"HttpAgent({self.url!r})"

    async def __call__(self, row: dict[str, Any]) -> Any:
        if self._session is None:  # created in the serving loop, on first use
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.limit, keepalive_timeout=KEEPALIVE_S),
                timeout=aiohttp.ClientTimeout(total=None),
            )
        body = (
            row
            if self.keep_identity
            else {k: v for k, v in row.items() if k not in (ROLLOUT_ID_FIELD, ATTEMPT_INDEX_FIELD)}
        )
        async with self._session.post(self.url, json=body) as resp:
            raw = await resp.read()
        if not 200 <= resp.status < 300:
            text = raw[:500].decode("utf-8", "replace")
            raise UpstreamAgentError(
                f"upstream {self.url} answered {resp.status}: {text}", status=resp.status
            )
        try:
            reply = json.loads(raw)
        except ValueError as exc:
            raise UpstreamAgentError(f"upstream {self.url} answered no JSON") from exc
        if not isinstance(reply, dict):
            raise UpstreamAgentError(f"upstream {self.url} answered no JSON object")
        return reply

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def make_agent(spec: str | Agent) -> Agent:
    """``simulated``, ``module:function``, an ``http(s)://`` URL, or an agent callable itself."""
    if callable(spec):
        return spec
    if spec == SIMULATED:
        return simulated_agent
    if spec.startswith(("http://", "https://")):
        return HttpAgent(spec)
    return load_callable(spec)
