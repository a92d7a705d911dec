"""The NeMo RL drop-in: an actor NeMo RL creates in place of its own ``NemoGym``.

``dropin``            the actor (``NemoGymDropIn``) and the plain class it wraps (``GymRolloutEnv``)
``config``            its settings, read from the ``rl_gym_actors`` section of NeMo RL's config
``selection``         ``use_in_nemo_rl()``: the one line that makes NeMo RL create the drop-in
``rows``              row identity, message logs and the failure types NeMo RL classifies
``results``           NeMo RL's result shape built from a Gym reply
``feed``              the stream of finished rows handed back to NeMo RL
``servers``, ``agent`` the Gym servers the drop-in starts itself and a policy-sampling agent
``dropin_status``     its health_check() and status()
``checkpoints``, ``checkpoint_calls``, ``participants``
                      NeMo RL's checkpoint-participant calls mapped onto the ledger's gate

The public names below load their module on first use, so importing a light module of this
package (``rows``, ``results``, ``agent``) does not import Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rl_gym_actors.integrations.nemo_rl.config import DropInConfig
    from rl_gym_actors.integrations.nemo_rl.dropin import GymRolloutEnv, NemoGymDropIn
    from rl_gym_actors.integrations.nemo_rl.selection import use_in_nemo_rl

_HOME = {
    "DropInConfig": "config",
    "GymRolloutEnv": "dropin",
    "NemoGymDropIn": "dropin",
    "use_in_nemo_rl": "selection",
}
__all__ = ["DropInConfig", "GymRolloutEnv", "NemoGymDropIn", "use_in_nemo_rl"]


if not TYPE_CHECKING:  # hidden from mypy, which would otherwise accept any name as Any

    def __getattr__(name: str) -> Any:
        home = _HOME.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{__name__}.{home}"), name)
