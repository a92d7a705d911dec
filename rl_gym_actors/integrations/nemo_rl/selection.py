"""Make NeMo RL create the drop-in instead of its own ``NemoGym``, with no edit to NeMo RL.

NeMo RL's ``spinup_nemo_gym_actor`` (GRPO, the single-controller setup) builds its
``NemoGymConfig`` and then calls ``NemoGym.options(**opts).remote(cfg)``, reading the name
``NemoGym`` from its module ``nemo_rl.environments.nemo_gym`` at call time. One line in the
training script, before NeMo RL sets up::

    from rl_gym_actors.integrations.nemo_rl import use_in_nemo_rl; use_in_nemo_rl()

puts a chooser under that name. A config whose ``env.nemo_gym`` has an ``rl_gym_actors``
section then gets :class:`~.dropin.NemoGymDropIn` (the section is the switch); any other
config gets NeMo RL's own ``NemoGym``, untouched. The drop-in runs in the driver's Python (this
package is installed there): the ``py_executable`` NeMo RL picked for NeMo Gym's venv, and the
venv variables pointing at it, are left out of its runtime environment; everything else of
NeMo RL's options (scheduling, other variables) is kept.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from rl_gym_actors.errors import ConfigError
from rl_gym_actors.integrations.nemo_rl.config import section_of

NEMO_GYM_MODULE = "nemo_rl.environments.nemo_gym"
VENV_VARIABLES = ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")


def wants_drop_in(cfg: Any) -> bool:
    """Whether a NemoGymConfig asks for the drop-in (has an ``rl_gym_actors`` section)."""
    return isinstance(cfg, Mapping) and section_of(cfg) is not None


def drop_in_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """NeMo RL's actor options for the drop-in: without NeMo Gym's interpreter and venv."""
    out = dict(options)
    runtime_env = dict(out.get("runtime_env") or {})
    runtime_env.pop("py_executable", None)
    env_vars = {
        k: v for k, v in (runtime_env.get("env_vars") or {}).items() if k not in VENV_VARIABLES
    }
    if env_vars:
        runtime_env["env_vars"] = env_vars
    else:
        runtime_env.pop("env_vars", None)
    if runtime_env:
        out["runtime_env"] = runtime_env
    else:
        out.pop("runtime_env", None)
    return out


class _Pending:
    """``NemoGym.options(...)`` awaiting its ``.remote(cfg)``, where the choice is made."""

    def __init__(self, chooser: NemoGymChooser, options: dict[str, Any]) -> None:
        self._chooser = chooser
        self._options = options

    def remote(self, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        if wants_drop_in(cfg):
            from rl_gym_actors.integrations.nemo_rl.dropin import NemoGymDropIn

            self._chooser.created += 1
            return NemoGymDropIn.options(**drop_in_options(self._options)).remote(cfg)
        original = self._chooser.original
        handle = original.options(**self._options) if self._options else original
        return handle.remote(cfg, *args, **kwargs)


class NemoGymChooser:
    """Stands where NeMo RL's ``NemoGym`` class was; see the module docstring."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.created = 0  # drop-ins created through it

    def options(self, **options: Any) -> _Pending:
        return _Pending(self, options)

    def remote(self, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        return _Pending(self, {}).remote(cfg, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


class NemoRlNotFound(ConfigError):
    """``use_in_nemo_rl()`` found no NeMo RL to install into: its module is not importable in
    this Python, or has no ``NemoGym``. ``module`` names what was looked for."""

    def __init__(self, message: str, *, module: str) -> None:
        super().__init__(message)
        self.module = module


def use_in_nemo_rl(module: ModuleType | str = NEMO_GYM_MODULE) -> NemoGymChooser:
    """Install the chooser in NeMo RL's module (idempotent); returns it. Raises
    :class:`NemoRlNotFound` (a ``ConfigError``) when NeMo RL is not installed here."""
    name = module if isinstance(module, str) else module.__name__
    try:
        mod = importlib.import_module(module) if isinstance(module, str) else module
    except ModuleNotFoundError as exc:
        if exc.name is None or not name.startswith(exc.name):
            raise  # something NeMo RL itself imports is missing: its own error says what
        raise NemoRlNotFound(
            f"use_in_nemo_rl(): NeMo RL is not installed in this Python ({exc.name!r} is not "
            f"importable; looked for {name!r}): call it in the Python that runs NeMo RL, or "
            f"install NeMo RL there",
            module=name,
        ) from None
    current = getattr(mod, "NemoGym", None)
    if current is None:
        raise NemoRlNotFound(
            f"use_in_nemo_rl(): {name!r} has no NemoGym: not NeMo RL's Gym environment module",
            module=name,
        )
    if isinstance(current, NemoGymChooser):
        return current
    chooser = NemoGymChooser(current)
    mod.NemoGym = chooser  # type: ignore[attr-defined]  # a module's attribute: no stub has it
    return chooser
