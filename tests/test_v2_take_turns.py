"""Another checkpoint id holding a Gym v2 server (another run's checkpoint, a dead trainer's of
another run) and this run's checkpoint: the gate waits for it to resume, so two runs that
checkpoint at once take turns, and past its deadline fails before sending anything, naming the
holder (``blockers[name]["active_checkpoint_id"]``), the holder left alone. Found against NeMo
Gym's real participant (control.py @011c3386), which refuses a prepare under another id with a
bare ``checkpoint_conflict``: the gate failed at once, naming the id only in the error's text.
Real parts: a local Ray ledger actor and the v2 server on loopback."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from rl_gym_actors.config import GymEndpoint, LedgerConfig, TryPolicy
from rl_gym_actors.errors import CheckpointFailed
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.testing.v2_server import V2ServerThread

pytestmark = [pytest.mark.ray, pytest.mark.slow]

_ids = itertools.count()
HOLDER = "run-x-ck-1"


async def make_ledger(endpoints: list[GymEndpoint]):
    """A started ledger that knows the servers speak v2 (so the test's clock starts there)."""
    from rl_gym_actors.actors.ledger_actor import LedgerActor, ledger_name
    from rl_gym_actors.actors.runtime import RAY_NAMESPACE

    ledger = LedgerActor.options(
        name=ledger_name(f"v2turns-{next(_ids)}"), namespace=RAY_NAMESPACE
    ).remote(endpoints, TryPolicy(control_s=3.0), LedgerConfig())
    assert await ledger.protocols.remote() == {e.url: "v2" for e in endpoints}
    return ledger


async def hold(gym: GymClient) -> None:
    """Another run's checkpoint, prepared and left open (its trainer gone quiet)."""
    answer = await V2Client(gym).prepare(HOLDER, deadline_ts=time.time() + 10.0)
    assert answer.phase == "prepared", answer


async def test_a_checkpoint_held_by_another_id_fails_at_its_deadline_naming_it(
    ray_session, tmp_path
):
    with V2ServerThread() as server:
        ledger = await make_ledger([server.endpoint])
        async with GymClient(server.endpoint) as gym:
            await hold(gym)
            started = time.monotonic()
            with pytest.raises(CheckpointFailed) as caught:
                await ledger.checkpoint.remote("run-y-ck-1", str(tmp_path), 3.0)
            waited = time.monotonic() - started
            assert 2.0 <= waited < 8.0, waited  # its own deadline, not at once
            [entry] = caught.value.blockers.values()
            assert entry["active_checkpoint_id"] == HOLDER, caught.value.blockers
            status = server.participant.status()  # the other run's checkpoint is left alone
            assert (status["phase"], status["checkpoint_id"]) == ("prepared", HOLDER)
            await V2Client(gym).resume(HOLDER, deadline_ts=time.time() + 10.0)


async def test_two_checkpoints_take_turns(ray_session, tmp_path):
    with V2ServerThread() as server:
        ledger = await make_ledger([server.endpoint])
        async with GymClient(server.endpoint) as gym:
            await hold(gym)

            async def resume_later() -> None:
                await asyncio.sleep(2.0)
                await V2Client(gym).resume(HOLDER, deadline_ts=time.time() + 10.0)

            later = asyncio.ensure_future(resume_later())
            started = time.monotonic()
            report = await ledger.checkpoint.remote("run-y-ck-1", str(tmp_path), 20.0)
            await later
            assert time.monotonic() - started >= 2.0  # it waited for the other one's resume
            [entry] = report.endpoints
            assert entry.protocol == "v2" and entry.checkpoint_dir
            assert server.participant.status()["phase"] == "idle"
