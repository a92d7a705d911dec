"""A small RL loop through the orchestrator, with Gym-aware checkpoints, faults and a crash.

The task: P prompts, each with A actions of hidden value (one clearly best). The policy is a
softmax over the actions of each prompt (NumPy logits), trained by a group-relative policy
gradient: each step samples G actions per prompt, the rows go to a Gym server through the
orchestrator, the simulated agent scores each row (its ``reward`` field is the action's value),
and a Ray task turns the rewards into the next logits. Every few steps a checkpoint goes through
the ledger's gate (adopt, ACK orphans, retire, prepare, commit, resume on Gym) into
``<workdir>/ckpt/step-N/gym``; the policy is saved beside it first (``policy.npz``,
``meta.json``), then ``checkpoint()`` writes the layer's part and gates Gym.

Faults are injected into rows: ``drop_reply`` (the reply is lost after Gym finished the run),
``receipt_delay_s`` (the receipt fetch times out), and a first try slower than ``rollout_s``
(its deadline fires; the try is retired and the next one runs).

The crash is real: the trainer runs in a child process (its own local Ray), which this script kills
with SIGKILL (every process of its session: the trainer, its Ray and the rollout actors) in the
middle of a step, while rollouts are running on Gym. It then starts the trainer again, which resumes
from ``rl_gym_actors.latest_checkpoint_dir(<workdir>/ckpt)`` (the newest step whose part is
complete: its policy was written before it) with ``restore_from=`` that dir: the steps after it
run again with the same rollout ids, so runs that
finished on Gym before the crash are replayed from Gym's store instead of rerun, and the first
checkpoint after the restart ACKs or retires what the dead trainer left behind. A reward enters the
policy at most once: the rollouts the policy has counted are saved with it and checked on every
update.

    .venv/bin/python examples/train_loop.py --quick      # about a minute; what CI runs
    .venv/bin/python examples/train_loop.py --quick --via-nemo-rl

``--via-nemo-rl`` runs the same trainer through the NeMo RL drop-in, driven the way NeMo RL's
rollout code drives its Gym actor (see ``examples/train_loop_nemo_rl.py``).

It prints the reward curve, the checkpoints committed, the tries adopted instead of rerun, and
the check that no rollout was counted twice; ``--json FILE`` writes the same as JSON. The exit
status is 0 only when the reward rose, every checkpoint committed and nothing was counted twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

try:
    import rl_gym_actors
except ImportError:  # run from a checkout without installing it: use the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import rl_gym_actors

TOKEN = "train-loop-token"
SLOW_FIRST_TRY = "slow_first_try_s"
MIDSTEP = "MIDSTEP"


# ---------------------------------------------------------------- the task and the policy


def action_values(prompts: int, actions: int, seed: int) -> np.ndarray:
    """values[p, a]: one best action (1.0) per prompt, the others in [0, 0.5)."""
    rng = np.random.default_rng([seed, 0])
    values = rng.uniform(0.0, 0.5, size=(prompts, actions))
    values[np.arange(prompts), rng.integers(0, actions, size=prompts)] = 1.0
    return values.round(4)


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def grpo_update(
    logits: np.ndarray, prompts: list[int], actions: list[int], rewards: list[float], lr: float
) -> np.ndarray:
    """One group-relative policy-gradient step: per prompt, each sample's advantage is its
    reward against its group's mean (over the group's std); the step follows
    advantage * grad log pi(action). Groups with fewer than two samples or no spread are skipped."""
    new = logits.copy()
    probs = softmax(logits)
    for p in sorted(set(prompts)):
        idx = [i for i, q in enumerate(prompts) if q == p]
        r = np.array([rewards[i] for i in idx])
        if len(idx) < 2 or r.std() < 1e-9:
            continue
        adv = (r - r.mean()) / (r.std() + 1e-6)
        grad = np.zeros_like(probs[p])
        for a_i, i in zip(adv, idx, strict=True):
            grad += a_i * (np.eye(len(grad))[actions[i]] - probs[p])
        new[p] += lr * grad / len(idx)
    return new


def rollout_id(step: int, prompt: int, sample: int, action: int) -> str:
    """Stable across a restart: the same step redone with the same action is the same rollout
    (and a different action a different one, so a stored reply never answers another row)."""
    return f"tl-s{step}-p{prompt}-g{sample}-a{action}"


def make_rows(
    step: int, logits: np.ndarray, values: np.ndarray, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    rng = np.random.default_rng([args.seed, step])
    probs = softmax(logits)
    rows, faults = [], {"drop_reply": 0, "receipt_delay": 0, "deadline": 0}
    for p in range(args.prompts):
        for g in range(args.group):
            a = int(rng.choice(len(probs[p]), p=probs[p]))
            row = {
                "_ng_rollout_id": rollout_id(step, p, g, a),
                "prompt": p,
                "action": a,
                "reward": float(values[p, a]),
                "sleep_s": round(float(rng.uniform(0.05, args.max_sleep_s)), 3),
            }
            u = rng.random()
            if u < args.fault_rate:
                row["drop_reply"] = True
                faults["drop_reply"] += 1
            elif u < 2 * args.fault_rate:
                row["receipt_delay_s"] = 2 * args.receipt_s
                faults["receipt_delay"] += 1
            elif u < 3 * args.fault_rate:
                row[SLOW_FIRST_TRY] = args.rollout_s + 1.0
                faults["deadline"] += 1
            rows.append(row)
    return rows, faults


def _faulty(row: dict[str, Any]) -> bool:
    return any(k in row for k in ("drop_reply", "receipt_delay_s", SLOW_FIRST_TRY))


async def scored_agent(row: dict[str, Any]) -> Any:
    """The library's simulated agent, with one more fault: a first try slower than its
    deadline (row field ``slow_first_try_s``); later tries of the rollout are not slowed."""
    from rl_gym_actors.gym.agents import simulated_agent

    if row.get(SLOW_FIRST_TRY) and row.get("_ng_attempt_index", 0) == 0:
        await asyncio.sleep(float(row[SLOW_FIRST_TRY]))
    return await simulated_agent(row)


# ---------------------------------------------------------------- checkpoints beside the policy


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_policy(ckpt_dir: Path, logits: np.ndarray, meta: dict[str, Any]) -> None:
    """policy.npz and meta.json into the step's dir, durably, *before* ``checkpoint()`` writes
    the layer's part into ``<dir>/gym``: a step dir whose part is complete always holds the
    policy that saw every result the part names. (The other order loses work: a trainer killed
    after the gate released a step's results and before its own state was written restarts
    from the step before, and those rows then get ``forgotten_rollout``.)"""
    with open(ckpt_dir / "policy.npz", "wb") as f:
        np.savez(f, logits=logits)
        f.flush()
        os.fsync(f.fileno())
    _write_atomic(ckpt_dir / "meta.json", json.dumps(meta).encode())


def latest_gym_dir(workdir: Path) -> Path | None:
    """Where a restarting trainer restores from: the layer's one rule,
    :func:`rl_gym_actors.latest_checkpoint_dir` (the newest dir holding a complete part)."""
    return rl_gym_actors.latest_checkpoint_dir(workdir / "ckpt")


def load_latest(workdir: Path, shape: tuple[int, int]) -> tuple[np.ndarray, dict[str, Any]]:
    """The policy and meta of the step dir :func:`latest_gym_dir` names (a fresh start if
    none)."""
    gym_dir = latest_gym_dir(workdir)
    if gym_dir is None:
        return np.zeros(shape), {"step": 0, "counted": [], "history": []}
    ckpt = gym_dir.parent
    with np.load(ckpt / "policy.npz") as data:
        logits = data["logits"]
    return logits, json.loads((ckpt / "meta.json").read_text())


def committed_checkpoints(workdir: Path) -> list[dict[str, Any]]:
    """Each step's committed checkpoint, by step, from the report the layer writes beside its
    part once Gym committed it."""
    from rl_gym_actors.checkpoint_part import committed_report, read_part
    from rl_gym_actors.errors import ConfigError

    out = []
    for gym_dir in sorted((workdir / "ckpt").glob("step-*/gym")):
        try:
            part, _ = read_part(gym_dir)
        except ConfigError:  # no part, or a torn one: not committed
            continue
        report = committed_report(gym_dir, part.checkpoint_id)
        if report is not None:
            out.append(
                {
                    "checkpoint_id": report.checkpoint_id,
                    "step": int(gym_dir.parent.name.removeprefix("step-")),
                    "adopted": report.adopted,
                    "orphans_acked": report.orphans_acked,
                    "retired": report.retired,
                    "records": sum(e.commit.records for e in report.endpoints),
                }
            )
    return out


# ---------------------------------------------------------------- the trainer (child process)


def count_once(seen: set[str], counted: list[str], rollout: str) -> None:
    """A rollout's reward enters the policy at most once; the trainer stops if not."""
    if rollout in seen:
        raise SystemExit(f"rollout {rollout} would be counted twice")
    seen.add(rollout)
    counted.append(rollout)


