"""``gym serve --protocol both`` on loopback: one ``/run`` whose run the v2 participant admits
in front and the agent-checkpoint participant runs and keeps behind (one receipt, one kept
reply, one agent run), a retire of either protocol stops it for both, a checkpoint of either
closes ``/run``, and discovery picks the agent-checkpoint routes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
from gym_test_helpers import cid, expect_type, rid, soon

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.errors import AdmissionClosed, StaleAttempt
from rl_gym_actors.gym import both
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.agent_checkpoint.participant import Participant
from rl_gym_actors.gym.agents import make_agent
from rl_gym_actors.gym.server import GymServer
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.discover import CheckpointProtocol, discover_protocol
from rl_gym_actors.testing.gym_process import GymServerProcess
from rl_gym_actors.testing.polling import until

aio = pytest.mark.asyncio(loop_scope="session")
TOKEN = "test-token"


@contextlib.contextmanager
def serve_both() -> Iterator[tuple[GymServer, both.BothParticipant]]:
    served = both.both_participant(Participant(make_agent("simulated"), lease_s=60.0))
    server = GymServer(
        served, token=TOKEN, app_factory=both.create_app, max_body_bytes=1 << 20, graceful_s=2.0
    )
    thread = server.serve_in_thread(10.0)
    try:
        yield server, served
    finally:
        server.stop()
        thread.join(10.0)


@aio
async def test_one_run_one_owner_one_receipt_one_kept_reply():
    with serve_both() as (server, served):
        async with GymClient(GymEndpoint(url=server.url, token=TOKEN)) as gym:
            v2 = V2Client(gym)
            found = await discover_protocol(gym, deadline_ts=soon())
            # both route sets: spoken to with the agent-checkpoint ones (they keep the replies)
            assert found.protocol is CheckpointProtocol.AGENT and found.both
            assert found.kind == "agent"
            r = rid()
            first = await gym.run(
                {"reward": 0.5}, rollout_id=r, attempt_index=0, deadline_ts=soon()
            )
            assert not first.replayed and first.receipt is not None  # the owner's receipt
            again = await gym.run(
                {"reward": 0.5}, rollout_id=r, attempt_index=0, deadline_ts=soon()
            )
            assert again.replayed and again.raw == first.raw and again.receipt == first.receipt
            snap = served.agent.snapshot()
            assert snap["agent_starts"] == 1 and snap["completed_unacknowledged"] == 1
            status = await v2.status(deadline_ts=soon())
            assert (status.model_extra or {})["kept_replies"] == 0  # kept once, behind
            capabilities = await gym.capabilities(deadline_ts=soon())
            assert capabilities is not None  # the agent-checkpoint routes answer too


@aio
async def test_a_v2_retire_stops_the_run_and_retires_its_execution():
    with serve_both() as (server, served):
        async with GymClient(GymEndpoint(url=server.url, token=TOKEN)) as gym:
            v2 = V2Client(gym)
            r = rid()
            run = asyncio.ensure_future(
                gym.run({"sleep_s": 30}, rollout_id=r, attempt_index=0, deadline_ts=soon(40))
            )
            await until(lambda: served.agent.snapshot()["running"] == 1, what="the run started")
            await v2.retire("any", [(r, 0)], deadline_ts=soon())
            await expect_type(StaleAttempt, run)
            snap = served.agent.snapshot()
            assert snap["running"] == 0 and snap["tombstoned"] == 1
            assert not served.v2.table.live
            retired = await gym.retire(r, 0, checkpoint_id=cid(), deadline_ts=soon())
            assert retired.tombstoned and not retired.retired  # already stopped behind


@aio
async def test_an_agent_checkpoint_retire_stops_the_v2_episode():
    with serve_both() as (server, served):
        async with GymClient(GymEndpoint(url=server.url, token=TOKEN)) as gym:
            r = rid()
            run = asyncio.ensure_future(
                gym.run({"sleep_s": 30}, rollout_id=r, attempt_index=0, deadline_ts=soon(40))
            )
            await until(lambda: bool(served.v2.table.live), what="the episode started")
            await until(lambda: served.agent.snapshot()["running"] == 1, what="the run started")
            await gym.retire(r, 0, checkpoint_id=cid(), deadline_ts=soon())
            await expect_type(StaleAttempt, run)  # its own code, not a 500
            await until(lambda: not served.v2.table.live, what="the episode ended")


@aio
async def test_a_checkpoint_of_either_protocol_closes_run():
    with serve_both() as (server, served):
        async with GymClient(GymEndpoint(url=server.url, token=TOKEN)) as gym:
            v2 = V2Client(gym)
            c = cid()
            assert (await v2.prepare(c, deadline_ts=soon())).prepared
            await expect_type(
                AdmissionClosed, gym.run({}, rollout_id=rid(), attempt_index=0, deadline_ts=soon())
            )
            await v2.resume(c, deadline_ts=soon())
            c = cid()
            assert (await gym.prepare(c, deadline_ts=soon())).ready_to_commit
            await expect_type(
                AdmissionClosed, gym.run({}, rollout_id=rid(), attempt_index=0, deadline_ts=soon())
            )
            assert served.v2.table.accepting  # refused behind, by the run's owner
            assert not served.v2.table.live  # and the v2 episode it began is gone
            await gym.resume(c, deadline_ts=soon())
            ok = await gym.run({}, rollout_id=rid(), attempt_index=0, deadline_ts=soon())
            assert not ok.replayed


@pytest.mark.slow  # seconds: out of make test-fast
def test_cli_serves_both(tmp_path):
    with GymServerProcess(args=["--protocol", "both"], state_dir=tmp_path) as srv:

        async def main():
            async with GymClient(srv.endpoint) as gym:
                status = await V2Client(gym).status(deadline_ts=soon())
                res = await gym.run({}, rollout_id=rid(), attempt_index=0, deadline_ts=soon())
                capabilities = await gym.capabilities(deadline_ts=soon())
                return status, res, capabilities

        status, res, capabilities = asyncio.run(main())
    assert status.kind == "agent" and (status.model_extra or {})["durable"] is True
    assert res.receipt is not None and "durable-store" in capabilities.features
