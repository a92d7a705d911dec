"""Small helpers the Gym server and client tests share: fresh ids, load-scaled deadlines, and
awaiting a call that must raise exactly one error type."""

from __future__ import annotations

import pickle
import uuid
from collections.abc import Awaitable
from typing import Any

import pytest

from rl_gym_actors.errors import RlGymError
from rl_gym_actors.testing.polling import soon

__all__ = ["cid", "expect", "expect_type", "rid", "soon"]


def rid() -> str:
    """A fresh rollout id."""
    return f"r{uuid.uuid4().hex[:10]}"


def cid() -> str:
    """A fresh checkpoint id."""
    return f"c{uuid.uuid4().hex[:10]}"


async def expect_type(cls: type[BaseException], call: Awaitable[Any]) -> Any:
    """Await ``call``, which must raise exactly ``cls``; the error."""
    with pytest.raises(Exception) as info:
        await call
    assert type(info.value) is cls, f"expected {cls.__name__}, got {info.value!r}"
    return info.value


async def expect(cls: type[RlGymError], call: Awaitable[Any]) -> RlGymError:
    """As :func:`expect_type`, for the project's errors, which must also survive pickling."""
    err = await expect_type(cls, call)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and back.__dict__ == err.__dict__
    return err
