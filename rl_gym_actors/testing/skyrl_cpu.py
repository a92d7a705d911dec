"""SkyRL's real trainers on CPU, for the adapter's tests: a stand-in policy through SkyRL's seams.

Needs SkyRL (``make test-skyrl``'s venv). What is real: SkyRL's ``RayPPOTrainer.train()`` and
``FullyAsyncRayPPOTrainer.train()`` loops, its dataloader and dataset, ``prepare_generator_input``,
``validate_generator_output``, ``convert_to_training_input``, the advantages, ``save_checkpoints``
and ``load_checkpoints`` (``resume_mode=latest``), and the adapter (:class:`GymPPOExp`,
:class:`GymGenerator`, the checkpoint hooks). What stands in for the GPU parts, through the seams
SkyRL gives subclasses: :class:`CpuDispatch` for the workers' dispatch (weights saved and loaded
as a small file per model), ``fwd_logprobs_values_reward`` and ``train_critic_and_policy``
(no model: the step's batch is reported instead), ``_cleanup_old_checkpoints`` (on this node
only), the inference client (no vLLM: the Gym agent is the policy) and a word-level tokenizer
written to disk (no hub).

:func:`policy_agent` is the Gym agent: a reply in NeMo Gym's shape with generated token ids and
logprobs, after ``sleep_s``; it raises for a row with ``fail``. :class:`PolicyAgent` counts its
runs per rollout id (in the test's process, given to a ``GymServerThread``).

Run as ``python -m rl_gym_actors.testing.skyrl_cpu --workdir W --url U --token T --run-id R
[--fully-async] [--ckpt-interval N] [--eval-data F] [--fault on_save:N] [--ray-address A]``: one
trainer incarnation, in the Ray at ``A`` or a local Ray of its own (loopback). It writes the
tokenizer and 12 training prompts (0.5 s agents) into ``W`` unless they are there.
It prints JSON lines: ``{"event": "started"}``, ``{"event": "step", "step", "epoch", "metrics",
"masked"}`` per trained step (``metrics``: the step's ``rlga/*`` rollout metrics), ``{"event":
"eval", "step", "metrics"}`` per evaluation (``--eval-data``: after every step), ``{"event":
"done"}``. ``--fault on_save:N`` SIGKILLs the process right after SkyRL made ``global_step_N``
durable and before the layer's checkpoint (a crash between the two).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import sys
import threading
import types
from collections import Counter
from pathlib import Path
from typing import Any

from rl_gym_actors.protocol import ATTEMPT_INDEX_FIELD, ROLLOUT_ID_FIELD

WORDS = [f"w{i}" for i in range(40)]
SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
GENERATED = 3  # tokens each turn of the stand-in policy generates


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


# ---------------------------------------------------------------- the Gym side (no SkyRL)


def _digest(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


def policy_reply(row: dict[str, Any]) -> dict[str, Any]:
    """A NeMo Gym reply for ``row``: one turn of generated tokens; the reward depends on the
    rollout id (so a group has variance)."""
    rid = str(row.get(ROLLOUT_ID_FIELD))
    seed = _digest(rid)
    tokens = [len(SPECIALS) + (seed >> (4 * i)) % len(WORDS) for i in range(GENERATED)]
    return {
        "id": f"r-{rid}",
        "reward": float(seed % 2),
        "response": {
            "output": [
                {
                    "type": "message",
                    "generation_token_ids": tokens,
                    "generation_log_probs": [-0.25] * GENERATED,
                }
            ]
        },
    }


class PolicyAgentError(RuntimeError):
    """The row asked the stand-in policy to fail."""


class PolicyAgent:
    """The stand-in policy as a Gym agent (async callable), counting runs per rollout id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.starts: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()

    def runs_of(self, rollout_id: str) -> int:
        with self._lock:
            return self.starts[rollout_id]

    def snapshot(self) -> tuple[dict[str, int], dict[str, int]]:
        with self._lock:
            return dict(self.starts), dict(self.finished)

    async def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        rid = str(row.get(ROLLOUT_ID_FIELD))
        _ = row.get(ATTEMPT_INDEX_FIELD, 0)
        with self._lock:
            self.starts[rid] += 1
        sleep_s = float(row.get("sleep_s") or 0.0)
        if sleep_s > 0:
            await asyncio.sleep(sleep_s)
        if row.get("fail"):
            raise PolicyAgentError(f"{rid}: the row asked the policy to fail")
        with self._lock:
            self.finished[rid] += 1
        return policy_reply(row)


