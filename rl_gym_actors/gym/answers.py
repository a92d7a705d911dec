"""Gym's HTTP answers -> values or typed errors, and request bodies -> bytes (pure; both protocols).

Coping with a real Gym server (docs/PROTOCOL.md, section 7): FastAPI's default 422 body
``{"detail": [...]}`` -> ``InvalidRequest``; a 401 with ``{"detail": "..."}`` -> ``Unauthorized``;
a 5xx whose body is not a JSON object -> ``ConnectionLost`` carrying the text; on ``/run`` any
5xx is the agent or its server failing (:func:`run_failure`), but for a 503
``too_many_connections`` (``ServerBusy``: refused before the request was read, nothing ran).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from rl_gym_actors.errors import (
    AgentFailed,
    ConfigError,
    ConnectionLost,
    ProtocolViolation,
    RlGymError,
    ServerBusy,
    StaleAttempt,
    gym_error,
)

M = TypeVar("M", bound=BaseModel)

TEXT_LIMIT = 2000  # characters of a non-JSON body kept in an error


@dataclass(frozen=True, slots=True)
class Answer:
    """One HTTP exchange's answer, whatever its status."""

    status: int
    raw: bytes
    url: str
    headers: Mapping[str, str]  # case-insensitive (aiohttp's own)


def body_text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")[:TEXT_LIMIT]


def _validation_summary(items: list[Any]) -> str:
    parts = []
    for item in items:
        if isinstance(item, Mapping):
            loc = ".".join(str(p) for p in item.get("loc", ()) or ())
            parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", item)))
        else:
            parts.append(str(item))
    return "; ".join(parts)


def error_for_response(status: int, raw: bytes, *, url: str = "") -> RlGymError:
    """The typed error for a non-2xx answer (pure).

    ``{"error": {"code", "detail"}}`` maps by code; FastAPI's ``{"detail": "..."}`` and
    ``{"detail": [...]}`` map by status (401 -> Unauthorized, 422 -> InvalidRequest); a 5xx whose
    body is not a JSON object is ``ConnectionLost`` (see the module docstring).
    """
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        if status >= 500:
            return ConnectionLost(
                f"HTTP {status} without a JSON error body: {body_text(raw)!r}", url=url
            )
        return gym_error(status, None, body_text(raw), url=url, body=None)
    err = body.get("error")
    if isinstance(err, Mapping):
        code = err.get("code") if isinstance(err.get("code"), str) else None
        return gym_error(status, code, str(err.get("detail", "")), url=url, body=body)
    detail = body.get("detail")
    if isinstance(detail, list):
        return gym_error(
            status,
            "invalid_request" if status == 422 else None,
            _validation_summary(detail),
            url=url,
            body=body,
        )
    return gym_error(status, None, "" if detail is None else str(detail), url=url, body=body)


# What a real Gym answers the caller of a /run that a retire cancelled: its agent server's
# middleware finds no response from the cancelled handler and Gym's exception middleware sends
# the RuntimeError's repr as a JSON string, with status 500. Our server answers that caller 409
# stale_attempt; this is the one place the real Gym's body is read to mean the same.
RETIRED_RUN_BODY = "RuntimeError('No response returned.')"


def run_failure(
    status: int, raw: bytes, *, url: str = ""
) -> AgentFailed | StaleAttempt | ServerBusy:
    """A 5xx answer to ``/run`` (pure): the agent or its server failed. The text is the error
    body's ``detail``, a JSON string body itself (a real Gym's exception repr), or the plain
    text. A real Gym's answer to a retired run's caller (:data:`RETIRED_RUN_BODY`) is the
    retire's outcome instead: ``StaleAttempt``, as our server says it. A 503
    ``too_many_connections`` is ``ServerBusy``: refused before the request was read, the agent
    never ran."""
    try:
        body = json.loads(raw) if raw else None
    except ValueError:
        body = None
    if body == RETIRED_RUN_BODY:
        return StaleAttempt(
            "the run was retired (a real Gym's 500 for a cancelled run)", status=status, url=url
        )
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, Mapping) and err.get("code") == ServerBusy.code:
        return ServerBusy(str(err.get("detail", "")), status=status, url=url, body=body)
    if isinstance(err, Mapping) and isinstance(err.get("detail"), str):
        text = err["detail"]
    elif isinstance(body, str):
        text = body
    else:
        text = body_text(raw)
    return AgentFailed(
        text[:TEXT_LIMIT], status=status, url=url, body=body if isinstance(body, dict) else None
    )


def json_of(answer: Answer) -> Any:
    try:
        return json.loads(answer.raw)
    except ValueError as exc:
        raise ProtocolViolation(
            f"{answer.url}: HTTP {answer.status} body is not JSON: {body_text(answer.raw)!r}"
        ) from exc


def as_model(model: type[M], data: Any, url: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ProtocolViolation(f"{url}: answer is no {model.__name__}: {exc}") from exc


def model_of(model: type[M], answer: Answer) -> M:
    """A 2xx answer's body as ``model`` in one pass over the bytes (pydantic's own JSON parser,
    no dict in between: a status listing thousands of attempts is the checkpoint's largest
    parse); any other answer, or a body that does not validate, goes the two-step way
    (:func:`ok`, :func:`as_model`), which names what is wrong."""
    if 200 <= answer.status < 300:
        try:
            return model.model_validate_json(answer.raw)
        except ValidationError:
            pass
    return as_model(model, ok(answer), answer.url)


def ok(answer: Answer) -> Any:
    """The JSON of a 2xx answer; the typed error of any other."""
    if not 200 <= answer.status < 300:
        raise error_for_response(answer.status, answer.raw, url=answer.url)
    return json_of(answer)


def build_request(model: type[M], **fields: Any) -> M:
    try:
        return model(**fields)
    except ValidationError as exc:
        raise ConfigError(f"invalid {model.__name__}: {exc}") from exc


def encode(body: Any) -> bytes:
    try:
        return json.dumps(body, separators=(",", ":"), allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"request body is not JSON-serializable: {exc}") from exc
