"""The NeMo RL drop-in, driven exactly as NeMo RL drives its NemoGym actor: a Ray streaming
generator over rows stamped with ``_rowidx``, typed failures, early stop and re-dispatch, and the
checkpoint calls; against the real Gym server on loopback and the real local Ray."""

from __future__ import annotations

import hashlib
import time

import nemo_rl_checkpoint_models as models
import pytest

from rl_gym_actors.errors import (
    CheckpointConflict,
    CheckpointFailed,
    CheckpointNotReady,
    ConfigError,
    ConnectionLost,
    StaleCheckpoint,
)
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.integrations.nemo_rl import DropInConfig, NemoGymDropIn
from rl_gym_actors.integrations.nemo_rl.rows import RolloutDataError, RolloutFailure
from rl_gym_actors.testing.inspect_gym import key_state
from rl_gym_actors.testing.nemo_rl_stand_in import CodePointTokenizer, build_nemo_gym_config
from rl_gym_actors.testing.polling import scaled, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = {
    "rollout_s": 2.0,
    "receipt_s": 0.5,
    "max_tries": 1,
    "control_s": 2.0,
    "admission_wait_s": 30.0,
}


def stand_in_tokenizer():
    """Characters to code points (the package's stand-in, importable by the actor)."""
    return CodePointTokenizer()


@pytest.fixture(scope="module")
def env(ray_session, gym):
    # the config as NeMo RL builds it from the user's env.nemo_gym
    actor = NemoGymDropIn.remote(
        build_nemo_gym_config(
            {
                "nemo_gym": {
                    "rl_gym_actors": {
                        "endpoints": [{"url": gym.url, "token": gym.token}],
                        "policy": POLICY,
                        "pool": {"size": 2, "rollouts_per_actor": 4},
                        "run_id": "t",
                        "untrained_replies": "tokenize",
                        "stream_tuple": 4,  # NeMo RL's checkpoint work (PR #4093) reads 4
                    }
                }
            },
            ["http://127.0.0.1:9/v1"],
            "policy-model",
        )
    )
    ray_session.get(actor._spinup.remote())
    ray_session.get(actor.set_tokenizer.remote(stand_in_tokenizer()))
    yield actor
    ray_session.get(actor.shutdown.remote())
    ray_session.kill(actor)


def starts(gym) -> int:
    return gym.participant.snapshot()["agent_starts"]


def stream(env, rows, prefix="gym"):
    return env.run_rollouts.options(num_returns="streaming").remote(rows, prefix)


def drain(ray, gen, keep_agent_ref=False):
    """Read a stream as NeMo RL does; return the yields and the exception that ended it. The
    yields are 4-tuples (the default protocol); ``(rowidx, result, timing)`` is returned
    unless ``keep_agent_ref``."""
    got, error = [], None
    try:
        for ref in gen:
            item = ray.get(ref)
            assert len(item) == 4 and isinstance(item[1], dict) and item[1]["name"]
            got.append(item if keep_agent_ref else (item[0], item[2], item[3]))
    except Exception as exc:  # the stream's own failure, raised after its last yield
        error = exc
    return got, error


def row(i, **fields):
    return {
        "_rowidx": i,
        "responses_create_params": {"input": [{"role": "user", "content": f"q{i}"}]},
        **fields,
    }


def test_calls_before_spinup_fail_cleanly_and_shutdown_is_always_safe(ray_session, gym):
    actor = NemoGymDropIn.remote({"endpoints": [gym.url], "model_name": "ignored-nemo-rl-key"})
    with pytest.raises(RuntimeError, match="spun up"):
        ray_session.get(actor.health_check.remote())
    got, error = drain(ray_session, stream(actor, [row(0)]))
    assert got == [] and isinstance(error, RuntimeError) and "spun up" in str(error)
    ray_session.get(actor.shutdown.remote())
    ray_session.get(actor.shutdown.remote())
    ray_session.kill(actor)


@pytest.mark.parametrize(
    "cfg",
    [
        {"endpoints": []},
        {"endpoints": ["ftp://x"]},
        {"endpoints": ["http://x"], "typo": 1},
        "http://x",
    ],
)
def test_bad_configs_are_config_errors(cfg):
    with pytest.raises(ConfigError):
        DropInConfig.from_any(cfg)


