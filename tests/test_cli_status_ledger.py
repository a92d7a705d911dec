"""`rl-gym-actors ledger`: finds the ledger actors on a running Ray and prints their snapshots."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import uuid

import pytest

from rl_gym_actors.cli_observe import ledger_command
from rl_gym_actors.config import GymEndpoint, LedgerConfig, TryPolicy
from rl_gym_actors.core.attempt_book import LedgerSnapshot
from rl_gym_actors.core.attempt_reports import AttemptReport, AttemptState
from rl_gym_actors.observe import snapshot_table

pytestmark = [pytest.mark.ray, pytest.mark.slow]

URL = "http://127.0.0.1:9"  # never contacted: the ledger only folds reports here


@pytest.fixture
def ledger(ray_session):
    from rl_gym_actors.actors.ledger_actor import LedgerActor, ledger_name
    from rl_gym_actors.actors.runtime import RAY_NAMESPACE

    name = ledger_name(f"cli-{uuid.uuid4().hex[:8]}")
    actor = LedgerActor.options(name=name, namespace=RAY_NAMESPACE).remote(
        [GymEndpoint(url=URL)], TryPolicy(), LedgerConfig()
    )
    ray_session.get(
        actor.report.remote(
            [
                AttemptReport("r1", 0, URL, AttemptState.ACKED, "owner-a"),
                AttemptReport("r2", 0, URL, AttemptState.RUNNING, "owner-a"),
                AttemptReport("r3", 1, URL, AttemptState.SEALED, "owner-b", adopted=True),
            ]
        )
    )
    yield name
    ray_session.kill(actor)


def run(**kw):
    args = argparse.Namespace(**{"address": None, "timeout_s": 10.0, "json": False, **kw})
    out, err = io.StringIO(), io.StringIO()
    code = ledger_command(args, out, err)
    return code, out.getvalue(), err.getvalue()


def test_ledger_command_prints_every_ledger_as_a_table(ledger):
    code, out, err = run()
    assert code == 0, err
    block = out[out.index(f"Ledger {ledger}") :]
    row = next(line for line in block.splitlines() if line.startswith(URL))
    assert row.split() == [URL, "3", "1", "1", "1", "0", "1", "ok"]
    assert "rollouts" in block and "checkpoints committed" in block


def test_ledger_command_json_is_the_snapshot(ledger):
    code, out, _ = run(json=True)
    assert code == 0
    snap = LedgerSnapshot.model_validate(json.loads(out)[ledger])
    assert snap.endpoints[URL].dispatched == 3 and snap.invariant_ok


def test_snapshot_table_flags_a_broken_invariant():
    from rl_gym_actors.core.attempt_book import EndpointSnapshot

    snap = LedgerSnapshot(
        endpoints={URL: EndpointSnapshot(endpoint=URL, dispatched=2, acked=1, invariant_ok=False)},
        rollouts=2,
        attempts=2,
        reports=2,
        owners={},
        invariant_ok=False,
    )
    text = snapshot_table("x", snap)
    assert "BROKEN" in text.splitlines()[2] and text.rstrip().endswith("BROKEN")


def test_the_command_line_attaches_to_a_running_ray_by_address(ledger, ray_session):
    address = ray_session.get_runtime_context().gcs_address
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    proc = subprocess.run(
        [sys.executable, "-m", "rl_gym_actors.cli", "ledger", "--address", address, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    snap = LedgerSnapshot.model_validate(json.loads(proc.stdout)[ledger])
    assert snap.endpoints[URL].acked == 1


def test_no_ray_to_attach_to_exits_1():
    proc = subprocess.run(
        [sys.executable, "-m", "rl_gym_actors.cli", "ledger", "--address", "127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and "nothing answers as Ray at 127.0.0.1:9" in proc.stderr
    assert proc.stderr.count("\n") == 1  # one line, no traceback
