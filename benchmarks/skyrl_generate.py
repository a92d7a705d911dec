"""SkyRL's ``generate()`` through the layer against a SkyRL generator that calls ``/run`` itself.

Needs the skyrl extra (``make test-skyrl`` builds its venv): ``.venv-skyrl/bin/python
benchmarks/skyrl_generate.py [--quick] [--trajectories 64] [--sleep-s 0.5] [--trials 15]
[--profile]``.

One Gym server (``gym serve`` in a subprocess, the stand-in policy agent of
``rl_gym_actors.testing.skyrl_cpu`` sleeping ``--sleep-s`` per run) and one local Ray, up for
every arm. Each trial builds one SkyRL batch (SkyRL's own ``prepare_generator_input``: 32 prompts
x 2 samples by default) and hands it to each arm's ``generate()`` from this process, the order
alternating from trial to trial:

- ``direct``: :class:`DirectGymGenerator`, the generator a SkyRL user writes without the layer:
  SkyRL's ``GeneratorInterface``, every trajectory one ``POST /run`` at once over one aiohttp
  session (a connector as SkyRL's own HTTP inference client opens it), the same rows and the
  same reply mapping as the layer's generator. Its results are ACKed after the timed call, so
  the server holds no more than in the layer's arm.
- ``layer``: ``GymGenerator.generate()`` with the pool sized by default from
  ``train_batch_size x n_samples_per_prompt``; the layer's checkpoint (which releases the batch)
  follows the timed call.

It reports each arm's median, quartiles and range, the per-trial ratio layer / direct (median and
range), and the load average beside every trial. ``--profile`` adds a cProfile of this process
over the layer's timed calls (the top functions by cumulative time, in the result).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import common

from rl_gym_actors.protocol import RECEIPT_HEADER, ROLLOUT_ID_FIELD, CompletionReceipt
from rl_gym_actors.testing.gym_process import GymServerProcess


def make_input(prompts: int, samples: int, step: int, sleep_s: float) -> Any:
    from skyrl.train.generators.utils import prepare_generator_input

    batch = [
        {
            "prompt": [{"role": "user", "content": f"w{i % 40} w1 w2"}],
            "env_class": "rl_gym_actors",
            "env_extras": {"sleep_s": sleep_s},
            "uid": str(i),
        }
        for i in range(prompts)
    ]
    generator_input, _ = prepare_generator_input(batch, samples, {}, "rl_gym_actors", "train", step)
    return generator_input


def direct_generator_class() -> type:
    """:class:`DirectGymGenerator`, defined once SkyRL is importable."""
    import aiohttp
    from skyrl.train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput

    from rl_gym_actors.integrations.skyrl.generator import (
        GymGenerator,
        pad_id_of,
        prompt_token_ids,
    )
    from rl_gym_actors.integrations.skyrl.replies import output_from
    from rl_gym_actors.outcome import Outcome

    class DirectGymGenerator(GeneratorInterface):
        """What a SkyRL user writes against a Gym server without the layer: one ``POST /run``
        per trajectory, all at once, in the process SkyRL calls ``generate()`` from. Rows and
        the reply mapping are the layer generator's (``rows_for``, ``output_from``), so the
        two arms differ only in how the rollouts travel. ``receipts`` collects each answer's
        receipt header for the ACKs after the timed call."""

        def __init__(self, url: str, tokenizer: Any, run_id: str) -> None:
            self.url = url.rstrip("/") + "/run"
            self.tokenizer = tokenizer
            self.rows = GymGenerator(None, tokenizer, run_id)  # type: ignore[arg-type]
            self.session: aiohttp.ClientSession | None = None
            self.receipts: list[str] = []

        async def _session(self) -> aiohttp.ClientSession:
            if self.session is None:
                connector = aiohttp.TCPConnector(limit=50_000, keepalive_timeout=2)
                self.session = aiohttp.ClientSession(
                    connector=connector, timeout=aiohttp.ClientTimeout(total=None)
                )
            return self.session

        async def _run(self, row: dict[str, Any]) -> Any:
            session = await self._session()
            async with session.post(self.url, json=row) as resp:
                body = await resp.json()
                resp.raise_for_status()
                self.receipts.append(resp.headers[RECEIPT_HEADER])
                return body

        async def generate(
            self, input_batch: GeneratorInput, disable_tqdm: bool = False
        ) -> GeneratorOutput:
            rows, groups = self.rows.rows_for(input_batch)
            prompt_ids = [prompt_token_ids(self.tokenizer, p) for p in input_batch["prompts"]]
            replies = await asyncio.gather(*(self._run(row) for row in rows))
            outcomes = [
                Outcome(rollout_id=row[ROLLOUT_ID_FIELD], status="sealed", reply=reply)
                for row, reply in zip(rows, replies, strict=True)
            ]
            return output_from(  # type: ignore[return-value]
                outcomes,
                prompt_ids,
                groups,
                pad_id=pad_id_of(self.tokenizer),
                trajectory_ids=input_batch.get("trajectory_ids"),
            )

        async def close(self) -> None:
            if self.session is not None:
                await self.session.close()

    return DirectGymGenerator


def spread(values: Sequence[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "p25": round(float(common.percentile(values, 25) or 0.0), 4),
        "p75": round(float(common.percentile(values, 75) or 0.0), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from rl_gym_actors.actors.runtime import ensure_ray
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient
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
    server = GymServerProcess(
        agent="rl_gym_actors.testing.skyrl_cpu:policy_agent", allow_faults=False
    )
    server.start()
    try:
        common.progress("starting Ray")
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
    layer = GymGenerator(orch, tokenizer, "bench")
    direct = direct_generator_class()(server.endpoint.url, tokenizer, "direct")
    control = GymClient(server.endpoint)
    profile = cProfile.Profile() if args.profile else None
    times: dict[str, list[float]] = {"direct": [], "layer": []}
    loads: list[float] = []

    async def run_direct(gen_input: Any) -> float:
        direct.rows.epoch = gen_input["batch_metadata"].global_step
        direct.receipts.clear()
        t0 = time.perf_counter()
        out = await direct.generate(gen_input)
        seconds = time.perf_counter() - t0
        assert out["rollout_metrics"]["rlga/sealed"] == trajectories, out["rollout_metrics"]
        deadline = time.time() + 60
        await asyncio.gather(  # untimed: the server ends each trial holding nothing
            *(
                control.acknowledge(CompletionReceipt.model_validate_json(r), deadline_ts=deadline)
                for r in direct.receipts
            )
        )
        return seconds

    async def run_layer(gen_input: Any, trial: int) -> float:
        layer.epoch = gen_input["batch_metadata"].global_step
        if profile is not None and trial > 0:
            profile.enable()
        t0 = time.perf_counter()
        out = await layer.generate(gen_input)
        seconds = time.perf_counter() - t0
        if profile is not None:
            profile.disable()
        assert out["rollout_metrics"]["rlga/sealed"] == trajectories, out["rollout_metrics"]
        await orch.acheckpoint(f"bench-{trial}", str(work / f"ckpt-{trial}"))  # releases it
        return seconds

    try:
        common.progress("warm-up (the pool starts)")
        await run_layer(make_input(prompts, args.samples, 0, args.sleep_s), 0)
        await run_direct(make_input(prompts, args.samples, 0, args.sleep_s))
        for trial in range(1, args.trials + 1):
            gen_input = make_input(prompts, args.samples, trial, args.sleep_s)
            loads.append(os.getloadavg()[0])
            order = ("direct", "layer") if trial % 2 else ("layer", "direct")
            for arm in order:
                seconds = (
                    await run_direct(gen_input)
                    if arm == "direct"
                    else await run_layer(gen_input, trial)
                )
                times[arm].append(seconds)
            common.progress(
                f"trial {trial}: direct {times['direct'][-1] * 1e3:.0f} ms, "
                f"layer {times['layer'][-1] * 1e3:.0f} ms, load {loads[-1]:.1f}"
            )
    finally:
        await direct.close()
        await control.close()
        await orch.aclose()
        server.stop()
    ratios = [g / d for g, d in zip(times["layer"], times["direct"], strict=True)]
    out: dict[str, Any] = {
        "trajectories": trajectories,
        "sleep_s": args.sleep_s,
        "pool": f"{pool} x {settings.rollouts_per_actor}",
        "trials": args.trials,
        "direct_s": spread(times["direct"]),
        "layer_s": spread(times["layer"]),
        "ratio_of_medians": round(
            statistics.median(times["layer"]) / statistics.median(times["direct"]), 3
        ),
        "ratio_per_trial": {k: round(v, 3) for k, v in spread(ratios).items()},
        "load_1min": {"min": round(min(loads), 1), "max": round(max(loads), 1)},
        "raw": {"direct": times["direct"], "layer": times["layer"], "load": loads},
    }
    if profile is not None:
        buf = io.StringIO()
        pstats.Stats(profile, stream=buf).sort_stats("cumulative").print_stats(30)
        out["profile_layer_cumulative"] = buf.getvalue()
    return out


def body(result: common.Result, args: argparse.Namespace) -> None:
    if args.quick:
        args.trials = min(args.trials, 3)
    result.command = " ".join([".venv-skyrl/bin/python", *result.command.split()[1:]])
    m = asyncio.run(measure(args))
    profile = m.pop("profile_layer_cumulative", None)
    result.rows.append(m)
    result.params.update(trajectories=m["trajectories"], pool=m["pool"], sleep_s=args.sleep_s)
    d, g, r = m["direct_s"], m["layer_s"], m["ratio_per_trial"]
    result.add_table(
        f"{m['trajectories']} trajectories at {args.sleep_s} s agents, pool {m['pool']} (sized "
        f"by default), {m['trials']} alternating trials, load (1 min) "
        f"{m['load_1min']['min']}-{m['load_1min']['max']}:",
        ["arm", "median ms", "p25-p75 ms", "min-max ms"],
        [
            [
                name,
                round(s["median"] * 1e3),
                f"{s['p25'] * 1e3:.0f}-{s['p75'] * 1e3:.0f}",
                f"{s['min'] * 1e3:.0f}-{s['max'] * 1e3:.0f}",
            ]
            for name, s in (("direct (a SkyRL generator posting /run)", d), ("layer", g))
        ],
    )
    result.extra["headline"] = (
        f"generate() of {m['trajectories']} trajectories at {args.sleep_s} s agents: the layer "
        f"{m['ratio_of_medians']}x the direct generator (ratio of the medians; per trial "
        f"{r['median']}x, {r['min']}-{r['max']}x) at load {m['load_1min']['min']}-"
        f"{m['load_1min']['max']}"
    )
    result.notes.append(
        f"layer / direct: {m['ratio_of_medians']}x of the medians; per trial median "
        f"{r['median']}x, range {r['min']}-{r['max']}x (target <= 1.1x)"
    )
    if profile is not None:
        result.extra["profile_layer_cumulative"] = profile
        result.notes.append("cProfile of the layer's timed calls: `extra.profile_layer_cumulative`")


def extra_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trajectories", type=int, default=64)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--sleep-s", type=float, default=0.5)
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument("--profile", action="store_true", help="cProfile the layer's calls")


if __name__ == "__main__":
    common.bench_main(
        "skyrl_generate",
        "SkyRL generate(): through the layer vs a SkyRL generator posting /run",
        body,
        extra_args=extra_args,
    )
