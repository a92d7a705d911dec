"""What the trainer keeps across checkpoints (issue 27, items 2 and 7), on a real Gym server and a
real local Ray: ``checkpoint(..., keep=ids)`` keeps handed results the trainer has not trained on
in this part and every later one while they are kept, with their replies (``keep_results`` is
the default); a handed result not kept is consumed and leaves the next part (the part stays
flat); an id never handed out is refused before anything is written, and ignored in
``keep_if_handed`` (kept only when handed out); the same checkpoint id
asked again with the same dir answers its committed report (also after a restore), with
another dir a ConfigError; and a checkpoint that fails after it released results says so."""

from __future__ import annotations

import json

import pytest

from rl_gym_actors import CheckpointFailed, ConfigError, Orchestrator, TryPolicy
from rl_gym_actors.failures import FailureKind
from rl_gym_actors.testing.counting_agent import CountingAgent
from rl_gym_actors.testing.gym_process import GymServerThread

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = TryPolicy(rollout_s=10.0, receipt_s=2.0, max_tries=2, control_s=5.0)


def _orch(gym, run_id: str, **kwargs) -> Orchestrator:
    return Orchestrator(
        [gym.endpoint],
        policy=POLICY,
        pool_size=1,
        rollouts_per_actor=8,
        run_id=run_id,
        progress=False,
        **kwargs,
    )


def _part(directory) -> dict:
    return json.loads((directory / "rl_gym_actors" / "part.json").read_text())


def _rows(run: str, step: int, n: int) -> list[dict]:
    return [{"_ng_rollout_id": f"{run}-s{step}-{i}", "reward": 0.125 * i + step} for i in range(n)]


def test_a_kept_result_stays_in_every_part_and_restores_with_its_reply(
    ray_session, gym, agent, tmp_path
):
    run = "kp"
    sizes, handed = [], []
    with _orch(gym, run) as orch:
        kept_row = _rows(run, 0, 1)[0]
        [first] = orch.run_batch([kept_row])
        kept_id = first.rollout_id
        for step in (1, 2, 3):
            outcomes = orch.run_batch(_rows(run, step, 8))
            assert [o.status for o in outcomes] == ["sealed"] * 8
            directory = tmp_path / f"global_step_{step}"
            # the async trainer's buffer: the first result, two checkpoints long
            keep = [kept_id] if step < 3 else None
            orch.checkpoint(f"{run}-ck-{step}", str(directory), keep=keep, deadline_s=30)
            part = _part(directory)
            held = (*part["handed"], *part["undelivered"])
            handed.append(sorted(o["rollout_id"] for o in held))
            kept_in = [o["rollout_id"] for o in part["undelivered"]]
            assert kept_in == ([kept_id] if keep else [])  # kept: untrained, undelivered
            sizes.append(len((directory / "rl_gym_actors" / "part.json").read_bytes()))
            assert all(o["reply"] is not None for o in held)  # keep_results default
    step_ids = [sorted(f"{run}-s{s}-{i}" for i in range(8)) for s in (1, 2, 3)]
    assert handed[0] == sorted([kept_id, *step_ids[0]])
    # step 1's results were consumed at checkpoint 1: gone from part 2; the kept one stays
    assert handed[1] == sorted([kept_id, *step_ids[1]])
    assert handed[2] == sorted([kept_id, *step_ids[2]])  # kept at 2, consumed at 3
    assert max(sizes) < 1.25 * min(sizes)  # flat: one interval of results (plus the kept one)

    # a trainer restored from checkpoint 2 (its buffer lost) sends the kept row again
    with _orch(gym, run, restore_from=tmp_path / "global_step_2") as again:
        [back, gone] = again.run_batch([kept_row, _rows(run, 1, 1)[0]])
    # kept untrained at checkpoint 2: the row's result, not ``repeated`` (the state has not
    # seen it), with its reply
    assert back.status == "sealed" and not back.repeated and back.reward == kept_row["reward"]
    assert back.reply is not None and back.reply.get("reward") == kept_row["reward"]
    assert gone.failure is FailureKind.FORGOTTEN  # consumed at checkpoint 1: no rerun
    assert agent.runs_of(kept_id) == 1 and agent.runs_of(f"{run}-s1-0") == 1


