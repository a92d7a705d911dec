"""verl's real v1 trainer loop on CPU, for the adapter's tests and benchmark (verl 0.9.1).

What is verl's own here: the config (``ppo_trainer.yaml`` composed by hydra), the dataset and
its ``StatefulDataLoader``, TransferQueue, ``AgentLoopManagerTQ`` and its ``AgentLoopWorkerTQ``
actors building the agent loop from the packaged loop config, the replay buffer, ``fit()``,
``_save_checkpoint`` / ``_load_checkpoint`` (``resume_mode``) and the checkpoint callback call.
What stands in for the GPUs: :class:`CpuTrainerMixin` replaces ``init()`` (no worker groups, no
LLM servers: a stand-in actor worker group that saves a small file) and ``_step_once``'s model
work (the sampled batch is read back from TransferQueue and logged to ``trained.jsonl``); the
policy is :func:`agent`, a Gym agent (``gym serve --agent rl_gym_actors.testing.verl_cpu:agent``)
that "samples" tokens from the rollout id and logs each start and finish.

Run as a script: ``python -m rl_gym_actors.testing.verl_cpu --workdir W --gym-url U --token T
[--mode rlga_sync|rlga_colocate_async|rlga_separate_async] [--steps N] [--run-id R]
[--rollout-s S]`` (one incarnation of a trainer; kill it with SIGKILL, run it again to resume;
``--rollout-s`` is the layer's deadline of one try, 60 s by default). A new run against the
same Gym server needs a ``--run-id`` of its own (default ``vcpu``): the same id is a resume, and
the rollouts Gym already ACKed under it come back ``forgotten_rollout``.
Two switches let a test pick its kill instants without racing the trainer: ``AGENT_HOLD_ENV`` (in
the Gym server's environment) keeps chosen rollouts running on Gym; in the trainer's,
``SAVE_WHEN_ENV`` holds a step's checkpoint until the test lets it start and
``PAUSE_AFTER_SAVE_ENV`` stops the trainer right after a step's checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import json
import os
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from rl_gym_actors.protocol import ATTEMPT_INDEX_FIELD, ROLLOUT_ID_FIELD
from rl_gym_actors.testing.polling import wait_for

AGENT_LOG_ENV = "RLGA_VERL_AGENT_LOG"
# a JSON list of fnmatch patterns: while this file exists, a rollout whose id matches one waits
# (it has started on Gym and stays running until the file is removed)
AGENT_HOLD_ENV = "RLGA_VERL_AGENT_HOLD"
# a global step: the trainer stops right after that step's checkpoint (verl's and the layer's),
# writes ``paused-<step>`` beside its checkpoint dir and waits there to be killed
PAUSE_AFTER_SAVE_ENV = "RLGA_VERL_PAUSE_AFTER_SAVE"
# ``<step>:<path>``: the trainer starts that step's checkpoint (verl's save, then the layer's) only
# once ``path`` exists, so a test can have chosen sessions running on Gym before the layer's gate
# closes admission (the async modes fetch a step's batch at most ~0.1 s before its save)
SAVE_WHEN_ENV = "RLGA_VERL_SAVE_WHEN"
SAVE_WHEN_LIMIT_S = 3600.0
HOLD_POLL_S = 0.05
VOCAB = 64
PROMPTS = 12


# ---------------------------------------------------------------- the policy (a Gym agent)


def expected_reward(rollout_id: str) -> float:
    """The reward the stand-in policy earns for a rollout (a test compares every trained one)."""
    return (zlib.crc32(rollout_id.encode()) % 1000) / 1000.0


def tokens_for(rollout_id: str, count: int, salt: int) -> list[int]:
    seed = zlib.crc32(f"{rollout_id}:{salt}".encode())
    return [3 + (seed >> (i % 24)) % (VOCAB - 3) for i in range(count)]


def _log(event: str, key: tuple[str, int]) -> None:
    path = os.environ.get(AGENT_LOG_ENV)
    if path:
        line = json.dumps({"event": event, "rid": key[0], "attempt": key[1], "t": time.time()})
        with open(path, "a") as f:
            f.write(line + "\n")


async def agent(row: dict[str, Any]) -> dict[str, Any]:
    """Two model turns in NeMo Gym's reply shape, tokens and reward derived from the rollout id;
    sleeps ``sleep_s`` (a row field, from the dataset's extra_info)."""
    rid = str(row.get(ROLLOUT_ID_FIELD))
    key = (rid, int(row.get(ATTEMPT_INDEX_FIELD, 0)))
    _log("start", key)
    try:
        await asyncio.sleep(float(row.get("sleep_s", 0.0)))
        while _held(rid):
            await asyncio.sleep(HOLD_POLL_S)
    except asyncio.CancelledError:
        _log("cancelled", key)
        raise
    prompt = tokens_for(rid, 6, 0)
    first = tokens_for(rid, 4, 1)
    tool = tokens_for(rid, 2, 2)
    second = tokens_for(rid, 3, 3)
    output = [
        {
            "type": "message",
            "prompt_token_ids": prompt,
            "generation_token_ids": first,
            "generation_log_probs": [-0.5] * len(first),
        },
        {
            "type": "message",
            "prompt_token_ids": prompt + first + tool,
            "generation_token_ids": second,
            "generation_log_probs": [-0.25] * len(second),
        },
    ]
    _log("finish", key)
    return {"id": f"r-{rid}", "response": {"output": output}, "reward": expected_reward(rid)}


def _held(rollout_id: str) -> bool:
    path = os.environ.get(AGENT_HOLD_ENV)
    if not path:
        return False
    try:
        patterns = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return False
    return any(fnmatch.fnmatchcase(rollout_id, str(p)) for p in patterns)


# ---------------------------------------------------------------- files verl reads


def write_model_dir(path: Path) -> Path:
    """A tokenizer and a model config verl's ``HFModelConfig`` loads (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(str(path))
    config = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": VOCAB,
        "n_embd": 8,
        "n_layer": 1,
        "n_head": 1,
        "n_positions": 256,
        "eos_token_id": 1,
        "pad_token_id": 0,
    }
    (path / "config.json").write_text(json.dumps(config))
    return path


def write_dataset(path: Path, prompts: int = PROMPTS, sleep_s: float = 0.5) -> Path:
    import pandas as pd

    rows = [
        {
            "data_source": "rlga",
            "prompt": [{"role": "user", "content": f"w{3 + i % 60} w{4 + i % 59}"}],
            "extra_info": {"index": i, "sleep_s": sleep_s},
        }
        for i in range(prompts)
    ]
    pd.DataFrame(rows).to_parquet(path)
    return path


def compose(overrides: list[str]) -> Any:
    import verl.trainer
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    config_dir = str(Path(verl.trainer.__file__).parent / "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


# what verl's trainer of a mode asserts in its constructor, on CPU. separate_async: a batch is
# parameter_sync_step (4, verl's default) mini-batches, and a standalone rollout pool with GPUs
# and a checkpoint engine other than naive is configured (none is started: init() is stood in)
MODE_OVERRIDES = {
    "rlga_separate_async": [
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",  # batch 4 = 4 x 1
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
    ],
}


def trainer_config(
    workdir: Path,
    endpoints: list[dict[str, str]],
    mode: str,
    steps: int,
    batch: int = 4,
    n: int = 2,
    save_freq: int = 1,
    sleep_s: float = 0.5,
    run_id: str = "vcpu",
    extra: list[str] | None = None,
    loop_config: str | None = None,
    rollout_s: float | None = None,
) -> Any:
    from omegaconf import OmegaConf, open_dict

    from rl_gym_actors.integrations.verl.agent_loop import LOOP_CONFIG

    model = write_model_dir(workdir / "model")
    data = workdir / "train.parquet"
    if not data.exists():
        write_dataset(data, sleep_s=sleep_s)
    overrides = [
        f"data.train_files={data}",
        f"data.val_files={data}",
        f"data.train_batch_size={batch}",
        "data.filter_overlong_prompts=False",
        "data.dataloader_num_workers=0",
        "data.max_prompt_length=64",
        "data.max_response_length=64",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.prompt_length=64",
        "actor_rollout_ref.rollout.response_length=64",
        "actor_rollout_ref.rollout.agent.num_workers=2",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loop_config or LOOP_CONFIG}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=rl_gym_actors",
        "trainer.checkpoint_callback_class="
        "rl_gym_actors.integrations.verl.checkpoints.GymCheckpointCallback",
        f"trainer.v1.trainer_mode={mode}",
        f"trainer.default_local_dir={workdir / 'ckpt'}",
        f"trainer.total_training_steps={steps}",
        f"trainer.save_freq={save_freq}",
        "trainer.resume_mode=auto",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.logger=[console]",
        "trainer.n_gpus_per_node=0",
        "algorithm.adv_estimator=grpo",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=2",
        *MODE_OVERRIDES.get(mode, []),
        *(extra or []),
    ]
    config = compose(overrides)
    with open_dict(config):
        config.rl_gym_actors = {
            "endpoints": endpoints,
            "run_id": run_id,
            **({"rollout_s": rollout_s} if rollout_s else {}),
        }
        config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    return config


# ---------------------------------------------------------------- the trainer's stand-ins


class _StandInWorkerGroup:
    """The actor worker group's checkpoint calls, on CPU: a file per save."""

    def save_checkpoint(self, local_path: str, *args: Any, **kwargs: Any) -> None:
        Path(local_path).mkdir(parents=True, exist_ok=True)
        (Path(local_path) / "weights.json").write_text(json.dumps({"saved": time.time()}))

    def load_checkpoint(self, local_path: str, *args: Any, **kwargs: Any) -> None:
        if not (Path(local_path) / "weights.json").is_file():
            raise FileNotFoundError(local_path)


class _StandInWeights:
    def update_weights(self, *args: Any, **kwargs: Any) -> None:
        return None

    def sleep_replicas(self, *args: Any, **kwargs: Any) -> None:
        return None

    def abort_replicas(self, *args: Any, **kwargs: Any) -> None:
        return None

    def resume_generation_replicas(self, *args: Any, **kwargs: Any) -> None:
        return None


class _NoRewardWorkers:
    # not None: verl then computes no colocated reward (the agent loop's reward is the one used)
    reward_loop_worker_handles: tuple[object, ...] = (object(),)


class CpuTrainerMixin:
    """``init()`` and the model work of ``_step_once`` on CPU (see the module docstring)."""

    def init(self) -> None:
        me: Any = self
        me._init_tokenizer()
        me._init_dataloader()
        me._init_dump_executor()
        me.actor_rollout_wg = _StandInWorkerGroup()
        me.checkpoint_manager = _StandInWeights()
        me.reward_loop_manager = _NoRewardWorkers()
        self._stand_in_mode_parts()
        me.use_critic = False
        me.curr_step_profile = False
        me._load_checkpoint()
        me.on_init_end()

    def _stand_in_mode_parts(self) -> None:
        """What a mode's own ``_setup`` adds (none for sync and colocate_async)."""

    def get_llm_client(self) -> Any:
        return None

    def get_teacher_client(self) -> Any:
        return None

    def get_reward_handles(self) -> Any:
        return None

    def _start_profiling(self) -> None:
        return None

    def _stop_profiling(self) -> None:
        return None

    def _compute_metrics(self, *args: Any, **kwargs: Any) -> None:
        return None

    def _save_checkpoint(self) -> Any:
        me: Any = self
        _wait_to_save(me.global_steps)
        result = super()._save_checkpoint()  # type: ignore[misc]
        pause = os.environ.get(PAUSE_AFTER_SAVE_ENV)
        if pause and int(pause) == me.global_steps:
            marker = Path(me.config.trainer.default_local_dir).parent / f"paused-{pause}"
            marker.write_text("paused")
            threading.Event().wait()  # until SIGKILL
        return result

    def on_step_begin(self) -> None:
        super().on_step_begin()  # type: ignore[misc]
        me: Any = self
        _append(Path(me.config.trainer.default_local_dir).parent / "steps.jsonl", me.global_steps)

    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> Any:
        import transfer_queue as tq

        me: Any = self
        batch, _ = me.replay_buffer.sample(
            global_steps=me.global_steps, partition_id="train", batch_size=sample_batch_size
        )
        tags = zip(batch.keys, batch.tags, strict=True)
        keys = [k for k, tag in tags if not tag.get("is_padding", False)]
        data = tq.kv_batch_get(keys=keys, partition_id="train") if keys else None
        log = Path(me.config.trainer.default_local_dir).parent / "trained.jsonl"
        for i, key in enumerate(keys):
            extra = data["extra_fields"][i] if data is not None else {}
            extra = getattr(extra, "data", extra)
            reward = float(data["rm_scores"][i].sum()) if data is not None else None
            record = {
                "step": me.global_steps,
                "key": key,
                "rid": extra.get("rlga_rollout_id"),
                "reward": reward,
                "adopted": extra.get("rlga_adopted"),
                "repeated": extra.get("rlga_repeated"),
            }
            with open(log, "a") as f:
                f.write(json.dumps(record) + "\n")
        return batch


def _wait_to_save(step: int) -> None:
    """With ``SAVE_WHEN_ENV`` naming ``step``: wait for its file (see the constant)."""
    spec = os.environ.get(SAVE_WHEN_ENV)
    if not spec:
        return
    at, _, path = spec.partition(":")
    if int(at) != step:
        return
    wait_for(
        Path(path).exists,
        timeout_s=SAVE_WHEN_LIMIT_S,
        interval_s=HOLD_POLL_S,
        what=f"{SAVE_WHEN_ENV}'s {path}",
    )


def _append(path: Path, step: int) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"step": step, "t": time.time()}) + "\n")


