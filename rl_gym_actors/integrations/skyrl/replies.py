"""A Gym reply as one SkyRL trajectory, and a batch of outcomes as SkyRL's ``GeneratorOutput``.

The reply is NeMo Gym's: every item of ``reply["response"]["output"]`` with non-empty
``generation_token_ids`` is one model turn, with its ``prompt_token_ids`` (everything the policy
saw: the first turn's prompt, then each turn's prompt extends every token seen before) and
``generation_log_probs``. :func:`trajectory_from_reply` lays the turns out as SkyRL trains on
them: the first turn's prompt is the trajectory's prompt (the generator's own tokenization of
SkyRL's prompt when the first turn carries none), then for each turn the tokens its prompt adds
(tool and environment output: loss mask 0, logprob 0.0) and the tokens it generated (mask 1,
their logprobs). The reward is the reply's numeric ``reward``; a reply without one is a failure
(no reward is made up). ``stop_reason`` is the reply's, else the last turn's
``finish_reason``, else ``stop``.

A trajectory without a result (the rollout failed, or its reply cannot be trained on) becomes a
masked placeholder (:func:`placeholder`): one response token with loss mask 0, so it adds no
gradient, and ``stop_reason`` ``rlga_<failure code>``. Its reward enters SkyRL's group baseline
all the same, so it is set to the mean reward of the group's trajectories that have a result
(its advantage is then 0 and its siblings' baseline is unchanged), or 0.0 when none has:
:func:`output_from` does that and counts what happened in ``rollout_metrics`` (``rlga/...``).

Nothing here imports SkyRL, torch or Ray: :func:`output_from` returns a plain dict with the keys
of SkyRL's ``GeneratorOutput`` that it fills.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rl_gym_actors.failures import FailureKind
from rl_gym_actors.outcome import Outcome

METRIC_PREFIX = "rlga"
PLACEHOLDER_PREFIX = "rlga_"
MASKED_FRACTION = f"{METRIC_PREFIX}/masked_fraction"
UNTRAINABLE = "untrainable_reply"  # the code of a reply that maps to no trajectory


class UntrainableReply(ValueError):
    """A sealed reply that cannot be trained on (no turn, no reward, inconsistent tokens): the
    trajectory is masked, with ``rlga_untrainable_reply`` as its stop reason."""


@dataclass(frozen=True, slots=True)
class Trajectory:
    """One trajectory as SkyRL trains on it. ``response_ids``, ``loss_mask`` and ``logprobs``
    have one entry per response token."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float
    stop_reason: str
    masked: bool = False  # a placeholder for a trajectory without a result


ReplyMapper = Callable[[Any, list[int]], Trajectory]


