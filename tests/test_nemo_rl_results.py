"""Gym replies become NeMo RL results with NeMo RL's own semantics. The replies are written
here in the shapes NeMo Gym returns for training: ``response.output`` items, the last item of
each model call carrying ``prompt_token_ids`` / ``generation_token_ids`` /
``generation_log_probs`` (and ``routed_experts`` under router replay)."""

from __future__ import annotations

import array
import base64
import math
import pickle

import pytest

from rl_gym_actors.integrations.nemo_rl.config import NemoRLSettings
from rl_gym_actors.integrations.nemo_rl.results import (
    MissingGenerationData,
    NanLogprobs,
    detect_flags,
    to_nemo_rl_result,
)
from rl_gym_actors.integrations.nemo_rl.rows import RolloutDataError
from rl_gym_actors.testing.nemo_rl_stand_in import CodePointTokenizer


def ids(text):
    return [ord(c) for c in text]


def message(text, prompt, generated, logprobs=None, **extra):
    return {
        "type": "message",
        "role": "assistant",
        "id": "msg_1",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
        "prompt_token_ids": ids(prompt),
        "generation_token_ids": ids(generated),
        "generation_log_probs": logprobs if logprobs is not None else [-0.5] * len(generated),
        **extra,
    }


def reply(*output, reward=1.0):
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Q"}]},
        "response": {"id": "resp_1", "object": "response", "output": list(output)},
        "reward": reward,
    }


def two_turns():
    # turn 1: a tool call (no tokens on the function_call item itself), turn 2: the answer
    call = {"type": "function_call", "name": "add", "arguments": "{}", "call_id": "c1"}
    first = message("", "Q", "T", [-0.25])
    first["type"], first["content"] = "reasoning", None
    first["summary"] = [{"type": "summary_text", "text": "<think>plan</think>"}]
    tool_out = {"type": "function_call_output", "call_id": "c1", "output": "3"}
    answer = message("It is 3 <think>oops</think>", "QTR", "A3", [-0.1, -0.2])
    return reply(call, first, tool_out, answer)


def test_turns_split_flags_set_and_strings_decoded_as_nemo_rl_does():
    out = to_nemo_rl_result({"_rowidx": 0}, two_turns(), CodePointTokenizer())
    log = out["message_log"]
    assert [m["role"] for m in log] == ["user", "assistant", "user", "assistant"]
    assert [m["token_ids"] for m in log] == [ids("Q"), ids("T"), ids("R"), ids("A3")]
    assert log[3]["generation_logprobs"] == [-0.1, -0.2]
    assert all(m["content"] == "" for m in log)
    # a single think pair in a reasoning summary is fine, any tag in a final answer is not
    assert (log[1]["is_invalid_tool_call"], log[1]["has_malformed_thinking"]) == (False, False)
    assert (log[3]["is_invalid_tool_call"], log[3]["has_malformed_thinking"]) == (False, True)
    assert out["input_message_log"] == log[:1]
    items = out["full_result"]["response"]["output"]
    assert (items[1]["prompt_str"], items[1]["generation_str"]) == ("Q", "T")
    assert (items[3]["prompt_str"], items[3]["generation_str"]) == ("QTR", "A3")
    assert not any(
        k in item for item in items for k in ("prompt_token_ids", "generation_token_ids")
    )
    assert out["full_result"]["reward"] == 1.0


def test_detection_uses_the_configured_patterns_and_tags():
    item = {"content": [{"text": "call <tool_call>{}</tool_call> [[x]]"}]}
    assert detect_flags(item) == (True, False)
    assert detect_flags(item, patterns=["[[x]]"], tags=["<r>"]) == (True, False)
    assert detect_flags(item, patterns=["nope"], tags=["[["]) == (False, True)
    repeated = {"type": "reasoning", "summary": [{"text": "<think>a</think><think>b"}]}
    assert detect_flags(repeated) == (False, True)
    settings = NemoRLSettings(invalid_tool_call_patterns=["ANSWER:"])
    out = to_nemo_rl_result(
        {}, reply(message("ANSWER: 3", "Q", "x")), CodePointTokenizer(), settings=settings
    )
    assert out["message_log"][1]["is_invalid_tool_call"] is True


