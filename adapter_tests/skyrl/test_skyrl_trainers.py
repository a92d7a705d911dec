"""SkyRL's real trainers on the layer, on CPU: a trainer SIGKILLed and resumed (resume_mode=latest).

Each case runs real trainer incarnations (``rl_gym_actors.testing.skyrl_cpu``: SkyRL's own
``train()`` loops, dataloader, checkpoints; a stand-in policy through SkyRL's seams) against the
project's Gym server in this process, 12 prompts x 2 samples, 3 steps an epoch, 2 epochs, a
checkpoint every step; prompt 5's agent always fails. Every case asserts: the agent never ran a
finished trajectory twice, no trajectory came back ``forgotten_rollout``, every step ran with the
failed trajectories masked (none aborted a step), and Gym ends with nothing un-ACKed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import skyrl  # noqa: F401  (the real package: missing is a failure, never a skip)

from rl_gym_actors.testing.driver import DriverProcess
from rl_gym_actors.testing.polling import scaled
from rl_gym_actors.testing.skyrl_cpu import write_dataset, write_tokenizer

PROMPTS, BATCH, SAMPLES, EPOCHS = 12, 4, 2, 2
STEPS = PROMPTS // BATCH * EPOCHS
FAILING = 5  # the prompt whose agent always fails
SLEEP_S = 0.5
INCARNATION_S = 240.0


def workdir(tmp_path: Path, failing: int = FAILING) -> Path:
    write_tokenizer(tmp_path / "tokenizer")
    write_dataset(tmp_path / "train.jsonl", PROMPTS, sleep_s=SLEEP_S, fail=(failing,))
    return tmp_path


def trainer(gym: Any, ray: str, work: Path, run_id: str, *extra: str) -> DriverProcess:
    log = open(work / f"trainer-{time.monotonic_ns()}.log", "w")  # noqa: SIM115
    return DriverProcess(
        [
            "--workdir",
            str(work),
            "--url",
            gym.url,
            "--token",
            gym.token,
            "--run-id",
            run_id,
            "--epochs",
            str(EPOCHS),
            "--batch",
            str(BATCH),
            *extra,
        ],
        module="rl_gym_actors.testing.skyrl_cpu",
        ray_address=ray,
        stderr=log,
    )


def wait_until(what: str, check, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + scaled(timeout_s)
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout_s}s (load-scaled)")


def finish(proc: DriverProcess) -> list[dict[str, Any]]:
    """Wait for the trainer's ``done`` and its exit 0; its step events."""
    proc.wait_for("done", scaled(INCARNATION_S))
    assert proc.wait(scaled(60)) == 0
    return [e for e in proc.events if e.get("event") == "step"]


def committed(work: Path, step: int) -> bool:
    return (work / "ckpt" / f"global_step_{step}" / "rl_gym_actors" / "part.json").is_file()


def drained(proc: DriverProcess) -> list[dict[str, Any]]:
    """The step events of a trainer that ended without ``done`` (killed): all it printed."""
    try:
        proc.wait_for("done", scaled(30))
    except RuntimeError:  # its output ended
        pass
    return [e for e in proc.events if e.get("event") == "step"]


def kill_during_step(proc: DriverProcess, policy: Any, work: Path, after_step: int) -> set[str]:
    """SIGKILL the trainer (and its Ray) while step ``after_step + 1`` generates, once
    ``global_step_<after_step>`` holds the layer's part. The rollout ids started before."""
    wait_until(
        f"the layer's part in global_step_{after_step}",
        lambda: committed(work, after_step),
        INCARNATION_S,
    )
    before = set(policy.snapshot()[0])
    wait_until("the next step's runs started", lambda: len(policy.snapshot()[0]) > len(before))
    proc.kill()
    return before


def trained_steps(before: list[dict], resumed: list[dict]) -> list[dict]:
    """Each step's last training: a step the dead incarnation trained after its last checkpoint
    is trained again by the resumed one (SkyRL resumes from the checkpoint)."""
    first = resumed[0]["step"] if resumed else STEPS + 1
    return [s for s in before if s["step"] < first] + resumed


