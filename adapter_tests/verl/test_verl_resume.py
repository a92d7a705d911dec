"""verl's real v1 trainer (verl 0.9.1, ``fit()``, TransferQueue, ``AgentLoopManagerTQ``) on the
layer, killed with SIGKILL twice and resumed with ``resume_mode=auto``, in sync mode and in both
async modes (``colocate_async``, ``separate_async``).

One durable ``gym serve`` (the CPU stand-in policy of ``rl_gym_actors.testing.verl_cpu`` as its
agent, logging every start and finish); the trainer is a subprocess in a session of its own (its
local Ray with it), 12 prompts, batch 4 x ``rollout.n`` 2, a checkpoint every step, 4 steps (one
epoch boundary). Incarnation A is killed during step 2 once some of its sessions finished on
Gym; B resumes from step 1 and is killed right after its checkpoint of step 2; C resumes from
step 2 and finishes. Then: every trained sample of every step has the reward the
policy gave that rollout (none made up), each step trained its 8 sessions (no
``forgotten_rollout``, no failed group), no finished run of the agent was run again, the
resumed step 2 took A's finished runs from Gym (adopted), and Gym holds nothing un-ACKed.

The async cases pick their instants for verl's async trainers, which run a batch ahead (see
:func:`_resume_async`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

import rl_gym_actors.integrations.verl.agent_loop  # noqa: F401  (fails here when verl is missing)
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.wire import Phase
from rl_gym_actors.testing.gym_process import GymServerProcess
from rl_gym_actors.testing.polling import wait_for
from rl_gym_actors.testing.verl_cpu import (
    AGENT_HOLD_ENV,
    AGENT_LOG_ENV,
    PAUSE_AFTER_SAVE_ENV,
    SAVE_WHEN_ENV,
    expected_reward,
)

STEPS = 4
SESSIONS_PER_STEP = 8  # batch 4 x rollout.n 2
INCARNATION_S = 600.0  # scaled by the load: Ray, TransferQueue and verl start in each
# one try's deadline in the layer (the adapter's rollout_s): past any incarnation, so that a
# session the test holds running on Gym stays one try until the test lets it go, however long
# the trainer takes at load to reach the instant the test kills it in (the default is 60 s)
ROLLOUT_S = 3600.0


def _lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Trainer:
    def __init__(
        self,
        workdir: Path,
        gym: GymServerProcess,
        mode: str,
        env: dict[str, str] | None = None,
        steps: int = STEPS,
    ) -> None:
        cmd = [
            sys.executable,
            "-m",
            "rl_gym_actors.testing.verl_cpu",
            "--workdir",
            str(workdir),
            "--gym-url",
            str(gym.url),
            "--token",
            str(gym.token),
            "--mode",
            mode,
            "--steps",
            str(steps),
            "--rollout-s",
            str(ROLLOUT_S),
        ]
        self.log_path = workdir / f"trainer-{time.time():.0f}.log"
        self.log = open(self.log_path, "w")  # noqa: SIM115
        env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **(env or {})}
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text().splitlines()[-25:])

    def kill9(self) -> None:
        """SIGKILL the trainer's whole session: the driver and the Ray it started."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)
        self.log.close()


def _batch_of(rid: str) -> str:
    """``e<epoch>-b<batch>`` of a session's rollout id (``<run>-e0-b2-p1-s0``)."""
    match = re.search(r"-(e\d+-b\d+)-p\d+-s\d+$", rid)
    assert match, rid
    return match.group(1)


def _by_step(work: Path) -> dict[int, list[dict]]:
    by_step: dict[int, list[dict]] = defaultdict(list)
    for record in _lines(work / "trained.jsonl"):
        by_step[record["step"]].append(record)
    return by_step


def _check_trained(by_step: dict[int, list[dict]], agent_log: Path) -> Counter:
    """Every step trained once, 8 distinct sessions, each with the reward the policy gave it
    (none made up), and no finished run of the agent was started again. The starts per rollout."""
    # every training of a step is logged, whichever incarnation did it: 16 would show a step
    # trained twice
    assert sorted(by_step) == list(range(1, STEPS + 1)), sorted(by_step)
    for step, records in by_step.items():
        rids = [r["rid"] for r in records]
        assert len(rids) == SESSIONS_PER_STEP == len(set(rids)), (step, rids)
        for r in records:
            assert r["reward"] == pytest.approx(expected_reward(r["rid"]), abs=1e-6), r
    events = _lines(agent_log)
    finished: set[str] = set()
    reruns = []
    for e in events:
        if e["event"] == "start" and e["rid"] in finished:
            reruns.append((e["rid"], e["attempt"]))
        if e["event"] == "finish":
            finished.add(e["rid"])
    assert reruns == [], reruns
    starts = Counter(e["rid"] for e in events if e["event"] == "start")
    assert set(starts) >= {r["rid"] for rs in by_step.values() for r in rs}
    return starts


