"""The orchestrator end to end: a real local Ray, two real Gym servers on loopback.

Every way a reply gets lost and its repair, with one rollout per actor and (slow) with two, against
the agent-checkpoint server and (slow, two per actor) against ``gym serve --protocol v2``. After
each test a checkpoint must commit on both endpoints, Gym must hold nothing running and nothing
completed-un-ACKed (on v2: no episode, no kept reply, no retired mark once forgotten), no rollout
may have two sealed results and the agent must not have run a sealed key twice.
"""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor

import pytest

from rl_gym_actors import GymEndpoint, Orchestrator, TryPolicy
from rl_gym_actors.errors import ConfigError
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.orchestrator import endpoint_index_for
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.inspect_gym import key_state_sync as key_state
from rl_gym_actors.testing.polling import scaled, soon, wait_for
from rl_gym_actors.testing.v2_server import V2ServerThread

pytestmark = pytest.mark.ray

POLICY = TryPolicy(rollout_s=1.0, receipt_s=1.0, max_tries=3, control_s=5.0, admission_wait_s=10.0)
_ckpt = itertools.count()


# (protocol, rollouts per actor): the pool's multiplexing and the protocol are apart, so v2 runs
# with two per actor only (the busier case); one per actor on the agent-checkpoint server is the
# fast set's
VARIANTS = [
    pytest.param(("agent", 1), id="1-per-actor-agent"),
    pytest.param(("agent", 2), id="2-per-actor-agent", marks=pytest.mark.slow),
    pytest.param(("v2", 2), id="2-per-actor-v2", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request) -> tuple[str, int]:
    return request.param


@pytest.fixture(scope="module")
def protocol(variant) -> str:
    """The checkpoint protocol of the two Gym servers (``gym serve --protocol``)."""
    return variant[0]


@pytest.fixture(scope="module")
def gyms(agent, protocol):
    serve = GymServerThread if protocol == "agent" else V2ServerThread
    with serve(agent=agent, allow_faults=True) as a, serve(agent=agent, allow_faults=True) as b:
        yield a, b


@pytest.fixture(scope="module")
def orch(variant, ray_session, gyms, protocol, tmp_path_factory):
    per_actor = variant[1]
    endpoints = [
        GymEndpoint(url=g.url, token=g.token, name=n) for g, n in zip(gyms, "ab", strict=True)
    ]
    with Orchestrator(
        endpoints,
        # a try's /run bound stretched by the load (a loaded machine's instant agent can take a
        # second to answer); receipt_s stays: the receipt-hold cases need their 2.5 s to pass it
        policy=POLICY.model_copy(update={"rollout_s": scaled(POLICY.rollout_s)}),
        pool_size=2,
        rollouts_per_actor=per_actor,
        run_id=f"{protocol}-p{per_actor}",  # the rows' ids start with it: this run's
        progress=False,
    ) as o:
        o.test_prefix = f"{protocol}-p{per_actor}"
        o.protocol = protocol
        yield o
        # the servers outlive this run: a last checkpoint retires and forgets what the run left
        # there (a v2 gate acts only on its own run's episodes, so the next run could not)
        o.checkpoint(f"ck-end-{next(_ckpt)}", str(tmp_path_factory.mktemp("end")), deadline_s=30.0)


def rid(orch, name: str) -> str:
    return f"{orch.test_prefix}-{name}"


def gym_call(endpoint: GymEndpoint, method: str, *args, **kwargs):
    """One client call from sync test code (a fresh client on a fresh loop)."""

    async def go():
        async with GymClient(endpoint) as client:
            return await getattr(client, method)(*args, deadline_ts=soon(10), **kwargs)

    return asyncio.run(go())


def settle_and_check(orch, gyms, agent, tmp_path, *batches):
    """A checkpoint commits on both endpoints, and nothing is left behind or counted twice."""
    report = orch.checkpoint(
        f"ck-{next(_ckpt)}", str(tmp_path / f"ck-{next(_ckpt)}"), deadline_s=30.0
    )
    assert [e.endpoint for e in report.endpoints] == [g.url for g in gyms]
    assert all(e.commit is not None and e.protocol == orch.protocol for e in report.endpoints)
    v2 = orch.protocol == "v2"
    for g in gyms:
        if v2:  # nothing runs, every reply handed over was forgotten with its retired marks
            status = g.participant.status()
            assert status["report"]["counts"]["episodes"] == 0, status
            assert status["kept_replies"] == 0 and status["retired_rollouts"] == 0, status
        else:
            assert all(e.commit.manifest_digest for e in report.endpoints)
            snap = g.participant.snapshot()
            assert snap["running"] == 0 and snap["completed_unacknowledged"] == 0, snap
    sealed: dict[str, int] = {}
    for outcomes in batches:
        for o in outcomes:
            if o.status == "sealed":
                sealed[o.rollout_id] = sealed.get(o.rollout_id, 0) + 1
                if o.tries:  # a fresh seal (not a kept result handed out again)
                    assert agent.starts[(o.rollout_id, o.attempt_index)] == 1
                    ep = GymEndpoint(url=o.endpoint, token="test-token")
                    if not v2:
                        assert key_state(ep, o.rollout_id, o.attempt_index) == "acknowledged"
    assert all(n == 1 for n in sealed.values()), f"a rollout sealed twice: {sealed}"
    snap = orch.snapshot()
    assert snap.ledger.invariant_ok
    return report


def test_reply_lost_after_gym_finished_is_adopted(orch, gyms, agent, tmp_path):
    rows = [
        {
            "_ng_rollout_id": rid(orch, f"drop-{ep}"),
            "_ng_endpoint": ep,
            "reward": r,
            "drop_reply": True,
        }
        for ep, r in (("a", 0.5), ("b", 0.25))
    ]
    outs = orch.run_batch(rows)
    for o, row in zip(outs, rows, strict=True):
        assert (o.status, o.attempt_index, o.adopted, o.tries) == ("sealed", 0, True, 1)
        assert o.reward == row["reward"] and o.receipt.execution_generation == 1
        assert agent.runs_of(o.rollout_id) == 1
    assert [o.endpoint for o in outs] == [g.url for g in gyms]
    settle_and_check(orch, gyms, agent, tmp_path, outs)


def test_deadline_while_the_agent_works_cancels_and_runs_the_next_try(orch, gyms, agent, tmp_path):
    r = rid(orch, "deadline")
    (out,) = orch.run_batch([{"_ng_rollout_id": r, "first_try_sleep_s": 30, "reward": 0.5}])
    assert (out.status, out.attempt_index, out.tries, out.adopted) == ("sealed", 1, 2, False)
    wait_for(lambda: (r, 0) in agent.cancelled, what="the first try to be cancelled")
    ep = GymEndpoint(url=out.endpoint, token="test-token")
    if orch.protocol == "agent":
        assert key_state(ep, r, 0) == "tombstoned"
    settle_and_check(orch, gyms, agent, tmp_path, [out])


def test_receipt_fetch_timing_out_is_adopted(orch, gyms, agent, tmp_path):
    """v2 has no receipt (a reply's digest is its receipt): the fetch of proof that times out
    there is the kept-reply fetch of a lost reply, held past the whole retire step (control_s),
    so only a fetch tried again after receipt_s adopts it."""
    r = rid(orch, "receipt")
    row = {"_ng_rollout_id": r, "receipt_delay_s": 2.5, "reward": 0.75}
    if orch.protocol == "v2":
        row.update(drop_reply=True, receipt_delay_s=30)
    delayed = sum(g.faults.delayed for g in gyms)
    (out,) = orch.run_batch([row])
    assert (out.status, out.attempt_index, out.tries, out.adopted) == ("sealed", 0, 1, True)
    assert out.reward == 0.75 and agent.runs_of(r) == 1
    assert sum(g.faults.delayed for g in gyms) == delayed + 1  # the first fetch was held
    settle_and_check(orch, gyms, agent, tmp_path, [out])


def test_fail_fast_cancels_running_rollouts_and_a_redispatch_continues(orch, gyms, agent, tmp_path):
    bad, slow = rid(orch, "ff-bad"), rid(orch, "ff-slow")
    rows = [
        {"_ng_rollout_id": bad, "fail": True, "sleep_s": 0.1},
        {"_ng_rollout_id": slow, "sleep_s": 30},
    ]
    outs = orch.run_batch(rows, fail_fast=True)
    assert outs[0].status == "failed" and "agent_data_failed" in outs[0].reason
    assert (outs[1].status, outs[1].has_result, outs[1].tries) == ("abandoned", False, 1)
    wait_for(lambda: (slow, 0) in agent.cancelled, what="the running try to be cancelled")
    # the same rollout again: its unsealed try 0 is settled first, then try 1 runs
    (again,) = orch.run_batch([{"_ng_rollout_id": slow, "reward": 0.5}])
    assert (again.status, again.attempt_index, again.adopted) == ("sealed", 1, False)
    settle_and_check(orch, gyms, agent, tmp_path, outs, [again])


def test_fail_fast_adopts_a_finished_try_and_a_later_batch_gets_it(orch, gyms, agent, tmp_path):
    """A finished try is held back by a slow receipt fetch (v2: its reply lost, by a slow
    kept-reply fetch) when the batch is abandoned."""
    bad, done = rid(orch, "ff2-bad"), rid(orch, "ff2-done")
    done_row = {"_ng_rollout_id": done, "receipt_delay_s": 30, "reward": 0.125}
    if orch.protocol == "v2":
        done_row["drop_reply"] = True
    rows = [{"_ng_rollout_id": bad, "fail": True, "sleep_s": 0.1}, done_row]
    outs = orch.run_batch(rows, fail_fast=True)
    assert outs[0].status == "failed"
    kept = outs[1]
    assert kept.status == "abandoned" and kept.has_result and kept.adopted
    assert (kept.reward, kept.attempt_index) == (0.125, 0)
    with pytest.raises(ConfigError):  # a bad batch hands out nothing
        orch.run_batch([{"_ng_rollout_id": done}, {"_ng_rollout_id": "bad id!"}])
    (later,) = orch.run_batch([done_row])
    assert (later.status, later.adopted, later.reward, later.attempt_index) == (
        "sealed",
        True,
        0.125,
        0,
    )
    assert agent.runs_of(done) == 1
    settle_and_check(orch, gyms, agent, tmp_path, outs, [later])


def test_rows_beyond_the_slots_are_not_dispatched_after_fail_fast(orch, gyms, agent, tmp_path):
    slots = 2 * orch.pool_config.rollouts_per_actor
    rows = [{"_ng_rollout_id": rid(orch, "ff3-bad"), "fail": True}]
    rows += [{"_ng_rollout_id": rid(orch, f"ff3-{i}"), "sleep_s": 30} for i in range(slots)]
    outs = orch.run_batch(rows, fail_fast=True)
    assert outs[0].status == "failed"
    assert all(o.status == "abandoned" and not o.has_result for o in outs[1:])
    never = [o for o in outs[1:] if o.tries == 0]
    assert never and all(agent.runs_of(o.rollout_id) == 0 for o in never)
    settle_and_check(orch, gyms, agent, tmp_path, outs)


def test_actor_killed_before_the_ack_leaves_an_orphan_the_checkpoint_acks(
    orch, gyms, agent, tmp_path
):
    if orch.protocol == "v2":
        return actor_killed_before_its_run_finished_v2(orch, gyms, agent, tmp_path)
    import ray

    r = rid(orch, "killed")
    row = {"_ng_rollout_id": r, "_ng_endpoint": "a", "receipt_delay_s": 30, "reward": 0.5}
    delayed = gyms[0].faults.delayed
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(orch.run_batch, [row])
        # Gym finished the try; the actor waits on its receipt, nothing is ACKed yet
        wait_for(lambda: gyms[0].faults.delayed > delayed, what="the receipt fetch")
        owner = orch.snapshot().pool.leases[r]
        ray.kill(ray.get_actor(owner, namespace="rl_gym_actors"), no_restart=True)
        (out,) = future.result(timeout=30)
    assert out.status == "failed" and "died" in out.reason
    assert gyms[0].participant.snapshot()["completed_unacknowledged"] >= 1
    report = settle_and_check(orch, gyms, agent, tmp_path, [out])
    assert report.endpoints[0].orphans_acked == 1 and report.endpoints[1].orphans_acked == 0
    assert agent.runs_of(r) == 1
    pool = orch.snapshot().pool
    assert pool.replaced == 1 and owner not in pool.actors
    # the replacement serves the next batch
    (next_out,) = orch.run_batch([{"_ng_rollout_id": rid(orch, "after-kill"), "reward": 1.0}])
    assert next_out.status == "sealed"


def actor_killed_before_its_run_finished_v2(orch, gyms, agent, tmp_path):
    """v2 has no ACK: the finished run nobody confirms is one whose actor died before Gym
    finished it. Its kept reply is retired by the checkpoint (the book had the attempt as running
    with a dead owner, or never heard of it: an orphan) and forgotten; never rerun."""
    import ray

    r = rid(orch, "killed")
    row = {"_ng_rollout_id": r, "_ng_endpoint": "a", "hold": True, "reward": 0.5}
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(orch.run_batch, [row])
        wait_for(lambda: agent.runs_of(r) == 1, what="the run to start on Gym")
        owner = orch.snapshot().pool.leases[r]
        ray.kill(ray.get_actor(owner, namespace="rl_gym_actors"), no_restart=True)
        (out,) = future.result(timeout=30)
    assert out.status == "failed" and "died" in out.reason
    agent.release(r)  # Gym finishes the run for nobody: its reply is kept
    wait_for(lambda: gyms[0].participant.status()["kept_replies"] >= 1, what="the kept reply")
    report = settle_and_check(orch, gyms, agent, tmp_path, [out])
    a, b = report.endpoints
    assert (a.retired + a.orphans_acked, b.retired + b.orphans_acked) == (1, 0)
    assert agent.runs_of(r) == 1
    pool = orch.snapshot().pool
    assert pool.replaced == 1 and owner not in pool.actors
    (next_out,) = orch.run_batch([{"_ng_rollout_id": rid(orch, "after-kill"), "reward": 1.0}])
    assert next_out.status == "sealed"


def test_lost_replies_on_two_endpoints_one_checkpoint_commits_both(orch, gyms, agent, tmp_path):
    """Replies an earlier process lost: on v2, kept replies of runs the book never saw, which
    the checkpoint retires and forgets (as the agent-checkpoint one ACKs orphans)."""
    # replies an earlier trainer process lost: completed on Gym, owned by nobody
    for g, ep in zip(gyms, "ab", strict=True):
        gym_call(
            g.endpoint, "run", {"reward": 0.5}, rollout_id=rid(orch, f"lost-{ep}"), attempt_index=0
        )
    rows = [
        {"_ng_rollout_id": rid(orch, f"two-{ep}"), "_ng_endpoint": ep, "drop_reply": True}
        for ep in "ab"
    ]
    outs = orch.run_batch(rows)
    assert all(o.status == "sealed" and o.adopted for o in outs)
    report = settle_and_check(orch, gyms, agent, tmp_path, outs)
    assert [e.orphans_acked for e in report.endpoints] == [1, 1]
    for g, ep in zip(gyms, "ab", strict=True):
        if orch.protocol == "agent":
            assert key_state(g.endpoint, rid(orch, f"lost-{ep}"), 0) == "acknowledged"
        else:  # forgotten: nothing kept, no mark (settle_and_check), and never run again
            assert agent.runs_of(rid(orch, f"lost-{ep}")) == 1


def test_snapshot_shows_the_pool_the_actors_and_the_ledger(orch, gyms):
    snap = orch.snapshot()
    assert snap.pool.size == 2 and len(snap.pool.actors) == 2
    assert all(name.startswith(f"rlga-rollout-{orch.id}-") for name in snap.pool.actors)
    assert snap.pool.free == 2 * orch.pool_config.rollouts_per_actor and snap.in_flight == 0
    assert set(snap.ledger.endpoints) == {g.url for g in gyms}
    assert snap.actors.actors == 2 and snap.actors.seals >= snap.actors.adoptions > 0
    assert snap.ledger.checkpoints_committed >= 1


async def test_async_variants_work_from_another_event_loop(orch):
    rows = [{"_ng_rollout_id": rid(orch, f"async-{i}"), "reward": float(i)} for i in range(3)]
    outs = await orch.arun_batch(rows)
    assert [o.reward for o in outs] == [0.0, 1.0, 2.0]
    assert all(o.status == "sealed" for o in outs)
    snap = await orch.asnapshot()
    assert snap.in_flight == 0


def test_bad_rows_raise_config_error_before_dispatch(orch, agent):
    r = rid(orch, "dup")
    for rows in (
        [{"_ng_rollout_id": r}, {"_ng_rollout_id": r}],
        [{"_ng_rollout_id": "not valid!"}],
        [{"_ng_endpoint": "nowhere"}],
        [{"_ng_attempt_index": -1}],
        ["not a row"],
        [{"_ng_rollout_id": r, "payload": object()}],
        [{"_ng_rollout_id": r, "score": float("nan")}],
        {"_ng_rollout_id": "a-mapping-not-a-list"},
    ):
        with pytest.raises(ConfigError):
            orch.run_batch(rows)
    assert agent.runs_of(r) == 0
    assert orch.run_batch([]) == []


def test_minted_ids_are_valid_and_endpoints_follow_a_stable_hash(orch, gyms):
    outs = orch.run_batch([{"reward": 1.0} for _ in range(4)])
    assert len({o.rollout_id for o in outs}) == 4
    assert all(o.status == "sealed" and o.rollout_id.startswith(orch.run_id + "-") for o in outs)
    urls = [g.url for g in gyms]
    assert [o.endpoint for o in outs] == [urls[endpoint_index_for(o.rollout_id, 2)] for o in outs]
    # the same ids again: never played again; the same sealed results, marked repeated
    again = orch.run_batch([{"_ng_rollout_id": o.rollout_id} for o in outs])
    assert [o.endpoint for o in again] == [o.endpoint for o in outs]
    assert all(
        o.status == "sealed" and o.attempt_index == 0 and o.repeated and o.tries == 0 for o in again
    )
    assert [(o.reward, o.receipt) for o in again] == [(o.reward, o.receipt) for o in outs]
    assert endpoint_index_for("some-rollout", 7) == endpoint_index_for("some-rollout", 7)


def test_bad_settings_raise_config_error_without_starting_anything():
    url = "http://127.0.0.1:9"
    for kwargs in (
        dict(endpoints=[]),
        dict(endpoints="http://127.0.0.1:9"),
        dict(endpoints=[url, url]),
        dict(endpoints=["ftp://x"]),
        dict(endpoints=[url], pool_size=0),
        dict(endpoints=[url], rollouts_per_actor=0),
        dict(endpoints=[url], orchestrator_id="not valid!"),
    ):
        with pytest.raises(ConfigError):
            Orchestrator(start=False, **kwargs)


def test_a_closed_orchestrator_refuses_work():
    from rl_gym_actors.errors import PoolClosed

    orch = Orchestrator(["http://127.0.0.1:9"], start=False)
    orch.close()
    with pytest.raises(PoolClosed):
        orch.run_batch([{"reward": 1.0}])
    with pytest.raises(PoolClosed):
        orch.snapshot()
    orch.close()  # closing twice is fine


def test_named_try_of_an_unseen_rollout_adopts_the_finished_try_before_it(
    orch, gyms, agent, tmp_path
):
    """A trainer that restarts names try 1 of a rollout this orchestrator never saw; try 0 had
    finished on Gym, its reply lost: try 0 is retired, found finished, and adopted (no rerun)."""
    agent_side = orch.protocol == "agent"  # key_state reads the agent-checkpoint status
    r = rid(orch, "named-try")
    gym = gyms[endpoint_index_for(r, len(gyms))]
    ep = GymEndpoint(url=gym.url, token="test-token")
    kept = 0 if agent_side else gym.participant.status()["kept_replies"]
    reply = gym_call(ep, "run", {"reward": 0.75}, rollout_id=r, attempt_index=0).reply
    if agent_side:
        assert key_state(ep, r, 0) == "completed"
    else:
        assert gym.participant.status()["kept_replies"] == kept + 1
    (out,) = orch.run_batch([{"_ng_rollout_id": r, "_ng_attempt_index": 1, "reward": 0.1}])
    assert (out.status, out.attempt_index, out.adopted) == ("sealed", 0, True)
    assert out.reply == reply and out.reward == 0.75
    assert agent.runs_of(r) == 1 and agent.starts[(r, 1)] == 0
    if agent_side:
        assert key_state(ep, r, 1) == "unknown"
    settle_and_check(orch, gyms, agent, tmp_path, [out])
