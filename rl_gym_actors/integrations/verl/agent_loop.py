"""The agent loop verl plays each session through: ``GymAgentLoop``, registered as
``rl_gym_actors``.

verl builds one loop per session (``hydra.utils.instantiate`` in an ``AgentLoopWorker`` actor)
and calls ``run(sampling_params, **sample)``. The loop makes the session's Gym row
(:meth:`GymAgentLoop.make_row`: the dataset's ``extra_info`` fields, ``raw_prompt`` as the
``responses_create_params.input``, and the rollout id ``<run>-<uid>-s<session_id>``), plays it
through the run's host (:mod:`rl_gym_actors.integrations.verl.host`, one orchestrator for every
worker process), and maps the sealed reply into ``AgentLoopOutput``
(:mod:`rl_gym_actors.integrations.verl.outputs`). A rollout without a usable result raises
:class:`~rl_gym_actors.integrations.verl.outputs.GymRolloutFailed`; verl marks the prompt's
group ``failure`` (see there for what each trainer mode then does). No reward is made up.

verl's worker processes learn the loop from the packaged config file:
``actor_rollout_ref.rollout.agent.agent_loop_config_path=`` :data:`LOOP_CONFIG` (print it with
``python -m rl_gym_actors.integrations.verl``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from rl_gym_actors.integrations.verl.host import HostSpec, aensure_host, find_host
from rl_gym_actors.integrations.verl.ids import rollout_id
from rl_gym_actors.integrations.verl.outputs import GymRolloutFailed, output_fields
from rl_gym_actors.integrations.verl.settings import VerlSettings, restore_dir, settings_from
from rl_gym_actors.protocol import ROLLOUT_ID_FIELD

LOOP_NAME = "rl_gym_actors"
LOOP_CONFIG = str(Path(__file__).with_name("agent_loops.yaml"))
_HOSTS: dict[str, Any] = {}  # run id -> the host's handle, per worker process
_SETTINGS: dict[int, tuple[Any, VerlSettings]] = {}  # id(config) -> (config, its settings)


def loop_settings(config: Any) -> VerlSettings:
    """:func:`settings_from` ``config``, read once per config object in a worker process (verl
    hands every loop of a worker the same config; reading it through OmegaConf for every
    session was more than half the loop's own time, measured by benchmarks/verl_overhead.py)."""
    hit = _SETTINGS.get(id(config))
    if hit is not None and hit[0] is config:
        return hit[1]
    settings = settings_from(config)
    _SETTINGS[id(config)] = (config, settings)  # holding config: its id is not reused
    return settings


def host_spec(config: Any) -> HostSpec:
    """The host verl's config describes (the same in every process that reads it)."""
    from rl_gym_actors.config import TryPolicy

    settings = settings_from(config)
    policy_args: dict[str, Any] = {
        k: v
        for k, v in (
            ("rollout_s", settings.rollout_s),
            ("receipt_s", settings.receipt_s),
            ("max_tries", settings.max_tries),
        )
        if v is not None
    }
    restore = restore_dir(config)
    return HostSpec(
        endpoints=settings.endpoints,
        run_id=settings.run_id,
        pool_size=settings.pool_size,
        rollouts_per_actor=settings.rollouts_per_actor,
        policy=TryPolicy(**policy_args) if policy_args else None,
        restore_from=None if restore is None else str(restore),
    )


async def host_for(config: Any) -> tuple[str, Any]:
    run_id = loop_settings(config).run_id
    handle = _HOSTS.get(run_id) or find_host(run_id)
    if handle is None:
        handle = await aensure_host(host_spec(config))
    _HOSTS[run_id] = handle
    return run_id, handle


@register(LOOP_NAME)
class GymAgentLoop(AgentLoopBase):
    """See the module docstring."""

    def make_row(self, run_id: str, sample: dict[str, Any]) -> dict[str, Any]:
        """The Gym row of one session (override to shape rows for another agent)."""
        extra = sample.get("extra_info")
        row: dict[str, Any] = dict(extra) if isinstance(extra, dict) else {}
        row.pop("index", None)
        row.setdefault("responses_create_params", {"input": _plain(sample.get("raw_prompt"))})
        row[ROLLOUT_ID_FIELD] = rollout_id(run_id, sample["uid"], int(sample.get("session_id", 0)))
        return row

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        started = time.perf_counter()
        run_id, host = await host_for(self.config)
        row = self.make_row(run_id, kwargs)
        rid = row[ROLLOUT_ID_FIELD]
        outcome = await host.run.remote(row)
        if not outcome.has_result or outcome.reply is None:
            raise GymRolloutFailed(rid, outcome.reason or outcome.status, outcome.failure)
        fields = output_fields(outcome.reply, rid, self.rollout_config.response_length)
        fields["extra_fields"].update(
            rlga_rollout_id=rid,
            rlga_adopted=bool(outcome.adopted),
            rlga_repeated=bool(outcome.repeated),
            rlga_tries=int(outcome.tries),
        )
        metrics = AgentLoopMetrics(generate_sequences=time.perf_counter() - started)
        return AgentLoopOutput(metrics=metrics, **fields)


def _plain(value: Any) -> Any:
    """``raw_prompt`` as JSON-able data (verl hands numpy arrays of dicts)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value
