"""Each way a /run reply gets lost, and its repair, played for real.

Starts a local Gym server (a subprocess on 127.0.0.1, simulated agent, faults allowed) and a
local Ray (loopback only), then:

  0. replays the protocol's seven-step example against the server with the plain Gym client;
  1. a reply dropped after Gym finished the run      -> adopted at attempt 0, agent ran once;
  2. a deadline that fires while the agent works     -> try 0 retired and cancelled, try 1 runs;
  3. a receipt fetch that times out                  -> given up, retired, adopted;
  4. fail_fast stopping a batch at its first failure -> running tries cancelled, a finished one
                                                        adopted and kept for a later batch;
  5. a checkpoint that commits, and the ledger's snapshot.

Every step checks what it shows; the exit status is 0 only when all of them held.
Run it with ``make demo`` (or ``.venv/bin/python examples/lost_replies.py [-v]``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

try:
    import rl_gym_actors  # noqa: F401
except ImportError:  # run from a checkout that is not installed: use the checkout
    _ROOT = str(Path(__file__).resolve().parents[1])
    sys.path.insert(0, _ROOT)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p
    )  # for Ray's worker processes

from rl_gym_actors import GymEndpoint, Orchestrator, TryPolicy
from rl_gym_actors.errors import ConnectionLost, StaleAttempt
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.testing.gym_process import GymServerProcess
from rl_gym_actors.testing.inspect_gym import key_state_sync as key_state

# The simulated agent's replies, plus ``first_try_sleep_s`` (a slow first try only).
AGENT = "rl_gym_actors.testing.counting_agent:agent"
POLICY = TryPolicy(rollout_s=1.0, receipt_s=0.5, max_tries=3, control_s=5.0, admission_wait_s=10.0)

Say = Callable[[str], None]


class Checks:
    """Collects what the demo expected and whether it held."""

    def __init__(self, say: Say) -> None:
        self.say = say
        self.failed: list[str] = []

    def expect(self, ok: bool, what: str) -> None:
        self.say(f"     {'ok ' if ok else 'NO!'} {what}")
        if not ok:
            self.failed.append(what)


async def _call(endpoint: GymEndpoint, method: str, *args, **kwargs):
    async with GymClient(endpoint) as client:
        return await getattr(client, method)(*args, deadline_ts=time.time() + 10, **kwargs)


def gym(endpoint: GymEndpoint, method: str, *args, **kwargs):
    return asyncio.run(_call(endpoint, method, *args, **kwargs))


# ---------------------------------------------------------------- 0. the seven wire steps


async def wire_steps(endpoint: GymEndpoint, check: Checks) -> None:
    say = check.say
    say("== 0. The protocol's seven-step example, against the Gym server ==")
    say("  (words used below: '(rD, 0)' is one try, rollout id rD, attempt index 0;")
    say("   'execution_generation' counts how many times Gym's agent ran that try;")
    say("   'ACKed': the trainer told Gym it has the result, so Gym may let it go;")
    say("   'tombstoned': a try cancelled for good, never run or stored again)")
    async with GymClient(endpoint) as c:
        soon = lambda: time.time() + 10  # noqa: E731
        try:
            await c.run(
                {"reward": 0.5, "drop_reply": True},
                rollout_id="rD",
                attempt_index=0,
                deadline_ts=soon(),
            )
            lost = False
        except ConnectionLost:
            lost = True
        say("  1. POST /run (rD, 0): Gym finishes it, its reply never reaches RL")
        check.expect(lost, "the caller saw the connection close without an answer")

        report = await c.prepare("seed-ckpt", deadline_ts=time.time() + 1)
        listed = [a.key for a in report.completed_unacknowledged_attempts]
        say(f"  2. POST /prepare -> 409, {report.summary()} | listed: {listed}")
        check.expect(
            not report.ready_to_commit and listed == [("rD", 0)],
            "prepare refuses and lists (rD, 0) as completed, not ACKed",
        )

        replay = await c.replay(
            {"reward": 0.5}, rollout_id="rD", attempt_index=0, deadline_ts=soon()
        )
        say(f"  3. POST /run (rD, 0) during prepare -> replayed: {replay.reply}")
        check.expect(
            replay.replayed and replay.reply == {"id": "r-rD", "reward": 0.5},
            "the stored reply came back; the agent did not run",
        )

        receipt = (await c.receipt("rD", 0, deadline_ts=soon())).completion_receipt
        ack = await c.acknowledge(receipt, deadline_ts=soon())
        say(f"  4. POST /acknowledge with its receipt -> {ack.model_dump()}")
        check.expect(ack.acknowledged and not ack.idempotent, "ACKed, the first time")

        report = await c.prepare("seed-ckpt", deadline_ts=time.time() + 2)
        say(f"  5. POST /prepare again -> {report.summary()}")
        check.expect(report.ready_to_commit, "prepare is ready to commit")
        commit = await c.commit(
            "seed-ckpt", tempfile.mkdtemp(prefix="seed-ckpt-"), deadline_ts=soon()
        )
        await c.resume("seed-ckpt", deadline_ts=soon())
        say(f"     (commit: {commit.records} records; resume: admission open again)")

        say(f"  6. (rD, 0) execution_generation = {receipt.execution_generation}")
        check.expect(receipt.execution_generation == 1, "the agent ran (rD, 0) exactly once")

        run_t = asyncio.ensure_future(
            c.run({"sleep_s": 30}, rollout_id="rT", attempt_index=0, deadline_ts=time.time() + 60)
        )
        while (await c.status("seed-probe", deadline_ts=soon())).running < 1:
            await asyncio.sleep(0.02)
        answer = await c.retire("rT", 0, checkpoint_id="seed-probe", deadline_ts=soon())
        say(f"  7. POST /retire (rT, 0) while it still runs -> {answer.model_dump()}")
        check.expect(answer.retired and answer.tombstoned, "the running try is cancelled")
        try:
            await run_t
        except StaleAttempt:
            say("     (its caller got 409 stale_attempt)")


# ---------------------------------------------------------------- 1-5 with the orchestrator


def outcome_line(o) -> str:
    parts = [f"{o.rollout_id}: {o.status}", f"attempt {o.attempt_index}", f"tries {o.tries}"]
    if o.has_result:
        parts.append(f"reward {o.reward}")
        parts.append("adopted" if o.adopted else "not adopted")
    if o.reason:
        parts.append(f"({o.reason})")
    return ", ".join(parts)


def rollouts(orch: Orchestrator, ep: GymEndpoint, check: Checks) -> None:
    say = check.say

    say("== 1. A reply dropped after Gym finished the run ==")
    (o,) = orch.run_batch([{"_ng_rollout_id": "demo-drop", "reward": 0.5, "drop_reply": True}])
    say(f"  {outcome_line(o)}")
    say(
        "  the /run connection broke -> retire said completed_unacknowledged -> replay /run "
        "-> seal -> ACK"
    )
    check.expect(
        o.status == "sealed" and o.adopted and o.attempt_index == 0 and o.reward == 0.5,
        "sealed and adopted at attempt 0, reward as sent",
    )
    check.expect(o.receipt.execution_generation == 1, "execution_generation 1: the agent ran once")

    say("== 2. The rollout_s deadline fires while the agent still works ==")
    (o,) = orch.run_batch(
        [{"_ng_rollout_id": "demo-deadline", "first_try_sleep_s": 30, "reward": 0.25}]
    )
    say(f"  {outcome_line(o)}")
    state0 = key_state(ep, "demo-deadline", 0)
    say(f"  try 0 on Gym: {state0} (retire said retired: the agent call was cancelled)")
    check.expect(state0 == "tombstoned", "try 0 was retired and cancelled")
    check.expect(
        o.status == "sealed" and o.attempt_index == 1 and not o.adopted, "try 1 ran and was sealed"
    )

    say("== 3. The per-row receipt fetch times out ==")
    (o,) = orch.run_batch(
        [{"_ng_rollout_id": "demo-receipt", "receipt_delay_s": 2.0, "reward": 0.75}]
    )
    say(f"  {outcome_line(o)}")
    say(
        f"  the receipt did not come within receipt_s={POLICY.receipt_s}s -> retire said "
        "completed_unacknowledged -> adopted"
    )
    check.expect(
        o.status == "sealed"
        and o.adopted
        and o.attempt_index == 0
        and o.receipt.execution_generation == 1,
        "adopted at attempt 0; the agent ran once",
    )

    say("== 4. fail_fast: the first failed row stops the batch ==")
    rows = [
        {"_ng_rollout_id": "demo-bad", "fail": True, "sleep_s": 0.1},
        {"_ng_rollout_id": "demo-slow", "sleep_s": 30},
        {"_ng_rollout_id": "demo-done", "receipt_delay_s": 30, "reward": 0.125},
    ]
    bad, slow, done = orch.run_batch(rows, fail_fast=True)
    for o in (bad, slow, done):
        say(f"  {outcome_line(o)}")
    check.expect(
        bad.status == "failed" and bad.failure is not None and bad.failure.is_data,
        "demo-bad failed as data (the agent failed the row: one try, not retried)",
    )
    check.expect(
        slow.status == "abandoned"
        and not slow.has_result
        and key_state(ep, "demo-slow", 0) == "tombstoned",
        "demo-slow was abandoned: its running try retired and cancelled",
    )
    check.expect(
        done.status == "abandoned" and done.adopted and done.reward == 0.125,
        "demo-done had finished on Gym: adopted, its result kept",
    )
    (later,) = orch.run_batch([{"_ng_rollout_id": "demo-done", "reward": 0.125}])
    say(f"  a later batch asks for demo-done again -> {outcome_line(later)}")
    check.expect(
        later.status == "sealed" and later.adopted and later.receipt == done.receipt,
        "it gets the kept result; no agent run",
    )


def checkpoint(orch: Orchestrator, ep: GymEndpoint, check: Checks, ckpt_dir: str) -> None:
    say = check.say
    say("== 5. A checkpoint, then the ledger's snapshot ==")
    report = orch.checkpoint("demo-step-1", ckpt_dir, deadline_s=30.0)
    for e in report.endpoints:
        say(
            f"  {e.label}: adopted {e.adopted}, orphans ACKed {e.orphans_acked}, retired "
            f"{e.retired}, prepare rounds {e.prepare_rounds}, committed {e.commit.records} "
            f"records"
        )
    check.expect(
        all(e.commit.manifest_digest for e in report.endpoints), "the checkpoint committed"
    )
    status = gym(ep, "status", "demo-probe")
    say(
        f"  Gym status: running={status.running} "
        f"completed_unacknowledged={status.completed_unacknowledged} "
        f"acknowledged={status.acknowledged_completed}"
    )
    check.expect(
        status.running == 0 and status.completed_unacknowledged == 0,
        "nothing running, nothing completed and un-ACKed",
    )
    snap = orch.snapshot()
    for url, e in snap.ledger.endpoints.items():
        say(
            f"  ledger {url}: dispatched {e.dispatched} = running {e.running} + completed_unacked "
            f"{e.completed_unacked} + acked {e.acked} + tombstoned {e.tombstoned}; adopted "
            f"{e.adopted}"
        )
    check.expect(snap.ledger.invariant_ok, "the ledger's books balance")
    say(
        f"  pool: {snap.pool.size} actors warm in {snap.pool.startup_s:.2f}s; "
        f"seals {snap.actors.seals}, adoptions {snap.actors.adoptions}, "
        f"cancelled tries {snap.actors.cancelled}"
    )


def run_demo(say: Say = print) -> bool:
    """Play the whole scenario; True when every expectation held."""
    check = Checks(say)
    started = time.perf_counter()
    with GymServerProcess(agent=AGENT, allow_faults=True) as server:
        ep = server.endpoint
        say(f"Gym server: {ep.url} (pid {server.pid})")
        asyncio.run(wire_steps(ep, check))
        t = time.perf_counter()
        say(
            "Starting a local Ray and 2 rollout actors (one process each; 10-40 s on a busy "
            "machine, nothing to see meanwhile) ..."
        )
        with Orchestrator(
            [ep], policy=POLICY, pool_size=2, rollouts_per_actor=2, progress=False
        ) as orch:
            say(f"Ray and the orchestrator up in {time.perf_counter() - t:.1f}s")
            rollouts(orch, ep, check)
            with tempfile.TemporaryDirectory(prefix="demo-ckpt-") as ckpt_dir:
                checkpoint(orch, ep, check, ckpt_dir)
    verdict = "FAILED: " + "; ".join(check.failed) if check.failed else "all expectations held"
    say(f"== {verdict} ({time.perf_counter() - started:.1f}s) ==")
    return not check.failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the library does")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s: %(message)s",
    )
    return 0 if run_demo(lambda line: print(line, flush=True)) else 1


if __name__ == "__main__":
    sys.exit(main())
