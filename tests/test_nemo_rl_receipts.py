"""The drop-in's ``gym_completion_receipt`` against a real Gym that gives no receipt per key (the
real-Gym stand-in: no receipt beside ``/run``, no per-key route), ``ack="at_checkpoint"``.

NeMo RL's checkpoint work (PR #4093, the 4-tuple consumer) needs the receipt on every result: its
actor asserts one on each result and its ``acknowledge_completed_executions`` validates
``{receipt, agent_name}`` strictly. So with 4-tuples receipts are never deferred: each result
carries one that validates as the PR's receipt and is accepted back. NeMo RL main (3-tuples) reads
none: the receipt stays deferred to the checkpoint (no status listing per rollout) and the key is
left out. Either way ``gym_adopted`` says whether the result came from Gym's store."""

from __future__ import annotations

import nemo_rl_checkpoint_models as models
import pytest

from rl_gym_actors.integrations.nemo_rl import NemoGymDropIn
from rl_gym_actors.protocol import CONTROL_PREFIX
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.nemo_rl_stand_in import CodePointTokenizer
from rl_gym_actors.testing.real_gym import RealGymStandIn

pytestmark = [pytest.mark.ray, pytest.mark.slow]

STATUS = CONTROL_PREFIX + "/status"
POLICY = {"rollout_s": 5.0, "receipt_s": 2.0, "max_tries": 1, "control_s": 5.0}


def rows(prefix: str) -> list[dict]:
    out = [
        {
            "_rowidx": i,
            "_ng_rollout_id": f"{prefix}-{i}",
            "responses_create_params": {"input": [{"role": "user", "content": f"q{i}"}]},
            "reward": i / 10,
        }
        for i in range(4)
    ]
    out[2]["drop_reply"] = True  # its reply is lost: adopted from Gym's store, not rerun
    return out


def run(ray, real, stream_tuple: int, prefix: str) -> tuple[list, int, object]:
    actor = NemoGymDropIn.remote(
        {
            "rl_gym_actors": {
                "endpoints": [{"url": real.url, "token": real.token, "name": "math_agent"}],
                "policy": POLICY,
                "pool": {"size": 1, "rollouts_per_actor": 4},
                "run_id": prefix,
                "untrained_replies": "tokenize",
                "stream_tuple": stream_tuple,
            }
        }
    )
    ray.get(actor._spinup.remote())
    ray.get(actor.set_tokenizer.remote(CodePointTokenizer()))
    before = real.calls[STATUS]
    gen = actor.run_rollouts.options(num_returns="streaming").remote(rows(prefix), "gym")
    items = [ray.get(ref) for ref in gen]
    return items, real.calls[STATUS] - before, actor


def test_four_tuples_carry_a_strict_receipt_on_every_result_three_tuples_defer_it(ray_session):
    with (
        GymServerThread(token="test-token", allow_faults=True) as server,
        RealGymStandIn(server.endpoint) as real,
    ):
        items, listings, actor = run(ray_session, real, 4, "rc4")
        try:
            results = {i: res for i, _ref, res, _t in items}
            assert sorted(results) == [0, 1, 2, 3]
            receipts = [
                models.Receipt.model_validate(r["gym_completion_receipt"]) for r in results.values()
            ]
            assert {r.rollout_id for r in receipts} == {f"rc4-{i}" for i in range(4)}
            assert {i: r["gym_adopted"] for i, r in results.items()} == {
                0: False,
                1: False,
                2: True,
                3: False,
            }
            assert listings >= 4  # read at seal: one listing per rollout on this server
            done = [
                {"receipt": r["gym_completion_receipt"], "agent_name": "math_agent"}
                for r in results.values()
            ]
            answer = ray_session.get(actor.acknowledge_completed_executions.remote(done))
            models.Acknowledged.model_validate(answer)
        finally:
            ray_session.get(actor.shutdown.remote())
            ray_session.kill(actor)

        items, listings, actor = run(ray_session, real, 3, "rc3")
        try:
            results = {i: res for i, res, _t in items}
            assert sorted(results) == [0, 1, 2, 3]
            assert all("gym_completion_receipt" not in r for r in results.values())
            assert [results[i]["gym_adopted"] for i in range(4)] == [False, False, True, False]
            assert listings <= 1  # none per rollout (at most the protocol probe)
            assert server.participant.snapshot()["completed_unacknowledged"] >= 4
        finally:
            ray_session.get(actor.shutdown.remote())
            ray_session.kill(actor)
