"""A trainer that writes its own state AFTER ``checkpoint()`` returns (issue 27, item 5).

A synchronous trainer process (``rl_gym_actors.testing.campaign_trainer --order after``) trains
step 2's rows, calls ``checkpoint(step-2)`` and is killed with kill -9 once Gym performed the
ACK batch (agent-checkpoint) / forget (v2) of that checkpoint, before it could write its state
for step 2. The restarted trainer loads its own older state (step 1's, the newest it wrote) and
restores from that state's checkpoint dir, so it sends step 2's rows again, whose results Gym
has let go of. They come back sealed with their replies from the layer (the newer part beside the
restored one holds them), with no agent run on Gym, the checkpoint of step 2 asked again
commits at its first try (Gym spent that id: the layer gates it under a fresh one), and nothing
is lost, rerun or trained twice. The trainers join the session's Ray."""

from __future__ import annotations

import json

import pytest

from rl_gym_actors.testing.campaign import AgentLog, Instant, run_instant, server_for
from rl_gym_actors.testing.campaign_trainer import rows_of
from rl_gym_actors.testing.phase_hold import PhaseHold

CASES = [
    Instant("agent", "ack", 2, keep=False, order="after"),
    Instant("v2", "forget", 2, keep=False, order="after"),
]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("inst", CASES, ids=[c.protocol for c in CASES])
def test_killed_after_the_release_before_its_state_loses_nothing(ray_session, tmp_path, inst):
    address = ray_session.get_runtime_context().gcs_address
    log, hold = AgentLog(), PhaseHold()
    run_id = f"after-{inst.protocol}"
    try:
        with server_for(inst.protocol, log, hold) as server:
            res = run_instant(server, log, hold, inst, run_id, tmp_path, ray_address=address)
    finally:
        hold.release()
    assert not res.errors, res.errors
    assert res.landed == inst.phase  # Gym performed the release; the trainer never heard
    assert (res.lost_ids, res.rerun_ids, res.twice_ids) == ([], [], [])
    assert res.first_commit_first_try  # step-2 asked again: committed, no StaleCheckpoint

    events = [
        json.loads(line) for line in (tmp_path / run_id / "b.events").read_text().splitlines()
    ]
    started = next(e for e in events if e["event"] == "started")
    assert started["next_step"] == 2  # restored from its own older state
    assert started["restore_dir"].endswith("step-1/gym")  # root/step-N/gym: the README's layout
    again = next(e for e in events if e["event"] == "received" and e["step"] == 2)
    assert [(o["status"], o["reply"], o["repeated"]) for o in again["outcomes"]] == [
        ("sealed", True, False)
    ] * 6
    # Gym's agent ran each of step 2's rows once: for the dead trainer, never for the new one
    step2 = {r["_ng_rollout_id"] for r in rows_of(run_id, 2, 6, inst.protocol)}
    starts = log.of_run(run_id)["starts"]
    assert {rid: starts.get(rid, 0) for rid in step2} == dict.fromkeys(step2, 1)
    checkpoints = [e for e in events if e["event"] == "checkpoint"]
    assert [(c["checkpoint_id"], c["committed"]) for c in checkpoints[:1]] == [
        (f"{run_id}-step-2", True)
    ]
