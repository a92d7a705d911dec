"""``gym serve --protocol both``: the agent-checkpoint routes and the v2 routes on one server,
with one ``/run`` and one owner for each run (docs/PROTOCOL.md, "Both protocols on one server").

Ownership: the v2 participant is in front and the agent-checkpoint participant behind it.

- ``/run`` names its episode as on v2 (``_ng_rollout_id``, a rollout id or a capture key;
  ``_ng_attempt_index``). The v2 participant admits it first (retired marks ->
  ``stale_attempt``, a v2 checkpoint -> ``admission_closed``, a running episode ->
  ``duplicate_execution``); then the agent-checkpoint participant runs it as the execution
  ``(rollout_id, attempt)`` (its fence, its tombstones, its store). The answer carries the
  agent-checkpoint receipt header, and ``x-gym-replayed`` when that participant answered a stored
  reply.
- Finished replies are kept once, by the agent-checkpoint participant, until they are ACKed or
  retired there (the v2 participant keeps none here, so a lost reply is replayed with its
  receipt whichever protocol the controller speaks).
- A checkpoint of either protocol closes ``/run`` for both (each layer refuses with its own
  code), and each prepare waits for every run: every run is both a v2 episode and an execution.
- A v2 ``retire`` stops the episode and retires (tombstones) its execution behind; an
  agent-checkpoint ``retire`` stops the execution, and the ``/run`` caller gets
  ``stale_attempt``. Each protocol's ``forget``/ACK clears only its own marks and records.
- Episodes have one boundary, their start (the agent-checkpoint agent reports no steps).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from rl_gym_actors.errors import GymError, InvalidRequest
from rl_gym_actors.gym.agent_checkpoint import routes as agent_routes
from rl_gym_actors.gym.agent_checkpoint.participant import Participant
from rl_gym_actors.gym.v2 import routes as v2_routes
from rl_gym_actors.gym.v2.discover import AGENT_CHECKPOINT_FLAG
from rl_gym_actors.gym.v2.participant import DEFAULT_LEASE_GRACE_S, V2Participant
from rl_gym_actors.gym.v2.state import V2State
from rl_gym_actors.gym.v2.stepped import RawReply, StepAgent, Steps
from rl_gym_actors.gym.v2.wire import RESTART_HEADER
from rl_gym_actors.gym.web import Extension, json_response
from rl_gym_actors.protocol import REPLAYED_HEADER, is_valid_attempt_index, is_valid_rollout_id


def behind(agent: Participant) -> StepAgent:
    """The agent-checkpoint participant as the v2 participant's agent (see the module
    docstring)."""

    async def run(row: dict[str, Any], steps: Steps) -> RawReply:
        key = (steps.episode_id.rollout_id, steps.episode_id.attempt)
        call = asyncio.ensure_future(agent.run(key, row))
        try:
            answer = await asyncio.shield(call)
        except asyncio.CancelledError:
            # a v2 retire (or shutdown) stops the episode: its execution is retired behind,
            # and the run's own answer (stale_attempt, or 503 at shutdown) is taken here
            with contextlib.suppress(GymError):
                await agent.retire(None, key)
            with contextlib.suppress(GymError, asyncio.CancelledError):
                await call
            raise
        return RawReply(answer.reply, agent_routes.run_headers(answer))

    return run


class FrontParticipant(V2Participant):
    """The v2 participant in front: its status says the server has the agent-checkpoint routes
    too ((ext) ``agent_checkpoint: true``), so discovery speaks those (they keep the replies)."""

    def status(self) -> dict[str, Any]:
        return {**super().status(), AGENT_CHECKPOINT_FLAG: True}


class BothParticipant:
    """The two participants of one ``--protocol both`` server, served together."""

    def __init__(self, agent: Participant, v2: V2Participant) -> None:
        self.agent = agent
        self.v2 = v2

    async def start(self) -> None:
        await self.agent.start()
        await self.v2.start()

    async def stop_runs(self) -> None:
        await self.agent.stop_runs()  # first: the runs behind answer 503, not a retire
        await self.v2.stop_runs()

    async def aclose(self) -> None:
        await self.v2.aclose()
        await self.agent.aclose()

    def crash(self) -> None:
        self.v2.crash()
        self.agent.crash()


def both_participant(
    agent: Participant,
    *,
    lease_grace_s: float = DEFAULT_LEASE_GRACE_S,
    restart_only: bool = False,
    state_dir: str | None = None,
) -> BothParticipant:
    """``agent`` (the owner of every run) behind a v2 participant that keeps no replies."""
    v2 = FrontParticipant(
        behind(agent),
        lease_grace_s=lease_grace_s,
        restart_only=restart_only,
        keep_replies=False,
        state=None if state_dir is None else V2State(state_dir),
    )
    return BothParticipant(agent, v2)


def create_app(
    both: BothParticipant,
    *,
    token: str,
    max_body_bytes: int,
    extensions: Sequence[Extension] = (),
) -> FastAPI:
    """The agent-checkpoint app without its ``/run``, the v2 control routes, and the one
    ``/run`` (the :class:`~rl_gym_actors.gym.server.AppFactory` of ``--protocol both``)."""
    app = agent_routes.create_app(
        both.agent,
        token=token,
        max_body_bytes=max_body_bytes,
        extensions=extensions,
        run_route=False,
    )
    v2_routes.install_control_routes(app, both.v2, token=token, max_body_bytes=max_body_bytes)

    @app.post("/run")
    async def run(request: Request) -> Response:
        row = await v2_routes.read_row(request, max_body_bytes)
        episode = v2_routes.episode_of(row)
        if not (
            is_valid_rollout_id(episode.rollout_id) and is_valid_attempt_index(episode.attempt)
        ):  # what the store behind takes: at most 256 characters, a 64-bit attempt
            raise InvalidRequest(
                f"{episode} is out of the agent-checkpoint key's range", status=422
            )
        outcome = await both.v2.run(episode, row)
        headers = dict(outcome.headers)
        if outcome.replayed:
            headers[REPLAYED_HEADER] = "1"
        if both.v2.restart_only:
            headers[RESTART_HEADER] = "1"
        return json_response(outcome.reply, 200, headers)

    return app
