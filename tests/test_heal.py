"""Faults that heal leave Gym open (issue 16). A partition (here: the Gym process frozen with
SIGSTOP, so every call goes unanswered) during a checkpoint that had closed admission: the
checkpoint fails at its deadline and its resume gets no answer. Before, Gym stayed ``preparing``
until its own lease (51 s), forever on a server without one, and the next checkpoint of the same
orchestrator failed on a conflict naming its own id. Now the ledger resumes in the background:
within 15 s of the heal (SIGCONT) Gym accepts again and the next checkpoint commits, with and
without a lease on the server. ``start()`` against a server another checkpoint holds starts and
warns, naming the holder."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from rl_gym_actors import Orchestrator, TryPolicy
from rl_gym_actors.errors import CheckpointConflict, CheckpointFailed, DeadlineExceeded
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.gym_process import GymServerProcess
from rl_gym_actors.testing.polling import scaled, soon, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.ray]

POLICY = TryPolicy(rollout_s=60.0, receipt_s=2.0, max_tries=1, control_s=2.0)


NO_ANSWER = "(no answer)"  # a probe the loaded machine did not answer in time: ask again


def _holder(endpoint) -> str | None:
    """The checkpoint id holding the server (None: it accepts), from a status of our own."""

    async def ask() -> str | None:
        async with GymClient(endpoint) as client:
            try:
                status = await client.status("heal-probe", deadline_ts=soon(2.0))
                if status.state == "accepting":
                    return None
                caps = await client.capabilities(deadline_ts=soon(2.0))
            except CheckpointConflict as exc:
                return exc.active_checkpoint_id or "unknown"
            except DeadlineExceeded:
                return NO_ANSWER
            return (caps.active_checkpoint_id if caps is not None else None) or "unknown"

    return asyncio.run(ask())


@pytest.mark.parametrize("lease", ["0", "60"])
def test_a_partition_during_a_checkpoint_heals_without_a_person(ray_session, tmp_path, lease):
    server = GymServerProcess(token="heal", args=["--checkpoint-lease-s", lease]).start()
    try:
        with Orchestrator(
            [server.endpoint], policy=POLICY, pool_size=1, rollouts_per_actor=4, progress=False
        ) as orch:
            assert [o.status for o in orch.run_batch([{"_ng_rollout_id": "hl-0"}])] == ["sealed"]
            slow: list = []
            runner = threading.Thread(
                target=lambda: slow.extend(
                    orch.run_batch([{"_ng_rollout_id": "hl-slow", "sleep_s": 3.0}])
                )
            )
            runner.start()
            failed: list = []

            def checkpoint() -> None:
                try:
                    orch.checkpoint("hl-ck-1", str(tmp_path / "ck1"), deadline_s=4.0)
                except CheckpointFailed as exc:
                    failed.append(exc)

            gate = threading.Thread(target=checkpoint)
            gate.start()
            wait_for(lambda: _holder(server.endpoint) == "hl-ck-1", timeout_s=20, what="held")
            os.kill(server.pid, signal.SIGSTOP)  # the partition: nothing is answered
            gate.join(60)
            assert len(failed) == 1  # the deadline passed; its resume got no answer
            os.kill(server.pid, signal.SIGCONT)  # the heal
            healed = time.monotonic()
            wait_for(lambda: _holder(server.endpoint) is None, timeout_s=15, what="accepting")
            runner.join(60)
            assert [o.status for o in slow] == ["sealed"]
            orch.checkpoint("hl-ck-2", str(tmp_path / "ck2"), deadline_s=15)
            assert time.monotonic() - healed < scaled(15.0)
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()


def test_start_with_a_server_held_by_another_checkpoint_warns_naming_it(
    ray_session, tmp_path, caplog
):
    server = GymServerProcess(token="heal", args=["--checkpoint-lease-s", "0"]).start()
    try:

        async def hold() -> None:
            async with GymClient(server.endpoint) as client:
                await client.prepare("someone-else", deadline_ts=time.time() + 2.0)

        asyncio.run(hold())
        assert _holder(server.endpoint) == "someone-else"
        with (
            caplog.at_level("WARNING", logger="rl_gym_actors.gym.probe"),
            Orchestrator([server.endpoint], policy=POLICY, pool_size=1, progress=False) as orch,
        ):
            assert orch.snapshot().pool.size >= 1
        (warning,) = [r.getMessage() for r in caplog.records if "held by" in r.getMessage()]
        assert "someone-else" in warning and "gym abort" in warning
    finally:
        server.kill()
