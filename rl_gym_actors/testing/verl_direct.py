"""The baseline of ``benchmarks/verl_overhead.py``: a verl agent loop that posts each session to the
Gym server itself, with no layer (what a verl user without this project writes).

Per session, in verl's ``AgentLoopWorker`` process: ``/run``, the receipt (the one sent beside
the reply, else fetched), the digest check, the ACK (the Gym protocol's happy path), then the
same reply -> ``AgentLoopOutput`` mapping as
:class:`~rl_gym_actors.integrations.verl.agent_loop.GymAgentLoop` (so the two differ only in the
layer). No retry, no checkpoint, no adoption: a failure raises.
One :class:`~rl_gym_actors.gym.agent_checkpoint.client.GymClient` per worker process and endpoint.

Registered as ``rlga_direct``; a row picks it with ``agent_name``. :func:`write_loop_config`
writes a loop config holding both loops.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from rl_gym_actors.errors import ProtocolViolation
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.integrations.verl.agent_loop import LOOP_NAME, GymAgentLoop, loop_settings
from rl_gym_actors.integrations.verl.outputs import output_fields
from rl_gym_actors.protocol import ROLLOUT_ID_FIELD

DIRECT_LOOP = "rlga_direct"
CLIENT_LIMIT = 1000  # connections per worker process (every session of a batch at once)
RUN_TIMEOUT_S = 600.0
_CLIENTS: dict[str, GymClient] = {}


def write_loop_config(path: Path) -> Path:
    """A loop config (``agent_loop_config_path``) with the layer's loop and the direct one."""
    path.write_text(
        f"- name: {LOOP_NAME}\n"
        f"  _target_: {GymAgentLoop.__module__}.{GymAgentLoop.__name__}\n"
        f"- name: {DIRECT_LOOP}\n"
        f"  _target_: {__name__}.DirectGymAgentLoop\n"
    )
    return path


@register(DIRECT_LOOP)
class DirectGymAgentLoop(GymAgentLoop):
    """See the module docstring (the row is :meth:`GymAgentLoop.make_row`'s)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        started = time.perf_counter()
        settings = loop_settings(self.config)
        row = self.make_row(settings.run_id, kwargs)
        rid = str(row.pop(ROLLOUT_ID_FIELD))
        endpoint = settings.endpoints[0]
        client = _CLIENTS.get(endpoint.url)
        if client is None:
            client = _CLIENTS[endpoint.url] = GymClient(
                endpoint, limit=CLIENT_LIMIT, control_limit=CLIENT_LIMIT
            )
        deadline = time.time() + RUN_TIMEOUT_S
        result = await client.run(row, rollout_id=rid, attempt_index=0, deadline_ts=deadline)
        receipt = result.receipt  # sent beside the reply by this project's server
        if receipt is None:
            receipt = (await client.receipt(rid, 0, deadline_ts=deadline)).completion_receipt
        if receipt is None or receipt.result_digest != result.digest:
            raise ProtocolViolation(f"{rid}: no receipt, or its digest is not the reply's")
        await client.acknowledge(receipt, deadline_ts=deadline)
        fields = output_fields(result.reply, rid, self.rollout_config.response_length)
        fields["extra_fields"].update(rlga_rollout_id=rid)
        metrics = AgentLoopMetrics(generate_sequences=time.perf_counter() - started)
        return AgentLoopOutput(metrics=metrics, **fields)


__all__ = ["DIRECT_LOOP", "DirectGymAgentLoop", "write_loop_config"]