def test_keep_naming_a_result_never_handed_out_is_refused_before_anything(
    ray_session, gym, tmp_path
):
    with _orch(gym, "kr") as orch:
        orch.run_batch(_rows("kr", 0, 2))
        with pytest.raises(ConfigError, match="kr-never"):
            orch.checkpoint("kr-ck-1", str(tmp_path / "a"), keep=["kr-s0-0", "kr-never"])
        with pytest.raises(ConfigError):
            orch.checkpoint("kr-ck-1", str(tmp_path / "a"), keep="kr-s0-0")  # one string
        assert not (tmp_path / "a").exists()
        orch.checkpoint("kr-ck-1", str(tmp_path / "a"), deadline_s=30)
        with pytest.raises(ConfigError, match="kr-s0-1"):  # released at kr-ck-1
            orch.checkpoint("kr-ck-2", str(tmp_path / "b"), keep=["kr-s0-1"])


def test_keep_if_handed_keeps_the_handed_ids_and_ignores_the_others(ray_session, gym, tmp_path):
    # verl's async TransferQueue names every session of a prompt still running: some were
    # handed out (their result on its way to the trainer), some not yet
    with _orch(gym, "kh") as orch:
        orch.run_batch(_rows("kh", 0, 2))
        may_hold = ["kh-s0-0", "kh-not-yet"]
        orch.checkpoint("kh-ck-1", str(tmp_path / "a"), keep_if_handed=may_hold, deadline_s=30)
        part = _part(tmp_path / "a")
        assert [o["rollout_id"] for o in part["undelivered"]] == ["kh-s0-0"]
        orch.checkpoint("kh-ck-2", str(tmp_path / "b"), keep=["kh-s0-0"], deadline_s=30)
        with pytest.raises(ConfigError, match="kh-s0-1"):  # consumed at kh-ck-1: not kept
            orch.checkpoint("kh-ck-3", str(tmp_path / "c"), keep=["kh-s0-1"])
        with pytest.raises(ConfigError):
            orch.checkpoint("kh-ck-3", str(tmp_path / "c"), keep_if_handed="kh-s0-0")
        with pytest.raises(ConfigError):
            orch.checkpoint("kh-ck-3", str(tmp_path / "c"), keep_if_handed=[7])
        assert not (tmp_path / "c").exists()


def test_the_same_checkpoint_id_again_answers_its_committed_report(ray_session, gym, tmp_path):
    directory = tmp_path / "global_step_1"
    with _orch(gym, "si") as orch:
        orch.run_batch(_rows("si", 0, 3))
        report = orch.checkpoint("si-ck-1", str(directory), deadline_s=30)
        assert report.sealed_acked == 3
        again = orch.checkpoint("si-ck-1", directory, deadline_s=30)  # a retried save
        assert again == report
        with pytest.raises(ConfigError, match="si-ck-1"):
            orch.checkpoint("si-ck-1", str(tmp_path / "elsewhere"), deadline_s=30)
        assert not (tmp_path / "elsewhere").exists()
        assert orch.snapshot().ledger.checkpoints_committed == 1  # gated once
    stored = json.loads((directory / "rl_gym_actors" / "report.json").read_text())
    assert stored["checkpoint_id"] == "si-ck-1"
    # restored from it, a framework saves the same step again (e.g. after an epoch resume)
    with _orch(gym, "si", restore_from=directory) as restored:
        assert restored.checkpoint("si-ck-1", str(directory), deadline_s=30) == report
        with pytest.raises(ConfigError):
            restored.checkpoint("si-ck-1", str(tmp_path / "other"), deadline_s=30)
        restored.run_batch(_rows("si", 1, 2))
        restored.checkpoint("si-ck-2", str(tmp_path / "global_step_2"), deadline_s=30)


def test_a_checkpoint_that_fails_after_it_released_says_so(ray_session, tmp_path):
    root = tmp_path / "gym-root"
    root.mkdir()
    outside = tmp_path / "trainer" / "step-1"  # Gym may not commit there: fails after the ACKs
    agent = CountingAgent()
    with (
        GymServerThread(agent=agent, args=["--checkpoint-root", str(root)]) as srv,
        _orch(srv, "fr") as orch,
    ):
        outcomes = orch.run_batch(_rows("fr", 0, 5))
        with pytest.raises(CheckpointFailed) as failed:
            orch.checkpoint("fr-ck-1", str(outside), deadline_s=30)
        assert failed.value.released == 5 and failed.value.released_any
        assert failed.value.restore_from == str(outside)
        held = {o["rollout_id"] for o in _part(outside)["handed"]}
        assert held == {o.rollout_id for o in outcomes}  # all it released, in the part
    ok = CheckpointFailed("x", checkpoint_id="c", blockers={})
    assert (ok.released, ok.restore_from, ok.released_any) == (0, None, False)