@pytest.mark.parametrize(
    "bad",
    [
        reply({"type": "message", "content": [{"type": "output_text", "text": "hi"}]}),
        reply(message("", "Q", "")),  # all-EOS generation stripped to []
        reply(),
    ],
)
def test_a_reply_without_generation_data_is_a_value_error(bad):
    with pytest.raises(MissingGenerationData) as raised:
        to_nemo_rl_result({}, bad, CodePointTokenizer())
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, RolloutDataError)
    assert "no generation data" in str(raised.value)
    again = pickle.loads(pickle.dumps(raised.value))  # crosses Ray as it is
    assert type(again) is MissingGenerationData


def test_untrained_replies_can_be_tokenized_by_choice():
    plain = reply({"type": "message", "content": [{"type": "output_text", "text": "ok"}]})
    out = to_nemo_rl_result(
        {"responses_create_params": {"input": "hi"}},
        plain,
        CodePointTokenizer(),
        untrained="tokenize",
    )
    assert out["message_log"][0]["token_ids"] == ids("<user>hi")
    assert out["message_log"][1]["token_ids"] == ids("ok")
    assert out["message_log"][1]["generation_logprobs"] == [0.0, 0.0]


def test_nan_logprobs_are_a_runtime_error():
    with pytest.raises(NanLogprobs) as raised:
        to_nemo_rl_result(
            {}, reply(message("x", "Q", "ab", [-0.1, math.nan])), CodePointTokenizer()
        )
    assert isinstance(raised.value, RuntimeError)


def test_non_contiguous_turns_are_a_data_failure():
    bad = reply(message("a", "Q", "T"), message("b", "XTR", "A"))
    with pytest.raises(RolloutDataError, match="non-contiguous"):
        to_nemo_rl_result({}, bad, CodePointTokenizer())


def envelope(rows, dtype="int16"):
    flat = array.array(
        {"int8": "b", "int16": "h", "int32": "i"}[dtype],
        [v for token in rows for layer in token for v in layer],
    )
    shape = f"{len(rows)}x{len(rows[0])}x{len(rows[0][0])}"
    return f"nrlre1:{dtype}:{shape}:{base64.b64encode(flat.tobytes()).decode()}"


@pytest.mark.parametrize("encode", [lambda r: r, envelope])
def test_routed_experts_are_split_per_message_and_the_prefill_fixes_the_last_route(encode):
    turn1 = [[[t, t + 1]] for t in range(3)]  # Q + "TU": 3 tokens, 1 layer, top-2
    turn2 = [[[10 * t, 1]] for t in range(5)]  # QTU + R + A: 5 tokens
    r = reply(
        message("a", "Q", "TU", routed_experts=encode(turn1)),
        message("b", "QTUR", "A", routed_experts=encode(turn2)),
    )
    log = to_nemo_rl_result(
        {}, r, CodePointTokenizer(), settings=NemoRLSettings(require_routed_experts=True)
    )["message_log"]
    assert log[0]["routed_experts"] == turn1[:1]
    assert log[1]["routed_experts"] == [turn1[1], turn2[2]]  # last route from the prefill
    assert log[2]["routed_experts"] == turn2[3:4] and log[3]["routed_experts"] == turn2[4:]
    with pytest.raises(MissingGenerationData, match="routed_experts"):
        to_nemo_rl_result(
            {},
            reply(message("a", "Q", "T")),
            CodePointTokenizer(),
            settings=NemoRLSettings(require_routed_experts=True),
        )
    with pytest.raises(MissingGenerationData, match="rows"):
        to_nemo_rl_result(
            {},
            reply(message("a", "Q", "TU", routed_experts=encode(turn1[:2]))),
            CodePointTokenizer(),
        )
