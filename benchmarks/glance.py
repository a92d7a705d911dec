"""One screen of what a rollout costs and what it buys, read from the committed results.

Two places show it, generated from the same ``benchmarks/results/*.json`` so that neither can go
stale: the opening section of ``benchmarks/RESULTS.md`` (``run_all.py`` writes it there) and the
figures of the README's "What a rollout costs" section, between the markers
``<!-- glance:begin -->`` and ``<!-- glance:end -->``. Every figure names the commit and the
date of the run it came from.

    .venv/bin/python benchmarks/glance.py            # print the README block
    .venv/bin/python benchmarks/glance.py --readme   # rewrite the README block in place

``tests/test_readme_figures.py`` fails when the README's block differs from what this script
makes of the committed results: regenerate with ``--readme`` after a benchmark run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- glance:begin -->", "<!-- glance:end -->"


class MissingResult(Exception):
    """A result file the summary needs is not there (run its benchmark first)."""


def load(stem: str) -> dict[str, Any]:
    path = RESULTS / f"{stem}.json"
    if not path.exists():
        raise MissingResult(f"{path.relative_to(ROOT)} is missing: run benchmarks/{stem}.py")
    return json.loads(path.read_text())


def source(res: dict[str, Any]) -> str:
    """Where a figure comes from: the benchmark's file, the commit and the day it ran."""
    commit = res.get("machine", {}).get("git_commit") or "?"
    day = str(res.get("started_at", "?"))[:10]
    return f"`{res['name']}`, {commit}, {day}"


