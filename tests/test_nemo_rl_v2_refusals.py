"""The drop-in while NeMo RL's newest coordinator holds a v2 checkpoint open (its own calls:
``checkpoint_prepare`` / ``checkpoint_resume`` on the drop-in): rows Gym refused with 409
``admission_closed`` past ``admission_wait_s`` are yielded as ``GymAdmissionClosed(message,
row_idx)`` in their place, not raised, as NeMo RL's ``run_rollouts`` yields them; a row Gym
admitted before the checkpoint stays parked and keeps its stream open, and seals after resume
with one agent run; the refused rows sent again run. Real Ray, ``gym serve --protocol v2`` on
loopback."""

from __future__ import annotations

import time
from typing import Any

import pytest

from rl_gym_actors.integrations.nemo_rl import NemoGymDropIn
from rl_gym_actors.integrations.nemo_rl.v2_shapes import GymAdmissionClosed
from rl_gym_actors.testing.nemo_rl_stand_in import CodePointTokenizer, build_nemo_gym_config
from rl_gym_actors.testing.polling import until
from rl_gym_actors.testing.v2_server import V2ServerThread

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def row(i: int, **fields: Any) -> dict[str, Any]:
    return {
        "_rowidx": i,
        "responses_create_params": {"input": [{"role": "user", "content": f"q{i}"}]},
        **fields,
    }


def soon(s: float = 10.0) -> float:
    return time.time() + s


async def test_refused_rows_are_yielded_while_an_admitted_row_stays_parked(ray_session):
    with V2ServerThread() as gym:
        cfg = {
            "endpoints": [{"url": gym.url, "token": gym.token}],
            "policy": {
                "rollout_s": 30.0,
                "max_tries": 2,
                "control_s": 2.0,
                "admission_wait_s": 1.0,
            },
            "pool": {"size": 1, "rollouts_per_actor": 4},
            "run_id": "v2ref",
            "untrained_replies": "tokenize",
            "stream_tuple": 4,
            "admission_refusals": "yield",
        }
        actor = NemoGymDropIn.remote(
            build_nemo_gym_config(
                {"nemo_gym": {"rl_gym_actors": cfg}}, ["http://127.0.0.1:9/v1"], "m"
            )
        )
        try:
            ray_session.get(actor._spinup.remote())
            ray_session.get(actor.set_tokenizer.remote(CodePointTokenizer()))
            ray_session.get(actor.initialize_checkpoint_adapter.remote())
            admitted = actor.run_rollouts.options(num_returns="streaming").remote(
                [row(0, steps=3, step_s=0.4, reward=0.7)], "gym"
            )
            await until(lambda: gym.participant.steps_run >= 1, timeout_s=30.0, what="a step")
            prepared = ray_session.get(
                actor.checkpoint_prepare.remote("trainer-1", deadline_ts=soon())
            )
            assert prepared.prepared  # row 0's episode parked at a boundary
            steps_parked = gym.participant.steps_run
            refused = actor.run_rollouts.options(num_returns="streaming").remote(
                [row(1, reward=0.1), row(2, reward=0.2)], "gym"
            )
            items = [ray_session.get(ref) for ref in refused]  # ends: nothing raised
            assert sorted(i.row_idx for i in items) == [1, 2]
            assert all(isinstance(i, GymAdmissionClosed) for i in items)
            assert all("admission closed" in str(i) for i in items)
            assert gym.participant.steps_run == steps_parked  # none ran; row 0 still parked
            stats = ray_session.get(actor.status.remote())["stats"]
            assert stats["refused"] == 2 and stats["failed_rows"] == 0
            ray_session.get(actor.checkpoint_resume.remote("trainer-1", deadline_ts=soon()))
            [(idx, _agent, result, timing)] = [ray_session.get(ref) for ref in admitted]
            assert idx == 0 and timing is not None and result["gym_adopted"] is False
            assert gym.participant.steps_run == 3  # every step once: one agent run
            again = actor.run_rollouts.options(num_returns="streaming").remote(
                [row(1, reward=0.1), row(2, reward=0.2)], "gym"
            )
            done = [ray_session.get(ref) for ref in again]
            assert sorted(item[0] for item in done) == [1, 2]
            assert gym.participant.steps_run == 5
        finally:
            ray_session.get(actor.shutdown.remote())
            ray_session.kill(actor)
