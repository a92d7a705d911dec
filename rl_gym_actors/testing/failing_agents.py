"""User agents that fail their row each in one way, named ``module:function`` for ``gym serve
--agent`` (so a server in another process can load them): what a user's agent raises and how the
row ends up (:mod:`rl_gym_actors.gym.agent_failure`). Each counts its calls per rollout id in
``CALLS`` (meaningful only in the process that serves them).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rl_gym_actors.errors import AgentDataError, AgentTransientError
from rl_gym_actors.protocol import ROLLOUT_ID_FIELD

CALLS: Counter[str] = Counter()


def _count(row: dict[str, Any]) -> None:
    CALLS[str(row.get(ROLLOUT_ID_FIELD))] += 1


def raises_value_error(row: dict[str, Any]) -> dict[str, Any]:
    """A sync agent with a bug of the row's kind: ``ValueError`` (unexpected: data)."""
    _count(row)
    raise ValueError(f"cannot parse {row.get('prompt')!r}")


async def raises_key_error(row: dict[str, Any]) -> dict[str, Any]:
    """An async agent reading a field the row lacks: ``KeyError`` (unexpected: data)."""
    _count(row)
    return {"reward": row["no_such_field"]}


async def fails_as_data(row: dict[str, Any]) -> dict[str, Any]:
    """Says the row is bad: ``AgentDataError`` (data, terminal)."""
    _count(row)
    raise AgentDataError("the task does not parse")


async def fails_transiently(row: dict[str, Any]) -> dict[str, Any]:
    """Says the try failed for no fault of the row's: ``AgentTransientError`` (tried again)."""
    _count(row)
    raise AgentTransientError("the model server did not answer")


async def times_out(row: dict[str, Any]) -> dict[str, Any]:
    """A call of its own ran out of time: ``TimeoutError`` (infrastructure: tried again)."""
    _count(row)
    raise TimeoutError("the sandbox did not start in 30 s")


_BY_NAME = {
    f.__name__: f
    for f in (raises_value_error, raises_key_error, fails_as_data, fails_transiently, times_out)
}


async def by_row(row: dict[str, Any]) -> dict[str, Any]:
    """The agent the row names in ``fails`` (one of this module's), or the reward it asks for
    (``reward``, default 1.0) when it names none."""
    name = row.get("fails")
    if name is None:
        _count(row)
        return {"reward": row.get("reward", 1.0)}
    result = _BY_NAME[str(name)](row)
    return await result if not isinstance(result, dict) else result
