"""A Gym reply as NeMo RL's own post-processing turns it into a training result.

``to_nemo_rl_result(row, reply, tokenizer, settings)`` gives ``{"message_log",
"input_message_log", "full_result"}`` with the semantics of NeMo RL's ``NemoGym`` actor:

- Every output item of ``reply["response"]["output"]`` with non-empty ``generation_token_ids``
  is one model turn: a user message with the prompt tokens not seen before, then an assistant
  message with ``token_ids``, ``generation_logprobs`` and the flags GRPO's advantages read,
  ``is_invalid_tool_call`` (a tool-call pattern in the turn's text: the call was never executed)
  and ``has_malformed_thinking`` (a thinking tag in a final answer, or one repeated in a reasoning
  summary). Both messages have empty ``content``. A turn's prompt must extend every token seen.
- The token arrays leave the output items (they live in the message log); each turn's item
  gains ``prompt_str`` and ``generation_str``, decoded with the tokenizer's ``batch_decode``.
- ``routed_experts`` (nested lists ``[tokens][layers][topk]`` or the ``nrlre1`` base64 envelope)
  are split over the turn's two messages; each turn's prefill fixes the previous turn's last
  route. Missing while ``require_routed_experts``: :class:`MissingGenerationData`.
- No turn at all: :class:`MissingGenerationData` (a ``ValueError``), unless ``untrained`` is
  ``"tokenize"``: then the row's input goes through the chat template and the reply's text
  through ``encode``, with logprobs 0.0 (for agents that do not sample a policy, e.g. tests).
- A NaN logprob: :class:`NanLogprobs` (a ``RuntimeError``).

Both errors are data failures to NeMo RL (not infrastructure: a re-dispatch fails the same
way). Nothing here imports NeMo RL, torch or Ray; ``tensor(values, dtype)`` builds containers.
"""

from __future__ import annotations

import array
import base64
import copy
import math
from collections.abc import Callable, Mapping
from typing import Any

from rl_gym_actors.integrations.nemo_rl.config import NemoRLSettings
from rl_gym_actors.integrations.nemo_rl.rows import RolloutDataError

INVALID_TOOL_CALL_PATTERNS = ("<tool_call>", "</tool_call>", "<function_call>", "</function_call>")
THINKING_TAGS = ("<think>", "</think>")
TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
ROUTES_ENVELOPE = "nrlre1"
_TYPECODES = {"int8": "b", "int16": "h", "int32": "i"}

Tensor = Callable[..., Any]  # tensor(values, dtype=None | "float" | "int8" | ...)


class MissingGenerationData(RolloutDataError, ValueError):
    """The reply has no trainable turn (or lacks the routed experts required)."""


class NanLogprobs(RolloutDataError, RuntimeError):
    """A generation logprob is NaN."""


def list_tensor(values: list, dtype: str | None = None) -> list:
    return values


def torch_tensor() -> Tensor | None:
    try:
        import torch
    except ImportError:
        return None

    def make(values: list, dtype: str | None = None) -> Any:
        kind = torch.float32 if dtype == "float" else getattr(torch, dtype or "int64")
        return torch.tensor(values, dtype=kind)

    return make


def detect_flags(
    item: Mapping[str, Any], patterns: list[str] | None = None, tags: list[str] | None = None
) -> tuple[bool, bool]:
    """``(is_invalid_tool_call, has_malformed_thinking)`` of a turn's last output item."""
    patterns = patterns or list(INVALID_TOOL_CALL_PATTERNS)
    tags = tags or list(THINKING_TAGS)
    text = _first_text(item.get("content"))
    if text is not None:
        return any(p in text for p in patterns), any(t in text for t in tags)
    summary = _first_text(item.get("summary")) if item.get("type") == "reasoning" else None
    if summary is not None:
        return any(p in summary for p in patterns), any(summary.count(t) > 1 for t in tags)
    return False, False


def _first_text(parts: Any) -> str | None:
    if (
        isinstance(parts, list)
        and parts
        and isinstance(parts[0], Mapping)
        and isinstance(parts[0].get("text"), str)
    ):
        return parts[0]["text"]
    return None


def decode_routes(raw: Any) -> list:
    """Routed experts as nested lists ``[tokens][layers][topk]``; ValueError on another shape."""
    if isinstance(raw, str):
        magic, _, rest = raw.partition(":")
        dtype, _, rest = rest.partition(":")
        shape, _, data = rest.partition(":")
        dims = [int(d) for d in shape.split("x")] if shape else []
        if magic != ROUTES_ENVELOPE or dtype not in _TYPECODES or len(dims) != 3:
            raise MissingGenerationData("routed_experts is not a valid nrlre1 envelope")
        flat = array.array(_TYPECODES[dtype])
        flat.frombytes(base64.b64decode(data))
        tokens, layers, topk = dims
        if len(flat) != tokens * layers * topk:
            raise MissingGenerationData("routed_experts envelope size does not match its shape")
        per = layers * topk
        raw = [
            [list(flat[t * per + j * topk : t * per + (j + 1) * topk]) for j in range(layers)]
            for t in range(tokens)
        ]
    if not (
        isinstance(raw, list)
        and all(isinstance(t, list) and all(isinstance(layer, list) for layer in t) for t in raw)
    ):
        raise MissingGenerationData("routed_experts must have shape [tokens, layers, topk]")
    return raw


