"""Rows and checkpoint ids the orchestrator refuses before anything is dispatched or ACKed
(issue 16): an id with a trailing newline, rows nested deeper than MAX_JSON_DEPTH (980 and 995
levels were a server 500 and a RecursionError out of run_batch), a checkpoint id ``"c\\n"``
(it ACKed every held result before it was refused)."""

from __future__ import annotations

import pytest

from rl_gym_actors import Orchestrator, TryPolicy
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.protocol import MAX_JSON_DEPTH
from rl_gym_actors.testing.inspect_gym import key_state_sync

pytestmark = [pytest.mark.slow, pytest.mark.ray]

POLICY = TryPolicy(rollout_s=5.0, receipt_s=1.0, max_tries=2, control_s=5.0)


def _deep(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def test_bad_ids_and_deep_rows_are_refused_before_dispatch(ray_session, gym, agent, tmp_path):
    with Orchestrator([gym.endpoint], policy=POLICY, pool_size=1, progress=False) as orch:
        for bad in ("in-x\n", "in-x\r\n"):
            with pytest.raises(ConfigError, match="_ng_rollout_id"):
                orch.run_batch([{"_ng_rollout_id": bad}])
        for depth in (MAX_JSON_DEPTH, 980, 995, 3000):  # the row itself is one more level
            with pytest.raises(ConfigError, match=r"deeper|not JSON"):
                orch.run_batch([{"_ng_rollout_id": f"in-deep-{depth}", "x": _deep(depth)}])
            assert agent.runs_of(f"in-deep-{depth}") == 0
        (ok,) = orch.run_batch([{"_ng_rollout_id": "in-ok", "x": _deep(MAX_JSON_DEPTH - 1)}])
        assert ok.status == "sealed" and agent.runs_of("in-ok") == 1
        assert agent.runs_of("in-x\n") == agent.runs_of("in-x") == 0


def test_a_bad_checkpoint_id_acks_nothing(ray_session, gym, agent, tmp_path):
    with Orchestrator([gym.endpoint], policy=POLICY, pool_size=1, progress=False) as orch:
        outcomes = orch.run_batch([{"_ng_rollout_id": f"in-ck-{i}"} for i in range(3)])
        assert [o.status for o in outcomes] == ["sealed"] * 3
        ids = [o.rollout_id for o in outcomes]
        # ack="at_checkpoint": held on Gym until a checkpoint
        assert {key_state_sync(gym.endpoint, r, 0) for r in ids} == {"completed"}
        for bad in ("c\n", "c\r\n", "", "c 1"):
            with pytest.raises(ConfigError):
                orch.checkpoint(bad, str(tmp_path / "ck"), deadline_s=10)
        # nothing released
        assert {key_state_sync(gym.endpoint, r, 0) for r in ids} == {"completed"}
        # the other test's orchestrator left its sealed row on this module's server
        report = orch.checkpoint("in-ck", str(tmp_path / "ck"), deadline_s=30, sweep_foreign=True)
        assert report.sealed_acked >= 3
        assert {key_state_sync(gym.endpoint, r, 0) for r in ids} == {"acknowledged"}
