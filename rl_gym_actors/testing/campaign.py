"""A fault campaign in the Jepsen style: a trainer killed at instants spread over its checkpoints,
restored the documented way, and a checker from Gym's side and the trainer's.

Each instant is a run of its own on one Gym server of the protocol (``agent``: the
agent-checkpoint protocol without a lease, as a real Gym; ``v2``: a 600 s lease). Trainer A
(:mod:`rl_gym_actors.testing.campaign_trainer`, a process with a local Ray of its own) runs
steps 1.. and is SIGKILLed with its Ray in checkpoint ``step-K`` (K = 2 or 3, seeded) at the
instant's phase:

- ``prepare``: Gym performed prepare, A never got its answer (agent: admission closed while
  A's next rows drain; v2: episodes parked);
- ``ack`` (agent) / ``forget`` (v2): Gym performed A's ACK batch / forget, A never got the answer;
- ``before-commit``: A sent commit, Gym never performed it (between ACK or prepare and commit);
- ``commit``: Gym committed, A never got the answer;
- ``before-resume``: committed, A's resume never performed;
- ``part``: inside A's part write (its sealed-id file written, ``part.json`` not);
- ``report``: the gate returned (committed, resumed), ``checkpoint()`` has not;
- ``between``: a seeded instant 0-0.3 s after checkpoint K-1 returned, between two checkpoints.

Server-side phases are held by :class:`~rl_gym_actors.testing.phase_hold.PhaseHold` (A waits
at checkpoint K until it is armed), driver-side ones by A's ``--pause``. Trainer B starts (its
Ray, when it has one of its own) while A runs and starts its orchestrator once A is dead: it
restores from ``latest_checkpoint_dir``, sends the same rows and runs on to step K+2 and a
final checkpoint. The checker reads Gym's agent log (:class:`AgentLog`: each
key's starts, continuations, finished runs) and B's final state (what was trained), and says per
instant: rows lost (never trained, or trained from no reply), finished runs rerun (from their
input), v2 runs that finished after the commit exported them and were continued from that
boundary again by the restore (``tail_rerun``: Gym is restored to the checkpoint's cut), results
trained twice, whether B's first checkpoint committed at its first try, seconds from the kill
and from B's start to Gym taking work again, and from the kill to B's first commit.

:func:`run_campaign` runs a list of :class:`Instant` (:func:`schedule` draws them) and returns
the rows; :func:`totals` sums them. The benchmark (``benchmarks/fault_campaign.py``) and the
slow test (``tests/test_fault_campaign.py``) both call it.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl_gym_actors.protocol import ATTEMPT_INDEX_FIELD, ROLLOUT_ID_FIELD
from rl_gym_actors.testing.campaign_trainer import FINAL_FILE, checkpoint_id, rows_of
from rl_gym_actors.testing.driver import DriverProcess, alive
from rl_gym_actors.testing.phase_hold import PhaseHold

TOKEN = "campaign-token"
TRAINER = "rl_gym_actors.testing.campaign_trainer"
# phase -> (control route suffix, held before or after Gym performs it); None: the trainer's
SERVER_PHASES: dict[str, dict[str, tuple[str, str]]] = {
    "agent": {
        "prepare": ("/prepare", "after"),
        "ack": ("/acknowledge-completed", "after"),
        "before-commit": ("/commit", "before"),
        "commit": ("/commit", "after"),
        "before-resume": ("/resume", "before"),
    },
    "v2": {
        "prepare": ("/prepare", "after"),
        "forget": ("/forget", "after"),
        "before-commit": ("/commit", "before"),
        "commit": ("/commit", "after"),
        "before-resume": ("/resume", "before"),
    },
}
DRIVER_PHASES = ("part", "report")
BETWEEN = "between"


def phases(protocol: str) -> list[str]:
    return [*SERVER_PHASES[protocol], *DRIVER_PHASES, BETWEEN]


@dataclass(frozen=True)
class Instant:
    """Where one kill lands: the protocol, checkpoint ``step-<step>``'s ``phase`` (``between``:
    ``delay_s`` into step ``step``'s rows), the trainer (``keep``: a buffer across 2
    checkpoints; ``order``: its state written ``first`` or ``after`` ``checkpoint()``)."""

    protocol: str
    phase: str
    step: int
    delay_s: float = 0.0
    keep: bool = True
    order: str = "first"


def schedule(
    protocol: str, n: int, seed: int, *, keep: bool = True, order: str = "first"
) -> list[Instant]:
    """``n`` instants by a seeded RNG: every phase once before any twice (a shuffled round of
    all phases, then another), each at checkpoint 2 or 3, ``between`` at 0-0.3 s."""
    rng = random.Random(f"{seed}-{protocol}-{keep}-{order}")
    out: list[Instant] = []
    while len(out) < n:
        round_ = phases(protocol)
        rng.shuffle(round_)
        for phase in round_[: n - len(out)]:
            delay = round(rng.uniform(0.0, 0.3), 3) if phase == BETWEEN else 0.0
            out.append(Instant(protocol, phase, rng.choice([2, 3]), delay, keep, order))
    return out


# ---------------------------------------------------------------- Gym's side: the agent log


class AgentLog:
    """What the Gym server's agent did, per key: starts (a v2 continuation counted apart) and
    finished runs. Thread-safe; the agents are :meth:`agent` (agent-checkpoint) and
    :meth:`step_agent` (v2)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.starts: Counter[str] = Counter()
        self.continued: Counter[str] = Counter()
        self.finished: Counter[str] = Counter()  # runs that finished, started from the input
        self.finished_continued: Counter[str] = Counter()  # ... continued from a boundary

    def _start(self, row: dict[str, Any], continued: bool = False) -> str:
        rid = str(row.get(ROLLOUT_ID_FIELD))
        with self._lock:
            self.starts[rid] += 1
            if continued:
                self.continued[rid] += 1
        return rid

    def _finish(self, rid: str, continued: bool = False) -> None:
        with self._lock:
            (self.finished_continued if continued else self.finished)[rid] += 1

    async def agent(self, row: dict[str, Any]) -> dict[str, Any]:
        from rl_gym_actors.gym.agents import simulated_agent

        rid = self._start(row)
        reply = await simulated_agent(row)
        reply["attempt"] = row.get(ATTEMPT_INDEX_FIELD)
        self._finish(rid)
        return reply

    async def step_agent(self, row: dict[str, Any], steps: Any) -> dict[str, Any]:
        from rl_gym_actors.gym.v2.stepped import stepped_simulated_agent

        continued = steps.continuation is not None
        rid = self._start(row, continued=continued)
        reply = await stepped_simulated_agent(row, steps)
        self._finish(rid, continued)
        return reply

    def of_run(self, run_id: str) -> dict[str, dict[str, int]]:
        prefix = f"{run_id}-s"
        with self._lock:
            return {
                name: {r: n for r, n in c.items() if r.startswith(prefix)}
                for name, c in (
                    ("starts", self.starts),
                    ("continued", self.continued),
                    ("finished", self.finished),
                    ("finished_continued", self.finished_continued),
                )
            }


