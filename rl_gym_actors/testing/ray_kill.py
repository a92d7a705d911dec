"""Killing a Ray actor for good and knowing it is dead.

``ray.kill`` returns before the actor is gone: a call made right after it may still be served.
A test that kills an actor and then asserts what its death causes (a lost ledger, an owner whose
attempts count as forgotten) waits here first, until a call to the actor is refused.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rl_gym_actors.testing.polling import scaled, until


async def kill_for_good(actor: Any, *, what: str = "the killed actor to be gone") -> None:
    """``ray.kill(actor, no_restart=True)``, then wait (deadline scaled by the load) until Ray
    refuses a call to it."""
    import ray
    from ray.exceptions import RayActorError

    ray.kill(actor, no_restart=True)

    async def refused() -> bool:
        try:
            await asyncio.wait_for(actor.__ray_ready__.remote(), scaled(5.0))
        except RayActorError:
            return True
        except TimeoutError:
            return False
        return False

    _gone: bool = await until(refused, what=what)  # annotated: mypy cannot infer T here
