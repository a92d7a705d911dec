"""A stand-in for NeMo RL's module ``nemo_rl.environments.nemo_gym``, for tests and examples
where NeMo RL itself cannot be installed (it needs GPUs, vLLM and Python 3.13.14+).

Written from what NeMo RL's module does, not from its code: ``spinup_nemo_gym_actor`` moves
the detection knobs out of the user's ``env.nemo_gym`` to the top level of a ``NemoGymConfig``
(everything else stays under ``initial_global_config_dict``), builds a runtime environment for
NeMo Gym's own venv, then creates the actor through the module-level name ``NemoGym`` (looked up
at call time: the seam :func:`rl_gym_actors.integrations.nemo_rl.selection.use_in_nemo_rl` uses),
spins it up and installs the tokenizer. Its own ``NemoGym`` only records that it was made; its
``run_rollouts`` is annotated as NeMo RL main's (3-tuples), which is what the drop-in's
``stream_tuple: auto`` reads.

What NeMo RL main (7ea279ab) does with the stream, for tests: :func:`prepare_rows` is its row
building (each row gets ``_rowidx`` and the sampling settings, and no ``_ng_rollout_id``);
:func:`consume` reads a stream as its consumer does, unpacking exactly three values per row
(``rowidx, result, timing_metrics``) and refusing a repeated or out-of-range ``_rowidx``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncGenerator, Iterable
from typing import Any

import ray

# where NeMo RL would point NeMo Gym's actor: a venv of its own (here: this interpreter)
NEMO_GYM_VENV_PYTHON = sys.executable
TOP_LEVEL_KNOBS = ("invalid_tool_call_patterns", "thinking_tags", "tokenizer_config")


class CodePointTokenizer:
    """A tokenizer stand-in: characters to code points (and back)."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def batch_decode(self, batches: list[list[int]]) -> list[str]:
        return ["".join(map(chr, ids)) for ids in batches]

    def apply_chat_template(
        self, messages: list[dict[str, Any]], tokenize: bool = True
    ) -> list[int] | str:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return self.encode(text) if tokenize else text


@ray.remote(num_cpus=0)
class NemoGym:
    """NeMo RL's own Gym actor, reduced to saying that it is the one that was created."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg

    def kind(self) -> str:
        return "nemo_rl.NemoGym"

    def _spinup(self) -> None:
        return None

    def set_tokenizer(self, tokenizer: Any) -> None:
        return None

    async def run_rollouts(
        self, nemo_gym_examples: list[dict], timer_prefix: str, deduplicate: bool = False
    ) -> AsyncGenerator[tuple[int, dict, dict | None], None]:
        raise RuntimeError("the stand-in of NeMo RL's own NemoGym runs no rollouts")
        yield  # pragma: no cover


def prepare_rows(
    rows: list[dict[str, Any]],
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_tokens: int = 64,
) -> list[dict[str, Any]]:
    """NeMo RL main's row building, in place: sampling settings and ``_rowidx``, no ids."""
    for index, row in enumerate(rows):
        params = row.setdefault("responses_create_params", {})
        params["temperature"] = temperature
        params["top_p"] = top_p
        params["max_output_tokens"] = min(params.get("max_output_tokens") or max_tokens, max_tokens)
        row["_rowidx"] = index
    return rows


def consume(ray_module: Any, stream: Iterable[Any], rows: int, limit: int | None = None) -> dict:
    """Read a drop-in stream as NeMo RL main does: ``rowidx, result, timing = value`` (three
    values, else the ``ValueError`` main raises). Returns ``{rowidx: result}``; stops after
    ``limit`` rows (a trainer that dies mid-stream)."""
    got: dict[int, dict] = {}
    for ref in stream:
        rowidx, result, _timing = ray_module.get(ref)
        if not isinstance(rowidx, int) or not 0 <= rowidx < rows or rowidx in got:
            raise ValueError(f"NeMo-Gym returned a bad or duplicate row index {rowidx!r}")
        got[rowidx] = result
        if limit is not None and len(got) >= limit:
            break
    return got


def build_nemo_gym_config(
    env_configs: dict[str, Any],
    base_urls: list[str],
    model_name: str,
    *,
    enable_router_replay: bool = False,
    routed_experts_dtype: str = "int16",
    use_fastokens: bool = False,
) -> dict[str, Any]:
    nemo_gym = dict(env_configs["nemo_gym"])
    top = {key: nemo_gym.pop(key, None) for key in TOP_LEVEL_KNOBS}
    return {
        "model_name": model_name,
        "base_urls": list(base_urls),
        **top,
        "require_routed_experts": enable_router_replay,
        "routed_experts_dtype": routed_experts_dtype,
        "use_fastokens": use_fastokens,
        "initial_global_config_dict": nemo_gym,
    }


def spinup_nemo_gym_actor(
    env_configs: dict[str, Any],
    base_urls: list[str],
    model_name: str,
    *,
    tokenizer: Any,
    enable_router_replay: bool = False,
    routed_experts_dtype: str = "int16",
    use_fastokens: bool = False,
) -> Any:
    cfg = build_nemo_gym_config(
        env_configs,
        base_urls,
        model_name,
        enable_router_replay=enable_router_replay,
        routed_experts_dtype=routed_experts_dtype,
        use_fastokens=use_fastokens,
    )
    options = {
        "runtime_env": {
            "py_executable": NEMO_GYM_VENV_PYTHON,
            "env_vars": {
                "VIRTUAL_ENV": os.path.dirname(os.path.dirname(NEMO_GYM_VENV_PYTHON)),
                "UV_PROJECT_ENVIRONMENT": "nemo-gym-venv",
                "RL_GYM_STAND_IN": "1",
            },
        }
    }
    # @ray.remote's stubs keep the class's own type; the ActorClass it returns has .options
    actor = NemoGym.options(**options).remote(cfg)  # type: ignore[attr-defined]
    ray.get(actor._spinup.remote())
    ray.get(actor.set_tokenizer.remote(tokenizer))
    return actor
