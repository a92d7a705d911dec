"""The trainer of ``examples/train_loop.py --via-nemo-rl``: the same task and policy, with the
rollouts going through the NeMo RL drop-in the way NeMo RL's own code drives its Gym actor.

- The actor comes from NeMo RL's spin-up (``spinup_nemo_gym_actor``; here the stand-in of its
  module, NeMo RL itself needs GPUs) after the one line ``use_in_nemo_rl(...)``, with the
  trainer's settings under ``env.nemo_gym.rl_gym_actors``.
- Each step streams its rows: ``run_rollouts.options(num_returns="streaming")``, reading
  ``(rowidx, agent_ref, result, timing)`` as rows end. A stream that ends in an infrastructure
  failure (``TimeoutError`` / ``ConnectionError``) has its missing rows re-dispatched with the
  next ``_ng_attempt_index``; a data failure drops the row, as NeMo RL's budget would.
- Between steps, every few: the policy saved first, then ``acknowledge_completed_executions``
  for the results counted since the last checkpoint, ``prepare_checkpoint`` /
  ``commit_checkpoint`` / ``resume_checkpoint``. A restarted trainer calls
  ``restore_checkpoint`` on ``rl_gym_actors.latest_checkpoint_dir`` (the newest directory with
  a complete part, whose policy was written before it) and ``resume_checkpoint`` before its
  first step.

The rows' ``_ng_rollout_id`` is stable across a restart, so the runs the killed trainer left on
Gym are replayed from Gym's store rather than rerun, and the counted-once check holds.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REDISPATCHES = 4
AGENT = "toy"


def spin_up(args: Any, incarnation: str) -> Any:
    """What a NeMo RL training script does: the one line, then NeMo RL's own spin-up."""
    from rl_gym_actors.integrations.nemo_rl import use_in_nemo_rl
    from rl_gym_actors.testing import nemo_rl_stand_in as nemo_gym

    use_in_nemo_rl(nemo_gym)
    env_configs = {
        "nemo_gym": {
            "rl_gym_actors": {
                "endpoints": [{"url": args.gym_url, "token": args.token, "name": AGENT}],
                # one try per dispatch: a try that fails ends the row's stream as infrastructure,
                # and the trainer re-dispatches it, as NeMo RL does
                "policy": {
                    "rollout_s": args.rollout_s,
                    "receipt_s": args.receipt_s,
                    "max_tries": 1,
                    "control_s": 5.0,
                },
                "pool": {"size": args.pool_size, "rollouts_per_actor": args.per_actor},
                "orchestrator_id": f"tln{incarnation}",
                "untrained_replies": "tokenize",
                # this trainer reads (rowidx, agent_ref, result, timing) as NeMo RL's checkpoint
                # work (PR #4093) does; "auto" would pick what the installed NeMo RL reads
                "stream_tuple": 4,
            }
        }
    }
    return nemo_gym.spinup_nemo_gym_actor(
        env_configs, base_urls=[], model_name="toy-policy", tokenizer=nemo_gym.CodePointTokenizer()
    )


def rollout(ray: Any, actor: Any, rows: list[dict[str, Any]]) -> tuple[dict[int, Any], int]:
    """Stream a batch; re-dispatch the rows an infrastructure failure left without a result.
    Returns ``{rowidx: (agent_ref, result)}`` and how many re-dispatches it took."""
    got: dict[int, Any] = {}
    pending = [dict(r, _rowidx=i) for i, r in enumerate(rows)]
    redispatches = 0
    while pending:
        failure: BaseException | None = None
        try:
            for ref in actor.run_rollouts.options(num_returns="streaming").remote(pending, "gym"):
                rowidx, agent_ref, result, _timing = ray.get(ref)
                got[rowidx] = (agent_ref, result)
        except Exception as exc:  # the stream's failure, after its last yield
            failure = getattr(exc, "cause", None) or exc
        missing = [r for r in pending if r["_rowidx"] not in got]
        if failure is None or not missing:
            break
        if not isinstance(failure, (TimeoutError, ConnectionError)) or redispatches >= REDISPATCHES:
            break  # data: these rows are dropped
        redispatches += 1
        pending = [dict(r, _ng_attempt_index=r.get("_ng_attempt_index", 0) + 1) for r in missing]
    return got, redispatches