def assert_the_layer_kept_everything(
    gym: Any, policy: Any, run_id: str, steps: list[dict], failing: int = FAILING
):
    starts, finished = policy.snapshot()
    ours = {rid: n for rid, n in starts.items() if rid.startswith(f"{run_id}-")}
    healthy = {rid: n for rid, n in ours.items() if f"-i{failing}-" not in rid}
    reruns = {rid: n for rid, n in healthy.items() if rid in finished and n > 1}
    assert reruns == {}, f"the agent ran finished trajectories again: {reruns}"
    forgotten = sum(s["metrics"].get("rlga/forgotten", 0) for s in steps)
    assert forgotten == 0, f"{forgotten} trajectories came back forgotten_rollout"
    numbers = [s["step"] for s in steps]
    assert numbers == list(range(1, STEPS + 1)), f"steps trained: {numbers}"
    # prompt 5's two trajectories fail every epoch: masked, their step trained all the same
    assert sum(s["masked"] for s in steps) == SAMPLES * EPOCHS
    assert all(s["rows"] == BATCH * SAMPLES for s in steps)
    assert any("-train-e1-" in rid for rid in ours), "the second epoch's ids carry its epoch"
    wait_until(
        "nothing un-ACKed on Gym",
        lambda: gym.participant.snapshot()["completed_unacknowledged"] == 0,
        30,
    )


def test_sync_trainer_killed_during_a_step_resumes_with_every_trajectory_from_the_layer(
    gym, policy, ray_address, tmp_path
):
    work, run = workdir(tmp_path), "sync-kill"
    first = trainer(gym, ray_address, work, run)
    before = kill_during_step(first, policy, work, after_step=1)
    steps_before = drained(first)
    in_flight = set(policy.snapshot()[0]) - before  # step 2's, running on Gym when it died
    resumed = finish(trainer(gym, ray_address, work, run))
    assert resumed[0]["step"] == 2
    step2 = resumed[0]["metrics"]
    from_layer = step2["rlga/adopted"] + step2["rlga/repeated"]
    healthy = {rid for rid in in_flight if f"-i{FAILING}-" not in rid}
    assert from_layer == len(healthy), (step2, sorted(in_flight))
    assert_the_layer_kept_everything(gym, policy, run, trained_steps(steps_before, resumed))


def test_sync_trainer_killed_between_skyrls_save_and_the_layers_at_an_epoch_boundary(
    gym, policy, ray_address, tmp_path
):
    """SIGKILL right after SkyRL made global_step_3 (the end of epoch 0) durable, before the
    layer's commit: the layer restores global_step_2's part, SkyRL resumes from step 3 and the
    run goes on into epoch 1 (GymRayPPOTrainer; SkyRL's own trainer runs no step of it); what
    step 3 handed out is released by the next commit."""
    work, run = workdir(tmp_path), "sync-boundary"
    first = trainer(gym, ray_address, work, run, "--fault", "on_save:3")
    first.wait_for("started", scaled(INCARNATION_S))
    assert first.wait(scaled(INCARNATION_S)) != 0  # SIGKILLed by its fault
    steps_before = drained(first)
    assert committed(work, 2) and not committed(work, 3)
    resumed = finish(trainer(gym, ray_address, work, run))
    assert resumed[0]["step"] == 4 and resumed[0]["epoch"] == 1  # on into epoch 1
    assert committed(work, STEPS)
    assert_the_layer_kept_everything(gym, policy, run, trained_steps(steps_before, resumed))


def test_sync_trainer_killed_in_the_first_step_after_an_epoch_boundary_draws_the_same_epoch(
    gym, policy, ray_address, tmp_path
):
    """SIGKILL while step 4 (epoch 1's first) generates, global_step_3 (epoch 0's end) holding
    the layer's part: the resumed run draws epoch 1 in the order the dead run drew it, so step
    4's trajectories running on Gym are adopted there, and none of them comes back in a later
    step forgotten (SkyRL's restored loader draws another order: the dead step's prompts it moves
    to a later step were released by the commit after step 4). Prompt 0 fails here: with
    SkyRL's seed the prompt the restored loader moves out of step 4 is prompt 5."""
    failing = 0
    work, run = workdir(tmp_path, failing), "sync-epoch"
    first = trainer(gym, ray_address, work, run)
    before = kill_during_step(first, policy, work, after_step=3)
    steps_before = drained(first)
    in_flight = set(policy.snapshot()[0]) - before  # step 4's, running on Gym when it died
    resumed = finish(trainer(gym, ray_address, work, run))
    assert resumed[0]["step"] == 4 and resumed[0]["epoch"] == 1
    step4 = resumed[0]["metrics"]
    healthy = {rid for rid in in_flight if f"-i{failing}-" not in rid}
    assert step4["rlga/adopted"] + step4["rlga/repeated"] == len(healthy), (step4, in_flight)
    steps = trained_steps(steps_before, resumed)
    assert_the_layer_kept_everything(gym, policy, run, steps, failing)


