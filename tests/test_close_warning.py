"""close() with results held un-ACKed (ack="at_checkpoint", the default) says so: how many, on
which server, and the ways out; after a checkpoint, or with ack="on_seal", it says nothing."""

from __future__ import annotations

import pytest

from rl_gym_actors import Orchestrator, TryPolicy
from rl_gym_actors.held_results import held_at_close
from rl_gym_actors.testing.gym_process import GymServerThread

pytestmark = pytest.mark.slow  # Ray end to end: `make test` runs it

POLICY = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=2, control_s=5.0)
LOGGER = "rl_gym_actors.orchestrator"


def held_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "held un-ACKed" in r.getMessage()]


def run_and_close(gym, caplog, *, ack: str, checkpoint_dir=None, run_id: str) -> list[str]:
    caplog.clear()
    with (
        caplog.at_level("WARNING", logger=LOGGER),
        Orchestrator(
            [gym.endpoint], policy=POLICY, pool_size=1, ack=ack, run_id=run_id, progress=False
        ) as orch,
    ):
        outs = orch.run_batch([{"reward": 0.5} for _ in range(3)])
        assert [o.status for o in outs] == ["sealed"] * 3
        if checkpoint_dir is not None:
            orch.checkpoint(f"{run_id}-ck", str(checkpoint_dir), deadline_s=30)
    return held_warnings(caplog)


@pytest.mark.ray
def test_closing_with_held_results_warns_how_many_where_and_the_way_out(ray_session, caplog):
    with GymServerThread(token="t") as gym:  # its own: the held results block its checkpoints
        (warning,) = run_and_close(gym, caplog, ack="at_checkpoint", run_id="held-close")
    assert "3 sealed results" in warning and f"3 on {gym.url}" in warning
    assert "'held-close'" in warning
    assert "checkpoint() before close()" in warning and "ack='on_seal'" in warning
    assert "sweep_foreign=True" in warning


@pytest.mark.ray
def test_no_warning_after_a_checkpoint_or_with_on_seal(ray_session, caplog, tmp_path):
    with GymServerThread(token="t") as gym:
        assert run_and_close(gym, caplog, ack="on_seal", run_id="held-seal") == []
        ck = tmp_path / "ck"
        assert (
            run_and_close(gym, caplog, ack="at_checkpoint", checkpoint_dir=ck, run_id="held-ck")
            == []
        )


def test_the_warning_counts_per_server_and_falls_back_to_the_run_count():
    text = held_at_close("r", {"http://b": 2, "http://a": 1, "http://c": 0}, 3)
    assert text is not None and "3 sealed results" in text
    assert "(1 on http://a, 2 on http://b)" in text and "http://c" not in text
    fallback = held_at_close("r", {}, 5)  # no server named
    assert fallback is not None and "5 sealed results" in fallback
    assert held_at_close("r", {"http://a": 0}, 0) is None
