"""A handed-over try is kept (issue 16): the checkpoint gate adopts finished tries that rollouts
handed to the ledger unsettled, instead of ACKing them as orphans.

A row fails (e.g. Gym's disk was full, so ``/run`` answered 503 although the run completed) and
its rollout actor hands its try to the ledger unsettled (book state RUNNING, the rollout's
current try, released). If Gym then lists that try completed and not ACKed, the gate's phase 1
holds it like any completed result; before the release, :func:`adopt_handed_over` replays
``/run`` for its key (the stored reply; the agent does not run) and returns it as an
:class:`~rl_gym_actors.outcome.Outcome` (status ``abandoned``, ``adopted``). The gate writes
those into the checkpoint part's ``undelivered`` and marks them sealed in the book, all before
the first ACK; the orchestrator keeps them for the rollouts' next rows (no agent run). A replay
that fails leaves the try an orphan, ACKed as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from rl_gym_actors.actors.gate_endpoint import EndpointTally
from rl_gym_actors.core.attempt_book import AttemptBook
from rl_gym_actors.core.attempt_reports import AttemptState
from rl_gym_actors.core.prepare_plan import Step
from rl_gym_actors.core.rollout.events import Seal, outcome_of
from rl_gym_actors.errors import ConfigError, RlGymError
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.listing import receipt_model
from rl_gym_actors.outcome import Outcome

logger = logging.getLogger(__name__)

CONCURRENCY = 16
REASON = "handed over unsettled; its run finished and the checkpoint gate adopted it"


def replay_receipt(got: Any, step: Step) -> Any:
    """The receipt of a replayed held attempt: the replay's own, else the one the listing gave
    (none when that one is malformed)."""
    receipt = got.receipt
    if receipt is None and step.receipt is not None:
        with contextlib.suppress(ValueError):
            receipt = receipt_model(step.receipt)
    return receipt


def handed_over(book: AttemptBook, held: Sequence[Step]) -> list[Step]:
    """The held steps that are tries handed over unsettled: the book knows them as running,
    as their rollout's current try, and their owner let go of the rollout."""
    picks = []
    for step in held:
        view = book.attempt(step.rollout_id, step.attempt_index)
        if (
            view is not None
            and view.state is AttemptState.RUNNING
            and view.current
            and view.released
        ):
            picks.append(step)
    return picks


async def adopt_handed_over(
    book: AttemptBook,
    tallies: Sequence[EndpointTally],
    clients: Sequence[GymClient],
    deadline_ts: float,
) -> list[Outcome]:
    """Replay every handed-over try the tallies hold (see the module docstring); the outcomes
    of those that answered. Changes nothing in the book."""
    limit = asyncio.Semaphore(CONCURRENCY)

    async def replay(tally: EndpointTally, client: GymClient, step: Step) -> Outcome | None:
        async with limit:
            try:
                got = await client.replay(
                    {},  # a completed key's stored reply is answered by its key alone
                    rollout_id=step.rollout_id,
                    attempt_index=step.attempt_index,
                    deadline_ts=deadline_ts,
                )
            except RlGymError as exc:
                logger.warning(
                    "%s: handed-over %s not adopted (ACKed as an orphan): %r",
                    tally.endpoint.label,
                    step.key,
                    exc,
                )
                return None
        if not got.replayed:
            # the server ran it afresh: it did not hold the key completed after all
            logger.warning("%s: handed-over %s was not a replay", tally.endpoint.label, step.key)
            return None
        seal = Seal(step.attempt_index, got.reply, replay_receipt(got, step), adopted=True)
        return outcome_of(
            step.rollout_id,
            "abandoned",
            seal,
            step.attempt_index,
            acked=False,
            tries=0,
            endpoint=tally.endpoint.url,
            reason=REASON,
            failure=None,
        )

    answers = await asyncio.gather(
        *(
            replay(t, c, s)
            for t, c in zip(tallies, clients, strict=True)
            for s in handed_over(book, t.held)
        )
    )
    return [o for o in answers if o is not None]


async def keep_handed_over(
    book: AttemptBook,
    tallies: Sequence[EndpointTally],
    clients: Sequence[GymClient],
    deadline_ts: float,
    write: Callable[[list[Outcome]], int],
    pending: Sequence[Outcome] = (),
    also: Sequence[Outcome] = (),
) -> list[Outcome] | None:
    """Adopt the handed-over tries the tallies hold, ``write`` them, ``pending`` (kept by an
    earlier checkpoint that failed) and ``also`` (results the release lets go of that the part
    lacks, see actors/gate_record.py) into the checkpoint part (in a thread), then mark the
    adopted ones sealed in the book, so the release ACKs only results the part holds. What was
    kept (to hand to the orchestrator: not ``also``, whose rollouts' owners hand them over), or
    None when ``write`` raised ConfigError: every tally then says why and is not ready, the book
    is unchanged (adopted again next time)."""
    adopted = await adopt_handed_over(book, tallies, clients, deadline_ts)
    kept = [*pending, *adopted]
    if not kept and not also:
        return kept
    try:
        await asyncio.to_thread(write, [*kept, *also])
    except ConfigError as exc:
        for t in tallies:
            t.ready = t.held_ready = False
            t.error = f"handed-over results not kept: {exc}"
        return None
    for o in adopted:
        assert o.attempt_index is not None
        book.record(o.endpoint or "", o.rollout_id, o.attempt_index, AttemptState.SEALED)
    logger.info("kept %d handed-over result(s) for their rollouts' next rows", len(kept))
    return kept
