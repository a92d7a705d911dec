"""The policy being trained is what the agents call: the drop-in starts its own Gym server at
``_spinup`` from the config NeMo RL builds, and the agent samples the ``base_urls`` /
``model_name`` NeMo RL passed. A small HTTP server on loopback stands in for NeMo RL's vLLM."""

from __future__ import annotations

import asyncio
import threading

import pytest
from aiohttp import web
from test_nemo_rl_dropin import drain, stand_in_tokenizer

from rl_gym_actors.integrations.nemo_rl import NemoGymDropIn
from rl_gym_actors.integrations.nemo_rl.config import ServerSpec
from rl_gym_actors.integrations.nemo_rl.servers import PolicyEndpoint, agent_for
from rl_gym_actors.testing.nemo_rl_stand_in import build_nemo_gym_config

pytestmark = [pytest.mark.ray, pytest.mark.slow]
AGENT = "rl_gym_actors.integrations.nemo_rl.agent:chat_agent"


class VllmStandIn:
    """``POST /v1/chat/completions`` answering "4" with token ids and logprobs, as vLLM's
    OpenAI-compatible server does when asked; every request is recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append((request.path, body))
        prompt = "".join(m["content"] for m in body["messages"])
        return web.json_response(
            {
                "id": f"chatcmpl-{len(self.calls)}",
                "object": "chat.completion",
                "model": body["model"],
                "prompt_token_ids": [ord(c) for c in prompt],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "4"},
                        "token_ids": [ord("4")],
                        "finish_reason": "stop",
                        "logprobs": {"content": [{"token": "4", "logprob": -0.125}]},
                    }
                ],
            }
        )

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completions)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> VllmStandIn:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def question(i, text, expected):
    return {
        "_rowidx": i,
        "agent_ref": {"name": "chat"},
        "expected_answer": expected,
        "responses_create_params": {"input": [{"role": "user", "content": text}]},
    }


def test_agents_sample_the_policy_nemo_rl_passed_through_the_servers_the_drop_in_started(
    ray_session,
):
    with VllmStandIn() as vllm:
        cfg = build_nemo_gym_config(
            {
                "nemo_gym": {
                    "rl_gym_actors": {
                        "servers": [{"agent": AGENT, "name": "chat"}],
                        "pool": {"size": 1, "rollouts_per_actor": 2},
                        "stream_tuple": 4,  # reads the receipt: PR #4093's 4-tuples
                    }
                }
            },
            [f"{vllm.url}/v1"],
            "policy-under-training",
        )
        actor = NemoGymDropIn.remote(cfg)
        try:
            ray_session.get(actor._spinup.remote())
            ray_session.get(actor.set_tokenizer.remote(stand_in_tokenizer()))
            got, error = drain(
                ray_session,
                actor.run_rollouts.options(num_returns="streaming").remote(
                    [question(0, "2+2?", "4"), question(1, "3+3?", "6")], "gym"
                ),
                keep_agent_ref=True,
            )
            assert error is None, error
            assert sorted(path for path, _ in vllm.calls) == ["/v1/chat/completions"] * 2
            assert {body["model"] for _, body in vllm.calls} == {"policy-under-training"}
            assert sorted(body["messages"][0]["content"] for _, body in vllm.calls) == [
                "2+2?",
                "3+3?",
            ]
            by_row = {i: (ref, res) for i, ref, res, _ in got}
            assert by_row[0][0] == {"name": "chat"}
            assert by_row[0][1]["full_result"]["reward"] == 1.0
            assert by_row[1][1]["full_result"]["reward"] == 0.0
            log = by_row[0][1]["message_log"]
            assert log[0]["token_ids"] == [ord(c) for c in "2+2?"]
            assert log[1]["token_ids"] == [ord("4")] and log[1]["generation_logprobs"] == [-0.125]
            receipt = by_row[0][1]["gym_completion_receipt"]
            assert receipt["attempt_index"] == 0 and len(receipt["result_digest"]) == 64
            status = ray_session.get(actor.status.remote())
            assert next(iter(status["gym"].values()))["state"] == "accepting"
        finally:
            ray_session.get(actor.shutdown.remote())
            ray_session.kill(actor)


def sync_agent(row, policy):
    return {"reward": 1.0, "base_url": policy.base_url_for("k"), "model": policy.model_name}


async def test_a_module_function_agent_taking_policy_gets_it_sync_or_async():
    policy = PolicyEndpoint(("http://a/v1", "http://b/v1"), "m")
    agent = agent_for(ServerSpec(agent="test_nemo_rl_policy:sync_agent"), policy)
    reply = await agent({"x": 1})
    assert reply["model"] == "m" and reply["base_url"] in policy.base_urls
    assert agent_for(ServerSpec(agent=AGENT), policy).keywords == {"policy": policy}
    plain = agent_for(ServerSpec(agent="simulated"), policy)
    assert (await plain({"reward": 0.5}))["reward"] == 0.5