def _unacked(gym: GymServerProcess) -> tuple[int, int]:
    async def go() -> tuple[int, int]:
        async with GymClient(gym.endpoint) as client:
            report = await client.status("probe", deadline_ts=time.time() + 10)
            return report.completed_unacknowledged, report.running

    return asyncio.run(go())


def _resume_twice(tmp_path: Path, mode: str) -> None:
    work = tmp_path / "run"
    work.mkdir()
    agent_log = work / "agent.jsonl"
    env = {**os.environ, AGENT_LOG_ENV: str(agent_log)}
    ckpt = work / "ckpt"
    with GymServerProcess(
        agent="rl_gym_actors.testing.verl_cpu:agent", state_dir=tmp_path / "gym", env=env
    ) as gym:
        # A: killed during step 2, once some of step 2's sessions finished on Gym
        a = Trainer(work, gym, mode)
        try:

            def step2_running() -> bool:
                assert a.alive(), f"incarnation A ended before step 2:\n{a.tail()}"
                started = any(s["step"] == 2 for s in _lines(work / "steps.jsonl"))
                done = [e for e in _lines(agent_log) if e["event"] == "finish"]
                return started and any("-b1-" in e["rid"] for e in done)

            wait_for(step2_running, timeout_s=INCARNATION_S, interval_s=0.2, what="A in step 2")
            assert not (ckpt / "global_step_2").exists()
        finally:
            a.kill9()

        # B: resumes from step 1; killed right after its checkpoint of step 2 (step 3 begun)
        b = Trainer(work, gym, mode)
        try:
            steps_before = len(_lines(work / "steps.jsonl"))

            def saved_step2() -> bool:
                assert b.alive(), f"B ended before its checkpoint of step 2:\n{b.tail()}"
                began = [s["step"] for s in _lines(work / "steps.jsonl")[steps_before:]]
                return 3 in began

            wait_for(saved_step2, timeout_s=INCARNATION_S, interval_s=0.1, what="B saved step 2")
            assert (ckpt / "global_step_2" / "rl_gym_actors" / "part.json").exists()
        finally:
            b.kill9()

        # C: resumes from step 2 and finishes
        unacked, running = _finish(work, gym, mode)

    by_step = _by_step(work)
    _check_trained(by_step, agent_log)
    # deterministic uids: step k trains batch k-1 of epoch 0, then batch 0 of epoch 1
    assert all("-e0-b1-" in r["rid"] for r in by_step[2])
    assert all("-e1-b0-" in r["rid"] for r in by_step[4])
    # the resumed step 2 took A's finished runs from Gym instead of running them again
    assert any(r["adopted"] for r in by_step[2]), by_step[2]
    assert (unacked, running) == (0, 0)


def _finish(work: Path, gym: GymServerProcess, mode: str) -> tuple[int, int]:
    """The last incarnation: resumes and runs to the end. Then Gym's un-ACKed and running."""
    _run_to_end(work, Trainer(work, gym, mode), "C to finish")
    _check_end_part(work)
    return _unacked(gym)


def _check_end_part(work: Path) -> None:
    """fit() returned: the layer's part of the run's end (the last batch's sessions, which no
    step trains) was written and committed, once."""
    ends = sorted((work / "ckpt").glob("rl_gym_actors_end_gs*"))
    assert len(ends) == 1, ends
    assert (ends[0] / "rl_gym_actors" / "report.json").exists(), sorted(ends[0].rglob("*"))


def _run_to_end(work: Path, trainer: Trainer, what: str) -> None:
    """Wait for ``trainer`` to finish its run (its ``done`` file, or its exit): exit 0."""
    wait_for(
        lambda: (work / "done").exists() or trainer.proc.poll() is not None,
        timeout_s=INCARNATION_S,
        what=what,
    )
    trainer.proc.wait(timeout=60)
    assert trainer.proc.returncode == 0, trainer.tail()
    trainer.log.close()


