"""Selecting the drop-in the way a NeMo RL user does: one line in the training script and an
``rl_gym_actors`` section in ``env.nemo_gym``; NeMo RL's spin-up code (a stand-in of its module,
NeMo RL cannot be installed here) creates the actor from the config it builds itself."""

from __future__ import annotations

import sys

import pytest
from test_nemo_rl_dropin import stand_in_tokenizer

from rl_gym_actors.errors import ConfigError
from rl_gym_actors.integrations.nemo_rl.config import DropInConfig
from rl_gym_actors.integrations.nemo_rl.selection import (
    NemoGymChooser,
    drop_in_options,
    use_in_nemo_rl,
    wants_drop_in,
)
from rl_gym_actors.testing import nemo_rl_stand_in
from rl_gym_actors.testing.gym_process import GymServerThread


def test_the_config_nemo_rl_builds_is_read_with_our_section_inside():
    ours = {"endpoints": ["http://127.0.0.1:1"], "stream_tuple": 3}
    cfg = nemo_rl_stand_in.build_nemo_gym_config(
        {
            "nemo_gym": {
                "rl_gym_actors": ours,
                "thinking_tags": ["<t>", "</t>"],
                "config_paths": ["x.yaml"],
            }
        },
        ["http://10.0.0.1:8000/v1"],
        "m",
        enable_router_replay=True,
        routed_experts_dtype="int8",
    )
    assert wants_drop_in(cfg) and "rl_gym_actors" in cfg["initial_global_config_dict"]
    parsed = DropInConfig.from_any(cfg)
    assert parsed.stream_tuple == 3 and parsed.endpoints[0].url == "http://127.0.0.1:1"
    assert parsed.nemo.base_urls == ["http://10.0.0.1:8000/v1"]
    assert parsed.nemo.model_name == "m" and parsed.nemo.thinking_tags == ["<t>", "</t>"]
    assert parsed.nemo.require_routed_experts and parsed.nemo.routed_experts_dtype == "int8"
    assert not wants_drop_in(
        nemo_rl_stand_in.build_nemo_gym_config({"nemo_gym": {"config_paths": []}}, [], "m")
    )
    with pytest.raises(ConfigError, match="endpoints missing"):
        DropInConfig.from_any(
            nemo_rl_stand_in.build_nemo_gym_config({"nemo_gym": {"rl_gym_actors": {}}}, [], "m")
        )


def test_nemo_gyms_interpreter_and_venv_are_left_out_and_the_rest_kept():
    opts = {
        "runtime_env": {
            "py_executable": "/venvs/gym/bin/python",
            "env_vars": {
                "VIRTUAL_ENV": "/venvs/gym",
                "UV_PROJECT_ENVIRONMENT": "/venvs/gym",
                "HF_HOME": "/cache",
            },
        },
        "scheduling_strategy": "SPREAD",
    }
    assert drop_in_options(opts) == {
        "runtime_env": {"env_vars": {"HF_HOME": "/cache"}},
        "scheduling_strategy": "SPREAD",
    }
    assert drop_in_options({"runtime_env": {"py_executable": "x"}}) == {}


@pytest.fixture
def nemo_gym_module(monkeypatch):
    """NeMo RL's module as a training script sees it; restored afterwards."""
    monkeypatch.setattr(nemo_rl_stand_in, "NemoGym", nemo_rl_stand_in.NemoGym)
    return nemo_rl_stand_in


@pytest.mark.slow
@pytest.mark.ray
def test_one_line_and_the_config_section_make_nemo_rls_spinup_create_the_drop_in(
    ray_session, nemo_gym_module
):
    chooser = use_in_nemo_rl(nemo_gym_module)
    assert isinstance(nemo_gym_module.NemoGym, NemoGymChooser)
    assert use_in_nemo_rl(nemo_gym_module) is chooser  # idempotent
    # without our section NeMo RL's own actor is created, as before
    own = nemo_gym_module.spinup_nemo_gym_actor(
        {"nemo_gym": {}}, [], "m", tokenizer=stand_in_tokenizer()
    )
    assert ray_session.get(own.kind.remote()) == "nemo_rl.NemoGym" and chooser.created == 0
    ray_session.kill(own)
    with GymServerThread(token="t") as gym:
        env_configs = {
            "nemo_gym": {
                "rl_gym_actors": {
                    "endpoints": [{"url": gym.url, "token": gym.token, "name": "math"}],
                    "pool": {"size": 1, "rollouts_per_actor": 2},
                    "untrained_replies": "tokenize",
                }
            }
        }
        actor = nemo_gym_module.spinup_nemo_gym_actor(
            env_configs, ["http://127.0.0.1:9/v1"], "policy", tokenizer=stand_in_tokenizer()
        )
        try:
            assert chooser.created == 1
            status = ray_session.get(actor.status.remote())
            assert status["spun_up"] and status["python"] == sys.executable
            # NeMo RL main's rows (no ids) read by main's consumer (3-tuples): the default
            # ("auto") speaks what the installed NeMo RL reads
            rows = nemo_gym_module.prepare_rows([{"reward": 0.5}, {"reward": 0.25}])
            got = nemo_gym_module.consume(
                ray_session,
                actor.run_rollouts.options(num_returns="streaming").remote(rows, "gym"),
                rows=len(rows),
            )
            assert {i: r["full_result"]["reward"] for i, r in got.items()} == {0: 0.5, 1: 0.25}
        finally:
            ray_session.get(actor.shutdown.remote())
            ray_session.kill(actor)
