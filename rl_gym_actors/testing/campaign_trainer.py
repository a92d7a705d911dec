"""The trainer process of the fault campaign (:mod:`rl_gym_actors.testing.campaign`).

    python -m rl_gym_actors.testing.campaign_trainer --url URL --token T --run-id R --root DIR \\
        --protocol agent|v2 --steps 6 --rows 6 [--keep] [--order first|after] \\
        [--arm-step K] [--pause part|report:K] [--go-file F] [--ray-address ADDR]

It restores the documented way (:func:`restore_point`): ``restore_from=`` the checkpoint dir
whose state it loads (None: a fresh start). ``--order first`` (state written before
``checkpoint()``): ``latest_checkpoint_dir(root, run_id=R)`` and the state file beside its part;
``--order after`` (state written once ``checkpoint()`` returned, the examples' old order): its
newest state file's checkpoint dir, the last checkpoint it counted as taken. Step ``s``'s
rows are ``R-s<s>-<i>`` (the same ids and fields in every process). It checkpoints
``<R>-step-<s>`` into ``root/step-<s>`` after every step (``--order after``: into
``root/step-<s>/gym``, its state in ``root/step-<s>``, the README's example layout).

``--keep``: an async trainer with a buffer across 2 checkpoints: step s+1's rows are in flight
while checkpoint s runs, a step's results are trained two steps later, and the buffered ones are
passed as ``keep=``; restored, it sends its buffered steps' rows again first. Without it, a
synchronous trainer: a step's results are trained before its checkpoint. A result is trained
when it is sealed with a reply; anything else is recorded as bad (the checker counts it lost).

``--arm-step K``: before checkpoint K it prints ``checkpointing`` and waits for
``root/armed-K`` (the campaign arms a server-side hold, then writes it). ``--pause part:K``
stops for good inside checkpoint K's part write (the sealed-id file written, ``part.json`` not);
``--pause report:K`` once the gate returned (committed, resumed), before ``checkpoint()`` writes
its report and returns. Each prints ``paused`` first: the instant the campaign kills it.

JSON lines on stdout (each with ``ts``, epoch seconds): ``ready`` (with ``--go-file``: Ray is
up, waiting), ``started`` (restore dir, state), ``open`` (the orchestrator started: Gym freed
of a dead checkpoint of the run), ``received``
(each outcome of a batch), ``checkpointing``, ``checkpoint`` (committed or not, tries,
seconds), ``paused``, ``done`` (the final state). Without ``--ray-address`` it starts a local
Ray of its own, which a kill of its process group takes with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

STATE_FILE = "trainer_state.json"
FINAL_FILE = "final_state.json"
MAX_TRIES = 3


def _say(**fields: Any) -> None:
    print(json.dumps({**fields, "ts": time.time()}), flush=True)


def rows_of(run_id: str, step: int, n: int, protocol: str) -> list[dict[str, Any]]:
    """The rows of one step (the same ids and fields in every process)."""
    rows = []
    for i in range(n):
        row: dict[str, Any] = {
            "_ng_rollout_id": f"{run_id}-s{step}-{i}",
            "reward": round(step + 0.01 * i, 3),
        }
        if protocol == "v2":
            row.update(steps=3, step_s=0.1 + 0.1 * (i % 3))
        else:
            row["sleep_s"] = 0.3 + 0.3 * (i % 3)
        rows.append(row)
    return rows


GYM_SUBDIR = "gym"  # --order after: the part in step-<s>/gym, the state in step-<s>


def gym_dir(root: Path, step: int, order: str) -> Path:
    """Step ``step``'s checkpoint dir: ``root/step-<s>`` (``first``), ``root/step-<s>/gym``
    (``after``, the README's example layout, the state one level up)."""
    return step_dir(root, step) / GYM_SUBDIR if order == "after" else step_dir(root, step)


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step}"


def checkpoint_id(run_id: str, step: int) -> str:
    """Step ``step``'s checkpoint id: ``<run_id>-step-<step>`` (a spent id is spent for every
    run on a server, so each run names its own)."""
    return f"{run_id}-step-{step}"


def fresh_state() -> dict[str, Any]:
    return {"next_step": 1, "buffered": [], "trained": [], "bad": []}