def test_rows_stream_back_once_each_as_they_end_with_timing_on_the_last(ray_session, env, gym):
    before = starts(gym)
    rows = [row(i, reward=i / 10, sleep_s=0.15 * (4 - i)) for i in range(5)]
    rows.append(row(5, reward=0.0))  # identical to row 4 but for _rowidx
    rows[5]["responses_create_params"] = rows[4]["responses_create_params"]
    rows[5]["sleep_s"] = rows[4]["sleep_s"]
    got, error = drain(ray_session, stream(env, rows, "gym"))
    assert error is None
    assert sorted(i for i, _, _ in got) == list(range(6))
    order = [i for i, _, _ in got]
    assert order.index(0) > order.index(3)  # completion order, not row order
    for i, result, _ in got:
        full = result["full_result"]
        assert isinstance(full["reward"], float) and full["reward"] == rows[i]["reward"]
        assert result["input_message_log"] == result["message_log"][:1]
        assert result["message_log"][0]["token_ids"][:6] == [ord(c) for c in "<user>"]
    assert [t is None for _, _, t in got] == [True] * 5 + [False]
    assert set(got[-1][2]) >= {
        "gym/await_results",
        "gym/postprocess_results",
        "gym/postprocess_results_pct",
    }
    assert starts(gym) - before == 6  # identical rows are two rollouts


def test_a_failed_row_never_stops_the_stream_and_a_data_failure_is_raised_at_the_end(
    ray_session, env, gym
):
    # row 1 is no JSON (NaN): the request is refused, which describes the row (a 4xx)
    rows = [row(0, reward=0.5), row(1, x=float("nan")), row(2, reward=0.25, sleep_s=0.3)]
    got, error = drain(ray_session, stream(env, rows))
    assert sorted(i for i, _, _ in got) == [0, 2]  # the row after the failure came too
    assert isinstance(error, RolloutDataError) and isinstance(error, RolloutFailure)
    assert not isinstance(error, (ConnectionError, TimeoutError))  # NeMo RL: a data failure
    assert "row 1" in str(error) and "JSON" in str(error)


def test_an_agent_that_failed_transiently_on_gym_is_raised_as_infrastructure(ray_session, env, gym):
    # Gym answers a transient agent failure with a 5xx: NeMo RL counts any 5xx as infrastructure
    rows = [row(0, reward=0.5), row(1, transient=True)]
    got, error = drain(ray_session, stream(env, rows))
    assert [i for i, _, _ in got] == [0]
    assert isinstance(error, RolloutFailure) and isinstance(error, ConnectionError)
    assert "row 1" in str(error) and "agent_failed" in str(error)


def test_a_row_the_agent_failed_as_data_is_raised_as_a_data_failure(ray_session, env, gym):
    # Gym answers 422 agent_data_failed: NeMo RL counts it against the prompt's data budget
    rows = [row(0, reward=0.5), row(1, fail=True)]
    got, error = drain(ray_session, stream(env, rows))
    assert [i for i, _, _ in got] == [0]
    assert isinstance(error, RolloutDataError)
    assert not isinstance(error, (ConnectionError, TimeoutError))
    assert "row 1" in str(error) and "agent_data_failed" in str(error)


def test_a_try_past_its_deadline_is_retired_and_raised_as_a_timeout(ray_session, env, gym):
    got, error = drain(ray_session, stream(env, [row(0, sleep_s=30.0), row(1, reward=1.0)]))
    assert [i for i, _, _ in got] == [1]
    assert isinstance(error, TimeoutError)  # NeMo RL: infrastructure, re-dispatch
    wait_for(
        lambda: gym.participant.snapshot()["running"] == 0,
        timeout_s=10,
        what="the timed-out run to be cancelled by retire",
    )


