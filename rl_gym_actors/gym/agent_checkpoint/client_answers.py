"""The pure side of :class:`~.client.GymClient`: what ``/run`` answered (:class:`RunResult`), the
answers read beside a body (the (ext) receipt header, a prepare 409's report), and the checks of
the keys and receipts a caller hands in. No I/O."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from rl_gym_actors.errors import ConfigError
from rl_gym_actors.gym.answers import Answer, as_model
from rl_gym_actors.protocol import (
    RECEIPT_HEADER,
    CompletionReceipt,
    StatusReport,
    is_valid_rollout_id,
    result_digest,
)

logger = logging.getLogger(__name__)

PREPARE_INCOMPLETE = "agent_prepare_incomplete"


@dataclass(frozen=True, slots=True)
class RunResult:
    """What ``/run`` answered: the agent's reply (usually a dict), whether the server replayed a
    stored reply (the (ext) ``x-gym-replayed`` header; always False on a server without it), the
    raw bytes of the body, and the completion receipt when the server sent it beside the answer
    (the (ext) ``x-gym-completion-receipt`` header, the receipt's JSON; None without it, or when
    it is no receipt: then it is fetched as from any server)."""

    reply: Any
    replayed: bool
    raw: bytes = field(repr=False)
    receipt: CompletionReceipt | None = None

    @property
    def digest(self) -> str:
        """The reply's canonical digest, to compare with a receipt's ``result_digest``."""
        return result_digest(self.reply)


@dataclass(frozen=True, slots=True)
class Incomplete:
    report: StatusReport | None  # None: the 409 carried counts only


class _PrepareRefusal(BaseModel):
    """A prepare 409's body, read in one pass (its report lists every attempt left)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    error: dict[str, Any]
    report: StatusReport | None = None


def prepare_incomplete(answer: Answer) -> Incomplete | None:
    """A prepare 409 ``agent_prepare_incomplete`` as a value; None for any other answer."""
    try:
        refusal = _PrepareRefusal.model_validate_json(answer.raw)
    except ValidationError:
        refusal = None  # not this shape: the two-step reading below decides, and names why
    if (
        refusal is not None
        and refusal.report is not None
        and refusal.error.get("code") == PREPARE_INCOMPLETE
    ):
        return Incomplete(refusal.report.model_copy(update={"ready_to_commit": False}))
    try:
        body = json.loads(answer.raw)
    except ValueError:
        return None
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, Mapping) or err.get("code") != PREPARE_INCOMPLETE:
        return None
    if isinstance(body.get("report"), Mapping):
        report = as_model(StatusReport, body["report"], answer.url)
        return Incomplete(report.model_copy(update={"ready_to_commit": False}))
    logger.debug("%s: prepare 409 without a report (%s)", answer.url, err.get("detail"))
    return Incomplete(None)


def header_receipt(answer: Answer) -> CompletionReceipt | None:
    """The (ext) receipt sent beside a 2xx ``/run`` answer; None when absent or malformed (the
    caller then fetches it, as from a server without the header)."""
    header = answer.headers.get(RECEIPT_HEADER)
    if header is None:
        return None
    try:
        return CompletionReceipt.model_validate_json(header)
    except ValidationError:
        logger.warning("%s: ignoring a malformed %s header", answer.url, RECEIPT_HEADER)
        return None


def check_key(rollout_id: str, attempt_index: int) -> None:
    if not is_valid_rollout_id(rollout_id):
        raise ConfigError(f"invalid rollout_id {rollout_id!r}")
    if not isinstance(attempt_index, int) or isinstance(attempt_index, bool) or attempt_index < 0:
        raise ConfigError(f"attempt_index must be an int >= 0, got {attempt_index!r}")


def as_receipt(value: CompletionReceipt | Mapping[str, Any]) -> CompletionReceipt:
    if isinstance(value, CompletionReceipt):
        return value
    try:
        return CompletionReceipt.model_validate(value)
    except ValidationError as exc:
        raise ConfigError(f"invalid completion receipt: {exc}") from exc