def server_for(protocol: str, log: AgentLog, hold: PhaseHold) -> Any:
    """The project's ``gym serve`` in a thread of this process, with the hold in front."""
    if protocol == "agent":
        from rl_gym_actors.testing.gym_process import GymServerThread

        return GymServerThread(
            agent=log.agent,
            token=TOKEN,
            allow_faults=False,
            args=["--checkpoint-lease-s", "0"],  # no lease, as a real Gym
            extensions=[hold.extension()],
        )
    from rl_gym_actors.testing.v2_server import V2ServerThread

    return V2ServerThread(agent=log.step_agent, token=TOKEN, extensions=[hold.extension()])


def gym_open(server: Any) -> bool:
    """Whether Gym takes work: no checkpoint holds it (read in the server's process)."""
    participant = server.participant
    if participant is None:
        return False
    if hasattr(participant, "status") and hasattr(participant, "machine"):  # v2
        return bool(participant.status()["phase"] == "idle")
    return bool(participant.snapshot()["phase"] == "idle")


class OpenWatch:
    """A thread reading :func:`gym_open` every 20 ms: the first time Gym takes work again."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.opened_at: float | None = None
        self.held_seen = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            if gym_open(self.server):
                self.opened_at = time.time()
                return
            self.held_seen = True
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


# ---------------------------------------------------------------- one instant


@dataclass
class InstantResult:
    """One row of the campaign's table."""

    instant: Instant
    run_id: str
    landed: str = ""  # where the kill landed (the phase, or what was seen instead)
    rows: int = 0
    lost: int = 0
    rerun: int = 0
    twice: int = 0
    continued: int = 0  # v2: runs that continued from an exported boundary
    tail_rerun: int = 0  # v2: finished after the commit, continued from its boundary again
    first_commit_first_try: bool = False
    first_tries: int = 0
    gym_held_at_kill: bool = False
    kill_to_open_s: float | None = None
    start_to_open_s: float | None = None  # B's start to Gym taking work (<= 0: never held)
    kill_to_commit_s: float | None = None
    b_started_after_kill_s: float | None = None
    baseline_commit_s: float | None = None  # A, unkilled: its start to its first commit
    lost_ids: list[str] = field(default_factory=list)
    rerun_ids: list[str] = field(default_factory=list)
    twice_ids: list[str] = field(default_factory=list)
    tail_rerun_ids: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(d.pop("instant"))
        return d


