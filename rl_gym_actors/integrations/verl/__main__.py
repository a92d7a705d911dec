"""``python -m rl_gym_actors.integrations.verl``: print the config lines a verl run adds."""

from __future__ import annotations

from pathlib import Path

LOOP_CONFIG = Path(__file__).with_name("agent_loops.yaml")


def lines() -> list[str]:
    return [
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={LOOP_CONFIG}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=rl_gym_actors",
        "trainer.checkpoint_callback_class="
        "rl_gym_actors.integrations.verl.checkpoints.GymCheckpointCallback",
        "trainer.v1.trainer_mode=rlga_sync",
        "trainer.resume_mode=auto",
        # quoted: a shell may read the brackets as a glob (zsh's fails when nothing matches)
        "'+rl_gym_actors.endpoints=[http://127.0.0.1:8000]'",
    ]


if __name__ == "__main__":
    print(" \\\n  ".join(lines()))