# verl's async modes fetch one prompt at a time (``data.gen_batch_size`` 1): uid e<epoch>-b<k>-p0
def _prompts(epoch: int, first: int, last: int) -> set[str]:
    return {f"e{epoch}-b{k}" for k in range(first, last + 1)}


FETCHED_AT_STEP2 = _prompts(0, 8, 11)
HELD = [f"*-{p}-p0-s1" for p in sorted(FETCHED_AT_STEP2)]  # start on Gym, stay running
# warm-up 0-3, step 1: 4-7, step 2: 8-11 (A); step 3: e1 0-3 (B); step 4: e1 4-7 (C: fetched at
# the last step, they may not reach Gym before the run ends). A failed group (a
# forgotten_rollout, say) would be dropped and refilled with a prompt beyond these.
PLAYED = _prompts(0, 0, 11) | _prompts(1, 0, 3)
FETCHED = PLAYED | _prompts(1, 4, 7)


def _resume_async(tmp_path: Path, mode: str) -> None:
    """verl's async trainers fetch a warm-up batch before step 1 and one batch in every step, and
    train any 4 finished groups, the earliest fetched first (``separate_async`` samples them a
    group at a time, its ``parameter_sync_step`` 4 mini-batches of 1 prompt: the same 8 sessions
    a step; its standalone rollout pool and hybrid switch are GPU parts, stood in). On
    the agent-checkpoint protocol the layer's checkpoint waits for the sessions in flight (a
    drain barrier), so each checkpoint finishes the batch fetched at its step.

    A: steps 1-2 train the warm-up batch and step 1's; killed in step 2's checkpoint (verl's
    own save done, the layer's part written, its commit waiting): step 2's batch has every
    session 0 finished on Gym and every session 1 running (held). Released, those finish on Gym
    with no trainer. B resumes from step 2 (verl re-issues step 2's batch from its
    TransferQueue: the layer adopts A's runs), trains step 3 and is killed right after its
    checkpoint of step 3 (four finished groups untrained there: in verl's TransferQueue
    checkpoint and kept by the layer). C resumes from step 3, trains step 4 and finishes. Every
    trained session has the reward its one run on Gym gave it, and Gym ends holding nothing."""
    work = tmp_path / "run"
    work.mkdir()
    agent_log = work / "agent.jsonl"
    hold = work / "hold.json"
    hold.write_text(json.dumps(HELD))
    env = {**os.environ, AGENT_LOG_ENV: str(agent_log), AGENT_HOLD_ENV: str(hold)}
    ckpt = work / "ckpt"
    # A's checkpoint of step 2 starts once step 2's batch is on Gym: verl fetches it ~0.1 s before
    # that save, and at load the layer's gate could close admission first (step 2's sessions then
    # started after its commit, and the checkpoint had not waited for any: the flake of issue 28)
    save_2 = work / "save-2"
    with GymServerProcess(
        agent="rl_gym_actors.testing.verl_cpu:agent", state_dir=tmp_path / "gym", env=env
    ) as gym:
        a = Trainer(work, gym, mode, env={SAVE_WHEN_ENV: f"2:{save_2}"})
        try:

            def step2_batch_on_gym() -> bool:
                assert a.alive(), f"incarnation A ended before step 2's batch:\n{a.tail()}"
                events = _lines(agent_log)
                started = {e["rid"] for e in events if e["event"] == "start"}
                finished = {e["rid"] for e in events if e["event"] == "finish"}
                fresh = {r for r in started if _batch_of(r) in FETCHED_AT_STEP2}
                done = {r for r in fresh if r.endswith("-s0")}
                return len(fresh) == 2 * len(FETCHED_AT_STEP2) and done <= finished

            wait_for(step2_batch_on_gym, timeout_s=INCARNATION_S, interval_s=0.2, what="A")
            assert not (ckpt / "global_step_2").exists()
            save_2.write_text("go")

            def in_step2_checkpoint() -> bool:
                assert a.alive(), (
                    f"incarnation A ended before its checkpoint of step 2:\n{a.tail()}"
                )
                return (ckpt / "global_step_2" / "rl_gym_actors" / "part.json").exists()

            wait_for(in_step2_checkpoint, timeout_s=INCARNATION_S, interval_s=0.2, what="A")
            assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
            held_events = [e for e in _lines(agent_log) if e["rid"].endswith("-s1")]
            assert not (ckpt / "global_step_2" / "rl_gym_actors" / "report.json").exists(), (
                f"step 2's checkpoint committed with sessions held; their events: {held_events}"
                f"\n{a.tail()}"
            )
        finally:
            a.kill9()
        assert sorted(_by_step(work)) == [1, 2]
        hold.unlink()

        b = Trainer(work, gym, mode, env={PAUSE_AFTER_SAVE_ENV: "3"})
        try:

            def paused_after_step3() -> bool:
                assert b.alive(), f"B ended before its checkpoint of step 3:\n{b.tail()}"
                return (work / "paused-3").exists()

            wait_for(paused_after_step3, timeout_s=INCARNATION_S, what="B saved step 3")
            assert (ckpt / "global_step_3" / "rl_gym_actors" / "part.json").exists()
        finally:
            b.kill9()
        assert sorted(_by_step(work)) == [1, 2, 3]

        unacked, running = _finish(work, gym, mode)

    by_step = _by_step(work)
    starts = _check_trained(by_step, agent_log)
    batches = {step: {_batch_of(r["rid"]) for r in records} for step, records in by_step.items()}
    assert batches[1] | batches[2] == _prompts(0, 0, 7), batches
    trained = [r["rid"] for records in by_step.values() for r in records]
    assert len(set(trained)) == STEPS * SESSIONS_PER_STEP  # no session trained twice
    # every prompt fetched before the last step was played, none refilled; each session ran once
    played = {_batch_of(r) for r in starts}
    assert PLAYED <= played <= FETCHED, sorted(played)
    assert {rid: n for rid, n in starts.items() if n != 1} == {}
    # the sessions A left finished or running on Gym and B or C trained: adopted, not rerun
    resumed = [r for r in by_step[3] + by_step[4] if _batch_of(r["rid"]) in FETCHED_AT_STEP2]
    assert resumed and any(r["adopted"] for r in resumed), resumed
    assert (unacked, running) == (0, 0)