def _trainer_args(server: Any, run_id: str, root: Path, inst: Instant, steps: int) -> list[str]:
    args = ["--url", server.url, "--token", TOKEN, "--run-id", run_id, "--root", str(root)]
    args += ["--protocol", inst.protocol, "--steps", str(steps), "--rows", "6"]
    args += ["--order", inst.order, "--deadline-s", "60"]
    return args + (["--keep"] if inst.keep else [])


def _kill(driver: DriverProcess) -> float:
    pids = driver.kill()
    deadline = time.monotonic() + 30
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return time.time()


def run_instant(
    server: Any,
    log: AgentLog,
    hold: PhaseHold,
    inst: Instant,
    run_id: str,
    workdir: Path,
    *,
    ray_address: str | None = None,
    timeout_s: float = 240.0,
) -> InstantResult:
    """Kill trainer A at ``inst``, restore trainer B, check. Never raises for what it finds:
    a trainer that failed is the row's ``errors``."""
    t0 = time.monotonic()
    res = InstantResult(inst, run_id)
    root = workdir / run_id
    root.mkdir(parents=True)
    steps = inst.step + 2
    base = _trainer_args(server, run_id, root, inst, steps)
    if ray_address:  # a Ray shared by the trainers (else each starts one of its own)
        base += ["--ray-address", ray_address]
    extra: list[str] = []
    server_phase = SERVER_PHASES[inst.protocol].get(inst.phase)
    if server_phase is not None:
        extra += ["--arm-step", str(inst.step)]
    elif inst.phase in DRIVER_PHASES:
        extra += ["--pause", f"{inst.phase}:{inst.step}"]
    with open(root / "a.stderr", "w") as a_err, open(root / "b.stderr", "w") as b_err:
        a = DriverProcess(base + extra, module=TRAINER, stderr=a_err)
        # B starts while A runs and restores once A is dead (``go``): its start is then
        b_args = [*base, "--go-file", str(root / "go")]
        b = DriverProcess(b_args, module=TRAINER, stderr=b_err)
        try:
            _kill_and_restore(server, hold, inst, res, a, b, root, server_phase, timeout_s)
        finally:
            for name, d in (("a", a), ("b", b)):
                d.kill()  # gone already, unless something above raised
                lines = "".join(json.dumps(e) + "\n" for e in d.events)
                (root / f"{name}.events").write_text(lines)
    _check(res, log, root, run_id, steps)
    res.seconds = time.monotonic() - t0
    return res


