"""What a server owes under bad numbers, a failing disk, a hostile checkpoint_dir and a long run:
bounded integers (422), a store that survives failed writes (5xx, then working again; refused at
once while broken), commits confined to --checkpoint-root, and memory that stays flat."""

from __future__ import annotations

import time

import pytest

from rl_gym_actors.protocol import WIRE_INT_MAX
from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import until
from rl_gym_actors.testing.store_faults import FaultyStore

TOO_BIG = 2**63


# ---------------------------------------------------------------- integers the store can hold


async def test_an_attempt_index_beyond_64_bits_is_422_and_the_durable_server_goes_on(
    tmp_path, wire_for
):
    with GymServerThread(state_dir=tmp_path) as srv:
        wire = wire_for(srv)
        got = await wire.run("big", TOO_BIG)
        assert (got.status, got.code) == (422, "invalid_request")
        assert (await wire.run("big", WIRE_INT_MAX)).status == 200  # the largest that fits
        assert (await wire.receipt("big", WIRE_INT_MAX)).status == 200
        assert (await wire.run("next")).status == 200  # nothing hangs
        for call in (wire.receipt("big", TOO_BIG), wire.retire("big", TOO_BIG)):
            got = await call
            assert (got.status, got.code) == (422, "invalid_request")
        receipt = (await wire.receipt("next")).json["completion_receipt"]
        for field in ("attempt_index", "execution_generation"):
            got = await wire.ack({**receipt, field: TOO_BIG})
            assert (got.status, got.code) == (422, "invalid_request"), field
        got = await wire.request(
            "POST",
            "/ng-control/v1/agent-checkpoint/acknowledge-completed",
            body={"schema_version": TOO_BIG, "executions": [receipt]},
        )
        assert (got.status, got.code) == (422, "invalid_request")


# ---------------------------------------------------------------- a store whose writes fail


async def test_a_failed_write_fails_that_request_and_the_next_ones_work(tmp_path, wire_for):
    with GymServerThread(state_dir=tmp_path, store_factory=FaultyStore) as srv:
        wire, store = wire_for(srv), srv.participant.store
        assert (await wire.run("ok-1")).status == 200
        store.fail_next(1)
        got = await wire.run("hit")
        assert (got.status, got.code) == (503, "store_write_failed")
        assert (await wire.run("ok-2")).status == 200
        assert (await wire.request("GET", "/ready")).status == 200
        st = (await wire.status()).json
        assert st["running"] == 0  # nothing is left running
        # the run's records were written with the next write: its reply is kept, and replays
        again = await wire.run("hit")
        assert again.status == 200 and again.replayed


async def test_a_broken_store_fails_readiness_and_refuses_at_once_until_it_heals(
    tmp_path, wire_for
):
    with GymServerThread(state_dir=tmp_path, store_factory=FaultyStore) as srv:
        wire, store = wire_for(srv), srv.participant.store
        assert (await wire.run("before")).status == 200
        store.fail_always()
        for i in range(3):  # each fails on its own write
            got = await wire.run(f"w{i}")
            assert got.status == 503 and got.code in ("store_write_failed", "store_unavailable")
        ready = await wire.request("GET", "/ready")
        assert (ready.status, ready.code) == (503, "store_unavailable")
        started = time.monotonic()
        got = await wire.run("refused")
        assert (got.status, got.code) == (503, "store_unavailable")
        assert time.monotonic() - started < 1.0  # refused at once, not after a wait
        store.heal()

        async def healed() -> bool:
            return (await wire.request("GET", "/ready")).status == 200

        await until(healed, interval_s=0.05, what="the store to heal")
        assert (await wire.run("after")).status == 200
        assert (await wire.run("before")).status == 200  # a replay, still there


# ---------------------------------------------------------------- --checkpoint-root


