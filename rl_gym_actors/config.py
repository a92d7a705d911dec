"""Settings: Gym endpoints, the try policy, the actor pool and the ledger. Every knob has a default."""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

TOKEN_ENV = "RL_GYM_CONTROL_TOKEN"


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GymEndpoint(_Settings):
    """One Gym agent server: its base URL and its control-plane bearer token."""

    url: str
    token: str | None = None
    name: str | None = None

    @field_validator("url")
    @classmethod
    def _strip(cls, v: str) -> str:
        v = v.rstrip("/")
        if not v.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return v

    @property
    def resolved_token(self) -> str | None:
        return self.token if self.token is not None else os.environ.get(TOKEN_ENV)

    @property
    def label(self) -> str:
        return self.name or self.url


class TryPolicy(_Settings):
    """How a rollout plays its tries.

    ``rollout_s`` bounds one try's ``/run``; ``receipt_s`` bounds the whole receipt fetch after it,
    retries included; ``max_tries`` caps tries per rollout; ``control_s`` bounds each retire,
    replay or ACK call; ``admission_wait_s`` bounds how long a try waits for a checkpoint's resume.
    """

    rollout_s: Annotated[float, Field(gt=0)] = 60.0
    receipt_s: Annotated[float, Field(gt=0)] = 5.0
    max_tries: Annotated[int, Field(ge=1)] = 3
    control_s: Annotated[float, Field(gt=0)] = 10.0
    admission_wait_s: Annotated[float, Field(gt=0)] = 600.0


class PoolConfig(_Settings):
    """The warm pool of rollout actors. ``size * rollouts_per_actor`` caps rollouts in flight."""

    size: Annotated[int, Field(ge=1)] = 16
    rollouts_per_actor: Annotated[int, Field(ge=1)] = 1
    num_cpus: Annotated[float, Field(ge=0)] = 0.0
    spread: bool = True                         # SPREAD scheduling across nodes


class LedgerConfig(_Settings):
    """How rollout actors report to the ledger: in batches of up to ``batch_size`` or every
    ``flush_interval_s``, whichever comes first."""

    batch_size: Annotated[int, Field(ge=1)] = 100
    flush_interval_s: Annotated[float, Field(gt=0)] = 0.05
    prepare_rounds: Annotated[int, Field(ge=1)] = 20
    prepare_slice_s: Annotated[float, Field(gt=0)] = 10.0
