"""A restored trainer frees Gym of its dead checkpoint before Ray starts its ledger (both
protocols): the fault campaign found Gym refusing work for the seconds a loaded machine takes to
start the ledger actor (8.1 s at load 36), past the 5 s the issue allows. The ledger's start is
watched, not replaced: when it is called, Gym already takes work."""

from __future__ import annotations

import pytest

from rl_gym_actors.checkpoint_part import write_part
from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.core.sealed_ids import SealedIds
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.testing.campaign import gym_open
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import soon
from rl_gym_actors.testing.v2_server import V2ServerThread

RUN = "early-run"
POLICY = TryPolicy(rollout_s=20.0, receipt_s=2.0, max_tries=2, control_s=3.0)


@pytest.mark.ray
@pytest.mark.parametrize("protocol", ["agent", "v2"])
async def test_gym_takes_work_before_the_ledger_starts(
    ray_session, tmp_path, monkeypatch, protocol
):
    from rl_gym_actors.actors import ledger_client
    from rl_gym_actors.orchestrator import Orchestrator

    if protocol == "agent":
        server = GymServerThread(token="test-token", args=["--checkpoint-lease-s", "0"])
    else:
        server = V2ServerThread()
    with server:
        endpoint = GymEndpoint(url=server.url, token=server.token)
        async with GymClient(endpoint) as client:  # a dead trainer's prepare, never resumed
            if protocol == "agent":
                await client.prepare("step-1", deadline_ts=soon(10))
            else:
                await V2Client(client).prepare("step-1", deadline_ts=soon(10))
        assert not gym_open(server)
        dead = tmp_path / "step-1"  # its part, written before its prepare
        write_part(
            dead, run_id=RUN, checkpoint_id="step-1", handed=[], undelivered=[], sealed=SealedIds()
        )
        open_at_ledger_start: list[bool] = []
        start = ledger_client.LedgerClient.start.__func__  # type: ignore[attr-defined]

        async def watched(cls, *args, **kwargs):
            open_at_ledger_start.append(gym_open(server))
            return await start(cls, *args, **kwargs)

        monkeypatch.setattr(ledger_client.LedgerClient, "start", classmethod(watched))
        async with Orchestrator(
            [endpoint],
            policy=POLICY,
            pool_size=1,
            run_id=RUN,
            progress=False,
            start=False,
            restore_from=str(dead),
        ) as orch:
            await orch.astart()
            assert open_at_ledger_start == [True]  # freed from the driver, before the ledger
            assert [(e.checkpoint_id, e.resumed) for e in orch.cleared] == [("step-1", True)]
            (out,) = await orch.arun_batch([{"reward": 0.5}])
            assert out.status == "sealed"
            report = await orch.acheckpoint("step-2", str(tmp_path / "step-2"), deadline_s=30)
            assert report.endpoints[0].commit is not None