def _row(rows: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    for row in rows:
        if all(row.get(k) == v for k, v in match.items()):
            return row
    raise MissingResult(f"no row with {match}")


def figures() -> dict[str, Any]:
    """The handful of numbers both places quote, each with its source."""
    thr, one, conc = load("throughput"), load("one_per_actor"), load("concurrency")
    storm, ckpt, scale = load("fault_storm"), load("checkpoint"), load("scale")
    eight = _row(thr["rows"], config="8 per actor", agent_ms=0)
    one_thr = _row(thr["rows"], config="1 per actor", agent_ms=0)
    slow8 = _row(
        thr["rows"], config="8 per actor", agent_ms=max(r["agent_ms"] for r in thr["rows"])
    )
    ways = {r["way"]: r for r in one["rows"]}
    big = max(conc["rows"], key=lambda r: r["in_flight"])
    ours, asis = storm["extra"]["summary"]
    none1 = _row(ckpt["rows"], kind="none", servers=1)
    fin1 = _row(ckpt["rows"], kind="finished", attempts=1000, servers=1)
    parts = [r for r in scale["rows"] if r.get("part") == "checkpoint"]
    fin_big = max((r for r in parts if r["kind"] == "finished"), key=lambda r: r["attempts"])
    run_big = max((r for r in parts if r["kind"] == "running"), key=lambda r: r["attempts"])
    nodes = [r for r in scale["rows"] if r.get("part") == "throughput"]
    most = max(nodes, key=lambda r: (r["nodes"], r["rollouts_per_actor"]))
    return {
        "eight": eight,
        "one_pss": one_thr["actor_pss_mb_per_slot"],
        "slow8": slow8,
        "one": ways["ours"],
        "floor": ways["Ray floor"],
        "big": big,
        "ours": ours,
        "asis": asis,
        "none1": none1,
        "fin1": fin1,
        "fin_big": fin_big,
        "run_big": run_big,
        "most": most,
        "src": {
            k: source(v)
            for k, v in dict(
                thr=thr, one=one, conc=conc, storm=storm, ckpt=ckpt, scale=scale
            ).items()
        },
    }


def cost_lines(f: dict[str, Any]) -> list[str]:
    e, o, fl, b, s = f["eight"], f["one"], f["floor"], f["big"], f["src"]
    return [
        f"- **CPU per rollout** (every process a run uses, the Gym server apart; instant agents, "
        f"16 in flight): {e['cpu_ms_per_rollout']:.1f} ms with 8 rollouts per actor and "
        f"{o['cpu_ms_per_rollout']:.1f} ms with one per actor, against "
        f"{e['direct_cpu_ms_per_rollout']:.1f} ms for a bare asyncio loop of `/run`, receipt and "
        f"ACK; Ray's own floor for one actor call per rollout is {fl['cpu_ms_per_rollout']:.1f} ms "
        f"({s['thr']}; {s['one']}).",
        f"- **Rollouts/s against that bare loop**, same run: {e['ratio']:.2f}x with 8 per actor, "
        f"{o['ratio']:.2f}x with one per actor (Ray's floor {fl['ratio']:.2f}x); with "
        f"{f['slow8']['agent_ms']} ms agents {f['slow8']['ratio']:.2f}x. The longer the agent, the "
        f"closer to 1x.",
        f"- **Memory**: an actor slot costs {e['actor_pss_mb_per_slot']:.0f} MB (PSS) at 8 per "
        f"actor and {f['one_pss']:.0f} MB at one per actor; "
        f"{b['in_flight']:,} in flight at {b['rollouts_per_actor']} per actor: "
        f"{b['pss_mb_per_rollout']:.1f} MB a rollout, a batch of 1 s agents in "
        f"{b['batch_s']:.1f} s ({s['conc']}).",
        f"- **A checkpoint** with nothing left behind: {f['none1']['ours_s'] * 1000:.0f} ms; "
        f"{f['fin1']['attempts']:,} finished, un-ACKed orphans ACKed and committed in "
        f"{f['fin1']['ours_s']:.2f} s ({s['ckpt']}); over {f['fin_big']['servers']} durable "
        f"servers {f['fin_big']['attempts']:,} finished in {f['fin_big']['ours_s']:.1f} s and "
        f"{f['run_big']['attempts']:,} running retired in {f['run_big']['ours_s']:.1f} s "
        f"({s['scale']}).",
        f"- **More nodes**: {f['most']['nodes']} raylets on this machine run "
        f"{f['most']['vs_1_node']:.2f}x the rollouts/s of one with 100 ms agents "
        f"({f['most']['cores_busy']:.2f} of the 2 cores busy: the cores are the bound; "
        f"{s['scale']}).",
    ]


def buys_lines(f: dict[str, Any]) -> list[str]:
    ours, asis = f["ours"], f["asis"]
    return [
        f"- **What it buys** (the fault storm: rows whose replies get lost, a checkpoint after "
        f"each batch; {f['src']['storm']}): ours committed {ours[1]} checkpoints, left "
        f"{ours[2]} attempts un-ACKed and adopted {ours[10]} finished tries instead of rerunning "
        f"them; the as-is policy (ACK what was received, never retire) committed {asis[1]}, left "
        f"{asis[2]} un-ACKed on Gym and reran {asis[5]} tries ({asis[6]:.0f} agent-seconds "
        f"wasted against {ours[6]:.0f}).",
    ]


def readme_block() -> str:
    f = figures()
    return "\n".join([BEGIN, *cost_lines(f), *buys_lines(f), END])


def results_section() -> list[str]:
    """The opening screen of RESULTS.md."""
    f = figures()
    storm = load("fault_storm")
    table = storm["tables"][0]
    return [
        "## At a glance",
        "",
        "What a rollout costs:",
        "",
        *cost_lines(f),
        "",
        "What it buys: the fault storm, this project against the as-is policy "
        f"({f['src']['storm']}). {table['caption']}",
        "",
        table["markdown"],
        "",
        "![fault storm](results/fault_storm.png)",
        "",
        "The rest, below: [throughput](#throughput), [concurrency](#concurrency), "
        "[checkpoint latency](#checkpoint-latency), [the fault storm](#fault-storm), "
        "[a node lost](#cluster-a-node-lost-mid-batch), [at scale](#at-scale-raylets-16-gym-"
        "servers-big-checkpoints-make-bench-scale), [memory over a long run](#soak-memory-over-"
        "a-long-run). The README's cost figures are this section's (`benchmarks/glance.py`).",
        "",
    ]


def readme_with_block(text: str, block: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise MissingResult(f"README.md has no {BEGIN} ... {END} block")
    return text[:start] + block + text[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", action="store_true", help="rewrite the README's block")
    args = parser.parse_args(argv)
    try:
        block = readme_block()
    except MissingResult as exc:
        print(f"glance: {exc}", file=sys.stderr)
        return 1
    if args.readme:
        README.write_text(readme_with_block(README.read_text(), block))
        print(f"glance: {README.relative_to(ROOT)} updated")
    else:
        print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
