"""Settings: Gym endpoints, the try policy, the actor pool and the ledger. Every knob has a
default."""

from __future__ import annotations

import hashlib
import math
import os
import random
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from tenacity import RetryCallState, wait_exponential
from tenacity.wait import wait_base

from rl_gym_actors.errors import ConfigError
from rl_gym_actors.protocol import is_valid_checkpoint_id, is_valid_rollout_id

TOKEN_ENV = "RL_GYM_CONTROL_TOKEN"


# ---------------------------------------------------------------- a caller's arguments
# One rule per input, for every RL-side entry point (orchestrator, ledger, client, drop-in);
# the Gym server checks the same ids on the wire and answers 422 instead.


def checkpoint_id_arg(value: object) -> str:
    """A checkpoint id from a caller; :class:`ConfigError` unless it is a valid wire id."""
    if not is_valid_checkpoint_id(value):
        raise ConfigError(f"invalid checkpoint_id {value!r}")
    return value


def run_id_arg(value: object, what: str = "run_id") -> str:
    """A run (or orchestrator) id from a caller: a valid rollout id of at most 200 characters,
    so that minted ids ``<run_id>-<hex>`` stay valid; :class:`ConfigError` otherwise."""
    if not (isinstance(value, str) and is_valid_rollout_id(value) and len(value) <= 200):
        raise ConfigError(f"invalid {what} {value!r}")
    return value


def deadline_s_arg(value: object) -> float:
    """A time budget in seconds from a caller; :class:`ConfigError` unless it is a finite
    number above 0 (a bool is not a number here)."""
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(f"deadline_s must be a positive number, got {value!r}")
    return float(value)


class _Settings(BaseModel):
    # inf and nan are refused in every setting: a deadline of inf never fires
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    def __init__(self, **data: Any) -> None:
        """A bad field is a :class:`ConfigError` naming it (one line), as every other setting
        a caller passes to the package; ``model_validate`` still raises pydantic's error."""
        try:
            super().__init__(**data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'settings'}: "
                f"{e['msg'].removeprefix('Value error, ')}"
                for e in exc.errors()
            )
            raise ConfigError(f"invalid {type(self).__name__}: {problems}") from None


class GymEndpoint(_Settings):
    """One Gym agent server: its base URL and its control-plane bearer token."""

    url: str
    token: str | None = None
    name: str | None = None

    @field_validator("url")
    @classmethod
    def _strip(cls, v: str) -> str:
        v = v.strip()
        if "://" not in v:
            raise ValueError(f"{v!r} has no scheme: write http://{v} (or https://)")
        scheme, rest = v.split("://", 1)
        if scheme not in ("http", "https") or not rest.strip("/"):
            raise ValueError(f"{v!r} is not an http:// or https:// URL of a host")
        return v.rstrip("/")

    @property
    def resolved_token(self) -> str | None:
        return self.token if self.token is not None else os.environ.get(TOKEN_ENV)

    @property
    def label(self) -> str:
        return self.name or self.url


class _Jittered(wait_base):
    """A tenacity wait with a random fraction up to ``jitter`` taken off (0: none, 1: full)."""

    def __init__(self, base: wait_base, jitter: float, rand: Callable[[], float]) -> None:
        self.base, self.jitter, self.rand = base, jitter, rand

    def __call__(self, retry_state: RetryCallState) -> float:
        return self.base(retry_state) * (1.0 - self.jitter * self.rand())


class _Try:
    """The one field of tenacity's retry state a wait reads."""

    def __init__(self, attempt_number: int) -> None:
        self.attempt_number = attempt_number


