"""Agents with step boundaries, for the v2 participant.

A step agent is ``async (row, steps) -> reply``. It reads ``steps.continuation`` (the progress a
restored attempt continues from; None for a fresh run) and calls ``await
steps.boundary(progress)`` after each step, with JSON progress that is enough to continue from;
``steps.episode_id`` names the attempt. A reply may be a :class:`RawReply` (bytes and headers
of the ``/run`` answer, as another participant behind this one answered them). At a boundary
the episode parks while a checkpoint is open; a checkpoint exports the latest progress; a
restore hands it to the next attempt as its continuation. Only the steps after that boundary
run again.

:func:`stepped_simulated_agent` reads ``steps`` (default 1), ``step_s`` (default ``sleep_s /
steps``, ``sleep_s`` defaulting to 0), ``reward`` (1.0) and ``fail`` (false) from the row and
answers ``{"id": "r-<rollout_id>", "reward", "steps", "steps_run"}`` (``steps_run``: how many
steps this attempt ran itself). A plain agent (``row -> reply``, :mod:`rl_gym_actors.gym.agents`)
has no boundary but its start: it blocks a prepare until it finishes.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rl_gym_actors.errors import ConfigError
from rl_gym_actors.gym.agents import SIMULATED, Agent, SimulatedAgentError, make_agent
from rl_gym_actors.gym.v2.wire import EpisodeId
from rl_gym_actors.protocol import ROLLOUT_ID_FIELD


class Steps(Protocol):
    episode_id: EpisodeId
    continuation: Any

    async def boundary(self, progress: Any) -> None: ...


StepAgent = Callable[[dict[str, Any], Steps], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class RawReply:
    """A reply a step agent hands back already encoded, with headers for the ``/run`` answer
    (the agent-checkpoint participant behind the v2 one, ``--protocol both``)."""

    body: bytes
    headers: Mapping[str, str]


def _number(row: dict[str, Any], name: str, default: float) -> float:
    value = row.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"row field {name!r} must be a number, got {value!r}")
    return float(value)


async def stepped_simulated_agent(row: dict[str, Any], steps: Steps) -> dict[str, Any]:
    total = int(_number(row, "steps", 1))
    step_s = _number(row, "step_s", _number(row, "sleep_s", 0) / max(total, 1))
    reward = _number(row, "reward", 1.0)
    done = 0
    if isinstance(steps.continuation, dict):
        done = int(steps.continuation.get("step", 0))
    ran = 0
    while done < total:
        if step_s > 0:
            await asyncio.sleep(step_s)
        done += 1
        ran += 1
        await steps.boundary({"step": done})
    if row.get("fail"):
        raise SimulatedAgentError("the row asked the simulated agent to fail")
    return {
        "id": f"r-{row.get(ROLLOUT_ID_FIELD)}",
        "reward": reward,
        "steps": total,
        "steps_run": ran,
    }


def plain(agent: Agent) -> StepAgent:
    """A ``row -> reply`` agent as a step agent without boundaries."""

    async def run(row: dict[str, Any], steps: Steps) -> Any:
        return await agent(row)

    return run


def make_step_agent(spec: str | Agent | StepAgent) -> StepAgent:
    """``simulated`` -> :func:`stepped_simulated_agent`; anything :func:`make_agent` takes ->
    that agent without boundaries; an async callable of two arguments is taken as it is."""
    if spec == SIMULATED:
        return stepped_simulated_agent
    if callable(spec) and not isinstance(spec, str):
        try:
            arity = len(inspect.signature(spec).parameters)
        except (TypeError, ValueError):
            arity = 1
        # the arity, checked at run time, says which kind of callable ``spec`` is
        return spec if arity == 2 else plain(spec)  # type: ignore[return-value,arg-type]
    if isinstance(spec, str):
        return plain(make_agent(spec))
    raise ConfigError(f"not an agent: {spec!r}")
