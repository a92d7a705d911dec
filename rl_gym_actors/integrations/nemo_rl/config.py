"""The drop-in's settings, read from the config NeMo RL hands its Gym actor.

NeMo RL builds a ``NemoGymConfig`` in ``spinup_nemo_gym_actor``: the policy it trains
(``model_name``, ``base_urls``: its vLLM servers), the post-processing knobs
(``invalid_tool_call_patterns``, ``thinking_tags``, ``require_routed_experts``,
``routed_experts_dtype``) at the top level, and everything else the user wrote under
``env.nemo_gym`` in ``initial_global_config_dict``. Our settings are the ``rl_gym_actors``
section there (so ``env.nemo_gym.rl_gym_actors`` in the user's YAML); a config that carries
``rl_gym_actors`` at its top level, or our settings themselves, is read as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rl_gym_actors.config import GymEndpoint, LedgerConfig, PoolConfig, TryPolicy
from rl_gym_actors.errors import ConfigError

SECTION = "rl_gym_actors"
GLOBAL_CONFIG_KEY = "initial_global_config_dict"
# NemoGymConfig's top-level keys the drop-in reads (the others concern NeMo Gym's own servers)
NEMO_RL_SETTINGS = (
    "model_name",
    "base_urls",
    "invalid_tool_call_patterns",
    "thinking_tags",
    "require_routed_experts",
    "routed_experts_dtype",
)
# Every key of NeMo RL's NemoGymConfig; dropped when our settings sit at its top level.
NEMO_RL_KEYS = frozenset(
    {
        *NEMO_RL_SETTINGS,
        GLOBAL_CONFIG_KEY,
        "port_range_low",
        "port_range_high",
        "use_fastokens",
        "tokenizer_config",
        "pad_dynamic_image_shapes",
        "token_capture",
    }
)


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NemoRLSettings(_Settings):
    """What NeMo RL passes at the top level of its NemoGymConfig (``None``: its default)."""

    model_name: str | None = None
    base_urls: list[str] = []
    invalid_tool_call_patterns: list[str] | None = None
    thinking_tags: list[str] | None = None
    require_routed_experts: bool = False
    routed_experts_dtype: Literal["int8", "int16", "int32"] = "int16"


class ServerSpec(_Settings):
    """A Gym server the drop-in starts itself at ``_spinup`` (on 127.0.0.1 of its node, in a
    thread of its actor). ``agent``: ``simulated``, ``module:function`` (called with the
    policy endpoint when it takes a ``policy`` argument) or an upstream agent's ``http(s)://``
    ``/run`` URL. ``name`` is the agent's name (``agent_ref``) and its endpoint's name;
    ``state_dir`` makes its ledger durable (SQLite) instead of in memory."""

    agent: str
    name: str = "rl_gym_actors"
    state_dir: str | None = None
    allow_faults: bool = False


class DropInConfig(_Settings):
    """Settings of the drop-in (the ``rl_gym_actors`` section).

    ``endpoints`` are Gym servers someone else runs, ``servers`` the ones the drop-in starts
    (at least one of the two). ``agent_name`` is the ``agent_ref`` of rows that carry none
    (default: the endpoint's name, else ``rl_gym_actors``). ``stream_tuple``: ``auto`` (default)
    yields what the installed NeMo RL's consumer unpacks, detected at spin-up
    (:mod:`.consumer`: 3 for NeMo RL main, 4 for its checkpoint work); 4 forces
    ``(rowidx, agent_ref, result, timing)``, 3 forces ``(rowidx, result, timing)``.
    ``admission_refusals``: a row Gym refused with 409 ``admission_closed`` past
    ``policy.admission_wait_s`` is yielded as ``GymAdmissionClosed(message, row_idx)`` in its
    place (``yield``, as NeMo RL's newest ``run_rollouts`` does) or counted among the failures
    the stream raises at its end (``raise``); ``auto`` (default) yields when the installed NeMo
    RL's ``run_rollouts`` is annotated to yield it (:mod:`.consumer`). ``run_id``
    names the training run: derived rollout ids start with it (plus a per-instance suffix that a
    restore from a checkpoint replaces with the checkpointed one); keep it stable across restarts
    and unique among runs sharing a Gym server. ``hold_s`` / ``max_held``
    bound how long and how many results of cancelled streams are kept for a re-dispatch;
    ``commit_min_s`` is the least time a commit's gate gets; ``tensors`` picks the token
    containers (``auto``: ``torch.tensor`` when torch is importable). ``untrained_replies``:
    a reply without token ids is a data failure (``error``, as in NeMo RL) or is tokenized
    with logprobs 0.0 (``tokenize``: agents that sample no policy, e.g. in tests). ``nemo`` is
    filled from NeMo RL's own keys.
    """

    endpoints: list[GymEndpoint] = []
    servers: list[ServerSpec] = []
    agent_name: str | None = None
    stream_tuple: Literal["auto", 3, 4] = "auto"
    admission_refusals: Literal["auto", "yield", "raise"] = "auto"
    policy: TryPolicy = TryPolicy()
    pool: PoolConfig = PoolConfig()
    ledger: LedgerConfig = LedgerConfig()
    run_id: str = "nrl"
    orchestrator_id: str | None = None
    hold_s: Annotated[float, Field(gt=0)] = 1800.0
    max_held: Annotated[int, Field(ge=1)] = 100_000
    commit_min_s: Annotated[float, Field(gt=0)] = 30.0
    tensors: Literal["auto", "list"] = "auto"
    untrained_replies: Literal["error", "tokenize"] = "error"
    nemo: NemoRLSettings = NemoRLSettings()

    @field_validator("endpoints", mode="before")
    @classmethod
    def _urls(cls, value: Any) -> Any:
        if isinstance(value, (str, GymEndpoint, Mapping)):
            value = [value]
        return [{"url": v} if isinstance(v, str) else v for v in value]

    @model_validator(mode="after")
    def _some_gym(self) -> DropInConfig:
        if not self.endpoints and not self.servers:
            raise ValueError(
                "endpoints missing: name Gym servers (endpoints) or have the "
                "drop-in start them (servers)"
            )
        names = [s.name for s in self.servers] + [e.name for e in self.endpoints if e.name]
        if len(names) != len(set(names)):
            raise ValueError(f"server and endpoint names must be unique: {names}")
        return self

    def default_agent_name(self) -> str:
        if self.agent_name:
            return self.agent_name
        named = [s.name for s in self.servers] + [e.name for e in self.endpoints if e.name]
        return named[0] if named else "rl_gym_actors"

    @classmethod
    def from_any(cls, cfg: DropInConfig | Mapping[str, Any]) -> DropInConfig:
        if isinstance(cfg, DropInConfig):
            return cfg
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"config must be a mapping, not {type(cfg).__name__}")
        ours = section_of(cfg)
        if ours is None:
            ours = {k: v for k, v in cfg.items() if k not in NEMO_RL_KEYS}
        if not isinstance(ours, Mapping):
            raise ConfigError(f"the {SECTION} section must be a mapping")
        nemo = {k: cfg[k] for k in NEMO_RL_SETTINGS if cfg.get(k) is not None}
        try:
            return cls.model_validate({**plain(ours), "nemo": plain(nemo)})
        except ValueError as exc:
            raise ConfigError(f"invalid drop-in config: {exc}") from None


def section_of(cfg: Mapping[str, Any]) -> Any:
    """Our section of a NemoGymConfig (or of a config with it at the top), else None."""
    if SECTION in cfg:
        return cfg[SECTION]
    inner = cfg.get(GLOBAL_CONFIG_KEY)
    if isinstance(inner, Mapping) and SECTION in inner:
        return inner[SECTION]
    return None


def plain(value: Any) -> Any:
    """Mappings and sequences (OmegaConf's included) as dicts and lists."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or (
        hasattr(value, "__iter__")
        and hasattr(value, "__getitem__")
        and not isinstance(value, (str, bytes))
    ):
        return [plain(v) for v in value]
    return value
