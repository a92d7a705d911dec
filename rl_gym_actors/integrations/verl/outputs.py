"""A Gym reply as the fields of verl's ``AgentLoopOutput`` (pure: no verl, torch or Ray).

``output_fields(reply, response_length)`` reads the NeMo Gym reply shape: every item of
``reply["response"]["output"]`` with non-empty ``generation_token_ids`` is one model turn, with
its ``prompt_token_ids`` (the whole context the policy saw) and ``generation_log_probs``.

- ``prompt_ids``: the first turn's prompt.
- ``response_ids``: the turns after it, each as the context tokens it added (tool and user
  tokens: ``response_mask`` 0, logprob 0.0) then its generation (mask 1, its logprobs); cut at
  ``response_length`` as verl's own loops cut theirs.
- ``response_logprobs``: only when every turn carries them (else None: verl recomputes).
- ``reward_score``: the reply's numeric ``reward``; ``num_turns``: 2 per model turn (user and
  assistant, as verl counts); ``extra_fields``: ``reward_extra_info`` (verl copies it between a
  trajectory's outputs) and the rollout's id, status and tries.

A reply that cannot become a sample raises :class:`UnusableReply` (a :class:`GymRolloutFailed`):
no turn, a turn whose prompt does not extend the context, a missing or non-numeric reward, NaN
logprobs. Nothing is filled in: no made-up tokens, no default reward.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rl_gym_actors.failures import FailureKind


class GymRolloutFailed(RuntimeError):
    """A session's rollout has no usable result. Raised from the agent loop's ``run()``: verl
    then marks the prompt's group ``failure`` (its replay buffer keeps the group's other
    sessions and pads this one out in sync mode, or drops the group and fetches another
    prompt with ``sync_refill_failed_groups`` and in the async modes). ``kind`` is the
    layer's :class:`~rl_gym_actors.failures.FailureKind` (None: the reply itself is unusable)."""

    def __init__(self, rollout_id: str, reason: str, kind: FailureKind | None = None) -> None:
        super().__init__(f"rollout {rollout_id}: {reason}")
        self.rollout_id = rollout_id
        self.reason = reason
        self.kind = kind

    def __reduce__(self) -> tuple[Any, ...]:  # crosses Ray with its fields
        return (type(self), (self.rollout_id, self.reason, self.kind))


class UnusableReply(GymRolloutFailed):
    """The rollout sealed a reply that cannot become a verl sample (no turn, no reward, ...)."""

    def __init__(self, rollout_id: str, reason: str, kind: FailureKind | None = None) -> None:
        super().__init__(rollout_id, reason, FailureKind.INVALID_REPLY if kind is None else kind)


def _ints(value: Any, what: str, rollout_id: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise UnusableReply(rollout_id, f"{what} is not a list of token ids")
    return list(value)


def _floats(value: Any, count: int, rollout_id: str) -> list[float] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != count:
        raise UnusableReply(rollout_id, "generation_log_probs does not match the tokens")
    out = [float(v) for v in value]
    if any(math.isnan(v) for v in out):
        raise UnusableReply(rollout_id, "a generation logprob is NaN")
    return out


def turns_of(reply: Any) -> list[Mapping[str, Any]]:
    response = reply.get("response") if isinstance(reply, Mapping) else None
    items = response.get("output") if isinstance(response, Mapping) else None
    if not isinstance(items, list):
        return []
    return [i for i in items if isinstance(i, Mapping) and i.get("generation_token_ids")]


def reward_of(reply: Any, rollout_id: str) -> float:
    value = reply.get("reward") if isinstance(reply, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise UnusableReply(rollout_id, "the reply has no numeric reward")
    return float(value)


def output_fields(
    reply: Any, rollout_id: str, response_length: int | None = None
) -> dict[str, Any]:
    """The ``AgentLoopOutput`` keyword arguments for a sealed reply (see the module docstring);
    ``metrics`` and the layer's own ``extra_fields`` entries are the caller's."""
    turns = turns_of(reply)
    if not turns:
        raise UnusableReply(rollout_id, "the reply has no model turn with generation_token_ids")
    reward = reward_of(reply, rollout_id)
    prompt = _ints(turns[0].get("prompt_token_ids"), "prompt_token_ids", rollout_id)
    seen = list(prompt)
    response: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    have_logprobs = True
    for turn in turns:
        context = _ints(turn.get("prompt_token_ids"), "prompt_token_ids", rollout_id)
        if context[: len(seen)] != seen:
            raise UnusableReply(rollout_id, "a turn's prompt does not extend the tokens before it")
        added = context[len(seen) :]
        generated = _ints(turn.get("generation_token_ids"), "generation_token_ids", rollout_id)
        turn_logprobs = _floats(turn.get("generation_log_probs"), len(generated), rollout_id)
        have_logprobs = have_logprobs and turn_logprobs is not None
        response += added + generated
        mask += [0] * len(added) + [1] * len(generated)
        logprobs += [0.0] * len(added) + (turn_logprobs or [0.0] * len(generated))
        seen = context + generated
    if response_length is not None:
        response, mask, logprobs = (
            response[:response_length],
            mask[:response_length],
            logprobs[:response_length],
        )
    return {
        "prompt_ids": prompt,
        "response_ids": response,
        "response_mask": mask,
        "response_logprobs": logprobs if have_logprobs else None,
        "reward_score": reward,
        "num_turns": 2 * len(turns),
        "extra_fields": {"reward_extra_info": {}},
    }
