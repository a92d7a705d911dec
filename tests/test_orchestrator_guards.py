"""What the orchestrator refuses or answers without running anything: a sealed rollout id sent
again (its result back, no agent run, counted once; after a committed checkpoint a typed
``forgotten_rollout`` failure, never a second result), an attempt index the wire cannot hold,
settings that are not finite, and an endpoint that is down or refuses the token (at start)."""

from __future__ import annotations

import math

import pytest

from rl_gym_actors import GymEndpoint, Orchestrator, TryPolicy
from rl_gym_actors.config import LedgerConfig, PoolConfig
from rl_gym_actors.errors import ConfigError, EndpointCheckFailed
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.protocol import WIRE_INT_MAX

pytestmark = pytest.mark.slow  # Ray end to end: `make test` runs it

POLICY = TryPolicy(rollout_s=5.0, receipt_s=1.0, max_tries=2, control_s=5.0)


@pytest.mark.ray
def test_a_sealed_id_sent_again_is_answered_not_played_then_forgotten_at_a_checkpoint(
    ray_session, gym, agent, tmp_path, caplog
):
    with Orchestrator(
        [gym.endpoint],
        policy=POLICY,
        pool_size=1,
        rollouts_per_actor=4,
        run_id="guard",
        warn_unacked=3,
        progress=False,
    ) as orch:
        rows = [{"_ng_rollout_id": f"guard-{i}", "reward": i / 4} for i in range(4)]
        with caplog.at_level("WARNING", logger="rl_gym_actors.orchestrator"):
            first = orch.run_batch(rows)
        # more sealed results held on Gym than warn_unacked: a warning that says what to do
        (warning,) = [r.getMessage() for r in caplog.records if "un-ACKed" in r.getMessage()]
        assert "checkpoint()" in warning and "on_seal" in warning
        assert [o.status for o in first] == ["sealed"] * 4 and not any(o.repeated for o in first)
        again = orch.run_batch(rows)
        assert [(o.status, o.repeated, o.tries) for o in again] == [("sealed", True, 0)] * 4
        assert [(o.reward, o.receipt) for o in again] == [(o.reward, o.receipt) for o in first]
        assert all(agent.runs_of(f"guard-{i}") == 1 for i in range(4))  # no agent run
        # counted once: what a trainer sums over not-repeated sealed outcomes is unchanged
        total = sum(o.reward for o in (*first, *again) if o.status == "sealed" and not o.repeated)
        assert total == sum(i / 4 for i in range(4))

        report = orch.checkpoint("guard-ck", str(tmp_path / "ck"), deadline_s=30)
        assert report.sealed_acked == 4
        assert orch.snapshot().known_rollouts == 0  # forgotten with the commit
        late = orch.run_batch(rows[:2])
        assert [(o.status, o.failure) for o in late] == [("failed", FailureKind.FORGOTTEN)] * 2
        assert all(o.reward is None and o.failure.is_data for o in late)
        assert all(agent.runs_of(f"guard-{i}") == 1 for i in range(2))  # still never rerun


@pytest.mark.ray
def test_an_attempt_index_the_wire_cannot_hold_is_refused_before_dispatch(ray_session, gym, agent):
    with Orchestrator([gym.endpoint], policy=POLICY, pool_size=1, progress=False) as orch:
        for bad in (2**63, WIRE_INT_MAX + 1, -1, True, 1.0):
            with pytest.raises(ConfigError, match="_ng_attempt_index"):
                orch.run_batch([{"_ng_rollout_id": "guard-big", "_ng_attempt_index": bad}])
        assert agent.runs_of("guard-big") == 0
        (ok,) = orch.run_batch([{"_ng_rollout_id": "guard-max", "_ng_attempt_index": 5}])
        assert ok.status == "sealed" and ok.attempt_index == 5


def test_settings_that_are_not_finite_are_refused_at_construction():
    for field in ("rollout_s", "receipt_s", "control_s", "admission_wait_s"):
        for value in (math.inf, math.nan):
            with pytest.raises(ValueError):
                TryPolicy(**{field: value})
    for model, field in (
        (LedgerConfig, "flush_interval_s"),
        (LedgerConfig, "prepare_slice_s"),
        (PoolConfig, "num_cpus"),
    ):
        with pytest.raises(ValueError):
            model(**{field: math.inf})
    with pytest.raises(ConfigError):
        Orchestrator(["http://127.0.0.1:9"], ack="never", start=False)


@pytest.mark.ray
def test_start_checks_every_endpoint_and_its_token_before_any_row(ray_session, gym, agent):
    wrong = GymEndpoint(url=gym.url, token="not-the-token", name="wrong-token")
    with pytest.raises(EndpointCheckFailed) as info:
        Orchestrator([wrong], policy=POLICY, pool_size=1, progress=False)
    assert info.value.endpoint == gym.url and info.value.error == "Unauthorized"
    assert "wrong-token" in str(info.value)
    down = GymEndpoint(url="http://127.0.0.1:9", token="t")
    with pytest.raises(EndpointCheckFailed) as info:
        Orchestrator([down], policy=POLICY, pool_size=1, progress=False)
    assert info.value.endpoint == "http://127.0.0.1:9"


START_CHECK = """
import json, sys, time
from rl_gym_actors import GymEndpoint, Orchestrator
from rl_gym_actors.errors import ConfigError, EndpointCheckFailed
import ray

found = {}
for label, url, token in json.loads(sys.argv[1]):
    started = time.monotonic()
    try:
        Orchestrator([GymEndpoint(url=url, token=token)], pool_size=1, progress=False)
        found[label] = ["started", 0.0]
    except (ConfigError, EndpointCheckFailed) as exc:
        found[label] = [type(exc).__name__, time.monotonic() - started]
found["ray_started"] = ray.is_initialized()
print(json.dumps(found))
"""


def test_a_bad_url_or_token_fails_in_seconds_before_ray_starts(gym):
    """In a fresh process: no Ray of the test session to hide a start."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from rl_gym_actors.testing.polling import scaled

    cases = [
        ["no scheme", "127.0.0.1:9", "t"],
        ["nobody listens", "http://127.0.0.1:9", "t"],
        ["wrong token", gym.url, "not-the-token"],
    ]
    root = str(Path(__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-c", START_CHECK, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=env,
        timeout=scaled(120),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["ray_started"] is False
    assert found["no scheme"][0] == "ConfigError"
    assert found["nobody listens"][0] == found["wrong token"][0] == "EndpointCheckFailed"
    for label, _, _ in cases:
        assert found[label][1] < scaled(2.0), (label, found[label])
