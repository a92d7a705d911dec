"""Free Gym of a dead trainer's checkpoint from the driver, before the ledger is up.

A trainer restored with ``restore_from=`` knows the checkpoint ids its dead predecessor may have
left holding Gym (:func:`~rl_gym_actors.checkpoint_part.own_open_ids`). The ledger actor
resumes them at start (``LedgerActor.clear_own_checkpoints``), but only once Ray has started
it: a new worker process, seconds on a loaded machine, during which Gym refuses work.
:func:`clear_own_directly` resumes them first, with clients of the driver's own (freeing Gym needs
no book, as :func:`~rl_gym_actors.actors.checkpoint_abort.abort_with_own_clients` says); the
ledger's clear then finds them resumed and takes the ids as its own. :func:`own_holder` is the
one rule of what is this run's, for both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from rl_gym_actors.actors.checkpoint_abort import EndpointAbort
from rl_gym_actors.actors.gate_select import GateSelect
from rl_gym_actors.config import GymEndpoint, restore_prefix
from rl_gym_actors.gym.agent_checkpoint.client import GymClient


def own_holder(checkpoint_ids: Iterable[str], run_id: str | None) -> Callable[[str], bool]:
    """Whether a checkpoint id holding a server is this run's: one of ``checkpoint_ids``, or a
    v2 restore id of the run (:func:`~rl_gym_actors.config.restore_prefix`)."""
    ids = frozenset(checkpoint_ids)
    prefix = restore_prefix(run_id) if run_id is not None else None

    def own(holder: str) -> bool:
        return holder in ids or (prefix is not None and holder.startswith(prefix))

    return own


async def clear_own_directly(
    endpoints: Sequence[GymEndpoint],
    checkpoint_ids: Sequence[str],
    run_id: str | None,
    deadline_ts: float,
) -> list[EndpointAbort]:
    """Resume, on every server, the id holding it when it is this run's (see
    :meth:`GateSelect.clear_own`), with clients made for the call. One entry per server an own
    id held; a server that cannot be asked is skipped (the ledger's clear asks it again)."""
    clients = [GymClient(ep) for ep in endpoints]
    try:
        select = GateSelect(endpoints, clients)
        return await select.clear_own(own_holder(checkpoint_ids, run_id), deadline_ts)
    finally:
        for client in clients:
            await client.close()
