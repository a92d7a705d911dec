"""The adapter's settings, read from verl's own config (pure: no verl, no Ray).

A verl user adds one section, ``+rl_gym_actors={...}`` (any mapping with ``.get``: verl's
``DictConfig`` or a plain dict), and everything else is read from verl's own keys:

- ``endpoints``: the Gym servers (URLs, or ``{url, token}`` mappings); required.
- ``run_id``: the run's name in every rollout id (default: ``trainer.experiment_name``); keep it
  stable across restarts.
- ``pool_size``: warm rollout actors (default: :func:`pool_size_for`, enough actors of
  ``rollouts_per_actor`` slots for every session verl has in flight, :func:`in_flight`).
- ``rollouts_per_actor`` (default 32, as the SkyRL adapter's), ``rollout_s``, ``receipt_s``,
  ``max_tries``: as in :class:`~rl_gym_actors.config.PoolConfig` /
  :class:`~rl_gym_actors.config.TryPolicy`.
- ``checkpoint_deadline_s``: how long a checkpoint of the layer may take (default 120).

:func:`restore_dir` says which checkpoint directory the layer restores from on resume.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_gym_actors.checkpoint_part import PART_DIR, PART_FILE
from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.integrations.verl.ids import check_run_id

SECTION = "rl_gym_actors"
# rollouts one actor plays at once: one actor per session made verl's default pool a Ray worker
# process per session (32 for a batch of 16 x n 2), each paying Ray's per-call floor
ROLLOUTS_PER_ACTOR = 32
STEP_PREFIX = "global_step_"
LATEST_FILE = "latest_checkpointed_iteration.txt"  # verl writes it once a save is durable
ASYNC_TRAINER_MODES = frozenset({"colocate_async", "separate_async"})


def _get(config: Any, path: str, default: Any = None) -> Any:
    node = config
    for key in path.split("."):
        if node is None or not hasattr(node, "get"):
            return default
        node = node.get(key)
    return default if node is None else node


@dataclass(frozen=True)
class VerlSettings:
    endpoints: tuple[GymEndpoint, ...]
    run_id: str
    pool_size: int
    rollouts_per_actor: int = ROLLOUTS_PER_ACTOR
    rollout_s: float | None = None
    receipt_s: float | None = None
    max_tries: int | None = None
    checkpoint_deadline_s: float = 120.0
    trainer_mode: str = "sync"

    @property
    def is_async(self) -> bool:
        return base_mode(self.trainer_mode) in ASYNC_TRAINER_MODES


def base_mode(trainer_mode: str) -> str:
    """verl's mode behind one of the adapter's registered names (``rlga_sync`` -> ``sync``)."""
    return trainer_mode.removeprefix("rlga_")


def pool_size_for(config: Any, rollouts_per_actor: int = ROLLOUTS_PER_ACTOR) -> int:
    """Warm rollout actors of ``rollouts_per_actor`` slots for every session verl has in flight
    at once (:func:`in_flight`)."""
    if isinstance(rollouts_per_actor, bool) or rollouts_per_actor < 1:
        raise ConfigError(f"{SECTION}.rollouts_per_actor must be at least 1")
    return max(1, math.ceil(in_flight(config) / rollouts_per_actor))


def in_flight(config: Any) -> int:
    """The sessions verl has in flight at once: the submitted batch (``data.train_batch_size``,
    or ``data.gen_batch_size`` when larger) times ``rollout.n``; the async modes submit
    ``num_warmup_batches`` batches more ahead of the one being trained."""
    batch = int(_get(config, "data.train_batch_size", 1))
    gen = int(_get(config, "data.gen_batch_size", 0) or 0)
    n = int(_get(config, "actor_rollout_ref.rollout.n", 1))
    mode = base_mode(str(_get(config, "trainer.v1.trainer_mode", "sync")))
    ahead = 0.0
    if mode in ASYNC_TRAINER_MODES:
        ahead = float(_get(config, f"trainer.v1.{mode}.num_warmup_batches", 1) or 0)
    prompts = max(batch, gen) * (1.0 + ahead)
    return max(1, int(prompts * n + 0.999999))


def _endpoint(value: Any) -> GymEndpoint:
    if isinstance(value, str):
        return GymEndpoint(url=value)
    if hasattr(value, "get") and value.get("url"):
        return GymEndpoint(url=str(value.get("url")), token=value.get("token"))
    raise ConfigError(f"{SECTION}.endpoints: {value!r} is neither a URL nor a {{url, token}}")


def settings_from(config: Any) -> VerlSettings:
    """The adapter's settings from verl's whole config; ConfigError names what is wrong."""
    section = _get(config, SECTION)
    if section is None or not hasattr(section, "get"):
        raise ConfigError(f"verl's config has no {SECTION} section (add +{SECTION}.endpoints=...)")
    raw = section.get("endpoints")
    if isinstance(raw, str):
        raw = [raw]
    if not raw:
        raise ConfigError(f"{SECTION}.endpoints: at least one Gym server is needed")
    endpoints = tuple(_endpoint(v) for v in raw)
    run_id = section.get("run_id") or _get(config, "trainer.experiment_name")
    if not run_id:
        raise ConfigError(f"{SECTION}.run_id (or trainer.experiment_name) must be set")
    known = {
        "endpoints",
        "run_id",
        "pool_size",
        "rollouts_per_actor",
        "rollout_s",
        "receipt_s",
        "max_tries",
        "checkpoint_deadline_s",
    }
    unknown = sorted(str(k) for k in section if k not in known)
    if unknown:
        raise ConfigError(f"{SECTION}: unknown keys {unknown}")

    def number(key: str, kind: type) -> Any:
        value = section.get(key)
        return None if value is None else kind(value)

    per_actor = number("rollouts_per_actor", int) or ROLLOUTS_PER_ACTOR
    return VerlSettings(
        endpoints=endpoints,
        run_id=check_run_id(str(run_id)),
        pool_size=number("pool_size", int) or pool_size_for(config, per_actor),
        rollouts_per_actor=per_actor,
        rollout_s=number("rollout_s", float),
        receipt_s=number("receipt_s", float),
        max_tries=number("max_tries", int),
        checkpoint_deadline_s=number("checkpoint_deadline_s", float) or 120.0,
        trainer_mode=str(_get(config, "trainer.v1.trainer_mode", "sync")),
    )


def has_part(step_dir: str | os.PathLike[str]) -> bool:
    return (Path(step_dir) / PART_DIR / PART_FILE).is_file()


def step_of(step_dir: str | os.PathLike[str]) -> int | None:
    name = Path(step_dir).name
    if not name.startswith(STEP_PREFIX) or not name[len(STEP_PREFIX) :].isdigit():
        return None
    return int(name[len(STEP_PREFIX) :])


def resume_step_dir(config: Any, cwd: str | None = None) -> Path | None:
    """The ``global_step_N`` directory verl resumes from (as its ``_load_checkpoint`` finds it:
    ``trainer.resume_mode`` auto reads ``latest_checkpointed_iteration.txt`` under
    ``trainer.default_local_dir``; resume_path takes ``trainer.resume_from_path``), or None."""
    mode = str(_get(config, "trainer.resume_mode", "auto"))
    base = Path(cwd or os.getcwd())
    if mode == "disable":
        return None
    if mode == "resume_path":
        path = _get(config, "trainer.resume_from_path")
        return None if not path else base / str(path)
    root = base / str(_get(config, "trainer.default_local_dir", "checkpoints"))
    try:
        text = (root / LATEST_FILE).read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None
    step_dir = root / f"{STEP_PREFIX}{int(text)}"
    return step_dir if step_dir.is_dir() else None


def restore_dir(config: Any, cwd: str | None = None) -> Path | None:
    """Where the layer restores from: the newest ``global_step_M`` (M <= the step verl resumes
    from) that holds the layer's part. A save that crashed between verl's marker and the
    layer's part leaves step N without one; the layer then resumes from the one before (its
    rollouts of step N are still held on Gym, un-ACKed, and adopted when sent again)."""
    resumed = resume_step_dir(config, cwd)
    if resumed is None:
        return None
    limit = step_of(resumed)
    if limit is None:
        return resumed if has_part(resumed) else None
    candidates = []
    for child in resumed.parent.iterdir():
        step = step_of(child)
        if step is not None and step <= limit and has_part(child):
            candidates.append((step, child))
    return max(candidates)[1] if candidates else None