# the adapter's trainer classes by mode (names in rl_gym_actors.integrations.verl.trainer)
TRAINER_MODES = {
    "rlga_sync": "GymPPOTrainerSync",
    "rlga_colocate_async": "GymPPOTrainerColocateAsync",
    "rlga_separate_async": "GymPPOTrainerSeparateAsync",
}


class _CpuSeparateAsync:
    """separate_async's ``_setup`` parts: the standalone pool's weight sync, stood in, and the
    hybrid engine in trainer mode (where its first step would switch it: nothing to lend)."""

    def _stand_in_mode_parts(self) -> None:
        from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode

        me: Any = self
        me.standalone_checkpoint_manager = _StandInWeights()
        me.current_mode = HybridEngineMode.TRAINER


_MODE_MIXINS: dict[str, tuple[type, ...]] = {"rlga_separate_async": (_CpuSeparateAsync,)}


def trainer_class(mode: str) -> type:
    from rl_gym_actors.integrations.verl import trainer as gym_trainers

    base = getattr(gym_trainers, TRAINER_MODES[mode])
    return type(f"Cpu{base.__name__}", (*_MODE_MIXINS.get(mode, ()), CpuTrainerMixin, base), {})


def run(config: Any) -> None:
    """One trainer incarnation, as verl's ``TaskRunnerV1.run`` does it (in this process)."""
    import transfer_queue as tq
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ

    tq.init(config.transfer_queue)
    try:
        trainer = trainer_class(str(config.trainer.v1.trainer_mode))(config=config)
        trainer.init()
        manager = AgentLoopManagerTQ.create(
            config=config, llm_client=None, teacher_client=None, reward_loop_worker_handles=None
        )
        trainer.fit(manager)
    finally:
        tq.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_gym_actors.testing.verl_cpu")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--gym-url", required=True)
    parser.add_argument("--token", default=None)
    parser.add_argument("--mode", default="rlga_sync", choices=sorted(TRAINER_MODES))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--sleep-s", type=float, default=0.5)
    parser.add_argument("--run-id", default="vcpu", help="the run's id (a new run: a new one)")
    parser.add_argument(
        "--rollout-s",
        type=float,
        default=None,
        help="one try's deadline (the adapter's rollout_s; default: the layer's, 60 s)",
    )
    args = parser.parse_args(argv)
    from rl_gym_actors.actors.runtime import start_local_ray

    workdir = Path(args.workdir)
    endpoint = {"url": args.gym_url, **({"token": args.token} if args.token else {})}
    config = trainer_config(
        workdir,
        [endpoint],
        args.mode,
        args.steps,
        sleep_s=args.sleep_s,
        run_id=args.run_id,
        rollout_s=args.rollout_s,
    )
    start_local_ray(num_cpus=16, include_dashboard=False, log_to_driver=False)
    run(config)
    (workdir / "done").write_text("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