def to_nemo_rl_result(
    row: Mapping[str, Any],
    reply: Any,
    tokenizer: Any,
    *,
    settings: NemoRLSettings = NemoRLSettings(),
    tensor: Tensor = list_tensor,
    untrained: str = "error",
) -> dict[str, Any]:
    """See the module docstring."""
    full_result = copy.deepcopy(dict(_object(reply)))
    full_result["reward"] = _reward(full_result)
    response = full_result.get("response")
    output = response.get("output") if isinstance(response, Mapping) else None
    messages: list[dict[str, Any]] = []
    turns: list[tuple[dict[str, Any], list[int], list[int]]] = []
    seen: list[int] = []
    for item in output if isinstance(output, list) else []:
        if not isinstance(item, dict) or not item.get("generation_token_ids"):
            continue
        prompt = list(item.pop("prompt_token_ids", None) or [])
        generated = list(item.pop("generation_token_ids"))
        logprobs = [float(x) for x in item.pop("generation_log_probs", None) or []]
        if len(logprobs) != len(generated):
            raise MissingGenerationData(
                f"{len(logprobs)} logprobs for {len(generated)} generated tokens"
            )
        if prompt[: len(seen)] != seen:
            raise RolloutDataError(
                "non-contiguous turns: a prompt does not extend the tokens "
                "seen so far (tokenization or truncated history)"
            )
        routes = _routes(item.pop("routed_experts", None), len(prompt) + len(generated), settings)
        if routes is not None and seen and "routed_experts" in messages[-1]:
            messages[-1]["routed_experts"][-1] = tensor(
                routes[len(seen) - 1], settings.routed_experts_dtype
            )
        user = {"role": "user", "content": "", "token_ids": tensor(prompt[len(seen) :])}
        invalid, malformed = detect_flags(
            item, settings.invalid_tool_call_patterns, settings.thinking_tags
        )
        assistant = {
            "role": "assistant",
            "content": "",
            "token_ids": tensor(generated),
            "generation_logprobs": tensor(logprobs, "float"),
            "is_invalid_tool_call": invalid,
            "has_malformed_thinking": malformed,
        }
        if routes is not None:
            dtype = settings.routed_experts_dtype
            user["routed_experts"] = tensor(routes[len(seen) : len(prompt)], dtype)
            assistant["routed_experts"] = tensor(
                routes[len(prompt) : len(prompt) + len(generated)], dtype
            )
        messages += [user, assistant]
        seen = prompt + generated
        turns.append((item, prompt, generated))
        if any(math.isnan(x) for x in logprobs):
            raise NanLogprobs("Generation logprobs contain NaN")
    if turns:
        decode = tokenizer.batch_decode
        for (item, _, _), p, g in zip(
            turns,
            decode([t[1] for t in turns]),
            decode([t[2] for t in turns]),
            strict=True,
        ):
            item["prompt_str"], item["generation_str"] = p, g
    elif untrained == "tokenize":
        messages = _tokenized(row, full_result, tokenizer, tensor)
    else:
        kinds = [o.get("type") for o in output or [] if isinstance(o, Mapping)]
        raise MissingGenerationData(
            f"the Gym reply has no generation data (output item types: {kinds}): the first "
            f"prompt may exceed the model's context, or no turn produced assistant tokens"
        )
    return {"message_log": messages, "input_message_log": messages[:1], "full_result": full_result}


def _routes(raw: Any, needed: int, settings: NemoRLSettings) -> list | None:
    if raw is None:
        if settings.require_routed_experts:
            raise MissingGenerationData(
                "require_routed_experts is set but an output item carries no routed_experts"
            )
        return None
    routes = decode_routes(raw)
    if len(routes) < needed:
        raise MissingGenerationData(
            f"routed_experts has {len(routes)} rows, a turn needs at least {needed}"
        )
    return routes


def _object(reply: Any) -> Mapping[str, Any]:
    if not isinstance(reply, Mapping):
        raise RolloutDataError(f"Gym reply is not an object: {type(reply).__name__}")
    return reply


def _reward(reply: Mapping[str, Any]) -> float:
    value = reply.get("reward")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RolloutDataError(f"Gym reply has no reward: {value!r}")
    return float(value)


# ---------------------------------------------------------------- untrained agents (opt-in)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            _text_of(part.get("text", "")) if isinstance(part, Mapping) else str(part)
            for part in content
        )
    return "" if content is None else str(content)


def input_messages(
    row: Mapping[str, Any], reply: Mapping[str, Any] | None = None
) -> list[dict[str, str]]:
    """The row's input as ``[{"role", "content"}]`` (``responses_create_params.input``)."""
    params = row.get("responses_create_params")
    if not isinstance(params, Mapping) and reply is not None:
        params = reply.get("responses_create_params")
    raw = (params if isinstance(params, Mapping) else {}).get("input", row.get("prompt", ""))
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    return [
        {"role": str(m.get("role", "user")), "content": _text_of(m.get("content"))}
        for m in raw
        if isinstance(m, Mapping)
    ]


def _tokenized(
    row: Mapping[str, Any], reply: Mapping[str, Any], tokenizer: Any, tensor: Tensor
) -> list[dict[str, Any]]:
    prompt_ids = list(tokenizer.apply_chat_template(input_messages(row, reply), tokenize=True))
    response = reply.get("response")
    text = ""
    if isinstance(response, Mapping):
        text = "".join(
            _text_of(o.get("content"))
            for o in response.get("output") or []
            if isinstance(o, Mapping) and o.get("type", "message") == "message"
        )
    if not text:
        output_text = reply.get("output_text")
        text = output_text if isinstance(output_text, str) else ""
    generated = list(tokenizer.encode(text)) if text else []
    return [
        {"role": "user", "content": "", "token_ids": tensor(prompt_ids)},
        {
            "role": "assistant",
            "content": "",
            "token_ids": tensor(generated),
            "generation_logprobs": tensor([0.0] * len(generated), "float"),
            "is_invalid_tool_call": False,
            "has_malformed_thinking": False,
        },
    ]