def test_fully_async_trainer_killed_during_a_step_resumes_with_every_trajectory_from_the_layer(
    gym, policy, ray_address, tmp_path
):
    work, run = workdir(tmp_path), "async-kill"
    first = trainer(gym, ray_address, work, run, "--fully-async")
    # groups generated two steps ahead: some handed out before global_step_1 are still
    # untrained at global_step_2, the checkpoint the kill resumes from
    kill_during_step(first, policy, work, after_step=2)
    steps_before = drained(first)
    resumed = finish(trainer(gym, ray_address, work, run, "--fully-async"))
    # the resumed run asked again for trajectories the dead one had generated: the layer's
    from_layer = sum(s["metrics"]["rlga/adopted"] + s["metrics"]["rlga/repeated"] for s in resumed)
    assert from_layer > 0, [s["metrics"] for s in resumed]
    assert_the_layer_kept_everything(gym, policy, run, trained_steps(steps_before, resumed))


def test_fully_async_trainer_killed_between_skyrls_save_and_the_layers_resumes_from_the_layer(
    gym, policy, ray_address, tmp_path
):
    """SIGKILL right after the fully async trainer made global_step_2 durable, before the layer's
    checkpoint started: SkyRL resumes from step 2 with the layer's newest part global_step_1's;
    the groups the dead run generated ahead come back from the layer, none rerun or forgotten."""
    work, run = workdir(tmp_path), "async-save"
    first = trainer(gym, ray_address, work, run, "--fully-async", "--fault", "on_save:2")
    first.wait_for("started", scaled(INCARNATION_S))
    assert first.wait(scaled(INCARNATION_S)) != 0  # SIGKILLed by its fault
    steps_before = drained(first)
    assert committed(work, 1) and not committed(work, 2)
    resumed = finish(trainer(gym, ray_address, work, run, "--fully-async"))
    assert resumed[0]["step"] == 3
    assert committed(work, STEPS)
    from_layer = sum(s["metrics"]["rlga/adopted"] + s["metrics"]["rlga/repeated"] for s in resumed)
    assert from_layer > 0, [s["metrics"] for s in resumed]
    assert_the_layer_kept_everything(gym, policy, run, trained_steps(steps_before, resumed))


EVAL_PROMPTS, EVAL_FAILING = 3, 1  # the evaluation set; prompt 1's agent always fails


def test_sync_trainer_evaluates_through_the_layer_across_a_kill_during_an_evaluation(
    gym, policy, ray_address, tmp_path
):
    """An evaluation after every step (``<run>-eval-s<step>-...`` ids through the generator), a
    SkyRL checkpoint every second step, SIGKILLed while step 5's evaluation runs on Gym: SkyRL
    resumes from global_step_4, trains step 5 again and evaluates it again, both from the layer
    (adopted from Gym, no agent rerun); the failing evaluation prompt is masked and no evaluation
    stops; the last evaluation (after the last checkpoint) is released before the run ends."""
    work, run = workdir(tmp_path), "sync-eval"
    evals = write_dataset(work / "eval.jsonl", EVAL_PROMPTS, sleep_s=SLEEP_S, fail=(EVAL_FAILING,))
    extra = ("--eval-data", evals, "--ckpt-interval", "2")
    first = trainer(gym, ray_address, work, run, *extra)
    wait_until("global_step_4's part", lambda: committed(work, 4), INCARNATION_S)
    wait_until(
        "step 5's evaluation started on Gym",
        lambda: any(f"{run}-eval-s5-" in rid for rid in policy.snapshot()[0]),
    )
    first.kill()
    steps_before = drained(first)
    evals_before = [e["step"] for e in first.events if e.get("event") == "eval"]
    assert not (work / "ckpt" / "global_step_6").exists()
    second = trainer(gym, ray_address, work, run, *extra)
    resumed = finish(second)
    assert resumed[0]["step"] == 5
    evals_after = [e["step"] for e in second.events if e.get("event") == "eval"]
    assert evals_before[:4] == [1, 2, 3, 4] and evals_after == [5, 6], (evals_before, evals_after)
    starts, _ = policy.snapshot()
    eval_ids = {rid: n for rid, n in starts.items() if rid.startswith(f"{run}-eval-")}
    expected = {
        f"{run}-eval-s{s}-i{k}-r0" for s in range(1, STEPS + 1) for k in range(EVAL_PROMPTS)
    }
    assert set(eval_ids) == expected, sorted(eval_ids)
    healthy = {rid: n for rid, n in eval_ids.items() if f"-i{EVAL_FAILING}-" not in rid}
    assert all(n == 1 for n in healthy.values()), f"evaluations ran again: {healthy}"
    step5 = resumed[0]
    from_layer = step5["metrics"]["rlga/adopted"] + step5["metrics"]["rlga/repeated"]
    assert from_layer == step5["rows"] - step5["masked"], step5  # every result of step 5
    assert_the_layer_kept_everything(gym, policy, run, trained_steps(steps_before, resumed))