def log_step(meta: dict[str, Any], log: Any, record: dict[str, Any], note: str) -> None:
    meta["history"].append(record)
    log.write(json.dumps(record) + "\n")
    log.flush()
    print(f"step {record['step']}: mean reward {record['mean_reward']:.3f} ({note})", flush=True)


def checkpoint_place(workdir: Path, step: int, incarnation: str) -> tuple[str, Path]:
    """The checkpoint id and directory of a step (Gym's part goes into ``<dir>/gym``)."""
    ckpt_dir = workdir / "ckpt" / f"step-{step:04d}"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    return f"step-{step}-{incarnation}", ckpt_dir


def train(args: argparse.Namespace) -> int:
    import ray

    from rl_gym_actors import GymEndpoint, Orchestrator, TryPolicy, start_local_ray

    # A Ray of our own, on loopback ("local": never attach to a cluster someone else started).
    start_local_ray(
        num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    workdir = Path(args.workdir)
    values = action_values(args.prompts, args.actions, args.seed)
    restore_from = latest_gym_dir(workdir)  # one rule: the newest complete part
    logits, meta = load_latest(workdir, values.shape)  # the policy written just before it
    counted: list[str] = meta["counted"]
    seen = set(counted)
    incarnation = f"{os.getpid()}"
    policy = TryPolicy(
        rollout_s=args.rollout_s, receipt_s=args.receipt_s, max_tries=3, control_s=5.0
    )
    with (
        open(workdir / "steps.jsonl", "a") as log,
        Orchestrator(
            [GymEndpoint(url=args.gym_url, token=TOKEN)],
            policy=policy,
            pool_size=args.pool_size,
            rollouts_per_actor=args.per_actor,
            orchestrator_id=f"tl{incarnation}",
            progress=False,  # the supervisor prints a line per step instead
            restore_from=restore_from,  # the results the part holds, the run id
        ) as orch,
    ):
        update = ray.remote(num_cpus=0)(grpo_update)
        print(f"trainer {incarnation}: resuming after step {meta['step']}", flush=True)
        for step in range(meta["step"] + 1, args.steps + 1):
            rows, faults = make_rows(step, logits, values, args)
            if step == args.crash_in_step:
                print(f"{MIDSTEP} {step}", flush=True)  # the supervisor kills us now
            outcomes = orch.run_batch(rows)
            used = [(r, o) for r, o in zip(rows, outcomes, strict=True) if o.status == "sealed"]
            for _, o in used:
                count_once(seen, counted, o.rollout_id)
            logits = ray.get(
                update.remote(
                    logits,
                    [r["prompt"] for r, _ in used],
                    [r["action"] for r, _ in used],
                    [o.reward for _, o in used],
                    args.lr,
                )
            )
            record = {
                "incarnation": incarnation,
                "step": step,
                "mean_reward": float(np.mean([o.reward for _, o in used])) if used else 0.0,
                "expected_reward": float((softmax(logits) * values).sum(1).mean()),
                "rows": len(rows),
                "sealed": len(used),
                "adopted": sum(o.adopted for o in outcomes),
                # adopted without a fault of their own: replayed from Gym's store after a
                # restart (a run the dead trainer started and never ACKed)
                "replayed_after_restart": sum(
                    o.adopted for r, o in zip(rows, outcomes, strict=True) if not _faulty(r)
                ),
                "tries": sum(o.tries for o in outcomes),
                "faults": faults,
            }
            log_step(meta, log, record, f"adopted {record['adopted']}, tries {record['tries']}")
            if step % args.ckpt_every == 0 or step == args.steps:
                cid, ckpt_dir = checkpoint_place(workdir, step, incarnation)
                meta.update(step=step, counted=counted)
                save_policy(ckpt_dir, logits, meta)  # the trainer's state first, then the gate
                orch.checkpoint(cid, str(ckpt_dir / "gym"), deadline_s=60.0)
                print(f"checkpoint {cid} committed", flush=True)
    return 0


# ---------------------------------------------------------------- the supervisor (this process)


def ray_auth_mode() -> str:
    """Ray's token authentication for the trainers' local Rays: $RAY_AUTH_MODE, else on (Ray
    2.60's default for a new local Ray)."""
    return os.environ.get("RAY_AUTH_MODE") or "token"


def _child(args: argparse.Namespace, gym_url: str, crash_in_step: int) -> subprocess.Popen:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--role",
        "trainer",
        "--gym-url",
        gym_url,
        "--crash-in-step",
        str(crash_in_step),
    ] + (["--via-nemo-rl"] if args.via_nemo_rl else [])
    for name in (
        "workdir",
        "steps",
        "prompts",
        "actions",
        "group",
        "ckpt_every",
        "lr",
        "seed",
        "fault_rate",
        "max_sleep_s",
        "rollout_s",
        "receipt_s",
        "pool_size",
        "per_actor",
    ):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    package_root = str(Path(rl_gym_actors.__file__).resolve().parents[1])
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        # explicit, so that each trainer's Ray does not print its token notice (main prints one)
        "RAY_AUTH_MODE": ray_auth_mode(),
        # the trainer's Ray workers import this package too
        "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p),
    }
    # its own session: the crash kills the trainer and every process it started (Ray included)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)


