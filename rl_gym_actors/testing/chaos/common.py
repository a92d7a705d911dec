"""What every chaos scenario shares: its sizes, its row, and the helpers that start, watch and
settle a run."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rl_gym_actors.config import GymEndpoint, TryPolicy
from rl_gym_actors.errors import CheckpointFailed
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.outcome import Outcome
from rl_gym_actors.testing.polling import wait_for


@dataclass(frozen=True)
class Sizes:
    rows: int = 16
    pool: int = 2
    per_actor: int = 2
    sleep_s: float = 0.5
    protocol: str = "agent"  # the Gym server's: "agent" (gym serve's default) or "v2"


QUICK = Sizes()
FULL = Sizes(rows=64, pool=4, per_actor=4, sleep_s=1.0)


@dataclass
class ChaosRow:
    scenario: str
    expected: str
    rows: int = 0
    sealed: int = 0
    failed_reason: int = 0
    failed_silent: int = 0
    gym_running: int | None = None
    gym_unacked: int | None = None
    committed: bool | None = None
    recover_s: float | None = None
    rewards_twice: int = 0
    ok: bool = False
    happened: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def count(self, outcomes: Iterable[Outcome]) -> ChaosRow:
        for o in outcomes:
            self.rows += 1
            if o.status == "sealed":
                self.sealed += 1
            elif o.reason:
                self.failed_reason += 1
            else:
                self.failed_silent += 1
        return self

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _twice(outcomes: Iterable[Outcome]) -> int:
    sealed = Counter(o.rollout_id for o in outcomes if o.status == "sealed")
    return sum(1 for n in sealed.values() if n > 1)


def _soon(s: float = 5.0) -> float:
    return time.time() + s


async def _v2_status(client: GymClient) -> Any | None:
    """The server's v2 status when it speaks v2 (not the agent-checkpoint routes), else None."""
    from rl_gym_actors.gym.v2.client import V2Client
    from rl_gym_actors.gym.v2.discover import CheckpointProtocol, discover_protocol

    found = await discover_protocol(client, deadline_ts=_soon())
    if found.protocol is not CheckpointProtocol.V2:
        return None
    return await V2Client(client).status(deadline_ts=_soon())


async def _gym_counts(endpoint: GymEndpoint) -> tuple[int, int]:
    async with GymClient(endpoint) as client:
        v2 = await _v2_status(client)
        if v2 is not None:  # episodes held, kept replies ((ext): v2's un-ACKed)
            extra = v2.model_extra or {}
            return v2.report.counts.get("episodes", 0), int(extra.get("kept_replies", 0))
        st = await client.status("chaos-probe", deadline_ts=_soon())
        return st.running, st.completed_unacknowledged


def gym_counts(endpoint: GymEndpoint) -> tuple[int, int]:
    """(running, completed un-ACKed) on one server, from its status; on a v2 server (episodes
    held, kept replies)."""
    return asyncio.run(_gym_counts(endpoint))


async def _retired_marks(endpoint: GymEndpoint) -> int | None:
    async with GymClient(endpoint) as client:
        v2 = await _v2_status(client)
        return None if v2 is None else v2.retired_rollouts


def retired_marks(endpoint: GymEndpoint) -> int | None:
    """A v2 server's retired marks (None on an agent-checkpoint server)."""
    return asyncio.run(_retired_marks(endpoint))


def thread_server(sizes: Sizes, agent: Any = None, **kw: Any) -> Any:
    """An in-process Gym server of the scenario's protocol (not started); ``agent``: an async
    callable (a :class:`CountingAgent` by default, so that :func:`agent_runs` can count)."""
    from rl_gym_actors.testing.counting_agent import CountingAgent
    from rl_gym_actors.testing.gym_process import GymServerThread
    from rl_gym_actors.testing.v2_server import V2ServerThread

    if sizes.protocol == "v2":
        return V2ServerThread(agent=agent or CountingAgent(), **kw)
    return GymServerThread(**({} if agent is None else {"agent": agent}), **kw)


def process_server(sizes: Sizes, **kw: Any) -> Any:
    """``gym serve`` of the scenario's protocol in a subprocess (not started)."""
    from rl_gym_actors.testing.gym_process import GymServerProcess

    if sizes.protocol == "v2":
        kw["args"] = [*kw.get("args", ()), "--protocol", "v2"]
    return GymServerProcess(**kw)


def agent_runs(server: Any) -> int:
    """How many runs the agent of an in-process server (from :func:`thread_server`) started."""
    snapshot = getattr(server.participant, "snapshot", None)
    if snapshot is not None:  # the agent-checkpoint participant counts its own
        return int(snapshot()["agent_starts"])
    return sum(server.agent.starts.values())


def _in_background(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
    """``fn(*args, **kwargs)`` in a thread of its own; its result (or error) from the future."""
    future: Future = Future()

    def go() -> None:
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to whoever reads the result
            future.set_exception(exc)

    threading.Thread(target=go, daemon=True).start()
    return future


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    wait_for(predicate, timeout_s=timeout_s, interval_s=0.02, what=what)


def _state(endpoint: GymEndpoint) -> str:
    """The agent-checkpoint state; a v2 server's phase (``idle`` and accepting: ``accepting``)."""

    async def read() -> str:
        async with GymClient(endpoint) as client:
            v2 = await _v2_status(client)
            if v2 is not None:
                accepting = (v2.model_extra or {}).get("accepting", True)
                idle = v2.phase.value == "idle"
                return "accepting" if idle and accepting else v2.phase.value
            return (await client.status("chaos-probe", deadline_ts=_soon())).state

    return asyncio.run(read())


def _running(endpoint: GymEndpoint) -> int:
    return gym_counts(endpoint)[0]


def _rows(prefix: str, sizes: Sizes, n: int | None = None, sleep_s: float | None = None):
    return [
        {
            "_ng_rollout_id": f"{prefix}-{i}",
            "reward": 0.5,
            "sleep_s": sizes.sleep_s if sleep_s is None else sleep_s,
        }
        for i in range(sizes.rows if n is None else n)
    ]


def _orchestrator(endpoint: GymEndpoint, sizes: Sizes, policy: TryPolicy, **kw: Any):
    from rl_gym_actors.orchestrator import Orchestrator

    return Orchestrator(
        [endpoint],
        policy=policy,
        pool_size=sizes.pool,
        rollouts_per_actor=sizes.per_actor,
        progress=False,
        **kw,
    )


def _after(
    row: ChaosRow,
    orch: Any,
    endpoint: GymEndpoint,
    tmp: Path,
    cid: str,
    fault_at: float,
    outcomes: list[Outcome],
    deadline_s: float = 60.0,
) -> None:
    """The trainer's next step after the fault: a checkpoint; then Gym's counts."""
    try:
        orch.checkpoint(cid, str(tmp / cid), deadline_s=deadline_s)
        row.committed = True
        row.recover_s = time.monotonic() - fault_at
    except CheckpointFailed as exc:
        row.committed = False
        row.happened += f" checkpoint failed: {exc}"[:300]
    row.gym_running, row.gym_unacked = gym_counts(endpoint)
    marks = retired_marks(endpoint)
    if marks is not None:
        row.extra["retired_marks"] = marks
    row.rewards_twice = _twice(outcomes)


def _clean(row: ChaosRow) -> bool:
    return (
        row.extra.get("retired_marks", 0) == 0  # v2: every retired mark forgotten
        and row.failed_silent == 0
        and row.committed is True
        and row.gym_running == 0
        and row.gym_unacked == 0
        and row.rewards_twice == 0
    )
