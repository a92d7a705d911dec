"""Nothing released unrecorded (issue 27): before the agent-checkpoint gate ACKs, every result it
is about to release that the checkpoint's part does not hold is read back from Gym and added to
the part.

The orchestrator writes its part when ``checkpoint()`` starts, from what it holds then, and tells
the gate which results that part holds (``recorded``: rollout id and try). Rows still running at
that moment finish while the gate waits for them, and the gate's phase 1 holds their completed
results with the others. Before the release, :func:`unrecorded_results` replays ``/run`` for each
held key of this run that the part lacks (a completed, un-ACKed key answers its stored reply;
the agent does not run: on a real Gym too, whose answer carries no replay header) and checks
the reply against the digest Gym's listing or the rollout's seal named. The gate writes those
outcomes into the part's ``undelivered`` together with the handed-over tries it adopts, all
before the first ACK: a trainer restored from this checkpoint that sends those rows again gets
their results, not ``forgotten_rollout``. A key that cannot be read back (no answer, a reply that
does not match) fails the checkpoint before anything is released; its result reaches the
orchestrator meanwhile, and the next checkpoint's part holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence, Set

from rl_gym_actors.actors.gate_endpoint import EndpointTally
from rl_gym_actors.actors.handover import replay_receipt
from rl_gym_actors.core.attempt_book import AttemptBook
from rl_gym_actors.core.prepare_plan import Step
from rl_gym_actors.core.rollout.events import Seal, outcome_of
from rl_gym_actors.errors import RlGymError, StaleAttempt
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.listing import receipt_digest
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.protocol import result_digest

logger = logging.getLogger(__name__)

CONCURRENCY = 16
REASON = "finished while its checkpoint waited; read back from Gym before the release"


class NotRecorded(Exception):
    """A result the release would let go of could not be read back (``key``, ``why``)."""

    def __init__(self, key: tuple[str, int], why: str) -> None:
        self.key, self.why = key, why
        super().__init__(f"{key[0]}/{key[1]}: {why}")


def to_record(
    tallies: Sequence[EndpointTally],
    recorded: Set[tuple[str, int]],
    own: Callable[[str], bool] | None,
    skip: Set[tuple[str, int]] = frozenset(),
) -> list[tuple[int, Step]]:
    """The held steps (by tally index) whose results the part lacks: this run's (``own``; None:
    every one), not in ``recorded`` and not in ``skip`` (handed-over tries, adopted apart)."""
    return [
        (i, s)
        for i, t in enumerate(tallies)
        for s in t.held
        if s.key not in recorded and s.key not in skip and (own is None or own(s.rollout_id))
    ]


async def unrecorded_results(
    book: AttemptBook,
    tallies: Sequence[EndpointTally],
    clients: Sequence[GymClient],
    steps: Sequence[tuple[int, Step]],
    deadline_ts: float,
) -> list[Outcome]:
    """Read back the results of ``steps`` (see the module docstring); raises NotRecorded for the
    first that cannot be. A key Gym no longer holds completed (ACKed by its owner meanwhile,
    ``ack="on_seal"``) is not the gate's to release and is left out."""
    limit = asyncio.Semaphore(CONCURRENCY)

    async def read(index: int, step: Step) -> Outcome | None:
        tally, client = tallies[index], clients[index]
        async with limit:
            try:
                got = await client.replay(
                    {},  # a completed key's stored reply is answered by its key alone
                    rollout_id=step.rollout_id,
                    attempt_index=step.attempt_index,
                    deadline_ts=deadline_ts,
                )
            except StaleAttempt:
                return None
            except RlGymError as exc:
                raise NotRecorded(step.key, f"{type(exc).__name__}: {exc}") from exc
        receipt = replay_receipt(got, step)
        expected = book.sealed_digest(*step.key)
        if expected is None and step.receipt is not None:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                expected = receipt_digest(step.receipt)
        if expected is not None and result_digest(got.reply) != expected:
            raise NotRecorded(step.key, "the reply read back does not match its digest")
        seal = Seal(step.attempt_index, got.reply, receipt, adopted=False)
        return outcome_of(
            step.rollout_id,
            "sealed",
            seal,
            step.attempt_index,
            acked=False,
            tries=0,
            endpoint=tally.endpoint.url,
            reason=None,
            failure=None,
        )

    answers = await asyncio.gather(*(read(i, s) for i, s in steps))
    outcomes = [o for o in answers if o is not None]
    if outcomes:
        logger.info("recording %d result(s) that finished while the gate waited", len(outcomes))
    return outcomes
