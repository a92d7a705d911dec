"""The drop-in's checkpoint steps on their own: asyncio only, a stand-in gate."""

from __future__ import annotations

import asyncio
import time

import pytest

from rl_gym_actors.errors import (
    CheckpointConflict,
    CheckpointFailed,
    CheckpointNotReady,
    ConfigError,
    StaleCheckpoint,
)
from rl_gym_actors.integrations.nemo_rl.checkpoints import CheckpointSteps
from rl_gym_actors.integrations.nemo_rl.rows import RolloutTransportError
from rl_gym_actors.testing.polling import soon


class Report:
    adopted, orphans_acked, retired, elapsed_s, endpoints = 1, 2, 3, 0.5, []


class Gate:
    def __init__(self, fail: Exception | None = None, delay_s: float = 0.0):
        self.calls: list[tuple[str, str, float]] = []
        self.fail = fail
        self.delay_s = delay_s

    async def __call__(self, cid, directory, deadline_s):
        self.calls.append((cid, directory, deadline_s))
        await asyncio.sleep(self.delay_s)
        if self.fail is not None:
            raise self.fail
        return Report()


def steps(**kw) -> CheckpointSteps:
    return CheckpointSteps(**{"admission_wait_s": 5.0, "commit_min_s": 1.0, **kw})


async def test_prepare_waits_for_rollouts_in_flight_and_new_ones_wait_for_resume():
    s = steps()
    release = asyncio.Event()

    async def rollout():
        await s.admitted()
        async with s.running("r1"):
            await release.wait()

    task = asyncio.create_task(rollout())
    await asyncio.sleep(0)
    prepare = asyncio.create_task(s.prepare("ck", soon(5)))
    await asyncio.sleep(0.05)
    assert not prepare.done() and s.snapshot()["admission"] == "closed"
    late = asyncio.create_task(s.admitted())
    release.set()
    answer = await prepare
    assert answer["ready_to_commit"] and answer["drained_s"] > 0.03
    await task
    assert not late.done()  # admission is closed until resume
    assert await s.prepare("ck", soon(5)) is answer  # a repeat: the recorded answer
    committed = await s.commit("ck", "/ckpt/a", Gate())
    assert (
        committed["orphans_acked"] == 2
        and s.snapshot()["checkpoint"]["phase"] == "committed_paused"
    )
    assert not late.done()
    resumed = s.end("ck")
    await asyncio.wait_for(late, 1.0)
    assert resumed == {"checkpoint_id": "ck", "state": "accepting", "committed": committed}
    assert s.end("ck") == resumed  # resume again: same answer
    assert await s.commit("ck", "/ckpt/a", Gate()) == committed
    with pytest.raises(StaleCheckpoint):
        await s.prepare("ck", soon(5))
    with pytest.raises(StaleCheckpoint):
        await s.commit("ck", "/ckpt/other", Gate())


async def test_prepare_past_its_deadline_names_the_blockers_and_keeps_admission_closed():
    s = steps()
    async with s.running("r-slow"):
        with pytest.raises(CheckpointFailed) as failed:
            await s.prepare("ck", time.time() + 0.05)
        assert failed.value.blockers == {"in_flight": ["r-slow"]}
        assert s.snapshot()["admission"] == "closed"
        with pytest.raises(CheckpointConflict):
            await s.prepare("other", time.time() + 1)
        with pytest.raises(CheckpointNotReady):
            await s.commit("ck", "/ckpt", Gate())
    assert (await s.prepare("ck", time.time() + 1))["ready_to_commit"]  # prepare again
    assert s.end("ck")["committed"] is None  # abort
    assert s.snapshot()["admission"] == "open"


async def test_admission_wait_is_bounded_and_a_transport_failure():
    s = steps(admission_wait_s=0.05)
    await s.prepare("ck", time.time() + 1)
    with pytest.raises(RolloutTransportError):
        await s.admitted()


async def test_a_failed_gate_spends_the_id_and_reopens_admission():
    s = steps()
    await s.prepare("ck", time.time() - 10)  # nothing in flight: ready at once
    gate = Gate(fail=CheckpointFailed("endpoint not ready", checkpoint_id="ck"))
    with pytest.raises(CheckpointFailed):
        await s.commit("ck", "/ckpt", gate)
    assert gate.calls[0][2] == 1.0  # an expired deadline gets commit_min_s
    assert s.snapshot()["admission"] == "open"
    with pytest.raises(StaleCheckpoint):
        await s.commit("ck", "/ckpt", Gate())
    assert s.end("ck")["failed"]


async def test_concurrent_commits_run_the_gate_once_and_a_dir_change_is_refused():
    s = steps()
    await s.prepare("ck", soon(5))
    gate = Gate(delay_s=0.05)
    a, b = await asyncio.gather(s.commit("ck", "/ckpt", gate), s.commit("ck", "/ckpt", gate))
    assert a is b and len(gate.calls) == 1 and s.committed == 1
    with pytest.raises(ConfigError):
        await s.commit("ck", "/elsewhere", gate)


async def test_resume_during_a_commit_is_refused():
    s = steps()
    await s.prepare("ck", soon(5))
    commit = asyncio.create_task(s.commit("ck", "/ckpt", Gate(delay_s=0.05)))
    await asyncio.sleep(0.01)
    with pytest.raises(CheckpointConflict):
        s.end("ck")
    await commit
    assert s.end("ck")["committed"] is not None


@pytest.mark.parametrize("bad", ["", "has space", "x" * 200])
async def test_bad_ids_are_config_errors(bad):
    with pytest.raises(ConfigError):
        await steps().prepare(bad, time.time() + 1)


async def test_give_up_reopens_without_spending_the_id_and_commit_takes_its_own_deadline():
    s = steps()
    async with s.running("r-slow"):
        with pytest.raises(CheckpointFailed):
            await s.prepare("ck", time.time() + 0.05)
        s.give_up("other")  # not the active one: no-op
        assert s.snapshot()["admission"] == "closed"
        s.give_up("ck")
        assert s.snapshot()["admission"] == "open" and s.snapshot()["checkpoint"] is None
    await s.prepare("ck", time.time() - 10)  # the same id prepares again
    assert s.record("ck", "k", {"a": 1}) == {"a": 1}
    assert s.record("ck", "k", {"a": 2}) == {"a": 1} and s.answer("ck", "k") == {"a": 1}
    gate = Gate()
    await s.commit("ck", "/ckpt", gate, deadline_ts=time.time() + 60)
    assert 50 < gate.calls[0][2] <= 60  # the commit's deadline, not prepare's
    s.give_up("ck")  # committed: give_up leaves it
    assert s.snapshot()["checkpoint"]["phase"] == "committed_paused"


async def test_give_up_reopens_admission_without_spending_the_id():
    s = steps()
    async with s.running("r-slow"):
        with pytest.raises(CheckpointFailed):
            await s.prepare("ck", time.time() + 0.05)
        s.give_up("ck")
        assert s.snapshot()["admission"] == "open" and s.snapshot()["checkpoint"] is None
        await s.admitted()  # new rollouts go in at once
    assert (await s.prepare("ck", time.time() + 1))["ready_to_commit"]  # the id is not spent
    with pytest.raises(CheckpointConflict):
        await s.prepare("other", time.time() + 1)