PROGRESS_PREFIXES = ("step ", "checkpoint ", "trainer ")


def _lines(proc: subprocess.Popen, verbose: bool) -> queue.Queue[str | None]:
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            # one line per step and per checkpoint (terminal or not); --verbose: every line
            if verbose or line.startswith(PROGRESS_PREFIXES):
                print(f"  [trainer] {line.rstrip()}", flush=True)
            lines.put(line.rstrip())
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_line(lines: queue.Queue[str | None], prefix: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            raise TimeoutError(f"no {prefix!r} line from the trainer in {timeout_s}s") from None
        if line is None:
            raise RuntimeError(f"the trainer exited before printing {prefix!r}")
        if line.startswith(prefix):
            return line


def _session_pids(sid: int) -> list[int]:
    """The processes of one session: the trainer, its Ray and Ray's workers, which put
    themselves into process groups of their own but stay in the session."""
    import psutil

    pids = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) == sid:
                pids.append(pid)
        except OSError:  # gone meanwhile
            continue
    return pids


def _crash(proc: subprocess.Popen) -> int:
    """SIGKILL the trainer and everything it started, at once, as a machine failure would.
    Returns how many processes were killed."""
    killed: set[int] = set()
    for _ in range(3):  # a process may fork while we kill
        pids = [p for p in _session_pids(proc.pid) if p not in killed]
        if not pids and killed:
            break
        for pid in pids or [proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            killed.add(pid)
    proc.wait(timeout=30)
    return len(killed)


def supervise(args: argparse.Namespace) -> dict[str, Any]:
    from rl_gym_actors.testing.gym_process import GymServerThread
    from rl_gym_actors.testing.polling import wait_for

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    crash: dict[str, Any] = {}
    with GymServerThread(agent=scored_agent, token=TOKEN, allow_faults=True) as gym:
        if args.crash_in_step:
            proc = _child(args, gym.url, args.crash_in_step)
            lines = _lines(proc, args.verbose)
            try:
                _wait_line(lines, MIDSTEP, timeout_s=args.timeout_s)
                rows = args.prompts * args.group
                wait_for(
                    lambda: gym.participant.snapshot()["running"] >= rows // 2,
                    timeout_s=30,
                    interval_s=0.005,
                    what="half the step's rollouts to run on Gym",
                )
                crash = {
                    "step": args.crash_in_step,
                    "running_on_gym": gym.participant.snapshot()["running"],
                }
            finally:
                crash["processes_killed"] = _crash(proc)
            crash["exit_status"] = proc.returncode
            print(
                f"  killed the trainer in step {args.crash_in_step} "
                f"({crash['processes_killed']} processes, "
                f"{crash.get('running_on_gym', '?')} runs going on Gym); restarting it",
                flush=True,
            )
        proc = _child(args, gym.url, 0)
        lines = _lines(proc, args.verbose)
        try:
            _wait_line(lines, "checkpoint step-" + str(args.steps), timeout_s=args.timeout_s)
            proc.wait(timeout=60)
            if proc.returncode != 0:
                raise RuntimeError(f"the trainer failed with exit status {proc.returncode}")
        except (RuntimeError, TimeoutError) as exc:  # say whether Gym was still there
            state = "serving" if gym.running else "NOT running any more"
            raise RuntimeError(f"{exc} (the Gym server on {gym.url} is {state})") from exc
        gym_counts = gym.participant.snapshot()
        replayed_hint = gym.faults.dropped if gym.faults is not None else 0
    _, meta = load_latest(workdir, (args.prompts, args.actions))
    runs = [json.loads(line) for line in (workdir / "steps.jsonl").read_text().splitlines()]
    checkpoints = committed_checkpoints(workdir)
    elapsed_s = time.monotonic() - started
    return summarize(args, meta, runs, crash, gym_counts, replayed_hint, elapsed_s, checkpoints)


def summarize(
    args: argparse.Namespace,
    meta: dict[str, Any],
    runs: list[dict[str, Any]],
    crash: dict[str, Any],
    gym_counts: dict[str, Any],
    dropped: int,
    elapsed_s: float,
    checkpoints: list[dict[str, Any]],
) -> dict[str, Any]:
    history = meta["history"]
    curve = [round(h["mean_reward"], 4) for h in history]
    k = max(1, len(curve) // 4)
    incarnations = list(dict.fromkeys(r["incarnation"] for r in runs))
    before = [r for r in runs if r["incarnation"] == incarnations[0]] if crash else []
    redone = sorted(
        ({r["step"] for r in before} | ({crash["step"]} if crash else set()))
        & {h["step"] for h in history if h["incarnation"] != incarnations[0]}
    )
    counted = meta["counted"]
    result = {
        "steps": len(history),
        "reward_curve": curve,
        "expected_reward_curve": [round(h["expected_reward"], 4) for h in history],
        "reward_rose": float(np.mean(curve[-k:])) > float(np.mean(curve[:k])) + 0.1,
        "checkpoints": checkpoints,
        "every_checkpoint_committed": [c["step"] for c in checkpoints]
        == [s for s in range(1, args.steps + 1) if s % args.ckpt_every == 0 or s == args.steps],
        "adopted_tries": sum(h["adopted"] for h in history),
        "redispatches": sum(h.get("redispatches", 0) for h in runs),
        "adopted_tries_all_runs": sum(r["adopted"] for r in runs),
        "replayed_after_restart": sum(h["replayed_after_restart"] for h in history),
        "faults": {
            k_: sum(h["faults"][k_] for h in history)
            for k_ in ("drop_reply", "receipt_delay", "deadline")
        },
        "crash": crash,
        "steps_redone_after_restart": redone,
        "counted": len(counted),
        "counted_distinct": len(set(counted)),
        "no_rollout_counted_twice": len(counted)
        == len(set(counted))
        == sum(h["sealed"] for h in history),
        "gym": {
            k_: gym_counts.get(k_)
            for k_ in ("agent_starts", "acknowledged", "completed_unacknowledged", "tombstoned")
        },
        "replies_dropped": dropped,
        "elapsed_s": round(elapsed_s, 1),
    }
    result["ok"] = (
        result["reward_rose"]
        and result["every_checkpoint_committed"]
        and result["no_rollout_counted_twice"]
    )
    return result


def print_summary(r: dict[str, Any]) -> None:
    print(
        f"\nreward curve ({r['steps']} steps; mean batch reward, then the policy's expected "
        f"reward):"
    )
    for i, (m, e) in enumerate(zip(r["reward_curve"], r["expected_reward_curve"], strict=True), 1):
        print(f"  step {i:3d}  {m:.3f}  {e:.3f}  {'#' * round(40 * m)}")
    print("checkpoints committed:")
    for c in r["checkpoints"]:
        gate = (
            ""
            if c["adopted"] is None
            else (
                f"; adopted {c['adopted']}, orphans ACKed "
                f"{c['orphans_acked']}, retired {c['retired']}"
            )
        )
        print(f"  {c['checkpoint_id']}: {c['records']} Gym records{gate}")
    f = r["faults"]
    print(
        f"faults injected: {f['drop_reply']} dropped replies, {f['receipt_delay']} late "
        f"receipts, {f['deadline']} first tries past their deadline"
    )
    print(
        f"tries adopted instead of rerun: {r['adopted_tries']} in the final lineage "
        f"({r['adopted_tries_all_runs']} over both runs)"
    )
    if r["crash"]:
        print(
            f"crash: SIGKILL to {r['crash']['processes_killed']} processes in step "
            f"{r['crash']['step']} with {r['crash']['running_on_gym']} "
            f"runs in flight on Gym; steps redone after the restart: "
            f"{r['steps_redone_after_restart']}; runs of the dead trainer replayed from Gym "
            f"instead of rerun: {r['replayed_after_restart']}"
        )
    g = r["gym"]
    print(
        f"Gym: {g['agent_starts']} agent runs, {g['acknowledged']} ACKed, "
        f"{g['completed_unacknowledged']} left un-ACKed, {g['tombstoned']} tombstoned"
    )
    print(
        f"counted once: {r['counted']} rollouts entered the final policy, "
        f"{r['counted_distinct']} distinct"
    )
    verdict = "ok" if r["ok"] else "FAILED"
    print(
        f"{verdict}: reward rose {r['reward_rose']}, every checkpoint committed "
        f"{r['every_checkpoint_committed']}, no rollout counted twice "
        f"{r['no_rollout_counted_twice']} ({r['elapsed_s']}s)"
    )


# --quick's sizes; the full run's are the defaults below. A size given on the command line wins.
QUICK = {"steps": 8, "prompts": 6, "group": 4, "ckpt_every": 3}
FULL = {"steps": 24, "prompts": 8, "group": 4, "ckpt_every": 4}


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a {kind.__name__}: {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    pos_int, pos_float = _positive(int), _positive(float)
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"the small run CI uses: {QUICK['steps']} steps, {QUICK['prompts']} prompts, "
        f"groups of {QUICK['group']}, a checkpoint every {QUICK['ckpt_every']} (sizes given "
        f"explicitly win)",
    )
    # internal: the supervisor starts the trainer as a child process with --role trainer
    p.add_argument(
        "--role", choices=["supervisor", "trainer"], default="supervisor", help=argparse.SUPPRESS
    )
    p.add_argument(
        "--workdir", default=None, help="checkpoints and logs (default: a new temporary dir)"
    )
    p.add_argument("--gym-url", default=None, help=argparse.SUPPRESS)  # internal, as --role
    p.add_argument("--steps", type=pos_int, default=None, help=f"steps (default: {FULL['steps']})")
    p.add_argument(
        "--prompts", type=pos_int, default=None, help=f"prompts (default: {FULL['prompts']})"
    )
    p.add_argument("--actions", type=pos_int, default=4, help="actions per prompt")
    p.add_argument(
        "--group",
        type=pos_int,
        default=None,
        help=f"actions sampled per prompt and step (default: {FULL['group']})",
    )
    p.add_argument(
        "--ckpt-every",
        type=pos_int,
        default=None,
        help=f"a checkpoint every this many steps (default: {FULL['ckpt_every']})",
    )
    p.add_argument(
        "--crash-in-step",
        type=int,
        default=None,
        help="kill the trainer in this step (0: never; default: two steps past a checkpoint)",
    )
    p.add_argument("--lr", type=pos_float, default=1.5, help="learning rate")
    p.add_argument("--seed", type=int, default=7, help="seed of the action values and sampling")
    p.add_argument(
        "--fault-rate", type=float, default=0.06, help="share of rows for each fault kind"
    )
    p.add_argument("--max-sleep-s", type=float, default=0.4, help="agent time per run, at most")
    p.add_argument("--rollout-s", type=pos_float, default=1.0, help="a try's deadline")
    p.add_argument("--receipt-s", type=pos_float, default=0.5, help="a receipt fetch's deadline")
    p.add_argument("--pool-size", type=pos_int, default=4, help="rollout actors")
    p.add_argument("--per-actor", type=pos_int, default=8, help="rollouts per rollout actor")
    p.add_argument("--timeout-s", type=pos_float, default=150.0, help="the most a trainer may take")
    p.add_argument("--json", default=None, help="write the summary here")
    p.add_argument("--verbose", action="store_true", help="echo every line of the trainer's")
    p.add_argument(
        "--via-nemo-rl",
        action="store_true",
        help="roll out through the NeMo RL drop-in, as NeMo RL drives it",
    )
    args = p.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if not 0 <= args.fault_rate <= 1 / 3:
        p.error(f"--fault-rate: three fault kinds share the rows: 0 to 0.33, got {args.fault_rate}")
    if args.crash_in_step is None:
        args.crash_in_step = args.ckpt_every + 2 if args.steps > args.ckpt_every + 2 else 0
    elif not 0 <= args.crash_in_step <= args.steps:
        p.error(f"--crash-in-step: 0 (never) or a step 1..{args.steps}, got {args.crash_in_step}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.role == "trainer" and args.via_nemo_rl:
        from train_loop_nemo_rl import train_via_nemo_rl

        return train_via_nemo_rl(args, sys.modules[__name__])
    if args.role == "trainer":
        return train(args)
    if args.workdir is None:
        args.workdir = tempfile.mkdtemp(prefix="rlga-train-loop-")
    print(
        f"work dir {args.workdir} (checkpoints, steps.jsonl; kept after the run)\n"
        f"{args.steps} steps of {args.prompts} prompts x {args.group}, a checkpoint every "
        f"{args.ckpt_every}, the trainer killed in step {args.crash_in_step or 'none'}; "
        f"Ray's token authentication: RAY_AUTH_MODE={ray_auth_mode()}",
        flush=True,
    )
    result = supervise(args)
    print_summary(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