def test_a_cancelled_stream_keeps_its_rollouts_and_the_redispatch_gets_them_without_a_rerun(
    ray_session, env, gym
):
    before = starts(gym)
    rows = [
        row(0, reward=0.1),
        row(1, reward=0.2, sleep_s=0.3),
        row(2, reward=0.3, sleep_s=1.5),
        row(3, reward=0.4, sleep_s=1.5),
    ]
    gen = stream(env, rows)
    first = ray_session.get(next(gen))
    ray_session.cancel(gen)  # RL stops reading the batch early
    assert first[0] == 0
    # NeMo RL re-dispatches the rows it did not get, renumbered
    again = [{**r, "_rowidx": 10 + r["_rowidx"]} for r in rows[1:]]
    got, error = drain(ray_session, stream(env, again))
    assert error is None, str(error)
    assert sorted((i, res["full_result"]["reward"]) for i, res, _ in got) == [
        (11, 0.2),
        (12, 0.3),
        (13, 0.4),
    ]
    assert starts(gym) - before == 4  # nothing ran twice
    status = ray_session.get(env.status.remote())
    assert status["book"]["reused"] >= 3 and status["stats"]["cancelled_streams"] >= 1


async def test_a_redispatched_try_that_finished_on_gym_is_adopted_not_rerun(ray_session, env, gym):
    # an earlier try of rollout rX finished on Gym, but its reply never reached RL
    async with GymClient(gym.endpoint) as client:
        with pytest.raises(ConnectionLost):
            await client.run(
                {"reward": 0.9, "drop_reply": True},
                rollout_id="rX",
                attempt_index=0,
                deadline_ts=soon(10),
            )
    before = starts(gym)
    rows = [
        row(0, _ng_rollout_id="rX", _ng_attempt_index=0, reward=0.9),
        row(1, reward=0.6, drop_reply=True),  # reply lost on the way back
        row(2, reward=0.7, receipt_delay_s=2.0),
    ]  # the receipt fetch times out
    got, error = drain(ray_session, stream(env, rows))
    assert error is None
    assert sorted((i, res["full_result"]["reward"]) for i, res, _ in got) == [
        (0, 0.9),
        (1, 0.6),
        (2, 0.7),
    ]
    assert starts(gym) - before == 2  # rX was replayed, not rerun
    assert ray_session.get(env.status.remote())["stats"]["adopted"] >= 2
    # with ack="at_checkpoint" (the default) Gym keeps the three sealed results until the
    # drop-in's next checkpoint commit releases them
    async with GymClient(gym.endpoint) as client:
        assert await key_state(client, "rX", 0) == "completed"


@pytest.fixture
def aborts(ray_session, env):
    """Checkpoint ids a test uses; each is aborted afterwards, so a failure cannot leave the
    shared actor's admission closed for the next test."""
    ids: list[str] = []
    yield ids
    for cid in ids:
        try:
            ray_session.get(env.abort_checkpoint.remote(cid, soon(10)))
        except Exception:  # spent or never active: nothing to reopen
            pass


def soon(s=20.0):
    return time.time() + scaled(s)  # stretched by the machine's load


