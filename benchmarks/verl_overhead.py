"""verl's own agent-loop path through the layer against the same path with a direct ``/run``.

Needs the verl extra's venv (``make test-verl`` builds it): ``.venv-verl/bin/python
benchmarks/verl_overhead.py [--quick] [--prompts 16] [--n 2] [--sleep-s 0.5] [--trials 7]``.

One run holds one Gym server (``gym serve``, the stand-in policy of
:mod:`rl_gym_actors.testing.verl_cpu` sleeping ``--sleep-s`` per session), one local Ray, verl's
real TransferQueue and ``AgentLoopManagerTQ`` (its 2 ``AgentLoopWorkerTQ`` actors), and the CPU
trainer of ``testing/verl_cpu.py`` (verl's v1 sync trainer with the adapter's uids and checkpoint
callback; the GPU work stood in). A trial is one batch of ``prompts x n`` sessions fetched from
verl's dataloader and submitted by verl's own ``_submit_batch_to_rollout``, timed until
TransferQueue marks every prompt ``finished`` (verl's replay buffer waits for exactly that):
once with the layer's ``GymAgentLoop`` (the host's pool sized by default from the batch) and
once with ``DirectGymAgentLoop`` (:mod:`rl_gym_actors.testing.verl_direct`: ``/run``, receipt,
ACK in the worker, no layer), which goes first alternating trial by trial. After its timed
part the layer's batch is checkpointed (its results ACKed, as after a training step).

Reports medians and the ratio layer / direct (target <= 1.1x at 0.5 s agents); writes
``benchmarks/results/verl_overhead[_full].{json,md}``. ``--profile`` samples the host actor and
the two agent-loop workers with py-spy during the layer's trials (``--profile-out``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common

POLL_S = 0.005  # TransferQueue status polls while a batch runs (the same for both loops)
BATCH_TIMEOUT_S = 300.0


def _args(parser: Any) -> None:
    parser.add_argument("--prompts", type=int, default=None, help="prompts per batch (16)")
    parser.add_argument("--n", type=int, default=2, help="rollout.n: sessions per prompt")
    parser.add_argument("--sleep-s", type=float, default=0.5, help="the agent's time per session")
    parser.add_argument("--trials", type=int, default=None, help="timed trials per loop (7)")
    parser.add_argument("--profile", action="store_true", help="py-spy the layer's trials")
    parser.add_argument("--profile-out", default=None, help="where py-spy writes (a directory)")


def _wait_finished(uids: list[str], expect: int) -> dict[str, dict]:
    """Poll TransferQueue until every prompt of the batch is ``finished``; its items."""
    import transfer_queue as tq

    deadline = time.monotonic() + BATCH_TIMEOUT_S
    while True:
        items = (tq.kv_list("train") or {}).get("train", {})
        status = [items.get(u, {}).get("status") for u in uids]
        if "failure" in status:
            raise RuntimeError(f"a prompt failed: {status}")
        if all(s == "finished" for s in status):
            trajectories = [k for k, t in items.items() if not t.get("is_prompt", False)]
            if len(trajectories) != expect:
                raise RuntimeError(f"{len(trajectories)} trajectories, expected {expect}")
            return items
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch not finished in {BATCH_TIMEOUT_S} s: {status}")
        time.sleep(POLL_S)


class Bench:
    def __init__(self, args: Any, work: Path, gym: Any) -> None:
        import transfer_queue as tq
        from verl.trainer.ppo.v1 import AgentLoopManagerTQ

        from rl_gym_actors.integrations.verl.settings import settings_from
        from rl_gym_actors.testing import verl_cpu
        from rl_gym_actors.testing.verl_direct import write_loop_config

        self.args = args
        self.work = work
        verl_cpu.write_dataset(
            work / "train.parquet", prompts=args.prompts * 4, sleep_s=args.sleep_s
        )
        endpoint = {"url": str(gym.url), "token": str(gym.token)}
        self.config = verl_cpu.trainer_config(
            work,
            [endpoint],
            "rlga_sync",
            steps=1000,
            batch=args.prompts,
            n=args.n,
            sleep_s=args.sleep_s,
            run_id="vbench",
            loop_config=str(write_loop_config(work / "loops.yaml")),
        )
        settings = settings_from(self.config)
        self.pool = f"{settings.pool_size} x {settings.rollouts_per_actor}"
        tq.init(self.config.transfer_queue)
        self.trainer = verl_cpu.trainer_class("rlga_sync")(config=self.config)
        self.trainer.init()
        self.trainer.agent_loop_manager = AgentLoopManagerTQ.create(
            config=self.config,
            llm_client=None,
            teacher_client=None,
            reward_loop_worker_handles=None,
        )
        self.host = self.trainer.checkpoint_callback.host
        self.step = 0

    def batch(self, loop: str) -> float:
        """One batch through ``loop`` ("layer" or "direct"): seconds from submit to finished."""
        import ray
        import transfer_queue as tq
        from verl.utils import tensordict_utils as tu

        from rl_gym_actors.testing.verl_direct import DIRECT_LOOP

        self.step += 1
        self.trainer.global_steps = self.step
        batch = self.trainer._next_train_batch()
        if loop == "direct":
            tu.assign_non_tensor_data(batch, "agent_name", DIRECT_LOOP)
        uids = [str(u) for u in batch["uid"]]
        t0 = time.perf_counter()
        self.trainer._submit_batch_to_rollout(batch)
        items = _wait_finished(uids, len(uids) * self.args.n)
        seconds = time.perf_counter() - t0
        tq.kv_clear(keys=list(items), partition_id="train")
        if loop == "layer":
            ray.get(
                self.host.checkpoint.remote(
                    f"vbench-{self.step}", str(self.work / "ckpt" / f"b{self.step}"), 120.0, None
                ),
                timeout=180,
            )
        return seconds

    def worker_pids(self) -> list[int]:
        import ray

        pids = [ray.get(self.host.__ray_call__.remote(lambda _: os.getpid()))]
        for worker in self.trainer.agent_loop_manager.agent_loop_workers:
            pids.append(ray.get(worker.__ray_call__.remote(lambda _: os.getpid())))
        return pids

    def close(self) -> None:
        import transfer_queue as tq

        from rl_gym_actors.integrations.verl.host import close_host

        try:
            close_host("vbench")
        finally:
            tq.close()


def _spy(pids: list[int], out: Path, seconds: float) -> list[subprocess.Popen]:
    spy = Path(sys.executable).with_name("py-spy")
    out.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                str(spy),
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(int(seconds) + 1),
                "--rate",
                "200",
                "--format",
                "raw",
                "--output",
                str(out / f"pid{pid}.txt"),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for pid in pids
    ]


def body(result: common.Result, args: Any) -> None:
    from rl_gym_actors.actors.runtime import start_local_ray
    from rl_gym_actors.testing.gym_process import GymServerProcess

    args.prompts = args.prompts or (8 if args.quick else 16)
    args.trials = args.trials or (3 if args.quick else 7)
    result.command = ".venv-verl/bin/python " + common.command_line().split(" ", 1)[1]
    work = Path(tempfile.mkdtemp(prefix="verl-bench-"))
    sessions = args.prompts * args.n
    direct_s: list[float] = []
    layer_s: list[float] = []
    gym = GymServerProcess(agent="rl_gym_actors.testing.verl_cpu:agent")
    gym.start()
    try:
        common.progress("verl_overhead: starting Ray, TransferQueue and verl's agent loop workers")
        start_local_ray(num_cpus=16, include_dashboard=False, log_to_driver=False)
        bench = Bench(args, work, gym)
        try:
            bench.batch("layer")  # warm-up: the host's pool, the workers' loops and clients
            bench.batch("direct")
            spies: list[subprocess.Popen] = []
            for trial in range(1, args.trials + 1):
                order = ("direct", "layer") if trial % 2 else ("layer", "direct")
                for loop in order:
                    if loop == "layer" and args.profile:
                        out = Path(args.profile_out or work / "profile") / f"t{trial}"
                        spies = _spy(bench.worker_pids(), out, 4 * args.sleep_s + 3)
                    seconds = bench.batch(loop)
                    (layer_s if loop == "layer" else direct_s).append(seconds)
                    for spy in spies:
                        spy.wait(timeout=60)
                    spies = []
                common.progress(
                    f"verl_overhead: trial {trial}: direct {direct_s[-1]:.3f} s, "
                    f"layer {layer_s[-1]:.3f} s"
                )
            pool = bench.pool
        finally:
            bench.close()
    finally:
        import ray

        ray.shutdown()
        gym.stop()
    d, g = statistics.median(direct_s), statistics.median(layer_s)
    ratio = g / d
    result.params.update(prompts=args.prompts, n=args.n, sessions=sessions, pool=pool)
    result.rows = [
        {"loop": "direct", "seconds": direct_s},
        {"loop": "layer", "seconds": layer_s},
    ]
    result.extra.update(
        direct_median_s=round(d, 4),
        layer_median_s=round(g, 4),
        direct_best_s=round(min(direct_s), 4),
        layer_best_s=round(min(layer_s), 4),
        ratio=round(ratio, 3),
        target=1.1,
        headline=(
            f"verl's submit-to-finished for {sessions} sessions ({args.prompts} prompts x n "
            f"{args.n}, {args.sleep_s} s agents): {g * 1000:.0f} ms through the layer against "
            f"{d * 1000:.0f} ms with a direct /run, **{ratio:.2f}x** (medians of {args.trials} "
            f"alternating trials; target <= 1.1x)"
        ),
    )
    result.add_table(
        f"Per loop, {args.trials} trials each, alternating; the layer's pool {pool} (actors x "
        "rollouts each, sized by default from the batch); direct: /run, receipt, ACK in verl's "
        "worker:",
        ["loop", "median (ms)", "best (ms)", "worst (ms)", "per session (ms)"],
        [
            [
                name,
                round(statistics.median(xs) * 1000),
                round(min(xs) * 1000),
                round(max(xs) * 1000),
                round(statistics.median(xs) * 1000 / sessions, 1),
            ]
            for name, xs in (("direct /run", direct_s), ("through the layer", layer_s))
        ],
    )
    result.notes.append(f"ratio layer / direct: {ratio:.3f} (target <= 1.1)")


def main(argv: list[str] | None = None) -> int:
    result = common.bench_main(
        "verl_overhead",
        "verl's agent loop through the layer against a direct /run",
        body,
        argv,
        extra_args=_args,
    )
    print(json.dumps(result.extra), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    sys.exit(main())
