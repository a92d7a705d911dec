"""What an orchestrator closing with ``ack="at_checkpoint"`` leaves held on Gym, said at close.

With ``ack="at_checkpoint"`` every sealed result stays completed and un-ACKed on its Gym server
until the run's next committed checkpoint. An orchestrator that closes after sealing results past
its last checkpoint leaves them there: the server keeps them in memory, and every other run's
checkpoint on that server waits for them and fails (``CheckpointFailed``, the attempts listed
``"foreign": True``). :func:`held_at_close` words the warning ``close()`` logs: how many, on
which servers, and the ways out.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

logger = logging.getLogger("rl_gym_actors.orchestrator")


def held_at_close(run_id: str, held: Mapping[str, int], total: int) -> str | None:
    """The warning for ``total`` results sealed since the last checkpoint and held un-ACKed,
    ``held`` of them per server URL; None when nothing is held."""
    servers = {url: n for url, n in sorted(held.items()) if n > 0}
    count = sum(servers.values()) if servers else total
    if count <= 0:
        return None
    where = (
        ", ".join(f"{n} on {url}" for url, n in servers.items())
        if servers
        else "on its Gym servers"
    )
    return (
        f"closing run {run_id!r} with {count} sealed results held un-ACKed on Gym ({where}): "
        f"ack='at_checkpoint' releases them only at a committed checkpoint, so the servers keep "
        f"them and every other run's checkpoint on those servers fails until they are released. "
        f"Call checkpoint() before close() to release them; a later run with the same run_id "
        f"claims them at its checkpoint; another run frees them with "
        f"checkpoint(..., sweep_foreign=True); or use ack='on_seal' so that none are held."
    )


def warn_if_held(run_id: str, held: Mapping[str, int], total: int) -> str | None:
    """Log :func:`held_at_close`'s warning (logger ``rl_gym_actors.orchestrator``), if any."""
    message = held_at_close(run_id, held, total)
    if message is not None:
        logger.warning(message)
    return message
