"""The tuple shape the installed NeMo RL's consumer reads, detected at spin-up (issue 17): 3 for
NeMo RL main (its NemoGym.run_rollouts yields tuple[int, dict, dict | None]), 4 for PR #4093's
(tuple[int, dict, dict, dict | None]); main's 3 when NeMo RL is absent or says nothing. NeMo RL's
newest yields ``tuple[...] | GymAdmissionClosed`` (issue 18): 4, and it takes refusals."""

from __future__ import annotations

import sys
import types
from collections.abc import AsyncGenerator

import ray

from rl_gym_actors.integrations.nemo_rl.consumer import detect_refusals, detect_stream_tuple
from rl_gym_actors.integrations.nemo_rl.selection import NemoGymChooser
from rl_gym_actors.testing import nemo_rl_stand_in


def module_with(cls: type) -> types.ModuleType:
    mod = types.ModuleType("fake_nemo_gym")
    mod.NemoGym = cls
    return mod


class Main:
    async def run_rollouts(
        self, rows: list[dict], timer_prefix: str
    ) -> AsyncGenerator[tuple[int, dict, dict | None], None]:
        yield 0, {}, None


class PR4093:
    async def run_rollouts(
        self, rows: list[dict], timer_prefix: str
    ) -> AsyncGenerator[tuple[int, dict, dict, dict | None], None]:
        yield 0, {}, {}, None


class GymAdmissionClosed(Exception):  # NeMo RL's name; the shape is (message, row_idx)
    def __init__(self, message: str, row_idx: int) -> None:
        super().__init__(message, row_idx)
        self.row_idx = row_idx


class Newest:
    async def run_rollouts(
        self, rows: list[dict], timer_prefix: str
    ) -> AsyncGenerator[tuple[int, dict, dict, dict | None] | GymAdmissionClosed, None]:
        yield 0, {}, {}, None


class Bare:
    async def run_rollouts(self, rows, timer_prefix):
        yield 0, {}, None


def test_the_annotation_of_nemo_rls_own_actor_decides():
    assert detect_stream_tuple(module_with(Main)) == 3
    assert detect_stream_tuple(module_with(PR4093)) == 4
    # a Ray actor class, behind the chooser use_in_nemo_rl puts in its place
    assert detect_stream_tuple(module_with(NemoGymChooser(ray.remote(PR4093)))) == 4


def test_the_stand_in_of_nemo_rl_main_reads_three():
    assert detect_stream_tuple(nemo_rl_stand_in) == 3


def test_without_an_annotation_the_checkpoint_module_decides_and_else_mains_three(monkeypatch):
    assert detect_stream_tuple(module_with(Bare)) == 3
    assert detect_stream_tuple("no_such_nemo_rl.environments.nemo_gym") == 3
    for name in ("nemo_rl", "nemo_rl.environments", "nemo_rl.environments.gym_checkpoint"):
        mod = types.ModuleType(name)
        mod.__path__ = []  # a package, so find_spec looks inside
        mod.__spec__ = types.SimpleNamespace(name=name, submodule_search_locations=[])
        monkeypatch.setitem(sys.modules, name, mod)
    assert detect_stream_tuple(module_with(Bare)) == 4


def test_nemo_rls_newest_yields_refusals_beside_its_four_tuples():
    assert detect_stream_tuple(module_with(Newest)) == 4
    assert detect_refusals(module_with(Newest)) is True
    assert detect_refusals(module_with(NemoGymChooser(ray.remote(Newest)))) is True
    # older consumers unpack every item: a refusal object would break them
    for older in (Main, PR4093, Bare):
        assert detect_refusals(module_with(older)) is False
    assert detect_refusals("no_such_nemo_rl.environments.nemo_gym") is False
    assert detect_refusals(nemo_rl_stand_in) is False
