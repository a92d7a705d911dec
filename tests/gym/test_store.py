"""The durable store on its own: durability before the wait returns, recovery after a crash,
group commit, and checkpoint files written manifest last."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3

import pytest

from rl_gym_actors.gym import checkpoint_files as files_mod
from rl_gym_actors.gym.checkpoint_files import (
    CONTINUATIONS_NAME,
    MANIFEST_NAME,
    RECORDS_NAME,
    write_checkpoint,
)
from rl_gym_actors.gym.store import (
    DB_NAME,
    Execution,
    MemoryStore,
    SpentCheckpoint,
    SqliteStore,
    StoreFailed,
    open_store,
)
from rl_gym_actors.protocol import ExecutionState as S

REPLY = b'{"id":"r-a","reward":0.5}'
RECEIPT = b'{"attempt_index":0,"execution_generation":1}'


def _rows(state_dir) -> dict:
    """What another process would read from the database file right now."""
    conn = sqlite3.connect(os.path.join(state_dir, DB_NAME))
    try:
        return {
            (r[0], r[1]): r[2:]
            for r in conn.execute(
                "SELECT rollout_id, attempt_index, state, generation, reply, receipt"
                " FROM executions"
            )
        }
    finally:
        conn.close()


async def test_a_record_is_durable_when_its_wait_returns(tmp_path):
    store = SqliteStore(tmp_path)
    try:
        ticket = store.submit([Execution("a", 0, S.COMPLETED, 1, REPLY, RECEIPT)])
        await store.wait(ticket)
        assert _rows(tmp_path)[("a", 0)] == ("completed", 1, REPLY, RECEIPT)
    finally:
        store.close()


async def test_an_empty_submit_is_a_barrier_on_everything_before_it(tmp_path):
    store = SqliteStore(tmp_path)
    try:
        store.submit([Execution("a", 0, S.RUNNING, 1)])
        await store.wait(store.submit([]))
        assert _rows(tmp_path)[("a", 0)][0] == "running"
    finally:
        store.close()


async def test_reopen_tombstones_what_was_running_and_keeps_the_rest_byte_for_byte(tmp_path):
    store = SqliteStore(tmp_path)
    await store.wait(
        store.submit(
            [
                Execution("run", 0, S.RUNNING, 1),
                Execution("park", 0, S.PARKED, 1),
                Execution("done", 0, S.COMPLETED, 1, REPLY, RECEIPT),
                Execution("acked", 2, S.ACKNOWLEDGED, 1, None, RECEIPT),
                Execution("gone", 0, S.TOMBSTONED, 0),
                SpentCheckpoint("c1", b'{"released":0}'),
            ]
        )
    )
    store.crash()
    again = SqliteStore(tmp_path)
    try:
        loaded = again.load()
        by_key = {e.key: e for e in loaded.executions}
        assert loaded.recovered == 2
        assert (
            by_key[("run", 0)].state is S.TOMBSTONED and by_key[("park", 0)].state is S.TOMBSTONED
        )
        assert by_key[("done", 0)] == Execution("done", 0, S.COMPLETED, 1, REPLY, RECEIPT)
        assert by_key[("acked", 2)] == Execution("acked", 2, S.ACKNOWLEDGED, 1, None, RECEIPT)
        assert by_key[("gone", 0)].state is S.TOMBSTONED
        assert loaded.spent == {"c1": b'{"released":0}'}
    finally:
        again.close()


async def test_concurrent_submits_share_transactions(tmp_path, monkeypatch):
    store = SqliteStore(tmp_path)
    commits = []
    original = store._commit
    monkeypatch.setattr(
        store, "_commit", lambda items: (commits.append(len(items)), original(items))
    )
    try:
        tickets = [store.submit([Execution(f"k{i}", 0, S.RUNNING, 1)]) for i in range(200)]
        await asyncio.gather(*(store.wait(t) for t in tickets))
        assert sum(commits) == 200
        assert len(commits) < 100  # many records per fsync, not one each
        assert len(_rows(tmp_path)) == 200
    finally:
        store.close()


async def test_after_a_crash_nothing_more_is_durable_and_waits_fail(tmp_path):
    store = SqliteStore(tmp_path)
    await store.wait(store.submit([Execution("a", 0, S.RUNNING, 1)]))
    store.crash()
    ticket = store.submit([Execution("a", 0, S.COMPLETED, 1, REPLY, RECEIPT)])
    with pytest.raises(StoreFailed):
        await store.wait(ticket)
    assert _rows(tmp_path)[("a", 0)][0] == "running"


async def test_a_failed_write_fails_its_waiters(tmp_path, monkeypatch):
    store = SqliteStore(tmp_path)
    try:
        store._conn.execute("DROP TABLE executions")  # every later write fails
        with pytest.raises(StoreFailed):
            await store.wait(store.submit([Execution("a", 0, S.RUNNING, 1)]))
        with pytest.raises(StoreFailed):
            await store.wait(store.submit([]))
    finally:
        store.close()


async def test_memory_store_keeps_nothing_and_never_waits():
    store = open_store(None)
    assert isinstance(store, MemoryStore) and not store.durable
    await store.wait(store.submit([Execution("a", 0, S.RUNNING, 1)]))
    assert store.load().executions == []


def test_write_checkpoint_writes_the_manifest_last(tmp_path, monkeypatch):
    renamed = []
    real_replace = os.replace
    monkeypatch.setattr(
        files_mod.os,
        "replace",
        lambda src, dst: (renamed.append(os.path.basename(dst)), real_replace(src, dst)),
    )
    executions = [
        Execution("b", 0, S.TOMBSTONED, 0),
        Execution("a", 1, S.ACKNOWLEDGED, 1, None, b'{"rollout_id":"a"}'),
    ]
    answer = write_checkpoint(tmp_path / "c", "ckpt-1", executions)
    assert renamed == [RECORDS_NAME, CONTINUATIONS_NAME, MANIFEST_NAME]
    manifest = (tmp_path / "c" / MANIFEST_NAME).read_bytes()
    records = (tmp_path / "c" / RECORDS_NAME).read_bytes()
    assert answer["records"] == 2
    assert answer["manifest_digest"] == hashlib.sha256(manifest).hexdigest()
    meta = json.loads(manifest)
    assert meta["continuation_index"] == answer["continuation_index"]
    assert (meta["checkpoint_id"], meta["records"], meta["records_sha256"]) == (
        "ckpt-1",
        2,
        hashlib.sha256(records).hexdigest(),
    )
    lines = [json.loads(x) for x in records.splitlines()]
    assert [(x["rollout_id"], x["state"]) for x in lines] == [
        ("a", "acknowledged"),
        ("b", "tombstoned"),
    ]
    assert lines[0]["completion_receipt"] == {"rollout_id": "a"}


def test_write_checkpoint_into_a_file_raises_oserror(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OSError):
        write_checkpoint(tmp_path / "f" / "c", "ckpt-1", [])
