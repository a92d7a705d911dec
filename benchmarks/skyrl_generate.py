"""SkyRL's ``generate()`` through the layer against the direct ``/run``, in one run.

Needs the skyrl extra (``make test-skyrl`` builds its venv): ``.venv-skyrl/bin/python
benchmarks/skyrl_generate.py [--trajectories 64] [--sleep-s 0.5] [--trials 5]``.

One Gym server (``gym serve`` in a subprocess, the stand-in policy agent of
``rl_gym_actors.testing.skyrl_cpu`` sleeping ``--sleep-s`` per run). Per trial, alternating:
the direct loop (``benchmarks/direct.py``: ``/run``, receipt, digest check, ACK, every
trajectory at once) over the rows the generator sends, then ``GymGenerator.generate()`` of the
same batch shape (SkyRL's ``GeneratorInput`` from its own ``prepare_generator_input``) with the
pool sized by default from ``train_batch_size x n_samples_per_prompt``. Prints one JSON line:
medians, best, and the ratio generate / direct (target <= 1.1x at 0.5 s agents).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import common
from direct import direct_batch, make_clients

from rl_gym_actors.protocol import ROLLOUT_ID_FIELD
from rl_gym_actors.testing.gym_process import GymServerProcess


def make_input(prompts: int, samples: int, step: int):
    from skyrl.train.generators.utils import prepare_generator_input

    batch = [
        {
            "prompt": [{"role": "user", "content": f"w{i % 40} w1 w2"}],
            "env_class": "rl_gym_actors",
            "env_extras": {"sleep_s": ARGS.sleep_s},
            "uid": str(i),
        }
        for i in range(prompts)
    ]
    generator_input, _ = prepare_generator_input(batch, samples, {}, "rl_gym_actors", "train", step)
    return generator_input


async def main_async(args: argparse.Namespace) -> dict:
    from transformers import AutoTokenizer

    from rl_gym_actors.actors.runtime import ensure_ray
    from rl_gym_actors.integrations.skyrl.generator import GymGenerator
    from rl_gym_actors.integrations.skyrl.settings import (
        RlGymActorsSettings,
        in_flight,
        pool_size_for,
    )
    from rl_gym_actors.orchestrator import Orchestrator
    from rl_gym_actors.testing.skyrl_cpu import write_tokenizer

    prompts = args.trajectories // args.samples
    settings = RlGymActorsSettings()
    trajectories = in_flight(train_batch_size=prompts, n_samples_per_prompt=args.samples)
    pool = pool_size_for(settings, trajectories)
    work = Path(tempfile.mkdtemp(prefix="skyrl-bench-"))
    tokenizer = AutoTokenizer.from_pretrained(write_tokenizer(work / "tokenizer"))
    server = GymServerProcess(agent="rl_gym_actors.testing.skyrl_cpu:policy_agent")
    server.start()
    try:
        await asyncio.to_thread(ensure_ray)
    except BaseException:
        server.stop()  # no Ray (an overloaded machine): the server goes too
        raise
    orch = Orchestrator(
        [server.endpoint],
        pool_size=pool,
        rollouts_per_actor=settings.rollouts_per_actor,
        run_id="bench",
        progress=False,
        start=False,
        keep_results=True,
    )
    generator = GymGenerator(orch, tokenizer, "bench")
    (client,) = make_clients([server.endpoint], trajectories)
    direct_s: list[float] = []
    layer_s: list[float] = []
    try:
        await generator.generate(make_input(prompts, args.samples, 0))  # warm-up: pool, Ray
        for trial in range(1, args.trials + 1):
            gen_input = make_input(prompts, args.samples, trial)
            generator.epoch = trial
            rows, _ = generator.rows_for(gen_input)
            for row in rows:
                row[ROLLOUT_ID_FIELD] = "direct-" + row[ROLLOUT_ID_FIELD]
            t0 = time.perf_counter()
            direct = await direct_batch([client], rows, concurrency=len(rows))
            direct_s.append(time.perf_counter() - t0)
            assert direct.ok == len(rows), direct.errors
            t0 = time.perf_counter()
            out = await generator.generate(gen_input)
            layer_s.append(time.perf_counter() - t0)
            assert out["rollout_metrics"]["rlga/sealed"] == len(rows), out["rollout_metrics"]
            orch_ckpt = work / f"ckpt-{trial}"
            await orch.acheckpoint(f"bench-{trial}", str(orch_ckpt))  # releases the batch
    finally:
        await client.close()
        await orch.aclose()
        server.stop()
    d, g = statistics.median(direct_s), statistics.median(layer_s)
    return {
        "benchmark": "skyrl_generate",
        "trajectories": trajectories,
        "sleep_s": args.sleep_s,
        "pool": f"{pool} x {settings.rollouts_per_actor}",
        "trials": args.trials,
        "direct_median_s": round(d, 4),
        "generate_median_s": round(g, 4),
        "direct_best_s": round(min(direct_s), 4),
        "generate_best_s": round(min(layer_s), 4),
        "ratio": round(g / d, 3),
        "machine": common.machine_line(common.machine_info()),
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--sleep-s", type=float, default=0.5)
    parser.add_argument("--trials", type=int, default=5)
    return parser.parse_args(argv)


ARGS = parse([])

if __name__ == "__main__":
    ARGS = parse()
    print(json.dumps(asyncio.run(main_async(ARGS))), flush=True)
