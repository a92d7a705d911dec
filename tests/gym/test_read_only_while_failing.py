"""Read-only routes answer while the store's writes fail (issue 16): with the state dir's disk
full, ``GET /status`` answered 503, so every checkpoint failed at once instead of waiting for the
disk. Now status and the receipt route answer from memory; writes (``/run``, prepare, ACK) still
fail with 503 and ``/ready`` says the store is failing, so nothing is committed on a bad disk."""

from __future__ import annotations

from rl_gym_actors.testing.gym_process import GymServerThread
from rl_gym_actors.testing.polling import until
from rl_gym_actors.testing.store_faults import FaultyStore


async def test_status_and_receipts_answer_while_writes_fail(tmp_path, wire_for):
    with GymServerThread(state_dir=tmp_path, store_factory=FaultyStore) as srv:
        wire, store = wire_for(srv), srv.participant.store
        receipt = await wire.complete("kept")
        store.fail_always()
        for i in range(3):  # writes fail, then the store counts as broken
            got = await wire.run(f"w{i}")
            assert got.status == 503 and got.code in ("store_write_failed", "store_unavailable")
        assert (await wire.request("GET", "/ready")).status == 503
        for checkpoint_id in ("rl-status", None, "ck-1"):
            status = await wire.status(checkpoint_id)
            assert status.status == 200, status.raw
            listed = {a["rollout_id"] for a in status.json["completed_unacknowledged_attempts"]}
            # the failed writes' runs completed in memory; their records wait for the disk
            assert "kept" in listed and status.json["completed_unacknowledged"] == len(listed)
        got = await wire.receipt("kept")
        assert got.status == 200 and got.json["completion_receipt"] == receipt
        assert (await wire.capabilities()).status == 200
        prepare = await wire.prepare("ck-1", deadline_s=1.0)
        assert (prepare.status, prepare.code) == (503, "store_unavailable")
        ack = await wire.ack(receipt)
        assert (ack.status, ack.code) == (503, "store_unavailable")
        store.heal()

        async def healed() -> bool:
            return (await wire.request("GET", "/ready")).status == 200

        await until(healed, interval_s=0.05, what="the store to heal")
        assert (await wire.ack(receipt)).json["acknowledged"] is True
        for attempt in (await wire.status()).json["completed_unacknowledged_attempts"]:
            assert (await wire.ack(attempt["completion_receipt"])).status == 200
        assert (await wire.prepare("ck-2")).status == 200
        assert (await wire.resume("ck-2")).status == 200
