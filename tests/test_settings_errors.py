"""Every settings object a caller builds (TryPolicy, RetryPolicy, PoolConfig, LedgerConfig,
GymEndpoint) refuses a bad value with one line of ConfigError naming the class and the field,
not pydantic's multi-line ValidationError; the orchestrator's pool_size shortcut too."""

from __future__ import annotations

import math

import pytest

from rl_gym_actors import GymEndpoint, LedgerConfig, PoolConfig, RetryPolicy, TryPolicy
from rl_gym_actors.config import pool_with
from rl_gym_actors.errors import ConfigError


@pytest.mark.parametrize(
    ("build", "name", "field"),
    [
        (lambda: TryPolicy(rollout_s=-1), "TryPolicy", "rollout_s"),
        (lambda: TryPolicy(max_tries=0), "TryPolicy", "max_tries"),
        (lambda: TryPolicy(receipt_s=math.inf), "TryPolicy", "receipt_s"),
        (lambda: TryPolicy(no_such_knob=1), "TryPolicy", "no_such_knob"),
        (lambda: RetryPolicy(attempts=0), "RetryPolicy", "attempts"),
        (lambda: PoolConfig(size=0), "PoolConfig", "size"),
        (lambda: LedgerConfig(batch_size=0), "LedgerConfig", "batch_size"),
        (lambda: GymEndpoint(url="ftp://x"), "GymEndpoint", "url"),
        (lambda: pool_with(PoolConfig(), 0, None), "PoolConfig", "size"),
    ],
)
def test_a_bad_setting_is_one_line_of_config_error_naming_the_field(build, name, field):
    with pytest.raises(ConfigError) as info:
        build()
    text = str(info.value)
    assert "\n" not in text, text
    assert text.startswith(f"invalid {name}: {field}: "), text
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_good_settings_still_build_and_validate():
    assert TryPolicy(rollout_s=5.0).rollout_s == 5.0
    assert pool_with(PoolConfig(), 2, 3).size == 2
    assert TryPolicy.model_validate({"rollout_s": 5.0}).rollout_s == 5.0