def restore_point(root: Path, run_id: str, order: str) -> tuple[Path | None, dict[str, Any]]:
    """The dir to restore from and the trainer's state, by the README's one rule: the
    checkpoint dir whose state the trainer loads. ``first``: ``latest_checkpoint_dir`` and the
    state beside it; ``after``: the trainer's newest state file and its dir (the newest
    checkpoint it counted as taken; the layer reads the newer parts beside it)."""
    from rl_gym_actors.checkpoint_part import latest_checkpoint_dir

    if order == "first":
        restore_dir = latest_checkpoint_dir(root, run_id=run_id)
        if restore_dir is None:
            return None, fresh_state()
        return restore_dir, json.loads((restore_dir / STATE_FILE).read_text())
    newest: tuple[int, Path] | None = None
    for d in root.glob("step-*"):
        f = d / STATE_FILE
        n = int(d.name[5:]) if d.name[5:].isdigit() else -1
        if f.is_file() and n >= 0 and (newest is None or n > newest[0]):
            newest = (n, f)
    if newest is None:
        return None, fresh_state()
    return newest[1].parent / GYM_SUBDIR, json.loads(newest[1].read_text())


def write_state(directory: Path, state: dict[str, Any], name: str = STATE_FILE) -> None:
    """Durably: a temp file, fsync, rename (a kill leaves the old one or the new one)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / name)


def install_pause(spec: str | None) -> None:
    """``part:K`` / ``report:K``: stop for good at that point of checkpoint ``step-K``."""
    if not spec:
        return
    from rl_gym_actors import checkpoint_part

    where, _, step = spec.partition(":")
    target = f"step-{int(step)}"  # the checkpoint dir's name

    def pause(what: str) -> None:
        _say(event="paused", at=what, checkpoint_id=target)
        while True:
            time.sleep(3600)  # killed here

    if where == "part":
        original_write = checkpoint_part.write_file_atomically

        def write(path: Any, data: bytes, *args: Any, **kwargs: Any) -> Any:
            p = Path(path)
            first = not (p.parent / checkpoint_part.PART_FILE).exists()
            ckpt = p.parent.parent  # <checkpoint dir>/rl_gym_actors/part.json
            named = target in (ckpt.name, ckpt.parent.name)
            if p.name == checkpoint_part.PART_FILE and named and first:
                pause("part")  # the sealed-id file is written, part.json is not
            return original_write(path, data, *args, **kwargs)

        vars(checkpoint_part)["write_file_atomically"] = write  # this process only
    elif where == "report":
        original_report = checkpoint_part.add_report

        def report(checkpoint_dir: str | os.PathLike[str], rep: Any) -> None:
            if target in (Path(checkpoint_dir).name, Path(checkpoint_dir).parent.name):
                pause("report")
            original_report(checkpoint_dir, rep)

        vars(checkpoint_part)["add_report"] = report
    else:
        raise SystemExit(f"--pause: part:K or report:K, not {spec!r}")


def _outcome_line(o: Any) -> dict[str, Any]:
    return {
        "rid": o.rollout_id,
        "status": o.status,
        "attempt": o.attempt_index,
        "reply": o.reply is not None,
        "reward": o.reward,
        "repeated": o.repeated,
        "adopted": o.adopted,
        "reason": o.reason,
    }


def train(state: dict[str, Any], outcomes: list[Any]) -> None:
    """What the trainer makes of a step's results: each sealed one with a reply is trained."""
    for o in outcomes:
        if o.status == "sealed" and o.reply is not None:
            state["trained"].append([o.rollout_id, o.attempt_index, o.reward])
        else:
            state["bad"].append([o.rollout_id, o.status, o.reason])


async def _checkpoint(orch: Any, args: argparse.Namespace, step: int, keep: list[str]) -> None:
    from rl_gym_actors.errors import CheckpointFailed

    root = Path(args.root)
    cid, cdir = checkpoint_id(args.run_id, step), gym_dir(root, step, args.order)
    if args.arm_step == step:
        _say(event="checkpointing", checkpoint_id=cid)
        while not (root / f"armed-{step}").exists():
            await asyncio.sleep(0.01)
    t0 = time.monotonic()
    errors: list[str] = []
    for tries in range(1, MAX_TRIES + 1):
        try:
            await orch.acheckpoint(
                cid, str(cdir), keep=keep if args.keep else None, deadline_s=args.deadline_s
            )
        except CheckpointFailed as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:600])
            continue
        _say(
            event="checkpoint",
            checkpoint_id=cid,
            committed=True,
            tries=tries,
            seconds=time.monotonic() - t0,
            errors=errors,
        )
        return
    _say(event="checkpoint", checkpoint_id=cid, committed=False, tries=MAX_TRIES, errors=errors)
    # giving up: release what this run holds on Gym under an id of its own first, so that the
    # next run on the server is not blocked by it (the campaign's instants share a server)
    try:
        await orch.acheckpoint(f"{cid}-giveup", str(cdir) + "-giveup", deadline_s=args.deadline_s)
    except CheckpointFailed:
        pass
    raise SystemExit(3)