def _kill_and_restore(
    server: Any,
    hold: PhaseHold,
    inst: Instant,
    res: InstantResult,
    a: DriverProcess,
    b: DriverProcess,
    root: Path,
    server_phase: tuple[str, str] | None,
    timeout_s: float,
) -> None:
    try:
        if server_phase is not None:
            a.wait_for("checkpointing", timeout_s)
            suffix, when = server_phase
            cid = checkpoint_id(res.run_id, inst.step)
            hold.arm(suffix, None if inst.phase == "ack" else cid, when)
            (root / f"armed-{inst.step}").touch()
            res.landed = _until_reached(a, hold, cid, inst.phase, timeout_s)
        elif inst.phase in DRIVER_PHASES:
            a.wait_for("paused", timeout_s)
            res.landed = inst.phase
        else:
            _wait_checkpoint(a, checkpoint_id(res.run_id, inst.step - 1), timeout_s)
            time.sleep(inst.delay_s)  # the seeded instant between checkpoints
            res.landed = BETWEEN
    except (TimeoutError, RuntimeError) as exc:
        res.errors.append(f"A: {exc}")
    killed_at = _kill(a)
    res.baseline_commit_s = _start_to_commit(a)
    hold.disarm()  # what it holds stays held: released when the campaign is done
    res.gym_held_at_kill = not gym_open(server)
    watch = OpenWatch(server)
    (root / "go").touch()
    try:
        started = b.wait_for("started", timeout_s)
        res.b_started_after_kill_s = started["ts"] - killed_at
        first = b.wait_for("checkpoint", timeout_s)
        res.first_tries = int(first.get("tries", 0))
        res.first_commit_first_try = bool(first.get("committed")) and res.first_tries == 1
        if first.get("errors"):
            res.errors += [f"B first checkpoint: {e}" for e in first["errors"]]
        res.kill_to_commit_s = first["ts"] - killed_at
        b.wait_for("done", timeout_s)
        b.wait(30)
    except (TimeoutError, RuntimeError) as exc:
        res.errors.append(f"B: {exc}")
    watch.stop()
    if watch.opened_at is not None:
        res.kill_to_open_s = max(watch.opened_at - killed_at, 0.0)
        if res.b_started_after_kill_s is not None:
            res.start_to_open_s = watch.opened_at - (killed_at + res.b_started_after_kill_s)


def _check(res: InstantResult, log: AgentLog, root: Path, run_id: str, steps: int) -> None:
    """The checker: B's final state (what was trained) against every row; Gym's agent log."""

    rows = [r for s in range(1, steps + 1) for r in rows_of(run_id, s, 6, "")]
    expected = {r["_ng_rollout_id"] for r in rows}
    res.rows = len(expected)
    trained: Counter[str] = Counter()
    final = root / FINAL_FILE
    if final.is_file():
        state = json.loads(final.read_text())
        trained.update(rid for rid, _, _ in state["trained"])
    else:
        res.errors.append("B wrote no final state")
    res.lost_ids = sorted(expected - set(trained))
    res.twice_ids = sorted(r for r, n in trained.items() if n > 1)
    gym = log.of_run(run_id)
    res.rerun_ids = sorted(r for r, n in gym["finished"].items() if n > 1)
    # v2: a run that finished after the commit exported it, continued again from that boundary
    # by the restore (Gym back at the checkpoint's cut): its steps after the boundary ran twice
    res.tail_rerun_ids = sorted(
        r for r in gym["finished_continued"] if gym["finished"].get(r, 0) >= 1
    )
    res.tail_rerun = len(res.tail_rerun_ids)
    res.lost, res.twice, res.rerun = len(res.lost_ids), len(res.twice_ids), len(res.rerun_ids)
    res.continued = sum(gym["continued"].values())


def _start_to_commit(d: DriverProcess) -> float | None:
    """From the trainer's ``started`` line to its first committed checkpoint's."""
    try:
        d.wait_for("", 0.2)  # the lines it printed before it died
    except (TimeoutError, RuntimeError):
        pass
    started = next((e["ts"] for e in d.events if e.get("event") == "started"), None)
    done = next(
        (e["ts"] for e in d.events if e.get("event") == "checkpoint" and e.get("committed")), None
    )
    return None if started is None or done is None else done - started