@pytest.mark.parametrize("escape", ["../outside", "a/../../outside", "/tmp/elsewhere"])
async def test_commit_outside_the_checkpoint_root_is_422_and_writes_nothing(
    tmp_path, wire_for, escape
):
    root = tmp_path / "root"
    with GymServerThread(args=["--checkpoint-root", str(root)]) as srv:
        wire = wire_for(srv)
        assert (await wire.prepare("cp-r")).status == 200
        got = await wire.commit("cp-r", escape)
        assert (got.status, got.code) == (422, "invalid_request")
        assert not (tmp_path / "outside").exists()
        ok = await wire.commit("cp-r", "step-1")  # relative: inside the root
        assert ok.status == 200 and (root / "step-1" / "manifest.json").is_file()
        caps = (await wire.capabilities()).json
        assert "checkpoint-root" in caps["features"]
        await wire.resume("cp-r")


async def test_a_symlink_out_of_the_root_is_refused(tmp_path, wire_for):
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)
    with GymServerThread(args=["--checkpoint-root", str(root)]) as srv:
        wire = wire_for(srv)
        await wire.prepare("cp-s")
        got = await wire.commit("cp-s", "link/escaped")
        assert (got.status, got.code) == (422, "invalid_request")
        assert not (tmp_path / "escaped").exists()


# ---------------------------------------------------------------- memory at a commit


async def _settle_keys(wire, prefix: str, n: int) -> list[dict]:
    receipts = [await wire.complete(f"{prefix}{i}") for i in range(n)]
    assert (await wire.ack_batch(receipts)).status == 200
    await wire.retire(f"{prefix}-gone")
    return receipts


@pytest.mark.parametrize("durable", [False, True])
async def test_a_commit_drops_settled_keys_from_memory_and_keeps_their_fence(
    tmp_path, wire_for, durable
):
    with GymServerThread(state_dir=tmp_path / "state" if durable else None) as srv:
        wire, core = wire_for(srv), srv.participant.core
        receipts = await _settle_keys(wire, "m", 5)
        await wire.complete("kept")  # completed, not ACKed: stays
        assert core.get(("m0", 0)) is not None
        await wire.ack(await wire.complete("kept2"))
        await wire.prepare("cp-m", deadline_s=0.2)  # 409: "kept" is un-ACKed
        await wire.ack((await wire.receipt("kept")).json["completion_receipt"])
        for cid in ("cp-m", "cp-m2"):
            assert (await wire.prepare(cid)).status == 200
            assert (await wire.commit(cid, tmp_path / cid)).status == 200
            await wire.resume(cid)
            if cid == "cp-m":  # kept whole for one interval
                assert core.get(("m0", 0)).receipt is not None
        assert core.get(("m0", 0)) is None and core.get(("m-gone", 0)) is None
        assert core.executions() == []
        for key in ("m0", "m4", "m-gone", "kept"):
            got = await wire.run(key)
            assert got.code == "stale_attempt", key
        assert (await wire.retire("m-gone")).json["tombstoned"] is True
        assert (await wire.retire("m1")).json.get("acknowledged") is True
        again = await wire.ack(receipts[2])
        assert again.json == {"acknowledged": False, "idempotent": True}
        st = (await wire.status()).json
        assert st["acknowledged_completed"] == 7 and st["active"] == 0
        receipt = await wire.receipt("m3")
        assert receipt.status == 200 and receipt.json["state"] == "acknowledged"
        if durable:  # the full record is still on disk
            assert receipt.json["completion_receipt"] == receipts[3]
            tampered = {**receipts[2], "result_identity": "other"}
            assert (await wire.ack(tampered)).code == "completed_execution_acknowledgement_error"
        else:
            assert "completion_receipt" not in receipt.json


async def test_a_restart_loads_settled_keys_compactly(tmp_path, wire_for):
    with GymServerThread(state_dir=tmp_path) as srv:
        wire = wire_for(srv)
        await _settle_keys(wire, "s", 3)
        srv.restart()
        wire = wire_for(srv)
        core = srv.participant.core
        assert core.executions() == [] and core.state_of(("s1", 0)).value == "acknowledged"
        assert (await wire.run("s1")).code == "stale_attempt"
        assert (await wire.receipt("s1")).json["state"] == "acknowledged"
