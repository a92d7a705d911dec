"""SkyRL's config with the layer's section: ``generator.rl_gym_actors`` (SkyRL >= 0.4).

SkyRL parses its config strictly (an unknown key is an error), so the layer's settings live in a
``GeneratorConfig`` subclass, and :data:`GymSkyRLConfig` is SkyRL's own ``SkyRLTrainConfig`` built
with it by ``make_config(generator_cls=...)``. No ``from __future__ import annotations`` here:
SkyRL's builder reads the field types at run time.
"""

from dataclasses import dataclass, field

from skyrl.train.config import GeneratorConfig, make_config

from rl_gym_actors.integrations.skyrl.settings import RlGymActorsSettings


@dataclass
class GymGeneratorConfig(GeneratorConfig):
    """SkyRL's ``GeneratorConfig`` plus ``rl_gym_actors`` (:class:`RlGymActorsSettings`)."""

    rl_gym_actors: RlGymActorsSettings = field(default_factory=RlGymActorsSettings)


GymSkyRLConfig = make_config(generator_cls=GymGeneratorConfig)


def settings_of(cfg) -> RlGymActorsSettings:
    """The layer's settings of a parsed config (the defaults when it has none)."""
    found = getattr(cfg.generator, "rl_gym_actors", None)
    if isinstance(found, RlGymActorsSettings):
        return found
    if isinstance(found, dict):
        return RlGymActorsSettings(**found)
    return RlGymActorsSettings()
