"""A minimal agent that samples the policy being trained, for the drop-in's own Gym servers
(``servers: [{agent: "rl_gym_actors.integrations.nemo_rl.agent:chat_agent"}]``).

One model call per row: ``POST <base_url>/chat/completions`` on the policy's OpenAI-compatible
server (NeMo RL's vLLM) with the row's ``responses_create_params.input`` as the messages, asking
for token ids and logprobs. The reply has NeMo Gym's training shape: one assistant output item
carrying ``prompt_token_ids`` / ``generation_token_ids`` / ``generation_log_probs`` (when the
server returned them), the request as ``responses_create_params``, and ``reward``: 1.0 when the
row's ``expected_answer`` occurs in the answer, else 0.0 (0.0 with no ``expected_answer``).
A non-2xx answer raises (the run fails; the row comes back to RL as a failure).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from rl_gym_actors.integrations.nemo_rl.results import input_messages
from rl_gym_actors.integrations.nemo_rl.servers import PolicyEndpoint
from rl_gym_actors.protocol import ROLLOUT_ID_FIELD


class PolicyCallFailed(RuntimeError):
    """The policy server answered with an error or with no choice."""


async def chat_agent(row: dict[str, Any], policy: PolicyEndpoint) -> dict[str, Any]:
    url = policy.base_url_for(str(row.get(ROLLOUT_ID_FIELD, ""))) + "/chat/completions"
    params = row.get("responses_create_params")
    params = dict(params) if isinstance(params, Mapping) else {}
    body = {
        "model": policy.model_name,
        "messages": input_messages(row),
        "logprobs": True,
        "return_token_ids": True,
    }
    for key in ("temperature", "top_p", "max_output_tokens"):
        if key in params:
            body["max_tokens" if key == "max_output_tokens" else key] = params[key]
    headers = {"Authorization": f"Bearer {policy.api_key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=headers) as resp,
    ):
        if resp.status != 200:
            raise PolicyCallFailed(
                f"policy {url} answered {resp.status}: {(await resp.text())[:300]}"
            )
        completion = await resp.json()
    choices = completion.get("choices") or []
    if not choices:
        raise PolicyCallFailed(f"policy {url} returned no choice")
    choice = choices[0]
    text = (choice.get("message") or {}).get("content") or ""
    item: dict[str, Any] = {
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    generated = choice.get("token_ids")
    if generated is not None:
        item["prompt_token_ids"] = completion.get("prompt_token_ids") or []
        item["generation_token_ids"] = list(generated)
        item["generation_log_probs"] = [
            entry.get("logprob", 0.0)
            for entry in (choice.get("logprobs") or {}).get("content") or []
        ]
    expected = row.get("expected_answer")
    reward = 1.0 if expected is not None and str(expected) in text else 0.0
    return {
        "id": completion.get("id") or f"r-{row.get(ROLLOUT_ID_FIELD)}",
        "reward": reward,
        "responses_create_params": params,
        "response": {"id": completion.get("id"), "object": "response", "output": [item]},
    }