async def _main(args: argparse.Namespace) -> int:
    from rl_gym_actors.config import GymEndpoint, TryPolicy
    from rl_gym_actors.orchestrator import Orchestrator

    root = Path(args.root)
    if args.go_file:  # started early (Ray), restores once the campaign says: A is dead
        _say(event="ready")
        while not os.path.exists(args.go_file):
            await asyncio.sleep(0.01)
    restore_dir, state = restore_point(root, args.run_id, args.order)
    _say(
        event="started",
        pid=os.getpid(),
        restore_dir=None if restore_dir is None else str(restore_dir),
        next_step=state["next_step"],
        buffered=state["buffered"],
    )
    endpoint = GymEndpoint(url=args.url, token=args.token)
    policy = TryPolicy(rollout_s=60.0, receipt_s=5.0, max_tries=3, control_s=5.0)
    async with Orchestrator(
        [endpoint],
        policy=policy,
        pool_size=2,
        rollouts_per_actor=2 * args.rows,
        run_id=args.run_id,
        progress=False,
        start=False,
        restore_from=None if restore_dir is None else str(restore_dir),
    ) as orch:
        await orch.astart()
        _say(event="open", cleared=[(e.checkpoint_id, e.resumed) for e in orch.cleared])

        async def batch(step: int) -> list[Any]:
            outcomes = await orch.arun_batch(rows_of(args.run_id, step, args.rows, args.protocol))
            _say(event="received", step=step, outcomes=[_outcome_line(o) for o in outcomes])
            return outcomes

        buffer: dict[int, list[Any]] = {}
        for step in state["buffered"]:  # a restored async trainer's lost buffer: sent again
            buffer[step] = await batch(step)
        first = state["next_step"]
        running = asyncio.ensure_future(batch(first)) if first <= args.steps else None
        for step in range(first, args.steps + 1):
            assert running is not None
            outcomes = await running
            running = None
            if args.keep:  # the next step's rows run while this checkpoint is taken
                buffer[step] = outcomes
                if step < args.steps:
                    running = asyncio.ensure_future(batch(step + 1))
                for old in sorted(s for s in buffer if s <= step - 2):
                    train(state, buffer.pop(old))
            else:
                train(state, outcomes)
            state["next_step"] = step + 1
            state["buffered"] = sorted(buffer)
            keep = [o.rollout_id for s in sorted(buffer) for o in buffer[s] if o.has_result]
            if args.order == "first":
                write_state(step_dir(root, step), state)
            await _checkpoint(orch, args, step, keep)
            if args.order == "after":
                write_state(step_dir(root, step), state)
            if not args.keep and step < args.steps:
                running = asyncio.ensure_future(batch(step + 1))
        for old in sorted(buffer):
            train(state, buffer.pop(old))
        state["buffered"] = []
        write_state(root, state, FINAL_FILE)
        final = checkpoint_id(args.run_id, 0) + "-final"
        await orch.acheckpoint(final, str(root / "final"), deadline_s=args.deadline_s)
        _say(event="done", trained=len(state["trained"]), bad=len(state["bad"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True)
    p.add_argument("--token", default=None)
    p.add_argument("--run-id", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--protocol", choices=["agent", "v2"], required=True)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rows", type=int, default=6)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--order", choices=["first", "after"], default="first")
    p.add_argument("--arm-step", type=int, default=None)
    p.add_argument("--pause", default=None)
    p.add_argument("--deadline-s", type=float, default=60.0)
    p.add_argument("--ray-address", default=None)
    p.add_argument("--go-file", default=None, help="restore and go on once this file exists")
    args = p.parse_args(argv)
    install_pause(args.pause)
    from rl_gym_actors.actors.runtime import ensure_ray

    ensure_ray(address=args.ray_address, num_cpus=None if args.ray_address else 2)
    return asyncio.run(_main(args))


if __name__ == "__main__":
    raise SystemExit(main())