def _ints(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise UntrainableReply(f"{what} is not a list of token ids")
    return value


def _floats(value: Any, n: int, what: str) -> list[float]:
    if not isinstance(value, list) or len(value) != n:
        raise UntrainableReply(f"{what} must have one logprob per generated token ({n})")
    out: list[float] = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
            raise UntrainableReply(f"{what} holds {v!r}, not a logprob")
        out.append(float(v))
    return out


def _reward(reply: Mapping[str, Any]) -> float:
    value = reply.get("reward")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise UntrainableReply(f"the reply has no numeric reward (reward={value!r})")
    return float(value)


def trajectory_from_reply(reply: Any, prompt_ids: list[int]) -> Trajectory:
    """The trajectory of a NeMo Gym reply (see the module docstring). ``prompt_ids``: the
    generator's tokenization of SkyRL's prompt, used when the first turn carries no prompt.
    UntrainableReply when the reply has no turn, no reward, or a turn whose prompt does not
    extend the tokens seen before it."""
    if not isinstance(reply, Mapping):
        raise UntrainableReply(f"the reply is a {type(reply).__name__}, not an object")
    response = reply.get("response")
    output = response.get("output") if isinstance(response, Mapping) else None
    turns = [
        item
        for item in (output if isinstance(output, list) else [])
        if isinstance(item, Mapping) and item.get("generation_token_ids")
    ]
    if not turns:
        raise UntrainableReply("the reply has no model turn (no generation_token_ids)")
    reward = _reward(reply)
    prompt: list[int] | None = None
    seen: list[int] = []
    response_ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    for n, turn in enumerate(turns):
        raw_prompt = turn.get("prompt_token_ids")
        if prompt is None:
            prompt = list(prompt_ids) if raw_prompt is None else _ints(raw_prompt, "turn 0 prompt")
            seen = list(prompt)
        elif raw_prompt is not None:
            turn_prompt = _ints(raw_prompt, f"turn {n} prompt")
            if turn_prompt[: len(seen)] != seen:
                raise UntrainableReply(f"turn {n}'s prompt does not extend the tokens before it")
            added = turn_prompt[len(seen) :]
            response_ids += added
            mask += [0] * len(added)
            logprobs += [0.0] * len(added)
            seen = turn_prompt
        generated = _ints(turn.get("generation_token_ids"), f"turn {n} generation")
        response_ids += generated
        mask += [1] * len(generated)
        logprobs += _floats(
            turn.get("generation_log_probs"), len(generated), f"turn {n} generation_log_probs"
        )
        seen = seen + generated
    stop = reply.get("stop_reason") or turns[-1].get("finish_reason") or "stop"
    assert prompt is not None
    return Trajectory(prompt, response_ids, mask, logprobs, reward, str(stop))


def placeholder(prompt_ids: list[int], code: str, pad_id: int, reward: float = 0.0) -> Trajectory:
    """A masked stand-in for a trajectory without a result: one pad token, loss mask 0."""
    return Trajectory(
        list(prompt_ids), [pad_id], [0], [0.0], reward, PLACEHOLDER_PREFIX + code, masked=True
    )


def failure_code(outcome: Outcome) -> str:
    """The code of a failed outcome's failure (``internal_error`` when it names none)."""
    kind = outcome.failure or FailureKind.INTERNAL
    return str(kind.value)


@dataclass(frozen=True, slots=True)
class Mapped:
    """One row's trajectory and what became of its rollout (``kind``: a metric's name)."""

    trajectory: Trajectory
    kind: str
    code: str | None = None  # the failure code of a masked trajectory


def map_outcome(
    outcome: Outcome, prompt_ids: list[int], mapper: ReplyMapper, pad_id: int
) -> Mapped:
    """One outcome as a trajectory (a masked placeholder when it has no usable result)."""
    if outcome.status == "sealed" or (outcome.status == "abandoned" and outcome.has_result):
        try:
            trajectory = mapper(outcome.reply, prompt_ids)
        except UntrainableReply:
            return Mapped(placeholder(prompt_ids, UNTRAINABLE, pad_id), "failed", UNTRAINABLE)
        kind = "repeated" if outcome.repeated else "adopted" if outcome.adopted else "sealed"
        return Mapped(trajectory, kind)
    code = failure_code(outcome)
    kind = "forgotten" if outcome.failure is FailureKind.FORGOTTEN else "failed"
    return Mapped(placeholder(prompt_ids, code, pad_id), kind, code)


def _fill_group_rewards(mapped: list[Mapped], groups: Sequence[str]) -> list[Trajectory]:
    """Placeholders take the mean reward of their group's trajectories that have a result."""
    sums: dict[str, list[float]] = {}
    for m, group in zip(mapped, groups, strict=True):
        if not m.trajectory.masked:
            sums.setdefault(group, []).append(m.trajectory.reward)
    out: list[Trajectory] = []
    for m, group in zip(mapped, groups, strict=True):
        t = m.trajectory
        rewards = sums.get(group)
        if t.masked and rewards:
            t = replace(t, reward=sum(rewards) / len(rewards))
        out.append(t)
    return out


def output_from(
    outcomes: Sequence[Outcome],
    prompt_ids: Sequence[list[int]],
    groups: Sequence[str],
    *,
    pad_id: int,
    mapper: ReplyMapper = trajectory_from_reply,
    trajectory_ids: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """SkyRL's ``GeneratorOutput`` fields for ``outcomes`` (in their order): one trajectory
    each, failed ones masked; ``groups`` are the trajectories' instance ids (a group shares a
    prompt). ``rollout_metrics`` count ``rlga/{sealed,adopted,repeated,failed,forgotten}`` and
    ``rlga/failed/<code>`` per failure code, and ``rlga/masked_fraction``."""
    if not (len(outcomes) == len(prompt_ids) == len(groups)):
        raise ValueError("outcomes, prompt_ids and groups must have one entry per trajectory")
    mapped = [
        map_outcome(o, list(p), mapper, pad_id) for o, p in zip(outcomes, prompt_ids, strict=True)
    ]
    trajectories = _fill_group_rewards(mapped, groups)
    counts: Counter[str] = Counter(m.kind for m in mapped)
    codes: Counter[str] = Counter(m.code for m in mapped if m.code is not None)
    metrics: dict[str, float] = {
        f"{METRIC_PREFIX}/{k}": float(counts.get(k, 0))
        for k in ("sealed", "adopted", "repeated", "failed", "forgotten")
    }
    metrics.update({f"{METRIC_PREFIX}/failed/{c}": float(n) for c, n in sorted(codes.items())})
    masked = sum(1 for t in trajectories if t.masked)
    metrics[MASKED_FRACTION] = masked / len(trajectories) if trajectories else 0.0
    return {
        "prompt_token_ids": [t.prompt_ids for t in trajectories],
        "response_ids": [t.response_ids for t in trajectories],
        "rewards": [t.reward for t in trajectories],
        "loss_masks": [t.loss_mask for t in trajectories],
        "stop_reasons": [t.stop_reason for t in trajectories],
        "rollout_metrics": metrics,
        "rollout_logprobs": [t.logprobs for t in trajectories],
        "trajectory_ids": None if trajectory_ids is None else list(trajectory_ids),
    }