def test_checkpoint_prepare_drains_holds_admission_and_commit_resume_repeat(
    ray_session, env, gym, tmp_path, aborts
):
    aborts.append("ck-1")
    slow = stream(env, [row(0, reward=0.5, sleep_s=0.8)])
    wait_for(
        lambda: gym.participant.snapshot()["running"] == 1,
        timeout_s=10,
        what="the slow rollout to start",
    )
    prepared = ray_session.get(env.prepare_checkpoint.remote("ck-1", soon()))
    models.PrepareResult.model_validate(prepared)
    assert prepared["checkpoint_id"] == "ck-1" and prepared["ready"] is True
    (part,) = prepared["participants"]
    assert part["participant"] == {
        "server_name": "gym-0",
        "component": "responses_api_agents",
        "participant_name": "gym-0",
    }
    assert part["ready"] and part["payload"]["ready_to_commit"]
    assert [i for i, _, _ in drain(ray_session, slow)[0]] == [0]

    held_back = stream(env, [row(1, reward=0.75)])  # admission is closed: it waits
    before = starts(gym)
    assert ray_session.get(env.prepare_checkpoint.remote("ck-1", soon())) == prepared
    with pytest.raises(CheckpointConflict):
        ray_session.get(env.prepare_checkpoint.remote("ck-2", soon()))
    assert ray_session.get(env.status.remote())["admission"] == "closed"

    committed = ray_session.get(env.commit_checkpoint.remote("ck-1", soon(), str(tmp_path)))
    models.CommitResult.model_validate(committed)
    (part,) = committed["participants"]
    manifest = tmp_path / part["manifest"]["relative_path"]
    assert manifest.name == "manifest.json"
    assert (
        hashlib.sha256(manifest.read_bytes()).hexdigest()
        == part["payload"]["manifest_digest"]
        == part["manifest"]["manifest_digest"]
    )
    index = part["payload"]["continuation_index"]
    assert (tmp_path / index["relative_path"]).stat().st_size == index["bytes"]
    assert ray_session.get(env.commit_checkpoint.remote("ck-1", soon(), str(tmp_path))) == committed
    with pytest.raises(ConfigError):
        ray_session.get(env.commit_checkpoint.remote("ck-1", soon(), str(tmp_path / "x")))
    assert starts(gym) == before  # nothing ran between prepare and now

    resumed = ray_session.get(env.resume_checkpoint.remote("ck-1", soon()))
    models.ResumeResult.model_validate(resumed)
    assert resumed["checkpoint_id"] == "ck-1"
    # an agent participant's resume payload (PR #4093's): released counted
    assert resumed["participants"][0]["payload"] == {"state": "accepting", "released": 0}
    assert ray_session.get(env.resume_checkpoint.remote("ck-1", soon())) == resumed
    with pytest.raises(StaleCheckpoint):
        ray_session.get(env.prepare_checkpoint.remote("ck-1", soon()))
    got, error = drain(ray_session, held_back)
    assert error is None and got[0][1]["full_result"]["reward"] == 0.75
    status = ray_session.get(env.status.remote())
    assert status["checkpoints_committed"] == 1
    assert status["orchestrator"]["ledger"]["checkpoints_committed"] >= 1

    # a restart restores from that directory: admission stays closed until resume
    restored = ray_session.get(env.restore_checkpoint.remote("ck-r", soon(), str(tmp_path), "ck-1"))
    restored_model = models.RestoreResult.model_validate(restored)
    # the restore reports the continuation index the commit did, and NeMo RL reads it
    assert (
        restored_model.participants[0].payload.continuation_index.model_dump()
        == committed["participants"][0]["payload"]["continuation_index"]
    )
    assert models.continuations(tmp_path, models.CommitResult.model_validate(committed)) == []
    assert restored["participants"][0]["payload"]["source_checkpoint_id"] == "ck-1"
    assert ray_session.get(env.status.remote())["admission"] == "closed"
    ray_session.get(env.resume_checkpoint.remote("ck-r", soon()))
    with pytest.raises(CheckpointFailed):
        ray_session.get(env.restore_checkpoint.remote("ck-r2", soon(), str(tmp_path), "ck-9"))
    assert ray_session.get(env.status.remote())["admission"] == "open"


def test_a_prepare_past_its_deadline_is_a_timeout_and_reopens(ray_session, env, gym, aborts):
    aborts.append("ck-3")
    slow = stream(env, [row(0, reward=0.5, sleep_s=1.0)])
    wait_for(
        lambda: gym.participant.snapshot()["running"] == 1,
        timeout_s=10,
        what="the slow rollout to start",
    )
    with pytest.raises(TimeoutError) as failed:
        ray_session.get(env.prepare_checkpoint.remote("ck-3", time.time() + 0.2))
    assert "ck-3" in str(failed.value)
    assert ray_session.get(env.status.remote())["admission"] == "open"
    with pytest.raises(CheckpointNotReady):
        ray_session.get(env.commit_checkpoint.remote("ck-3", soon(), "/tmp/never"))
    aborted = ray_session.get(env.abort_checkpoint.remote("ck-3", soon()))
    models.ResumeResult.model_validate(aborted)
    assert aborted["checkpoint_id"] == "ck-3"
    got, error = drain(ray_session, slow)
    assert error is None and [i for i, _, _ in got] == [0]


