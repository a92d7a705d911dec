"""A restore of a checkpoint's Gym v2 episodes for a new trainer (``actors/v2_restore.py``), on
v2 servers on loopback, without Ray: this run's attempts a dead trainer left running are retired
first (each checkpointed attempt, and every own episode the server reports running), the exported
episodes are installed as their next attempt and the servers resumed; a replacement ``/run`` then
runs only the steps after its boundary. All or nothing: one server that cannot restore leaves
every server with nothing pending (the replacements retired) and every rollout starting over;
another run's live episode (Gym restores only into a participant without one) is left alone and
fails the restore the same way. Also: the checkpoint part keeps the scopes; the rollout memory
dispatches a restored rollout's next row as the attempt the restore named, retiring nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import pytest

from rl_gym_actors.actors.gate_endpoint import OwnerAnswer
from rl_gym_actors.actors.v2_gate import RestoredPending, V2Gate
from rl_gym_actors.actors.v2_restore import restore
from rl_gym_actors.checkpoint_part import add_gym_v2, read_part, write_part
from rl_gym_actors.core.attempt_book import AttemptBook
from rl_gym_actors.core.checkpoint_report import V2EndpointScope
from rl_gym_actors.core.rollout_memory import RolloutMemory
from rl_gym_actors.core.sealed_ids import SealedIds
from rl_gym_actors.errors import StaleAttempt
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2 import coordinate as co
from rl_gym_actors.gym.v2.wire import EpisodeId
from rl_gym_actors.testing.polling import until
from rl_gym_actors.testing.v2_server import V2ServerThread

aio = pytest.mark.asyncio(loop_scope="session")
STEPS = 6


def soon(seconds: float = 10.0) -> float:
    return time.time() + seconds


def own(rid: str) -> bool:
    return rid.startswith("run-")


@contextlib.asynccontextmanager
async def servers(n: int):
    with contextlib.ExitStack() as stack:
        srvs = [stack.enter_context(V2ServerThread()) for _ in range(n)]
        async with contextlib.AsyncExitStack() as astack:
            clients = [await astack.enter_async_context(GymClient(s.endpoint)) for s in srvs]
            named = {s.endpoint.label: c for s, c in zip(srvs, clients, strict=True)}
            parts = await co.discover_participants(named, deadline_ts=soon())
            by_label = {p.name: p for p in parts}
            targets = [(s.endpoint, by_label[s.endpoint.label]) for s in srvs]
            yield srvs, clients, targets


def start(client: GymClient, rid: str, attempt: int = 0, steps: int = STEPS) -> asyncio.Future:
    row = {"steps": steps, "step_s": 0.15, "reward": 0.5}
    return asyncio.ensure_future(
        client.run(row, rollout_id=rid, attempt_index=attempt, deadline_ts=soon(60))
    )


def boundaries(checkpoint_dir: str) -> dict[str, int]:
    found = {}
    for manifest in Path(checkpoint_dir).rglob("manifest.json"):
        meta = json.loads(manifest.read_text())
        for line in (manifest.parent / meta["records_file"]).read_text().splitlines():
            record = json.loads(line)
            rid = EpisodeId.model_validate(record["episode_id"]).rollout_id
            found[rid] = (record["boundary"] or {}).get("step", 0)
    return found


async def checkpoint(srv, client, target, rids, tmp_path, cid="ck-1") -> V2EndpointScope:
    """Run ``rids`` on one server and commit them parked after a step or two."""
    runs = [start(client, r) for r in rids]
    await until(lambda: srv.participant.steps_run >= 2 * len(rids), what="steps")
    directory = str(tmp_path / target[0].label.replace(":", "_").replace("/", "_"))
    out = await co.checkpoint(
        [target[1]],
        cid,
        {target[1].name: directory},
        [EpisodeId(rollout_id=r) for r in rids],
        timeout_s=10.0,
    )
    assert sorted(out.commits[target[1].name].episode_ids) == sorted(rids)
    srv.dead_runs = runs  # the trainer that sent them "dies": nobody reads their answers
    return V2EndpointScope(
        endpoint=target[0].url, label=target[0].label, checkpoint_dir=directory, exported=rids
    )


async def gone(runs) -> None:
    await asyncio.gather(*runs, return_exceptions=True)


@aio
async def test_restore_retires_the_dead_trainers_runs_and_continues_from_the_boundary(tmp_path):
    async with servers(1) as ([srv], [client], [target]):
        scope = await checkpoint(srv, client, target, ["run-a", "run-b"], tmp_path)
        late = start(client, "run-late")  # started after the checkpoint, then orphaned
        foreign = start(client, "other-x", steps=2)  # another run's, finishes on its own
        await until(lambda: "run-late" in srv.participant.table.live, what="late run")
        await foreign
        book, pending = AttemptBook(), RestoredPending()
        report = await restore(
            book,
            [target],
            [scope],
            restore_id="rs-1",
            source_checkpoint_id="ck-1",
            deadline_ts=soon(),
            own=own,
            pending=pending,
        )
        assert report.restored and report.error is None, report
        assert report.placed == {"run-a": target[0].url, "run-b": target[0].url}
        assert report.next_attempts == {"run-a": 1, "run-b": 1, "run-late": 1}
        assert report.endpoints[0].retired == 3
        assert report.endpoints[0].restored == ["run-a-a1", "run-b-a1"]
        assert report.endpoints[0].source_checkpoint_id == "ck-1"
        status = srv.participant.status()
        assert status["phase"] == "idle" and status["accepting"] is True
        assert status["restored_pending"] == ["run-a-a1", "run-b-a1"]
        assert status["report"]["counts"]["episodes"] == 0  # nothing of the dead trainer runs
        assert pending.on(book, target[0].url) == [("run-a", 1), ("run-b", 1)]
        await gone([*srv.dead_runs, late])
        with pytest.raises(StaleAttempt):  # the dead trainer's attempt stays refused
            await client.run({}, rollout_id="run-late", attempt_index=0, deadline_ts=soon())
        step = boundaries(scope.checkpoint_dir)
        before = srv.participant.steps_run
        replies = await asyncio.gather(start(client, "run-a", 1), start(client, "run-b", 1))
        assert [r.reply["steps_run"] for r in replies] == [
            STEPS - step["run-a"],
            STEPS - step["run-b"],
        ]
        assert srv.participant.steps_run - before == 2 * STEPS - step["run-a"] - step["run-b"]


@aio
async def test_a_restore_after_an_interrupted_one_takes_its_pending_episodes_over(tmp_path):
    """A restorer that died after its restore (before any row) left run-a and run-b installed,
    pending, and a replacement of an earlier restore (run-old) the checkpoint does not name.
    The next restore of the same checkpoint installs nothing again (Gym would refuse: the
    pending episodes): it takes run-a's and run-b's over as they are, retires run-old's, and
    each replacement continues from its boundary."""
    async with servers(1) as ([srv], [client], [target]):
        scope = await checkpoint(srv, client, target, ["run-a", "run-b"], tmp_path)
        first = await restore(
            AttemptBook(),
            [target],
            [scope],
            restore_id="rs-1",
            source_checkpoint_id="ck-1",
            deadline_ts=soon(),
            own=own,
            pending=RestoredPending(),
        )
        assert first.restored, first
        srv.participant.table.install([(EpisodeId(rollout_id="run-old"), {"step": 1})])
        book, pending = AttemptBook(), RestoredPending()  # the next trainer's: it knows nothing
        report = await restore(
            book,
            [target],
            [scope],
            restore_id="rs-2",
            source_checkpoint_id="ck-1",
            deadline_ts=soon(),
            own=own,
            pending=pending,
        )
        assert report.restored and report.error is None, report
        assert report.endpoints[0].taken_over == ["run-a-a1", "run-b-a1"]
        assert report.placed == {"run-a": target[0].url, "run-b": target[0].url}
        assert report.next_attempts == {"run-a": 1, "run-b": 1, "run-old": 2}
        status = srv.participant.status()
        assert status["phase"] == "idle" and status["accepting"] is True
        assert status["restored_pending"] == ["run-a-a1", "run-b-a1"]
        assert pending.on(book, target[0].url) == [("run-a", 1), ("run-b", 1)]
        await gone(srv.dead_runs)
        step = boundaries(scope.checkpoint_dir)
        replies = await asyncio.gather(start(client, "run-a", 1), start(client, "run-b", 1))
        assert [r.reply["steps_run"] for r in replies] == [
            STEPS - step["run-a"],
            STEPS - step["run-b"],
        ]


@aio
async def test_a_server_that_cannot_restore_leaves_every_rollout_to_start_over(tmp_path):
    async with servers(2) as (srvs, clients, targets):
        s0 = await checkpoint(srvs[0], clients[0], targets[0], ["run-a"], tmp_path)
        s1 = await checkpoint(srvs[1], clients[1], targets[1], ["run-b"], tmp_path)
        broken = s1.model_copy(update={"checkpoint_dir": str(tmp_path / "missing")})
        book = AttemptBook()
        report = await restore(
            book,
            targets,
            [s0, broken],
            restore_id="rs-2",
            source_checkpoint_id="ck-1",
            deadline_ts=soon(),
            own=own,
            pending=RestoredPending(),
        )
        assert not report.restored and "restore" in (report.error or "")
        assert report.placed == {}
        assert report.next_attempts == {"run-a": 2, "run-b": 2}  # attempt 1 was retired
        for srv in srvs:
            status = srv.participant.status()
            assert status["phase"] == "idle" and status["accepting"] is True
            assert status["restored_pending"] == []
        assert book.current_attempt("run-a") == 1  # the retired replacement, in the book
        await gone([*srvs[0].dead_runs, *srvs[1].dead_runs])
        again = await start(clients[0], "run-a", 2)  # from its input
        assert again.reply["steps_run"] == STEPS


@aio
async def test_another_runs_live_episode_fails_the_restore_all_or_nothing(tmp_path):
    async with servers(1) as ([srv], [client], [target]):
        scope = await checkpoint(srv, client, target, ["run-a"], tmp_path)
        foreign = start(client, "other-y", steps=40)
        await until(lambda: "other-y" in srv.participant.table.live, what="foreign run")
        report = await restore(
            AttemptBook(),
            [target],
            [scope],
            restore_id="rs-3",
            source_checkpoint_id="ck-1",
            deadline_ts=soon(),
            own=own,
            pending=RestoredPending(),
        )
        assert not report.restored and report.next_attempts == {"run-a": 2}
        status = srv.participant.status()
        assert status["restored_pending"] == [] and status["phase"] == "idle"
        assert list(srv.participant.table.live) == ["other-y"]  # left alone
        foreign.cancel()
        await gone([*srv.dead_runs, foreign])


def test_the_part_keeps_the_scopes_and_memory_runs_the_named_attempt(tmp_path):
    write_part(
        tmp_path, run_id="run", checkpoint_id="ck", handed=[], undelivered=[], sealed=SealedIds()
    )
    scope = V2EndpointScope(
        endpoint="http://127.0.0.1:1",
        label="a",
        checkpoint_dir="d",
        exported=["run-a"],
        start_over=["run-r-a2"],
    )
    add_gym_v2(tmp_path, [scope])
    part, _ = read_part(tmp_path)
    assert part.gym_v2 == [scope] and part.run_id == "run"
    memory = RolloutMemory()
    assert memory.restart_at("run-a", 1)
    plan = memory.plan("run-a")
    assert (plan.first_attempt, plan.previous_attempt, plan.ready) == (1, None, None)
    memory.take("run-a", plan)  # running: a restore no longer touches it
    assert not memory.restart_at("run-a", 5)


class NoOwners:
    """The new trainer has sent no row yet: no rollout actor holds anything."""

    def live(self) -> frozenset[str]:
        return frozenset()

    async def adopt(self, owner, rollout_id, attempt_index, deadline_ts) -> OwnerAnswer:
        return OwnerAnswer.GONE

    async def flush(self, deadline_ts, checkpoint_id=None) -> int:
        return 0


@aio
@pytest.mark.parametrize("kept", [True, False])
async def test_a_restored_episode_stays_in_the_next_commits_scope_until_its_replacement(
    tmp_path, kept
):
    """A checkpoint before the trainer sends the row again: the gate scopes the pending
    replacement (exported under it, kept on Gym, its rollout not forgotten) and the replacement
    continues from the boundary; without it in scope Gym deletes it and the row starts over."""
    async with servers(1) as ([srv], [client], [target]):
        scope = await checkpoint(srv, client, target, ["run-a"], tmp_path)
        book, pending = AttemptBook(), RestoredPending()
        report = await restore(
            book,
            [target],
            [scope],
            restore_id="rs-4",
            source_checkpoint_id="ck-1",
            deadline_ts=soon(),
            own=own,
            pending=pending if kept else RestoredPending(),
        )
        assert report.restored and report.endpoints[0].restored == ["run-a-a1"]
        await gone(srv.dead_runs)
        gate = V2Gate(
            book,
            [target[0]],
            [""],
            [target[1]],
            NoOwners(),
            control_s=5.0,
            own=own,
            restored=pending,
        )
        [entry] = await gate.run("ck-2", str(tmp_path / "ck-2"), soon(20))
        extra = entry.commit.model_extra or {}
        status = srv.participant.status()
        step = boundaries(scope.checkpoint_dir)["run-a"]
        if kept:
            assert extra["episode_ids"] == extra["in_flight"] == ["run-a-a1"]
            assert boundaries(str(tmp_path / "ck-2"))["run-a"] == step  # its restored boundary
            assert status["restored_pending"] == ["run-a-a1"] and entry.forgotten == 0
            again = await start(client, "run-a", 1)
            assert again.reply["steps_run"] == STEPS - step
            assert pending.on(book, target[0].url) == [("run-a", 1)]  # the book never saw it
        else:
            assert extra["episode_ids"] == [] and status["restored_pending"] == []
            assert entry.forgotten == 1  # finished for good as far as this gate knows
            again = await start(client, "run-a", 1)
            assert again.reply["steps_run"] == STEPS  # from its input
