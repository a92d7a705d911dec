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
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rl_gym_actors.errors import ConfigError
from rl_gym_actors.gym.agents import (
    MAX_SIMULATED_S,
    MAX_SIMULATED_STEPS,
    SIMULATED,
    Agent,
    SimulatedAgentError,
    SimulatedRowInvalid,
    bounded_number,
    make_agent,
)
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


async def stepped_simulated_agent(row: dict[str, Any], steps: Steps) -> dict[str, Any]:
    """The simulated agent in steps (see the module docstring). A row past the bounds
    (:data:`~rl_gym_actors.gym.agents.MAX_SIMULATED_STEPS` steps, ``steps * step_s`` past
    :data:`~rl_gym_actors.gym.agents.MAX_SIMULATED_S`) is refused before any step
    (:class:`~rl_gym_actors.gym.agents.SimulatedRowInvalid`); every step yields the loop, so
    the control plane answers while it runs, even at ``step_s`` 0."""
    total = int(bounded_number(row, "steps", 1, low=0, high=MAX_SIMULATED_STEPS))
    sleep_s = bounded_number(row, "sleep_s", 0, low=0, high=MAX_SIMULATED_S)
    step_s = bounded_number(row, "step_s", sleep_s / max(total, 1), low=0, high=MAX_SIMULATED_S)
    reward = bounded_number(row, "reward", 1.0, low=-math.inf, high=math.inf)
    if total * step_s > MAX_SIMULATED_S:
        raise SimulatedRowInvalid(
            f"{total} steps of {step_s:g} s is past {MAX_SIMULATED_S:g} s", status=422
        )
    done = 0
    if isinstance(steps.continuation, dict):
        done = int(steps.continuation.get("step", 0))
    ran = 0
    while done < total:
        # a step of 0 s still yields: a boundary that does not park returns without waiting
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
