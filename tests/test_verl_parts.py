"""The verl adapter's pure parts (no verl, no Ray): rollout ids, reply -> AgentLoopOutput fields,
pool sizing from verl's config, and which checkpoint the layer restores from."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rl_gym_actors.errors import ConfigError
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.integrations.verl.ids import prompt_uid, rollout_id
from rl_gym_actors.integrations.verl.outputs import GymRolloutFailed, UnusableReply, output_fields
from rl_gym_actors.integrations.verl.settings import (
    in_flight,
    pool_size_for,
    restore_dir,
    resume_step_dir,
    settings_from,
)


def test_the_pure_parts_import_neither_verl_nor_ray():
    # the main suite's venv has no verl; nothing above imported Ray either
    pure = ", ".join(f"rl_gym_actors.integrations.verl.{m}" for m in ("settings", "ids", "outputs"))
    code = f"import sys, {pure}; print(sorted({{'ray', 'verl', 'torch'}} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_ids_come_from_the_data_position_and_session():
    uid = prompt_uid(1, 2, 3)
    assert uid == "e1-b2-p3" and "_" not in uid  # verl splits TransferQueue keys on "_"
    assert rollout_id("run", uid, 1) == "run-e1-b2-p3-s1"
    assert rollout_id("run", uid, 0) != rollout_id("run", prompt_uid(1, 2, 4), 0)
    for bad in (-1, True, "0"):
        with pytest.raises(ConfigError):
            prompt_uid(bad, 0, 0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        rollout_id("bad id", uid, 0)
    with pytest.raises(ConfigError):
        rollout_id("run", "has space", 0)


def _turn(prompt, gen, logprobs=None):
    item = {"type": "message", "prompt_token_ids": prompt, "generation_token_ids": gen}
    if logprobs is not None:
        item["generation_log_probs"] = logprobs
    return item


def test_two_turns_map_to_one_masked_response():
    reply = {
        "reward": 0.75,
        "response": {
            "output": [
                _turn([1, 2], [3, 4], [-0.1, -0.2]),
                {"type": "function_call_output", "output": "tool"},
                _turn([1, 2, 3, 4, 9], [5], [-0.3]),
            ]
        },
    }
    fields = output_fields(reply, "r1")
    assert fields["prompt_ids"] == [1, 2]
    assert fields["response_ids"] == [3, 4, 9, 5]
    assert fields["response_mask"] == [1, 1, 0, 1]
    assert fields["response_logprobs"] == [-0.1, -0.2, 0.0, -0.3]
    assert fields["reward_score"] == 0.75 and fields["num_turns"] == 4
    assert "reward_extra_info" in fields["extra_fields"]
    cut = output_fields(reply, "r1", response_length=3)
    assert cut["response_ids"] == [3, 4, 9] and cut["response_mask"] == [1, 1, 0]


def test_logprobs_are_none_unless_every_turn_has_them():
    reply = {"reward": 1, "response": {"output": [_turn([1], [2], [-1.0]), _turn([1, 2], [3])]}}
    assert output_fields(reply, "r")["response_logprobs"] is None


@pytest.mark.parametrize(
    "reply",
    [
        {"reward": 1.0},  # no turn: nothing to train on, nothing is made up
        {"response": {"output": [_turn([1], [2])]}},  # no reward: no default reward either
        {"reward": "1", "response": {"output": [_turn([1], [2])]}},
        {"reward": float("nan"), "response": {"output": [_turn([1], [2])]}},
        {"reward": 1.0, "response": {"output": [_turn([1], [2]), _turn([7], [3])]}},  # no prefix
        {"reward": 1.0, "response": {"output": [_turn([1], [2], [float("nan")])]}},
        {"reward": 1.0, "response": {"output": [_turn([1], [2], [-1.0, -2.0])]}},
        {"reward": 1.0, "response": {"output": [_turn(["a"], [2])]}},
    ],
)
def test_an_unusable_reply_is_a_typed_failure(reply):
    with pytest.raises(UnusableReply) as err:
        output_fields(reply, "r9")
    assert isinstance(err.value, GymRolloutFailed)
    assert err.value.kind is FailureKind.INVALID_REPLY and err.value.rollout_id == "r9"


def test_a_failure_survives_pickling_with_its_kind():
    import pickle

    failure = GymRolloutFailed("r1", "deadline", FailureKind.DEADLINE)
    back = pickle.loads(pickle.dumps(failure))
    assert (type(back), back.rollout_id, back.kind) == (
        GymRolloutFailed,
        "r1",
        FailureKind.DEADLINE,
    )


def _config(**over):
    config = {
        "data": {"train_batch_size": 16},
        "actor_rollout_ref": {"rollout": {"n": 4}},
        "trainer": {"experiment_name": "exp", "v1": {"trainer_mode": "rlga_sync"}},
        "rl_gym_actors": {"endpoints": ["http://127.0.0.1:1"]},
    }
    for path, value in over.items():
        node = config
        keys = path.split("__")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return config


def test_the_pool_holds_everything_verl_has_in_flight():
    assert in_flight(_config()) == 64  # 16 prompts x n 4
    assert in_flight(_config(data__gen_batch_size=32)) == 128
    async_config = _config(trainer__v1={"trainer_mode": "rlga_colocate_async"})
    assert in_flight(async_config) == 128  # one warm-up batch ahead by default
    async_config["trainer"]["v1"]["colocate_async"] = {"num_warmup_batches": 0.5}
    assert in_flight(async_config) == 96
    # actors of 32 slots each (not one actor, one Ray worker process, per session)
    assert pool_size_for(_config()) == 2
    assert pool_size_for(async_config) == 3
    assert pool_size_for(_config(), rollouts_per_actor=1) == 64
    settings = settings_from(_config())
    assert (settings.pool_size, settings.rollouts_per_actor) == (2, 32)
    settings = settings_from(_config(rl_gym_actors__rollouts_per_actor=8))
    assert (settings.pool_size, settings.rollouts_per_actor) == (8, 8)
    assert settings_from(_config(rl_gym_actors__pool_size=7)).pool_size == 7
    with pytest.raises(ConfigError):
        pool_size_for(_config(), rollouts_per_actor=0)


def test_settings_are_read_from_verls_config_and_bad_ones_named():
    settings = settings_from(_config())
    assert settings.run_id == "exp" and not settings.is_async
    assert settings.endpoints[0].url == "http://127.0.0.1:1"
    assert settings_from(_config(trainer__v1={"trainer_mode": "rlga_separate_async"})).is_async
    with pytest.raises(ConfigError):
        settings_from({"trainer": {}})
    with pytest.raises(ConfigError):
        settings_from(_config(rl_gym_actors={"endpoints": []}))
    with pytest.raises(ConfigError):
        settings_from(_config(rl_gym_actors={"endpoints": ["u"], "pool": 3}))


def _step(root, n, part=True):
    d = root / f"global_step_{n}"
    d.mkdir(parents=True)
    if part:
        (d / "rl_gym_actors").mkdir()
        (d / "rl_gym_actors" / "part.json").write_text("{}")
    return d


def test_the_layer_restores_from_the_newest_part_at_or_below_verls_step(tmp_path):
    root = tmp_path / "ckpt"
    config = _config(trainer__default_local_dir=str(root), trainer__resume_mode="auto")
    assert restore_dir(config) is None  # nothing saved: a fresh start
    _step(root, 1)
    _step(root, 2)
    _step(root, 3, part=False)  # verl's save of 3 finished, the layer's part did not
    _step(root, 4)  # newer than verl's marker: not durable for verl
    (root / "latest_checkpointed_iteration.txt").write_text("3")
    assert resume_step_dir(config) == root / "global_step_3"
    assert restore_dir(config) == root / "global_step_2"
    assert restore_dir(_config(trainer__resume_mode="disable")) is None
    path = _config(
        trainer__resume_mode="resume_path", trainer__resume_from_path=str(root / "global_step_1")
    )
    assert restore_dir(path) == root / "global_step_1"