def _wait_event(
    d: DriverProcess, pred: Callable[[dict[str, Any]], bool], timeout_s: float
) -> dict[str, Any]:
    """The first line of ``d`` that ``pred`` takes (TimeoutError; RuntimeError: ``d`` ended)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for ev in [*d.events, {}]:  # {}: a predicate that reads more than the lines
            if pred(ev):
                return ev
        if time.monotonic() > deadline:
            raise TimeoutError(f"no such line within {timeout_s}s")
        try:
            d.wait_for("", 0.05)  # no line has an empty event: reads what came meanwhile
        except TimeoutError:
            pass


def _wait_checkpoint(d: DriverProcess, cid: str, timeout_s: float) -> dict[str, Any]:
    return _wait_event(
        d, lambda ev: ev.get("event") == "checkpoint" and ev.get("checkpoint_id") == cid, timeout_s
    )


def _until_reached(
    d: DriverProcess, hold: PhaseHold, cid: str, phase: str, timeout_s: float
) -> str:
    """The phase once the held call came; if A's checkpoint ``cid`` returned first (that call
    never came), ``missed: <phase>``."""
    returned = [False]

    def seen(ev: dict[str, Any]) -> bool:
        if ev.get("event") == "checkpoint" and ev.get("checkpoint_id") == cid:
            returned[0] = True
        return hold.reached.is_set() or returned[0]

    _wait_event(d, seen, timeout_s)
    return phase if hold.reached.is_set() else f"missed: {phase}"


def run_campaign(
    instants: list[Instant],
    *,
    workdir: str | Path | None = None,
    ray_address: str | None = None,
    on_result: Callable[[InstantResult], None] | None = None,
) -> list[InstantResult]:
    """Each protocol's instants in turn on a server of its own (started here, stopped at the
    end); the protocols at once, a thread each. ``ray_address``: a running Ray the trainers
    join (a kill takes the trainer's process, and Ray ends the actors it owned); None: each
    trainer starts a local Ray of its own, which the kill takes with it. The results in the
    order of ``instants``."""
    base = Path(workdir or tempfile.mkdtemp(prefix="rlga-campaign-"))
    by_protocol: dict[str, list[tuple[int, Instant]]] = {}
    for n, inst in enumerate(instants):
        by_protocol.setdefault(inst.protocol, []).append((n, inst))
    done: dict[int, InstantResult] = {}
    lock = threading.Lock()
    failures: list[BaseException] = []

    def one_protocol(protocol: str, todo: list[tuple[int, Instant]]) -> None:
        log, hold = AgentLog(), PhaseHold()
        try:
            with server_for(protocol, log, hold) as server:
                try:
                    for i, (n, inst) in enumerate(todo):
                        variant = f"{'keep' if inst.keep else 'sync'}-{inst.order}"
                        run_id = f"camp-{protocol}-{variant}-{i}"
                        res = run_instant(
                            server, log, hold, inst, run_id, base, ray_address=ray_address
                        )
                        with lock:
                            done[n] = res
                            if on_result is not None:
                                on_result(res)
                finally:
                    hold.release()
        except BaseException as exc:  # re-raised in the caller's thread
            failures.append(exc)

    threads = [
        threading.Thread(target=one_protocol, args=item, daemon=True)
        for item in by_protocol.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if workdir is None:
        shutil.rmtree(base, ignore_errors=True)
    if failures:
        raise failures[0]
    return [done[n] for n in sorted(done)]


def totals(results: list[InstantResult]) -> dict[str, Any]:
    """The campaign's sums and worst cases."""

    def worst(name: str) -> float | None:
        vals = [getattr(r, name) for r in results if getattr(r, name) is not None]
        return max(vals) if vals else None

    return {
        "instants": len(results),
        "rows": sum(r.rows for r in results),
        "lost": sum(r.lost for r in results),
        "rerun": sum(r.rerun for r in results),
        "tail_rerun": sum(r.tail_rerun for r in results),
        "twice": sum(r.twice for r in results),
        "first_commit_first_try": sum(r.first_commit_first_try for r in results),
        "gym_held_at_kill": sum(r.gym_held_at_kill for r in results),
        "landed": sum(not r.landed.startswith("missed") and bool(r.landed) for r in results),
        "errors": sum(bool(r.errors) for r in results),
        "max_kill_to_open_s": worst("kill_to_open_s"),
        "max_start_to_open_s": worst("start_to_open_s"),
        "max_kill_to_commit_s": worst("kill_to_commit_s"),
    }