def checkpoint(
    ray: Any, actor: Any, cid: str, directory: Path, owned: list[dict[str, Any]]
) -> dict[str, Any]:
    """Between steps, in NeMo RL's order; returns what the commit wrote."""
    deadline = time.time() + 60.0
    if owned:
        ray.get(actor.acknowledge_completed_executions.remote(owned))
    ray.get(actor.prepare_checkpoint.remote(cid, deadline))
    committed = ray.get(actor.commit_checkpoint.remote(cid, deadline, str(directory)))
    return committed


def train_via_nemo_rl(args: Any, loop: Any) -> int:
    import ray

    from rl_gym_actors import start_local_ray

    start_local_ray(
        num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    from rl_gym_actors.checkpoint_part import read_part

    workdir = Path(args.workdir)
    values = loop.action_values(args.prompts, args.actions, args.seed)
    where = loop.latest_gym_dir(workdir)  # one rule: the newest dir with a complete part
    logits, meta = loop.load_latest(workdir, values.shape)  # the policy written before it
    counted: list[str] = meta["counted"]
    seen = set(counted)
    incarnation = f"{os.getpid()}"
    args.token = loop.TOKEN
    actor = spin_up(args, incarnation)
    if where is not None:  # a restart: restore, then reopen admission
        source = read_part(where)[0].checkpoint_id
        restore_id = f"restore-{incarnation}"
        ray.get(actor.restore_checkpoint.remote(restore_id, time.time() + 60, str(where), source))
        ray.get(actor.resume_checkpoint.remote(restore_id, time.time() + 60))
    update = ray.remote(num_cpus=0)(loop.grpo_update)
    owned: list[dict[str, Any]] = []
    with open(workdir / "steps.jsonl", "a") as log:
        print(
            f"trainer {incarnation} (via NeMo RL's drop-in): resuming after step {meta['step']}",
            flush=True,
        )
        for step in range(meta["step"] + 1, args.steps + 1):
            rows, faults = loop.make_rows(step, logits, values, args)
            for r in rows:
                r["responses_create_params"] = {
                    "input": [{"role": "user", "content": f"prompt {r['prompt']}"}]
                }
            if step == args.crash_in_step:
                print(f"{loop.MIDSTEP} {step}", flush=True)  # the supervisor kills us now
            got, redispatches = rollout(ray, actor, rows)
            used = []
            for i in sorted(got):
                agent_ref, result = got[i]
                receipt = result["gym_completion_receipt"]
                loop.count_once(seen, counted, receipt["rollout_id"])
                owned.append({"receipt": receipt, "agent_name": agent_ref["name"]})
                used.append((rows[i], float(result["full_result"]["reward"])))
            logits = ray.get(
                update.remote(
                    logits,
                    [r["prompt"] for r, _ in used],
                    [r["action"] for r, _ in used],
                    [w for _, w in used],
                    args.lr,
                )
            )
            # each result says whether it came from Gym's store rather than a run of this call
            from_gym = [(rows[i], got[i][1]["gym_adopted"]) for i in sorted(got)]
            adopted = sum(a for _, a in from_gym)
            record = {
                "incarnation": incarnation,
                "step": step,
                "mean_reward": float(np.mean([w for _, w in used])) if used else 0.0,
                "expected_reward": float((loop.softmax(logits) * values).sum(1).mean()),
                "rows": len(rows),
                "sealed": len(used),
                "adopted": adopted,
                # adopted without a fault of their own: replayed from Gym's store after a
                # restart (a run the dead trainer started and never ACKed)
                "replayed_after_restart": sum(a for r, a in from_gym if not loop._faulty(r)),
                "tries": len(rows) + redispatches,
                "redispatches": redispatches,
                "faults": faults,
            }
            loop.log_step(meta, log, record, f"adopted {adopted}, re-dispatches {redispatches}")
            if step % args.ckpt_every == 0 or step == args.steps:
                cid, ckpt_dir = loop.checkpoint_place(workdir, step, incarnation)
                meta.update(step=step, counted=counted)
                loop.save_policy(ckpt_dir, logits, meta)  # the trainer's state first
                checkpoint(ray, actor, cid, ckpt_dir / "gym", owned)
                owned = []
                ray.get(actor.resume_checkpoint.remote(cid, time.time() + 60))
                print(f"checkpoint {cid} committed", flush=True)
    ray.get(actor.shutdown.remote())
    return 0


if __name__ == "__main__":  # the same run as `train_loop.py --via-nemo-rl`, with its flags
    from train_loop import main

    sys.exit(main([*sys.argv[1:], "--via-nemo-rl"]))
