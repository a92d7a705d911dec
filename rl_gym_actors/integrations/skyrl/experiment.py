"""``GymPPOExp``: SkyRL's experiment with its generator played through the layer, and ``main()``.

A user selects it by config::

    python -m skyrl.train.entrypoints.main_base \\
        trainer.override_entrypoint=rl_gym_actors.integrations.skyrl.experiment \\
        generator.rl_gym_actors.endpoints='[http://127.0.0.1:8000]' ...

SkyRL's ``main_base`` imports the module named by ``trainer.override_entrypoint`` and calls its
``main()``, which parses the whole command line with :data:`~.config.GymSkyRLConfig` (SkyRL's
config plus ``generator.rl_gym_actors``), starts Ray as SkyRL does and runs the experiment in a
Ray task, as SkyRL's own entry point does. ``trainer.fully_async.enabled=true`` picks
:class:`~.checkpoints.FullyAsyncGymTrainer`, else :class:`~.trainer.GymRayPPOTrainer` (SkyRL's
``RayPPOTrainer``, resuming from an epoch boundary into the next epoch) with
:class:`~.checkpoints.GymCheckpointCallback`.

:func:`build_generator` makes the orchestrator from the config: its endpoints and policy, run id
(``generator.rl_gym_actors.run_id``, else ``trainer.run_name``), a pool sized for the trajectories
SkyRL has in flight, ``keep_results=True``, and the part it restores from when SkyRL resumes
(:mod:`.resume`).
"""

from __future__ import annotations

import re
import sys
from typing import Any

import ray
from skyrl.train.entrypoints.main_base import BasePPOExp
from skyrl.train.trainer import RayPPOTrainer

from rl_gym_actors.integrations.skyrl.checkpoints import FullyAsyncGymTrainer, GymCheckpointCallback
from rl_gym_actors.integrations.skyrl.config import GymSkyRLConfig, settings_of
from rl_gym_actors.integrations.skyrl.generator import GymGenerator
from rl_gym_actors.integrations.skyrl.ids import check_run_id
from rl_gym_actors.integrations.skyrl.resume import restore_dir, resume_step
from rl_gym_actors.integrations.skyrl.settings import (
    endpoints_of,
    in_flight,
    policy_of,
    pool_size_for,
)
from rl_gym_actors.integrations.skyrl.trainer import GymRayPPOTrainer
from rl_gym_actors.orchestrator import Orchestrator

ENTRYPOINT_ARG = "trainer.override_entrypoint="


def run_id_for(cfg: Any) -> str:
    """``generator.rl_gym_actors.run_id``, else ``trainer.run_name`` made a valid id."""
    settings = settings_of(cfg)
    if settings.run_id:
        return check_run_id(settings.run_id)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(cfg.trainer.run_name)).strip("-._") or "skyrl"
    return check_run_id(name[:96])


def build_orchestrator(cfg: Any) -> Orchestrator:
    settings = settings_of(cfg)
    fully_async = bool(cfg.trainer.fully_async.enabled)
    trajectories = in_flight(
        train_batch_size=cfg.trainer.train_batch_size,
        n_samples_per_prompt=cfg.generator.n_samples_per_prompt,
        fully_async=fully_async,
        num_parallel_generation_workers=cfg.trainer.fully_async.num_parallel_generation_workers,
    )
    step = resume_step(cfg.trainer.ckpt_path, cfg.trainer.resume_mode, cfg.trainer.resume_path)
    return Orchestrator(
        endpoints_of(settings),
        policy=policy_of(settings),
        pool_size=pool_size_for(settings, trajectories),
        rollouts_per_actor=settings.rollouts_per_actor,
        run_id=run_id_for(cfg),
        progress=False,
        start=False,
        restore_from=restore_dir(cfg.trainer.ckpt_path, step),
        keep_results=True,
    )


def build_generator(cfg: Any, tokenizer: Any) -> GymGenerator:
    return GymGenerator(build_orchestrator(cfg), tokenizer, run_id_for(cfg))


class GymPPOExp(BasePPOExp):
    """SkyRL's ``BasePPOExp`` with :class:`GymGenerator` and the layer's checkpoint hooks."""

    generator: GymGenerator | None = None
    # the trainers it builds (a subclass may swap them, e.g. the CPU stand-in of the tests)
    sync_trainer_cls: type[RayPPOTrainer] = GymRayPPOTrainer
    fully_async_trainer_cls: type[FullyAsyncGymTrainer] = FullyAsyncGymTrainer

    def get_generator(self, cfg: Any, tokenizer: Any, inference_engine_client: Any) -> GymGenerator:
        self.generator = build_generator(cfg, tokenizer)
        return self.generator

    def get_trainer(
        self,
        cfg: Any,
        tracker: Any,
        tokenizer: Any,
        train_dataset: Any,
        eval_dataset: Any,
        inference_engine_client: Any,
        generator: Any,
        colocate_pg: Any,
    ) -> RayPPOTrainer:
        deadline_s = settings_of(cfg).checkpoint_deadline_s
        common = dict(
            cfg=cfg,
            tracker=tracker,
            tokenizer=tokenizer,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            inference_engine_client=inference_engine_client,
            generator=generator,
            colocate_pg=colocate_pg,
        )
        if cfg.trainer.fully_async.enabled:
            return self.fully_async_trainer_cls(deadline_s=deadline_s, **common)
        return self.sync_trainer_cls(
            **common, callbacks=[GymCheckpointCallback(generator, deadline_s=deadline_s)]
        )

    def run(self) -> None:
        try:
            super().run()
        finally:
            if self.generator is not None:
                self.generator.orchestrator.close()


@ray.remote(num_cpus=1)
def gym_entrypoint(cfg: Any) -> None:
    GymPPOExp(cfg).run()


def parse_config(argv: list[str]) -> Any:
    """SkyRL's config plus the layer's section, from ``key=value`` overrides (the
    ``trainer.override_entrypoint`` that brought SkyRL here is left out)."""
    return GymSkyRLConfig.from_cli_overrides([a for a in argv if not a.startswith(ENTRYPOINT_ARG)])


def main() -> None:
    from skyrl.train.utils import validate_cfg
    from skyrl.train.utils.utils import initialize_ray

    cfg = parse_config(sys.argv[1:])
    validate_cfg(cfg)
    initialize_ray(cfg)
    ray.get(gym_entrypoint.remote(cfg))


if __name__ == "__main__":
    main()