async def policy_agent(row: dict[str, Any]) -> dict[str, Any]:
    """The stand-in policy without counting (for a ``gym serve --agent`` subprocess)."""
    return await PolicyAgent()(row)


# ---------------------------------------------------------------- files SkyRL reads


def write_tokenizer(directory: str | os.PathLike[str]) -> str:
    """A word-level tokenizer with a chat template, saved where SkyRL's ``get_tokenizer`` (and
    ``AutoTokenizer.from_pretrained``) reads it. Returns the directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *WORDS, "user", "assistant", ":"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))
    return str(directory)


def write_dataset(
    path: str | os.PathLike[str], prompts: int, *, sleep_s: float, fail: tuple[int, ...] = ()
) -> str:
    """``prompts`` rows of SkyRL's prompt dataset (JSON lines); extra columns reach the Gym row
    (``sleep_s``, ``fail`` for the indexes in ``fail``)."""
    with open(path, "w") as f:
        for i in range(prompts):
            row = {
                "prompt": [{"role": "user", "content": f"{WORDS[i % len(WORDS)]} w1 w2"}],
                "env_class": "rl_gym_actors",
                "sleep_s": sleep_s,
                "fail": i in fail,
            }
            f.write(json.dumps(row) + "\n")
    return str(path)


def write_inputs(workdir: Path, *, prompts: int = 12, sleep_s: float = 0.5) -> None:
    """The tokenizer and the training prompts in ``workdir``, each unless already there (a test
    writes its own first)."""
    workdir.mkdir(parents=True, exist_ok=True)
    if not (workdir / "tokenizer").is_dir():
        write_tokenizer(workdir / "tokenizer")
    if not (workdir / "train.jsonl").is_file():
        write_dataset(workdir / "train.jsonl", prompts, sleep_s=sleep_s)


# ---------------------------------------------------------------- SkyRL's seams (needs SkyRL)


class CpuDispatch:
    """The workers' dispatch without workers: a model's "weights" are a file it saves and loads."""

    def __init__(self) -> None:
        self.loaded: list[str] = []

    async def save_weights_for_sampler(self, *args: Any, **kwargs: Any) -> None:
        return None

    def init_weight_sync_state(self, *args: Any, **kwargs: Any) -> None:
        return None

    def get_timing_metrics(self) -> dict[str, float]:
        return {}

    def get_lcm_dp_size(self) -> int:
        return 1

    def get_node_ids(self) -> list[str]:
        return []

    def empty_cache(self, *args: Any, **kwargs: Any) -> None:
        return None

    def mark_all_offloaded(self, *args: Any, **kwargs: Any) -> None:
        return None

    def finalize_pending_saves(self, *args: Any, **kwargs: Any) -> None:
        return None

    def save_checkpoint(self, model: str, directory: str, tokenizer: Any = None) -> None:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "weights.txt"), "w") as f:
            f.write(model)
            f.flush()
            os.fsync(f.fileno())

    def load_checkpoint(self, model: str, directory: str, **kwargs: Any) -> None:
        if not os.path.isfile(os.path.join(directory, "weights.txt")):
            raise FileNotFoundError(f"no {model} weights in {directory}")
        self.loaded.append(directory)

    def save_hf_model(self, *args: Any, **kwargs: Any) -> None:
        return None


class StubInferenceClient:
    """No inference engine: the Gym agent is the policy."""

    async def sleep(self, *args: Any, **kwargs: Any) -> None:
        return None

    async def wake_up(self, *args: Any, **kwargs: Any) -> None:
        return None


class CpuTrainerMixin:
    """SkyRL's trainer with :class:`CpuDispatch` and no model: each step reports its batch."""

    dispatch: Any
    global_step: int
    all_metrics: dict[str, Any]
    cfg: Any

    def build_models(self, *args: Any, **kwargs: Any) -> None:
        self.dispatch = CpuDispatch()

    def fwd_logprobs_values_reward(self, training_input: Any) -> Any:
        training_input["base_action_log_probs"] = None
        training_input["action_log_probs"] = None
        training_input["values"] = None
        return training_input

    def train_critic_and_policy(self, data: Any) -> dict[str, float]:
        mask = data["loss_mask"]
        masked = int((mask.sum(dim=-1) == 0).sum().item())
        epoch = getattr(self, "epoch", getattr(self, "_current_epoch", None))
        metrics = {k: v for k, v in self.all_metrics.items() if k.startswith("rlga/")}
        say(
            event="step",
            step=self.global_step,
            epoch=epoch,
            rows=int(mask.shape[0]),
            masked=masked,
            metrics=metrics,
        )
        return {"policy_loss": 0.0}

    async def eval(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        metrics = await super().eval(*args, **kwargs)  # type: ignore[misc]
        say(
            event="eval",
            step=self.global_step,
            metrics={k: v for k, v in metrics.items() if k.startswith("eval/")},
        )
        return metrics

    def _cleanup_old_checkpoints(self) -> None:
        from skyrl.train.utils.trainer_utils import cleanup_old_checkpoints

        cleanup_old_checkpoints(self.cfg.trainer.ckpt_path, self.cfg.trainer.max_ckpts_to_keep)


def _fault_at(step: int) -> bool:
    fault = os.environ.get("RLGA_SKYRL_FAULT", "")
    return fault == f"on_save:{step}"


FSDP_WORKERS = "skyrl.backends.skyrl_train.workers.fsdp.fsdp_worker"


def _no_fsdp_workers() -> None:
    """SkyRL's ``_setup_trainer`` imports its FSDP worker classes (which need flash-attn, a GPU
    build) and hands them to ``build_models``; the CPU trainer's ``build_models`` builds none,
    so a module with placeholder classes stands in for that import."""
    if FSDP_WORKERS in sys.modules:
        return
    stub = types.ModuleType(FSDP_WORKERS)
    for name in ("PolicyWorker", "CriticWorker", "RefWorker"):
        setattr(stub, name, type(name, (), {}))
    sys.modules[FSDP_WORKERS] = stub


def cpu_classes() -> tuple[type, type, type]:
    """``(experiment, sync trainer, fully async trainer)`` classes on CPU (imports SkyRL)."""
    _no_fsdp_workers()
    from skyrl.train.dataset import PromptDataset

    from rl_gym_actors.integrations.skyrl.checkpoints import FullyAsyncGymTrainer
    from rl_gym_actors.integrations.skyrl.experiment import GymPPOExp
    from rl_gym_actors.integrations.skyrl.trainer import GymRayPPOTrainer

    class CpuRayPPOTrainer(CpuTrainerMixin, GymRayPPOTrainer):
        def save_checkpoints(self) -> str:
            folder = super().save_checkpoints()
            if _fault_at(self.global_step):  # SkyRL's state durable, the layer's not yet
                os.kill(os.getpid(), signal.SIGKILL)
            return folder

    class CpuFullyAsyncGymTrainer(CpuTrainerMixin, FullyAsyncGymTrainer):
        def save_checkpoints(self) -> str:
            if _fault_at(self.global_step):  # killed once SkyRL's state is durable: the
                # layer's checkpoint call is where this trainer's commit would start
                def killed(*args: Any, **kwargs: Any) -> None:
                    os.kill(os.getpid(), signal.SIGKILL)

                self.generator.orchestrator.checkpoint = killed
            return super().save_checkpoints()

    class CpuGymPPOExp(GymPPOExp):
        sync_trainer_cls = CpuRayPPOTrainer
        fully_async_trainer_cls = CpuFullyAsyncGymTrainer

        def get_train_dataset(self) -> Any:
            return PromptDataset(
                datasets=self.cfg.data.train_data,
                tokenizer=self.tokenizer,
                max_prompt_length=self.cfg.trainer.max_prompt_length,
                num_workers=1,
            )

        def get_eval_dataset(self) -> Any:
            if self.cfg.trainer.eval_interval <= 0 or not self.cfg.data.val_data:
                return None
            return PromptDataset(
                datasets=self.cfg.data.val_data,
                tokenizer=self.tokenizer,
                max_prompt_length=self.cfg.trainer.max_prompt_length,
                num_workers=1,
            )

        def get_inference_client(self) -> Any:
            return StubInferenceClient()

    return CpuGymPPOExp, CpuRayPPOTrainer, CpuFullyAsyncGymTrainer


def overrides(args: argparse.Namespace) -> list[str]:
    """SkyRL config overrides for a small CPU run (12 prompts x 2 samples, 3 steps an epoch)."""
    work = Path(args.workdir)
    out = [
        f"data.train_data=['{work / 'train.jsonl'}']",
        f"trainer.policy.model.path={work / 'tokenizer'}",
        f"trainer.ckpt_path={work / 'ckpt'}",
        f"trainer.export_path={work / 'export'}",
        f"trainer.run_name={args.run_id}",
        "trainer.logger=console",
        "data.dataloader.num_workers=0",  # no worker processes (respawned every epoch)
        f"trainer.epochs={args.epochs}",
        f"trainer.train_batch_size={args.batch}",
        f"trainer.policy_mini_batch_size={args.batch}",
        f"trainer.ckpt_interval={args.ckpt_interval}",
        "trainer.max_ckpts_to_keep=-1",
        "trainer.resume_mode=latest",
        "trainer.hf_save_interval=-1",
        "trainer.max_prompt_length=64",
        "trainer.placement.colocate_all=false",
        "trainer.algorithm.advantage_estimator=grpo",
        "generator.n_samples_per_prompt=2",
        f"generator.rl_gym_actors.endpoints=['{args.url}']",
        f"generator.rl_gym_actors.token={args.token}",
        "generator.rl_gym_actors.rollout_s=60",
        "generator.rl_gym_actors.max_tries=2",
        "generator.rl_gym_actors.checkpoint_deadline_s=60",
    ]
    if args.eval_data:  # an evaluation after every step, one sample per prompt
        out += [
            f"data.val_data=['{args.eval_data}']",
            "trainer.eval_interval=1",
            "trainer.eval_before_train=false",
            "generator.eval_n_samples_per_prompt=1",
        ]
    else:
        out += ["data.val_data=[]", "trainer.eval_interval=-1"]
    if args.fully_async:
        out += [
            "trainer.fully_async.enabled=true",
            # every group of an epoch generated up to two steps ahead of training
            f"trainer.fully_async.num_parallel_generation_workers={3 * args.batch}",
            "trainer.fully_async.max_staleness_steps=2",
            "trainer.algorithm.policy_loss_type=rollout_is",
        ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--ckpt-interval", type=int, default=1)
    parser.add_argument("--eval-data", default="", help="a prompt dataset to evaluate on")
    parser.add_argument("--fully-async", action="store_true")
    parser.add_argument("--fault", default="")
    parser.add_argument("--ray-address", default=None, help="a running Ray (default: a new one)")
    args = parser.parse_args(argv)
    if args.fault:
        os.environ["RLGA_SKYRL_FAULT"] = args.fault

    from rl_gym_actors.actors.runtime import ensure_ray
    from rl_gym_actors.integrations.skyrl.experiment import parse_config

    write_inputs(Path(args.workdir))
    cfg = parse_config(overrides(args))
    ensure_ray(address=args.ray_address)
    exp_cls, _, _ = cpu_classes()
    say(event="started", pid=os.getpid())
    exp_cls(cfg).run()
    say(event="done")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
