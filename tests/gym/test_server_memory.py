"""What the agent-checkpoint participant keeps per rollout stays bounded (issue 30, item 5): the
start time status's ``age_seconds`` reads is kept for the keys a status lists, not for every
key the server ever ran (200,000 rollouts had grown the server's RSS by 322 B each)."""

from __future__ import annotations

import asyncio

from rl_gym_actors.gym.agent_checkpoint.participant import Participant
from rl_gym_actors.gym.agents import make_agent
from rl_gym_actors.protocol import CompletionReceipt

ROLLOUTS = 1_500
SLACK = 1_024  # the start times of released keys kept at most (participant._SINCE_SLACK)


async def _run(participant: Participant, i: int) -> CompletionReceipt:
    answer = await participant.run((f"m-{i}", 0), {"reward": 1.0})
    return CompletionReceipt.model_validate_json(answer.receipt)


async def _runs(participant: Participant, start: int, stop: int, *, ack: bool) -> list:
    """Rollouts ``start`` to ``stop``, 100 at a time; each ACKed at once when ``ack``."""
    held: list[CompletionReceipt] = []
    for first in range(start, stop, 100):
        receipts = await asyncio.gather(
            *(_run(participant, i) for i in range(first, min(first + 100, stop)))
        )
        if ack:
            await participant.acknowledge_batch(receipts)
        else:
            held.extend(receipts)
    return held


async def test_start_times_of_released_keys_are_dropped_without_a_checkpoint() -> None:
    participant = Participant(make_agent("simulated"))
    # ack="immediate": each result ACKed at once, no checkpoint ever
    await _runs(participant, 0, ROLLOUTS, ack=True)
    assert participant.core.active() == []
    kept = len(participant._since)
    assert kept <= SLACK + 1, kept  # was 1,500: one per key ever run


async def test_keys_a_status_lists_keep_their_start_times() -> None:
    participant = Participant(make_agent("simulated"))
    held = await _runs(participant, 0, ROLLOUTS, ack=False)  # completed, not ACKed yet
    await participant.acknowledge_batch(held[:-10])
    # more runs: the start times of the keys released meanwhile are dropped
    await _runs(participant, ROLLOUTS, 2 * ROLLOUTS, ack=True)
    listed = [e.key for e in participant.core.active()]
    assert listed == sorted((r.rollout_id, r.attempt_index) for r in held[-10:])
    assert all(key in participant._since for key in listed)  # age_seconds since its own run
    assert len(participant._since) <= 2 * len(listed) + SLACK + 1