@pytest.mark.adapters
def test_sync_mode_resumes_twice_with_every_sample_from_the_layer(tmp_path):
    _resume_twice(tmp_path, "rlga_sync")


@pytest.mark.adapters
def test_colocate_async_mode_resumes_twice_with_every_sample_from_the_layer(tmp_path):
    _resume_async(tmp_path, "rlga_colocate_async")


@pytest.mark.adapters
def test_separate_async_mode_resumes_twice_with_every_sample_from_the_layer(tmp_path):
    _resume_async(tmp_path, "rlga_separate_async")


@pytest.mark.adapters
def test_sync_mode_on_gym_v2_trains_every_session_from_the_layer(tmp_path):
    """The agent loop on the other Gym protocol: verl's sync trainer against ``gym serve
    --protocol v2`` (the layer probes it), 2 steps with a checkpoint each: every session trained
    with its reward, each run once, both checkpoints committed, Gym v2 left idle."""
    work = tmp_path / "run"
    work.mkdir()
    agent_log = work / "agent.jsonl"
    env = {**os.environ, AGENT_LOG_ENV: str(agent_log)}
    with GymServerProcess(
        agent="rl_gym_actors.testing.verl_cpu:agent",
        state_dir=tmp_path / "gym",
        env=env,
        args=["--protocol", "v2"],
    ) as gym:
        _run_to_end(work, Trainer(work, gym, "rlga_sync", steps=2), "the trainer to finish")
        _check_end_part(work)

        async def v2_status():
            async with GymClient(gym.endpoint) as client:
                return await V2Client(client).status(deadline_ts=time.time() + 10)

        status = asyncio.run(v2_status())
    by_step = _by_step(work)
    assert sorted(by_step) == [1, 2]
    for step, records in by_step.items():
        rids = [r["rid"] for r in records]
        assert len(rids) == SESSIONS_PER_STEP == len(set(rids)), (step, rids)
        assert all(f"-e0-b{step - 1}-" in rid for rid in rids), rids
        for r in records:
            assert r["reward"] == pytest.approx(expected_reward(r["rid"]), abs=1e-6), r
    starts = Counter(e["rid"] for e in _lines(agent_log) if e["event"] == "start")
    assert {
        rid: starts[rid]
        for records in by_step.values()
        for r in records
        if starts[(rid := r["rid"])] != 1
    } == {}
    for step in (1, 2):
        assert (work / "ckpt" / f"global_step_{step}" / "rl_gym_actors" / "report.json").exists()
    assert status.phase not in (Phase.PREPARING, Phase.PREPARED), status
    assert status.report.blocker_count == 0, status
