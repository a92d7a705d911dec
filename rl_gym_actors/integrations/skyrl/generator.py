"""``GymGenerator``: SkyRL's generator interface played through the layer's Gym endpoints.

Each trajectory SkyRL asks for is one row: the dataset's extra columns (``env_extras``), the
prompt as ``responses_create_params.input`` (a row's own ``responses_create_params`` is kept and
only gains ``input`` and the sampling settings it lacks), ``env_class``, and the rollout id of
:func:`~rl_gym_actors.integrations.skyrl.ids.trajectory_rollout_id`, stable across a restart.
The batch runs as one ``arun_batch``; outputs come back in input order. A trajectory without a
usable result is a masked placeholder with its failure code as stop reason (never an exception
that aborts SkyRL's step, never a made-up reward: :mod:`.replies`). A result the layer had handed
out before (``repeated``: after a restore, the trainer's only copy) is used.

The epoch is not in SkyRL's ``GeneratorInput``: the sync trainer's callback sets
:attr:`GymGenerator.epoch` (``on_train_start``, ``on_epoch_start``); the fully async trainer
subclass sets :attr:`GymGenerator.epoch_source` to read its ``epoch``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from skyrl.train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput

from rl_gym_actors.integrations.skyrl.ids import trajectory_rollout_id
from rl_gym_actors.integrations.skyrl.replies import (
    PLACEHOLDER_PREFIX,
    ReplyMapper,
    output_from,
    trajectory_from_reply,
)
from rl_gym_actors.orchestrator import Orchestrator
from rl_gym_actors.protocol import ROLLOUT_ID_FIELD

PROMPT_FIELD = "responses_create_params"
# SkyRL's sampling keys -> NeMo Gym's responses_create_params keys
SAMPLING_KEYS = {"temperature": "temperature", "top_p": "top_p", "max_tokens": "max_output_tokens"}


def prompt_token_ids(tokenizer: Any, prompt: Any) -> list[int]:
    """The prompt through the tokenizer's chat template (SkyRL's own generator does the same)."""
    ids = tokenizer.apply_chat_template(
        prompt, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):  # transformers 5: an encoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def pad_id_of(tokenizer: Any) -> int:
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if isinstance(value, int):
            return value
    return 0


class GymGenerator(GeneratorInterface):
    """See the module docstring. ``orchestrator`` is started on the first batch when it is not
    yet; ``mapper`` turns a reply and the prompt's token ids into a
    :class:`~rl_gym_actors.integrations.skyrl.replies.Trajectory` (replace it for another reply
    shape)."""

    def __init__(
        self,
        orchestrator: Orchestrator,
        tokenizer: Any,
        run_id: str,
        *,
        mapper: ReplyMapper = trajectory_from_reply,
    ) -> None:
        self.orchestrator = orchestrator
        self.tokenizer = tokenizer
        self.run_id = run_id
        self.mapper = mapper
        self.epoch = 0
        self.epoch_source: Callable[[], int] | None = None
        self._lock = threading.Lock()
        # (epoch, instance id) -> the rollout ids handed to SkyRL (the fully async trainer's
        # checkpoint keeps those of groups still buffered untrained)
        self._handed: dict[tuple[int, str], list[str]] = {}
        self._started = False
        self.last_report: Any = None  # the last checkpoint the layer committed

    def current_epoch(self) -> int:
        return int(self.epoch_source()) if self.epoch_source is not None else int(self.epoch)

    def rows_for(self, input_batch: GeneratorInput) -> tuple[list[dict[str, Any]], list[str]]:
        """The Gym rows of a batch and each row's group (its instance id)."""
        prompts = input_batch["prompts"]
        n = len(prompts)
        extras = input_batch.get("env_extras") or [{} for _ in range(n)]
        env_classes = input_batch.get("env_classes") or [None] * n
        ids = input_batch.get("trajectory_ids")
        meta = input_batch.get("batch_metadata")
        phase = getattr(meta, "training_phase", "train") if meta is not None else "train"
        step = int(getattr(meta, "global_step", 0)) if meta is not None else 0
        epoch = self.current_epoch()
        sampling = {
            ours: value
            for theirs, ours in SAMPLING_KEYS.items()
            if (value := (input_batch.get("sampling_params") or {}).get(theirs)) is not None
        }
        rows: list[dict[str, Any]] = []
        groups: list[str] = []
        for i, prompt in enumerate(prompts):
            instance, repetition = (
                (str(ids[i].instance_id), int(ids[i].repetition_id)) if ids else (str(i), 0)
            )
            extra = dict(extras[i] or {})
            create = dict(extra.get(PROMPT_FIELD) or {})
            create.setdefault("input", prompt)
            for key, value in sampling.items():
                create.setdefault(key, value)
            extra[PROMPT_FIELD] = create
            if env_classes[i] is not None:
                extra.setdefault("env_class", env_classes[i])
            extra[ROLLOUT_ID_FIELD] = trajectory_rollout_id(
                self.run_id,
                phase,
                epoch=epoch,
                global_step=step,
                instance_id=instance,
                repetition_id=repetition,
            )
            rows.append(extra)
            groups.append(instance)
        return rows, groups

    async def generate(
        self, input_batch: GeneratorInput, disable_tqdm: bool = False
    ) -> GeneratorOutput:
        if not self._started:
            await self.orchestrator.astart()
            self._started = True
        rows, groups = self.rows_for(input_batch)
        prompt_ids = [prompt_token_ids(self.tokenizer, p) for p in input_batch["prompts"]]
        outcomes = await self.orchestrator.arun_batch(rows)
        out = output_from(
            outcomes,
            prompt_ids,
            groups,
            pad_id=pad_id_of(self.tokenizer),
            mapper=self.mapper,
            trajectory_ids=input_batch.get("trajectory_ids"),
        )
        meta = input_batch.get("batch_metadata")
        if getattr(meta, "training_phase", "train") == "train":
            epoch = self.current_epoch()
            with self._lock:  # the results handed out (a masked placeholder is none)
                for row, group, stop in zip(rows, groups, out["stop_reasons"], strict=True):
                    if not str(stop).startswith(PLACEHOLDER_PREFIX):
                        self._handed.setdefault((epoch, group), []).append(row[ROLLOUT_ID_FIELD])
        return out  # a plain dict with GeneratorOutput's keys

    def untrained(self, epoch: int, trained: Sequence[str]) -> list[str]:
        """The rollout ids handed to SkyRL in ``epoch`` whose group is not in ``trained`` (the
        groups a fully async trainer still buffers); forgets the trained ones and older epochs."""
        done = set(trained)
        keep: list[str] = []
        with self._lock:
            for key in list(self._handed):
                ep, group = key
                if ep < epoch or (ep == epoch and group in done):
                    del self._handed[key]
                else:
                    keep += self._handed[key]
        return keep