def test_capabilities_discovered_and_completed_executions_acknowledged(ray_session, env, gym):
    topo = ray_session.get(env.discover_checkpoint_capabilities.remote())
    models.Topology.model_validate(topo)
    # the policy model participant NeMo RL's checkpoint client requires, and the agent
    (policy,) = [c for c in topo["participants"] if c["instance_role"] == "policy"]
    assert policy["participant"]["component"] == "responses_api_models"
    (contract,) = [c for c in topo["participants"] if c["instance_role"] is None]
    assert contract["participant"]["component"] == "responses_api_agents"
    assert contract["checkpoint_mode"] == "export_restore"
    assert "completed_result_acknowledgement" in contract["features"]
    with pytest.raises(RuntimeError):
        ray_session.get(env.discover_checkpoint_capabilities.remote(["nobody"]))
    got, error = drain(ray_session, stream(env, [row(0, reward=0.5), row(1, reward=0.25)]))
    assert error is None
    receipts = [result["gym_completion_receipt"] for _, result, _ in got]
    done = [{"receipt": r, "agent_name": "rl_gym_actors"} for r in receipts]
    answer = ray_session.get(env.acknowledge_completed_executions.remote(done))
    assert answer == {"acknowledged": done}
    models.Acknowledged.model_validate(answer)
    assert ray_session.get(env.acknowledge_completed_executions.remote(done)) == answer
    assert ray_session.get(env.acknowledge_completed_executions.remote([])) == {"acknowledged": []}
    forged = {**receipts[0], "result_digest": "0" * 64}
    for bad in ([done[0], done[0]], [{"receipt": forged, "agent_name": "a"}], [{"x": 1}]):
        with pytest.raises(ValueError):
            ray_session.get(env.acknowledge_completed_executions.remote(bad))


def test_bad_rows_fail_as_data_before_anything_runs(ray_session, env, gym):
    before = starts(gym)
    for rows in ([{"reward": 1.0}], [row(0), row(0)], [row(0, _ng_rollout_id="not valid!")]):
        got, error = drain(ray_session, stream(env, rows))
        assert got == [] and isinstance(error, RolloutDataError)
    got, error = drain(ray_session, stream(env, []))
    assert isinstance(error, ValueError)
    assert starts(gym) == before


def test_health_and_status_see_the_ledger_the_pool_and_gym(ray_session, env, gym):
    ray_session.get(env.health_check.remote())
    status = ray_session.get(env.status.remote())
    assert status["spun_up"] and status["admission"] == "open"
    assert status["orchestrator"]["ledger"]["invariant_ok"]
    assert status["orchestrator"]["pool"]["size"] == 2
    assert status["gym"][gym.url]["state"] == "accepting"


@pytest.mark.slow
def test_four_tuples_name_the_rows_agent_and_three_tuples_are_the_default_without_nemo_rl(
    ray_session, env, gym
):
    rows = [row(0, reward=0.25, agent_ref={"name": "math_agent"}), row(1, reward=0.5)]
    got, error = drain(ray_session, stream(env, rows), keep_agent_ref=True)
    assert error is None
    assert {i: ref for i, ref, _, _ in got} == {
        0: {"name": "math_agent"},
        1: {"name": "rl_gym_actors"},
    }
    old = NemoGymDropIn.remote(
        {
            "rl_gym_actors": {
                "endpoints": [{"url": gym.url, "token": gym.token}],
                # no stream_tuple: "auto", and without NeMo RL installed that is main's 3
                "untrained_replies": "tokenize",
                "pool": {"size": 1, "rollouts_per_actor": 2},
            }
        }
    )
    try:
        ray_session.get(old._spinup.remote())
        ray_session.get(old.set_tokenizer.remote(stand_in_tokenizer()))
        items = [ray_session.get(ref) for ref in stream(old, rows)]
        assert sorted((len(item), item[0]) for item in items) == [(3, 0), (3, 1)]
        assert {item[0]: item[1]["full_result"]["reward"] for item in items} == {0: 0.25, 1: 0.5}
    finally:
        ray_session.get(old.shutdown.remote())
        ray_session.kill(old)
