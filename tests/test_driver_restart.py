"""A trainer's driver SIGKILLed mid-batch, no checkpoint since, restarted with the same rows: with
``ack="at_checkpoint"`` (the default) every run that finished is replayed by Gym, the runs still
going are waited for, nothing runs twice, and every row is sealed once.

The dead driver is a real process (a subprocess joined to the suite's Ray as its own job) killed
with SIGKILL; its rollout actors learn that their driver is gone and dispatch nothing more."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.gym_process import GymServerThread, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROWS = 24
SLEEP_S = 1.0
POOL = 6
POLICY = dict(rollout_s=20.0, receipt_s=5.0, max_tries=2, control_s=5.0)

DRIVER = textwrap.dedent("""
    import sys
    from rl_gym_actors.actors.runtime import ensure_ray
    from rl_gym_actors import GymEndpoint, Orchestrator, TryPolicy
    address, url, token, rows, pool, sleep_s = sys.argv[1:7]
    ensure_ray(address=address)
    rows = [{"_ng_rollout_id": f"dk-{i}", "sleep_s": float(sleep_s), "reward": i / 100}
            for i in range(int(rows))]
    orch = Orchestrator([GymEndpoint(url=url, token=token)], policy=TryPolicy(**%r),
                        pool_size=int(pool), progress=False)
    print("started", flush=True)
    orch.run_batch(rows)
    print("finished", flush=True)
""" % POLICY)


def rows() -> list[dict]:
    return [{"_ng_rollout_id": f"dk-{i}", "sleep_s": SLEEP_S, "reward": i / 100}
            for i in range(ROWS)]


def test_a_driver_killed_mid_batch_then_restarted_runs_every_row_once(ray_session, tmp_path):
    from rl_gym_actors.orchestrator import Orchestrator

    agent = CountingAgent()
    with GymServerThread(agent=agent, token="test-token") as gym:
        address = ray_session.get_runtime_context().gcs_address
        env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, address, gym.url, gym.token, str(ROWS), str(POOL),
             str(SLEEP_S)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        try:
            assert driver.stdout.readline().strip() == "started"
            # mid-batch: some rows finished on Gym, some still run, the rest never started
            # (past the first wave, whose results ack="on_seal" would have released by now)
            wait_for(lambda: len(agent.finished) > POOL, timeout_s=60,
                     what="a second wave of rows to finish")
            driver.send_signal(signal.SIGKILL)
            driver.wait(10)
        finally:
            if driver.poll() is None:
                driver.kill()
        finished_at_kill = len(agent.finished)
        assert 0 < finished_at_kill < ROWS
        status = gym.participant.snapshot()
        assert status["acknowledged"] == 0     # nothing was released with the driver

        policy = TryPolicy(**POLICY)
        with Orchestrator([GymEndpoint(url=gym.url, token=gym.token)], policy=policy,
                          pool_size=POOL, progress=False) as orch:
            outcomes = orch.run_batch(rows())
            assert [o.status for o in outcomes] == ["sealed"] * ROWS
            assert [o.reward for o in outcomes] == [i / 100 for i in range(ROWS)]
            assert all(o.attempt_index == 0 and o.receipt.execution_generation == 1
                       for o in outcomes)
            # the agent ran each row once, across both drivers: finished runs were replayed,
            # the ones still running were waited for, none was rerun
            assert sum(agent.starts.values()) == ROWS
            assert set(agent.starts) == {(f"dk-{i}", 0) for i in range(ROWS)}
            assert sum(o.adopted for o in outcomes) >= finished_at_kill
            report = orch.checkpoint("after-restart", str(tmp_path / "ck"), deadline_s=30)
            assert report.sealed_acked == ROWS and report.orphans_acked == 0
        status = gym.participant.snapshot()
        assert status["completed_unacknowledged"] == 0 and status["acknowledged"] == ROWS
