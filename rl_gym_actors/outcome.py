"""What a rollout hands back to the trainer: one ``Outcome`` per row."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from rl_gym_actors.failures import FailureKind
from rl_gym_actors.protocol import CompletionReceipt

OutcomeStatus = Literal["sealed", "failed", "abandoned"]


class Outcome(BaseModel):
    """The end of one rollout.

    ``status``: ``sealed`` (a result, digest-checked against its receipt; from a server that gives
    no receipt per key, ``receipt`` is None and ``result_digest`` is checked by the checkpoint
    gate against the receipt Gym lists, before it releases the result), ``failed`` (no result;
    ``reason`` says why) or ``abandoned`` (the batch stopped early; when the try had already
    finished on Gym its result was adopted and is kept here all the same).
    ``attempt_index`` is the try the result comes from (or the last try made); ``adopted`` marks
    a result taken from a finished try after retire instead of rerunning it; ``acked`` whether Gym
    released it (when False the ledger releases it at the next checkpoint); ``tries`` counts the
    fresh ``/run`` dispatches this rollout made. ``failure`` is the kind of what ``reason``
    says (None when there is no reason): read it, never the reason's text, to decide what to do
    (``failure.is_transport``: infrastructure, re-dispatch; ``failure.is_data``: the row's own).
    ``repeated``: the rollout id had sealed before in this run and was sent again; this is that
    same sealed result, handed back without an agent run: not a new result (count it once).
    """

    model_config = ConfigDict(frozen=True)

    rollout_id: str
    status: OutcomeStatus
    attempt_index: int | None = None
    reply: Any = None
    reward: float | None = None
    receipt: CompletionReceipt | None = None
    result_digest: str | None = None  # the sealed reply's; set also while its receipt is deferred
    adopted: bool = False
    acked: bool = False
    tries: int = 0
    endpoint: str = ""
    reason: str | None = None
    failure: FailureKind | None = None
    repeated: bool = False

    @property
    def has_result(self) -> bool:
        """True when the outcome carries a sealed reply (also for an abandoned, adopted one; also
        when its receipt is deferred to the checkpoint: ``receipt`` is then None)."""
        return self.receipt is not None or self.result_digest is not None


def reward_of(reply: Any) -> float | None:
    """The reply's numeric ``reward`` field, if any."""
    if isinstance(reply, dict):
        value = reply.get("reward")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None
