"""Which tuples the installed NeMo RL's consumer reads from ``run_rollouts``.

NeMo RL main (7ea279ab) unpacks ``rowidx, result, timing_metrics = await future``: 3-tuples. Its
checkpoint-participant work (PR #4093) reads ``(rowidx, agent_ref, result, timing)``: 4-tuples.
A stream of the wrong shape breaks the consumer at its first row (``ValueError: too many values
to unpack``), so the drop-in's ``stream_tuple: auto`` (the default) asks the installed NeMo RL at
spin-up: the return annotation of its own ``NemoGym.run_rollouts`` (``AsyncGenerator[tuple[...],
None]``; the chooser of :mod:`.selection` keeps the original class), else whether the module of
the checkpoint work (``nemo_rl.environments.gym_checkpoint``) is installed. Without NeMo RL, or
when neither says, it is 3: what NeMo RL main reads. ``stream_tuple: 3`` / ``4`` force a shape.

NeMo RL's newest ``run_rollouts`` yields ``tuple[...] | GymAdmissionClosed``: a row Gym refused
while a checkpoint had admission closed comes as that refusal object instead of a tuple.
:func:`detect_refusals` says whether the installed consumer takes such objects (its annotation
names a yielded type that is not a tuple); an older one would break unpacking one, so the
drop-in then raises the refusal at the stream's end as before.
"""

from __future__ import annotations

import importlib
import importlib.util
import types
import typing
from types import ModuleType
from typing import Any

NEMO_GYM_MODULE = "nemo_rl.environments.nemo_gym"
CHECKPOINT_MODULE = "nemo_rl.environments.gym_checkpoint"
MAIN_SHAPE = 3  # NeMo RL main's consumer


def _actor_class(obj: Any) -> Any:
    obj = getattr(obj, "original", obj)  # our chooser stands where NemoGym was
    meta = getattr(obj, "__ray_metadata__", None)  # a Ray actor class wraps the class
    return getattr(meta, "modified_class", obj)


def _yielded(module: ModuleType) -> list[Any]:
    """The types ``NemoGym.run_rollouts`` is annotated to yield (a union's members), or []."""
    run = getattr(_actor_class(getattr(module, "NemoGym", None)), "run_rollouts", None)
    if run is None:
        return []
    try:
        ret = typing.get_type_hints(run).get("return")
    except Exception:  # unresolvable names: the annotation says nothing usable
        return []
    args = typing.get_args(ret)  # AsyncGenerator[item, None]
    if not args:
        return []
    item = args[0]
    if typing.get_origin(item) in (typing.Union, types.UnionType):
        return list(typing.get_args(item))
    return [item]


def annotated_shape(module: ModuleType) -> int | None:
    """The tuple length ``NemoGym.run_rollouts`` is annotated to yield, or ``None``."""
    for arg in _yielded(module):
        if typing.get_origin(arg) is tuple:
            items = typing.get_args(arg)
            if items and items[-1] is not Ellipsis and len(items) in (3, 4):
                return len(items)
    return None


def detect_refusals(module: ModuleType | str = NEMO_GYM_MODULE) -> bool:
    """Whether the installed NeMo RL's ``run_rollouts`` yields refusal objects beside its
    tuples (its annotation names a yielded class that is not a tuple: ``GymAdmissionClosed``)."""
    if isinstance(module, str):
        try:
            module = importlib.import_module(module)
        except Exception:  # NeMo RL not installed here (or broken)
            return False
    return any(isinstance(arg, type) and issubclass(arg, BaseException) for arg in _yielded(module))


def detect_stream_tuple(module: ModuleType | str = NEMO_GYM_MODULE) -> int:
    """3 or 4: what the installed NeMo RL's consumer unpacks (see the module docstring)."""
    if isinstance(module, str):
        try:
            module = importlib.import_module(module)
        except Exception:  # NeMo RL not installed here (or broken): main's shape
            return MAIN_SHAPE
    shape = annotated_shape(module)
    if shape is not None:
        return shape
    try:
        if importlib.util.find_spec(CHECKPOINT_MODULE) is not None:
            return 4
    except (ImportError, ValueError):
        pass
    return MAIN_SHAPE