class RetryPolicy(_Settings):
    """How a call to Gym repeats itself inside its deadline (the decider is
    :func:`rl_gym_actors.gym.retry.call_with_retry`, built on tenacity; which failures it repeats
    is the call's kind, never the policy's).

    ``attempts`` bounds the tries (1 = no retry). The n-th sleep is tenacity's exponential wait,
    ``min(backoff_max_s, backoff_initial_s * backoff_multiplier ** (n - 1))``, of which a random
    fraction up to ``jitter`` is taken off (0 = no jitter, 1 = "full jitter").
    ``try_timeout_s`` bounds one try (``None``: a try may use all the time left), so that a hung
    try still leaves time for another; ``min_try_s`` is the least time a try starts with.
    ``reply_margin_s`` is kept off the deadline sent in a request body, so that a server that
    waits until that deadline still has time to answer. The defaults ride out about 1.5 s of
    refused connections (a quick restart), deadline allowing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    attempts: Annotated[int, Field(ge=1, strict=True)] = 6
    backoff_initial_s: Annotated[float, Field(ge=0)] = 0.05
    backoff_max_s: Annotated[float, Field(ge=0)] = 1.0
    backoff_multiplier: Annotated[float, Field(ge=1)] = 2.0
    jitter: Annotated[float, Field(ge=0, le=1)] = 0.5
    try_timeout_s: Annotated[float, Field(gt=0)] | None = None
    min_try_s: Annotated[float, Field(ge=0)] = 0.01
    reply_margin_s: Annotated[float, Field(ge=0)] = 0.25

    def wait(self, rand: Callable[[], float] = random.random) -> wait_base:
        """The tenacity wait of this policy; ``rand`` draws the jitter."""
        base = wait_exponential(
            multiplier=self.backoff_initial_s,
            max=self.backoff_max_s,
            exp_base=self.backoff_multiplier,
        )
        return _Jittered(base, self.jitter, rand) if self.jitter else base

    def backoff(self, retry_number: int, rand: float = 0.0) -> float:
        """The sleep after try ``retry_number`` fails; ``rand`` in [0, 1) draws the jitter."""
        # a wait reads only attempt_number of tenacity's RetryCallState, which _Try carries
        return self.wait(lambda: rand)(_Try(max(retry_number, 1)))  # type: ignore[arg-type]

    def try_deadline(self, deadline_ts: float, now: float) -> float:
        """The absolute deadline of one try started at ``now``."""
        if self.try_timeout_s is None:
            return deadline_ts
        return min(deadline_ts, now + self.try_timeout_s)

    def wire_deadline(self, deadline_ts: float, now: float) -> float:
        """The deadline to send in a body: ours, less a margin (at most a tenth of what is left)
        for the answer to travel back before our own timeout fires."""
        left = max(deadline_ts - now, 0.0)
        return deadline_ts - min(self.reply_margin_s, left / 10.0)


class TryPolicy(_Settings):
    """How a rollout plays its tries.

    ``rollout_s`` bounds one try's ``/run``; ``receipt_s`` bounds the whole receipt fetch after it,
    retries included; ``max_tries`` caps tries per rollout; ``control_s`` bounds each retire,
    replay or ACK call; ``admission_wait_s`` bounds how long a try waits for a checkpoint's resume.
    ``retry`` is how every call to Gym repeats itself inside its deadline (the rollout actors'
    and the ledger's); a rollout repeats a step itself only for what a call does not retry (a
    checkpoint in the way, a key not completed yet), backing off by the same policy.

    ``ack`` says when Gym may release a sealed result: ``"at_checkpoint"`` (the default) leaves it
    completed and un-ACKed on Gym until the checkpoint gate ACKs it just before prepare, so a
    trainer that restarts from its last checkpoint gets every later result replayed, not rerun;
    ``"on_seal"`` ACKs it as soon as the rollout seals it (Gym's memory comes back sooner, but a
    result the trainer loses in a crash is gone).

    ``defer_receipts`` (with ``at_checkpoint``): on a server that gives no receipt beside ``/run``
    and has no per-key receipt route, a rollout seals on its reply's digest and the checkpoint
    gate reads every receipt from its one status listing (``Outcome.receipt`` None until then).
    False makes each rollout read its receipt from a status listing at seal (a listing per
    rollout, growing with the results held): for a consumer that needs the receipt with the
    result (NeMo RL's checkpoint work, PR #4093).
    """

    rollout_s: Annotated[float, Field(gt=0)] = 60.0
    receipt_s: Annotated[float, Field(gt=0)] = 5.0
    max_tries: Annotated[int, Field(ge=1)] = 3
    control_s: Annotated[float, Field(gt=0)] = 10.0
    admission_wait_s: Annotated[float, Field(gt=0)] = 600.0
    retry: RetryPolicy = RetryPolicy()
    ack: Literal["at_checkpoint", "on_seal"] = "at_checkpoint"
    defer_receipts: bool = True


def policy_with_ack(policy: TryPolicy, ack: str | None) -> TryPolicy:
    """``policy`` with its ``ack`` replaced (when given); ConfigError for an unknown one."""
    if ack is None:
        return policy
    try:
        return TryPolicy.model_validate({**policy.model_dump(), "ack": ack})
    except ValueError as exc:
        raise ConfigError(f"ack must be 'at_checkpoint' or 'on_seal', got {ack!r}") from exc


class PoolConfig(_Settings):
    """The warm pool of rollout actors. ``size * rollouts_per_actor`` caps rollouts in flight.
    ``log_level``: the level of the actors' ``rl_gym_actors`` loggers, the rollout actors' and
    the ledger's (``WARNING`` by default; ``INFO`` or ``DEBUG`` to see each try, and a
    checkpoint's drain wait); their lines go to stderr in Ray's worker logs."""

    size: Annotated[int, Field(ge=1)] = 16
    rollouts_per_actor: Annotated[int, Field(ge=1)] = 1
    num_cpus: Annotated[float, Field(ge=0)] = 0.0
    spread: bool = True  # SPREAD scheduling across nodes
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "WARNING"

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


def pool_with(pool: PoolConfig, size: int | None, rollouts_per_actor: int | None) -> PoolConfig:
    """``pool`` with ``size`` / ``rollouts_per_actor`` replaced (when given), checked again."""
    updates = {
        k: v
        for k, v in (("size", size), ("rollouts_per_actor", rollouts_per_actor))
        if v is not None
    }
    return PoolConfig(**{**pool.model_dump(), **updates})  # a bad value: one-line ConfigError


class LedgerConfig(_Settings):
    """How rollout actors report to the ledger: in batches of up to ``batch_size`` or every
    ``flush_interval_s``, whichever comes first. A checkpoint's prepare is bounded by its
    deadline; ``prepare_rounds`` is only a backstop against a loop that makes no progress."""

    batch_size: Annotated[int, Field(ge=1)] = 100
    flush_interval_s: Annotated[float, Field(gt=0)] = 0.05
    prepare_rounds: Annotated[int, Field(ge=1)] = 10_000
    prepare_slice_s: Annotated[float, Field(gt=0)] = 10.0
    forget_batch: Annotated[int, Field(ge=1)] = 500  # Gym v2: rollout ids per forget call


def restore_prefix(run_id: str) -> str:
    """The start of every v2 restore id of run ``run_id`` (``restore-<digest>-``): a restore
    held open by a dead restorer of this run is this run's to finish."""
    return f"restore-{hashlib.sha256(run_id.encode()).hexdigest()[:12]}-"
