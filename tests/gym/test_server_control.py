"""The control plane against the real server on loopback: every row of PROTOCOL.md's table, the
checkpoint phases and their fences, the (ext) receipt and capabilities routes, and auth."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time

import pytest

from rl_gym_actors.gym.checkpoint_files import CONTINUATIONS_NAME, MANIFEST_NAME, RECORDS_NAME
from rl_gym_actors.protocol import CAPABILITIES_PATH, CONTROL_PREFIX
from rl_gym_actors.testing.polling import soon

# ---------------------------------------------------------------- acknowledge


async def test_ack_releases_once_then_is_idempotent(wire):
    receipt = await wire.complete("rA")
    first = await wire.ack(receipt)
    assert (first.status, first.json) == (200, {"acknowledged": True, "idempotent": False})
    again = await wire.ack(receipt)
    assert (again.status, again.json) == (200, {"acknowledged": False, "idempotent": True})
    assert (await wire.status()).json["acknowledged_completed"] == 1


async def test_ack_of_an_unknown_key_is_refused(wire):
    receipt = await wire.complete("rA")
    got = await wire.ack({**receipt, "rollout_id": "rNever"})
    assert (got.status, got.code) == (409, "completed_execution_acknowledgement_error")


async def test_ack_of_a_running_key_is_refused(wire):
    task = asyncio.create_task(wire.run("rR", sleep_s=30))
    await wire.until(lambda st: st["running"] == 1, what="rR running")
    receipt = {
        "rollout_id": "rR",
        "attempt_index": 0,
        "execution_generation": 1,
        "result_identity": "r-rR",
        "result_digest": "0" * 64,
    }
    got = await wire.ack(receipt)
    assert (got.status, got.code) == (409, "completed_execution_acknowledgement_error")
    await wire.retire("rR")
    assert (await task).code == "stale_attempt"


@pytest.mark.parametrize(
    "field,value",
    [("result_digest", "f" * 64), ("result_identity", "r-other"), ("execution_generation", 2)],
)
async def test_ack_with_any_receipt_field_changed_is_refused_and_releases_nothing(
    wire, field, value
):
    receipt = await wire.complete("rA")
    got = await wire.ack({**receipt, field: value})
    assert (got.status, got.code) == (409, "completed_execution_acknowledgement_error")
    assert field in got.json["error"]["detail"]
    assert (await wire.receipt("rA")).json["state"] == "completed"
    assert (await wire.ack(receipt)).json["acknowledged"] is True


async def test_batch_ack_is_all_or_nothing_and_idempotent(wire):
    r1, r2, r3 = [await wire.complete(r) for r in ("r1", "r2", "r3")]
    bad = await wire.ack_batch([r1, {**r2, "result_digest": "0" * 64}])
    assert (bad.status, bad.code) == (409, "completed_execution_acknowledgement_error")
    assert (await wire.status()).json["completed_unacknowledged"] == 3  # nothing released
    ok = await wire.ack_batch([r1, r2])
    assert (ok.status, ok.json) == (200, {"acknowledged": [r1, r2]})
    again = await wire.ack_batch([r1, r2])
    assert (again.status, again.json) == (200, {"acknowledged": [r1, r2]})
    mixed = await wire.ack_batch([r2, r3])  # one already ACKed, one not
    assert mixed.status == 200
    st = (await wire.status()).json
    assert (st["completed_unacknowledged"], st["acknowledged_completed"]) == (0, 3)


async def test_batch_ack_with_an_unknown_key_releases_nothing(wire):
    r1 = await wire.complete("r1")
    got = await wire.ack_batch([r1, {**r1, "rollout_id": "rNever"}])
    assert got.code == "completed_execution_acknowledgement_error"
    assert (await wire.receipt("r1")).json["state"] == "completed"


# ---------------------------------------------------------------- retire


async def test_retire_answers_for_every_state(wire):
    task = asyncio.create_task(wire.run("rRun", sleep_s=30))
    await wire.until(lambda st: st["running"] == 1, what="rRun running")
    receipt_c = await wire.complete("rC")
    receipt_a = await wire.complete("rA")
    await wire.ack(receipt_a)

    assert (await wire.retire("rRun")).json == {
        "retired": True,
        "tombstoned": True,
        "completed_unacknowledged": False,
    }
    assert (await wire.retire("rUnknown")).json == {
        "retired": False,
        "tombstoned": True,
        "completed_unacknowledged": False,
    }
    assert (await wire.retire("rC")).json == {
        "retired": False,
        "tombstoned": False,
        "completed_unacknowledged": True,
    }
    assert (await wire.retire("rUnknown")).json["tombstoned"] is True  # again: same
    acked = (await wire.retire("rA")).json
    assert acked["retired"] is False and acked["completed_unacknowledged"] is False
    # the completed reply survives retire: only an ACK releases it
    assert (await wire.run("rC")).replayed
    assert (await wire.ack(receipt_c)).json["acknowledged"] is True
    assert (await task).code == "stale_attempt"
    assert (await wire.run("rUnknown")).code == "stale_attempt"


# ---------------------------------------------------------------- status


async def test_status_lists_what_blocks_and_counts_it(wire):
    task = asyncio.create_task(wire.run("rRun", sleep_s=30))
    await wire.until(lambda st: st["running"] == 1, what="rRun running")
    receipt_c = await wire.complete("rC")
    await wire.ack(await wire.complete("rA"))
    st = (await wire.status()).json
    assert st["state"] == "accepting" and st["ready_to_commit"] is False
    assert (
        st["running"],
        st["parked"],
        st["parked_with_boundary"],
        st["parked_without_boundary"],
        st["completed_unacknowledged"],
        st["acknowledged_completed"],
        st["active"],
    ) == (1, 0, 0, 0, 1, 1, 2)
    assert [(a["rollout_id"], a["state"]) for a in st["blocking_attempts"]] == [
        ("rC", "completed"),
        ("rRun", "running"),
    ]
    # each attempt as a real Gym lists it (NeMo RL PR #4093's model: no other fields)
    [listed] = st["completed_unacknowledged_attempts"]
    assert listed.pop("age_seconds") >= 0
    assert listed == {
        "rollout_id": "rC",
        "attempt_index": 0,
        "state": "completed",
        "generation": 1,
        "parked_boundary_state": None,
        "completion_receipt": receipt_c,
    }
    assert st["selected_boundaries"] == [] and st["checkpoint_id"] == "rl-status"
    assert not {"phase", "checkpoint_lease"} & set(st)  # (ext): on the lease route
    assert {a["rollout_id"] for a in st["executions"]} == {"rC", "rRun"}
    await wire.retire("rRun")
    await task
    await wire.ack(receipt_c)
    st = (await wire.status()).json
    assert st["ready_to_commit"] is True and st["active"] == 0


async def test_status_without_a_checkpoint_id_is_allowed(wire):
    got = await wire.status(None)
    assert got.status == 200 and got.json["ready_to_commit"] is True


# ---------------------------------------------------------------- prepare


async def test_prepare_when_ready_closes_admission_and_records_its_answer(wire):
    first = await wire.prepare("c1")
    assert first.status == 200
    assert first.json["ready_to_commit"] is True and first.json["state"] == "preparing"
    again = await wire.prepare("c1")
    assert (again.status, again.json) == (200, first.json)
    assert (await wire.status()).json["state"] == "preparing"


async def test_prepare_not_ready_names_the_blockers_and_may_be_called_again(wire):
    receipt = await wire.complete("rD", reward=0.5)
    got = await wire.prepare("c1")
    assert (got.status, got.code) == (409, "agent_prepare_incomplete")
    assert got.json["error"]["detail"] == (
        "agent prepare is incomplete: running=0, "
        "parked_without_boundary=0, completed_unacknowledged=1"
    )
    report = got.json["report"]
    assert report["ready_to_commit"] is False
    assert [
        (a["rollout_id"], a["completion_receipt"])
        for a in report["completed_unacknowledged_attempts"]
    ] == [("rD", receipt)]
    await wire.ack(receipt)
    assert (await wire.prepare("c1")).json["ready_to_commit"] is True


async def test_prepare_waits_for_a_running_run_to_finish(wire):
    task = asyncio.create_task(wire.run("rS", sleep_s=0.4))
    await wire.until(lambda st: st["running"] == 1, what="rS running")
    got = await wire.prepare("c1", deadline_s=20)
    # the 409 comes after the run finished: it now blocks as completed, no longer as running
    assert got.code == "agent_prepare_incomplete"
    assert (got.json["report"]["running"], got.json["report"]["completed_unacknowledged"]) == (0, 1)
    assert (await task).status == 200


async def test_prepare_gives_up_at_its_deadline(wire):
    task = asyncio.create_task(wire.run("rS", sleep_s=30))
    await wire.until(lambda st: st["running"] == 1, what="rS running")
    started = time.monotonic()
    got = await wire.prepare("c1", deadline_s=0.3)
    assert got.code == "agent_prepare_incomplete" and got.json["report"]["running"] == 1
    assert time.monotonic() - started < 5
    await wire.retire("rS", checkpoint_id="c1")  # as on a real Gym: under the active id
    await task
    assert (await wire.prepare("c1")).status == 200


async def test_prepare_with_an_expired_deadline_and_nothing_blocking_is_ready(wire):
    assert (await wire.prepare("c1", deadline_s=-5)).status == 200


async def test_a_waiting_prepare_ends_when_its_checkpoint_is_resumed(wire):
    task = asyncio.create_task(wire.run("rS", sleep_s=30))
    await wire.until(lambda st: st["running"] == 1, what="rS running")
    prepare = asyncio.create_task(wire.prepare("c1", deadline_s=60))
    await wire.until(lambda st: st["state"] == "preparing", what="admission closed")
    assert (await wire.resume("c1")).status == 200
    got = await asyncio.wait_for(prepare, 10)
    assert (got.status, got.code) == (409, "stale_checkpoint")
    await wire.retire("rS")  # idle again: any id
    await task


# ---------------------------------------------------------------- commit and resume


async def test_commit_writes_records_then_manifest_and_repeats_its_answer(wire, tmp_path):
    await wire.ack(await wire.complete("rA"))
    await wire.retire("rT")
    assert (await wire.prepare("c1")).status == 200
    got = await wire.commit("c1", tmp_path / "ckpt")
    assert got.status == 200
    manifest = (tmp_path / "ckpt" / MANIFEST_NAME).read_bytes()
    records = (tmp_path / "ckpt" / RECORDS_NAME).read_bytes().splitlines()
    empty = hashlib.sha256(b"").hexdigest()  # no continuation roots: nothing parks here
    assert got.json == {
        "records": 2,
        "manifest_digest": hashlib.sha256(manifest).hexdigest(),
        "continuation_index": {
            "schema_version": 1,
            "relative_path": CONTINUATIONS_NAME,
            "sha256": empty,
            "records": 0,
            "bytes": 0,
        },
    }
    assert json.loads(manifest)["continuation_index"] == got.json["continuation_index"]
    assert (
        json.loads(manifest)["records_sha256"]
        == hashlib.sha256((tmp_path / "ckpt" / RECORDS_NAME).read_bytes()).hexdigest()
    )
    assert {(json.loads(r)["rollout_id"], json.loads(r)["state"]) for r in records} == {
        ("rA", "acknowledged"),
        ("rT", "tombstoned"),
    }
    again = await wire.commit("c1", tmp_path / "ckpt")
    assert (again.status, again.json) == (200, got.json)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == sorted(
        [MANIFEST_NAME, RECORDS_NAME, CONTINUATIONS_NAME]
    )  # no temp files left behind


async def test_commit_needs_a_ready_prepare(wire, tmp_path):
    idle = await wire.commit("c1", tmp_path)
    assert (idle.status, idle.code) == (409, "checkpoint_not_prepared")
    await wire.complete("rD")
    assert (await wire.prepare("c1")).status == 409
    preparing = await wire.commit("c1", tmp_path)
    assert (preparing.status, preparing.code) == (409, "checkpoint_not_prepared")
    assert not (tmp_path / MANIFEST_NAME).exists()


async def test_commit_into_an_unwritable_dir_is_refused_and_may_be_retried(wire, tmp_path):
    (tmp_path / "file").write_text("x")
    assert (await wire.prepare("c1")).status == 200
    bad = await wire.commit("c1", tmp_path / "file" / "ckpt")
    assert (bad.status, bad.code) == (409, "commit_failed")
    assert (await wire.commit("c1", tmp_path / "ok")).status == 200


async def test_resume_reopens_admission_and_spends_the_id(wire, tmp_path):
    assert (await wire.prepare("c1")).status == 200
    assert (await wire.commit("c1", tmp_path)).status == 200
    got = await wire.resume("c1")
    assert (got.status, got.json) == (200, {"state": "accepting", "released": 0})
    assert (await wire.run("rN")).status == 200
    for answer in (
        await wire.prepare("c1"),
        await wire.commit("c1", tmp_path),
        await wire.status("c1"),
        await wire.retire("rX", checkpoint_id="c1"),
    ):
        assert (answer.status, answer.code) == (409, "stale_checkpoint")
    again = await wire.resume("c1")  # a lost resume answer may be re-asked
    assert (again.status, again.json) == (200, got.json)


async def test_resume_aborts_a_checkpoint_before_commit(wire):
    await wire.complete("rD")
    assert (await wire.prepare("c1")).status == 409
    assert (await wire.resume("c1")).status == 200
    assert (await wire.status()).json["state"] == "accepting"
    assert (await wire.run("rN")).status == 200


async def test_resume_while_idle_fences_off_a_late_prepare(wire):
    assert (await wire.resume("c9")).status == 200
    assert (await wire.prepare("c9")).code == "stale_checkpoint"
    assert (await wire.status()).json["state"] == "accepting"


# ---------------------------------------------------------------- fences


async def test_another_id_while_one_is_active_conflicts(wire, tmp_path):
    assert (await wire.prepare("c1")).status == 200
    for answer in (
        await wire.prepare("c2"),
        await wire.commit("c2", tmp_path),
        await wire.resume("c2"),
    ):
        assert (answer.status, answer.code) == (409, "checkpoint_conflict")
    assert (await wire.capabilities()).json["active_checkpoint_id"] == "c1"
    assert (await wire.lease()).json["checkpoint_id"] == "c1"


@pytest.mark.parametrize("phase", ["idle", "preparing", "prepared", "committed"])
async def test_status_is_lenient_and_retire_fenced_as_on_a_real_gym(wire, tmp_path, phase):
    if phase == "preparing":
        await wire.complete("rD")
        assert (await wire.prepare("c1")).status == 409
    elif phase in ("prepared", "committed"):
        assert (await wire.prepare("c1")).status == 200
    if phase == "committed":
        assert (await wire.commit("c1", tmp_path)).status == 200
    # the phase names a real Gym and NeMo RL's client use: a commit leaves "committed_paused"
    assert (await wire.lease()).json["phase"] == (
        "committed_paused" if phase == "committed" else phase
    )
    assert (await wire.status("actor-7-status")).status == 200
    other = await wire.retire("rX", checkpoint_id="actor-7-retire")
    if phase == "idle":  # no checkpoint active: any id
        assert other.json["tombstoned"] is True
        return
    # a real Gym: another id while a checkpoint is active is a conflict naming it
    assert (other.status, other.code) == (409, "checkpoint_conflict")
    assert other.json["error"]["active_checkpoint_id"] == "c1"
    active = await wire.retire("rX", checkpoint_id="c1")
    if phase == "committed":  # committed_paused takes no retire, not even under its id
        assert (active.status, active.code) == (409, "checkpoint_conflict")
    else:
        assert active.json["tombstoned"] is True


# ---------------------------------------------------------------- (ext) receipt, capabilities


async def test_receipt_answers_for_every_state(wire):
    task = asyncio.create_task(wire.run("rRun", sleep_s=30))
    await wire.until(lambda st: st["running"] == 1, what="rRun running")
    receipt = await wire.complete("rC")
    completed = await wire.receipt("rC")
    assert completed.json == {"state": "completed", "completion_receipt": receipt}
    await wire.ack(receipt)
    acked = await wire.receipt("rC")
    assert acked.json == {"state": "acknowledged", "completion_receipt": receipt}
    assert (await wire.receipt("rRun")).code == "not_completed"
    assert (await wire.receipt("rRun")).status == 409
    await wire.retire("rRun")
    await task
    assert ((await wire.receipt("rRun")).status, (await wire.receipt("rRun")).code) == (
        409,
        "stale_attempt",
    )
    never = await wire.receipt("rNever")
    assert (never.status, never.code) == (404, "unknown_execution")


async def test_receipt_is_byte_identical_every_time(wire):
    await wire.run("rD")
    first = await wire.receipt("rD")
    await wire.run("rD")  # a replay
    assert (await wire.receipt("rD")).raw == first.raw


async def test_capabilities(wire):
    got = await wire.capabilities()
    assert got.status == 200
    body = got.json
    assert body["component"] == "responses_api_agents" and body["phase"] == "idle"
    assert {
        "completed_result_acknowledgement",
        "receipt",
        "replayed-header",
        "prepare-report",
        "faults",
    } <= set(body["features"])
    assert "durable-store" not in body["features"]


# ---------------------------------------------------------------- auth

CONTROL_ROUTES = [
    ("GET", CONTROL_PREFIX + "/status"),
    ("GET", CONTROL_PREFIX + "/receipt"),
    ("GET", CONTROL_PREFIX + "/completion-receipt"),
    ("POST", CONTROL_PREFIX + "/acknowledge"),
    ("POST", CONTROL_PREFIX + "/acknowledge-completed"),
    ("POST", CONTROL_PREFIX + "/retire"),
    ("POST", CONTROL_PREFIX + "/prepare"),
    ("POST", CONTROL_PREFIX + "/commit"),
    ("POST", CONTROL_PREFIX + "/resume"),
]


async def test_capabilities_answer_without_a_token_as_a_real_gyms_do(wire):
    got = await wire.request("GET", CAPABILITIES_PATH, token=None)
    assert got.status == 200 and got.json["component"] == "responses_api_agents"


@pytest.mark.parametrize("method,path", CONTROL_ROUTES)
@pytest.mark.parametrize("token", [None, "wrong-token", ""], ids=["missing", "wrong", "empty"])
async def test_every_control_route_needs_the_token(wire, method, path, token):
    body = {"checkpoint_id": "c1", "deadline_ts": soon(10)} if method == "POST" else None
    got = await wire.request(method, path, body=body, token=token)
    assert (got.status, got.code) == (401, "unauthorized")
    assert (await wire.status()).json["state"] == "accepting"  # the prepare did nothing


async def test_a_non_bearer_scheme_is_unauthorized(wire):
    got = await wire.request(
        "GET",
        CONTROL_PREFIX + "/status",
        token=None,
        headers={"Authorization": f"Basic {wire.token}"},
    )
    assert got.code == "unauthorized"


async def test_run_needs_no_token(wire):
    got = await wire.request("POST", "/run", body={"_ng_rollout_id": "r1"}, token=None)
    assert got.status == 200


async def test_metrics_count_runs_replays_acks_and_retires(wire):
    receipt = await wire.complete("rA")
    await wire.run("rA")  # a replay
    await wire.ack(receipt)
    await wire.retire("rT")
    got = await wire.request("GET", "/metrics", token=None)
    assert got.status == 200 and got.headers["content-type"].startswith("text/plain")
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in got.raw.decode().splitlines()
        if line and not line.startswith("#")
    }
    assert samples["gym_runs_started_total"] == 1
    assert samples["gym_runs_replayed_total"] == 1
    assert samples["gym_attempts_acked_total"] == 1
    assert samples["gym_attempts_retired_total"] == 1
    assert samples["gym_running"] == 0
