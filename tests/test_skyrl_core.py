"""The SkyRL adapter's framework-free half, without SkyRL installed: rollout ids, a reply as a
trajectory, the masked placeholder of a failed trajectory, the pool size and the part a restart
restores. (The adapter against the real SkyRL: adapter_tests/skyrl/, ``make test-skyrl``.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from rl_gym_actors.errors import ConfigError
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.integrations.skyrl.ids import trajectory_rollout_id
from rl_gym_actors.integrations.skyrl.replies import (
    UntrainableReply,
    output_from,
    trajectory_from_reply,
)
from rl_gym_actors.integrations.skyrl.resume import restore_dir, resume_step
from rl_gym_actors.integrations.skyrl.settings import (
    RlGymActorsSettings,
    endpoints_of,
    in_flight,
    pool_size_for,
)
from rl_gym_actors.outcome import Outcome


def test_trajectory_ids_are_stable_per_run_phase_epoch_instance_repetition():
    rid = trajectory_rollout_id(
        "grpo-1", "train", epoch=2, global_step=17, instance_id="5", repetition_id=3
    )
    assert rid == "grpo-1-train-e2-i5-r3"
    # the fully async trainer's global_step differs after a resume: not in a training id
    again = trajectory_rollout_id(
        "grpo-1", "train", epoch=2, global_step=4, instance_id="5", repetition_id=3
    )
    assert again == rid
    assert rid != trajectory_rollout_id(
        "grpo-1", "train", epoch=3, global_step=17, instance_id="5", repetition_id=3
    )
    # evaluation has no epoch: the step it evaluates at
    assert (
        trajectory_rollout_id(
            "grpo-1", "eval", epoch=2, global_step=17, instance_id="5", repetition_id=0
        )
        == "grpo-1-eval-s17-i5-r0"
    )


def test_an_instance_id_a_rollout_id_cannot_hold_is_digested():
    rid = trajectory_rollout_id(
        "r", "train", epoch=0, global_step=0, instance_id="a b/c", repetition_id=0
    )
    assert rid.startswith("r-train-e0-ih") and " " not in rid and "/" not in rid
    with pytest.raises(ConfigError):
        trajectory_rollout_id("r", "test", epoch=0, global_step=0, instance_id="1", repetition_id=0)
    with pytest.raises(ConfigError):
        trajectory_rollout_id(
            "r", "train", epoch=-1, global_step=0, instance_id="1", repetition_id=0
        )


def test_the_light_modules_import_no_skyrl_and_no_ray():
    code = (
        "import sys\n"
        "import rl_gym_actors.integrations.skyrl as s\n"
        "from rl_gym_actors.integrations.skyrl import ids, replies, resume, settings\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('skyrl', 'ray', 'torch')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def _turn(prompt, gen, logprobs=None):
    return {
        "type": "message",
        "prompt_token_ids": prompt,
        "generation_token_ids": gen,
        "generation_log_probs": logprobs if logprobs is not None else [-0.5] * len(gen),
    }


def test_a_two_turn_reply_is_one_trajectory_with_the_tool_output_masked():
    reply = {
        "reward": 0.75,
        "response": {
            "output": [_turn([1, 2], [3, 4]), {"type": "tool"}, _turn([1, 2, 3, 4, 9], [5])]
        },
    }
    t = trajectory_from_reply(reply, [7, 7, 7])
    assert t.prompt_ids == [1, 2]  # what the policy saw, not the generator's tokenization
    assert t.response_ids == [3, 4, 9, 5]
    assert t.loss_mask == [1, 1, 0, 1]
    assert t.logprobs == [-0.5, -0.5, 0.0, -0.5]
    assert t.reward == 0.75 and t.stop_reason == "stop" and not t.masked


def test_a_first_turn_without_prompt_takes_the_generators_tokenization():
    turn = {"generation_token_ids": [3], "generation_log_probs": [-1.0]}
    t = trajectory_from_reply({"reward": 1, "response": {"output": [turn]}}, [7, 8])
    assert t.prompt_ids == [7, 8] and t.response_ids == [3]


@pytest.mark.parametrize(
    "reply",
    [
        {"id": "r-1", "reward": 1.0},  # no model turn
        {"response": {"output": [_turn([1], [2])]}},  # no reward: none is made up
        {"reward": float("nan"), "response": {"output": [_turn([1], [2])]}},
        {"reward": 1.0, "response": {"output": [_turn([1], [2], [-1.0, -2.0])]}},
        {"reward": 1.0, "response": {"output": [_turn([1], [2]), _turn([9, 9], [3])]}},
        "text",
    ],
)
def test_an_untrainable_reply_is_a_typed_failure(reply):
    with pytest.raises(UntrainableReply):
        trajectory_from_reply(reply, [1])


def _sealed(rid, reward, **kw):
    reply = {"reward": reward, "response": {"output": [_turn([1], [10 + int(reward * 10)])]}}
    return Outcome(rollout_id=rid, status="sealed", reply=reply, result_digest="d", **kw)


def test_outputs_keep_input_order_and_a_failed_trajectory_is_masked_not_fatal():
    outcomes = [
        _sealed("a", 1.0),
        Outcome(rollout_id="b", status="failed", reason="boom", failure=FailureKind.AGENT_FAILED),
        _sealed("c", 0.5, adopted=True),
        _sealed("d", 0.0, repeated=True),
        Outcome(rollout_id="e", status="failed", reason="gone", failure=FailureKind.FORGOTTEN),
    ]
    out = output_from(
        outcomes, [[1]] * 5, ["0", "0", "1", "1", "2"], pad_id=0, trajectory_ids=list("abcde")
    )
    assert out["trajectory_ids"] == list("abcde")
    assert out["response_ids"][0] == [20] and out["response_ids"][2] == [15]
    assert out["loss_masks"][1] == [0] and out["stop_reasons"][1] == "rlga_agent_failed"
    # the placeholder takes its group's mean reward: advantage 0, the baseline unchanged
    assert out["rewards"][1] == 1.0
    # a group with no result at all: reward 0.0, still masked
    assert out["rewards"][4] == 0.0 and out["loss_masks"][4] == [0]
    assert out["stop_reasons"][4] == "rlga_forgotten_rollout"
    m = out["rollout_metrics"]
    assert (m["rlga/sealed"], m["rlga/adopted"], m["rlga/repeated"]) == (1.0, 1.0, 1.0)
    assert (m["rlga/failed"], m["rlga/forgotten"]) == (1.0, 1.0)
    assert m["rlga/failed/agent_failed"] == 1.0 and m["rlga/masked_fraction"] == 0.4
    assert all(
        len(r) == len(k) == len(lp)
        for r, k, lp in zip(
            out["response_ids"], out["loss_masks"], out["rollout_logprobs"], strict=True
        )
    )


def test_a_sealed_reply_that_cannot_be_trained_on_is_masked_with_its_reason():
    bad = Outcome(rollout_id="a", status="sealed", reply={"reward": 1.0}, result_digest="d")
    out = output_from([bad], [[1]], ["0"], pad_id=5)
    assert out["response_ids"] == [[5]] and out["loss_masks"] == [[0]]
    assert out["stop_reasons"] == ["rlga_untrainable_reply"]
    assert out["rollout_metrics"]["rlga/failed/untrainable_reply"] == 1.0


def test_the_pool_is_sized_for_the_trajectories_in_flight_unless_set():
    sync = in_flight(train_batch_size=32, n_samples_per_prompt=2)
    assert sync == 64
    assert pool_size_for(RlGymActorsSettings(), sync) == 2  # 2 actors x 32 slots
    assert pool_size_for(RlGymActorsSettings(rollouts_per_actor=8), 65) == 9
    assert pool_size_for(RlGymActorsSettings(pool_size=3), 640) == 3
    fully_async = in_flight(
        train_batch_size=4,
        n_samples_per_prompt=4,
        fully_async=True,
        num_parallel_generation_workers=8,
    )
    assert fully_async == 32
    with pytest.raises(ConfigError):
        pool_size_for(RlGymActorsSettings(pool_size=0), 1)


def test_endpoints_are_required_and_take_the_token():
    with pytest.raises(ConfigError, match="endpoints"):
        endpoints_of(RlGymActorsSettings())
    (ep,) = endpoints_of(RlGymActorsSettings(endpoints=["http://127.0.0.1:9"], token="t"))
    assert ep.url == "http://127.0.0.1:9" and ep.token == "t"


def _ckpt(root, step, part=True):
    d = root / f"global_step_{step}"
    (d / "policy").mkdir(parents=True)
    if part:
        (d / "rl_gym_actors").mkdir()
        (d / "rl_gym_actors" / "part.json").write_text("{}")
    return d


def test_the_restore_dir_is_the_newest_part_at_or_below_the_resumed_step(tmp_path):
    _ckpt(tmp_path, 2)
    four = _ckpt(tmp_path, 4)
    _ckpt(tmp_path, 6, part=False)  # killed between SkyRL's save and the layer's commit
    _ckpt(tmp_path, 8)  # newer than the step SkyRL resumes from (from_path)
    (tmp_path / "latest_ckpt_global_step.txt").write_text("6")
    assert resume_step(tmp_path, "latest") == 6
    assert restore_dir(tmp_path, resume_step(tmp_path, "latest")) == four
    assert resume_step(tmp_path, "from_path", str(tmp_path / "global_step_4")) == 4
    assert restore_dir(tmp_path, 4) == four
    assert resume_step(tmp_path, "none") is None and restore_dir(tmp_path, None) is None
    assert restore_dir(tmp_path, 1) is None
    assert resume_step(tmp_path / "nothing", "latest") is None
