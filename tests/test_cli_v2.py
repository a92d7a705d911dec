"""`rl-gym-actors status` and `gym abort` against a v2-only server (`gym serve --protocol v2`),
and its `GET /metrics`: a real v2 server on loopback, no 404 on the agent-checkpoint routes."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from rl_gym_actors.cli import main
from rl_gym_actors.gym.agent_checkpoint.client import GymClient
from rl_gym_actors.gym.v2.client import V2Client
from rl_gym_actors.gym.v2.wire import StatusAnswer
from rl_gym_actors.testing.polling import soon
from rl_gym_actors.testing.v2_server import V2ServerThread


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def v2():
    with V2ServerThread(token="t") as server:
        yield server


async def _run_one(server, rollout_id: str) -> None:
    async with GymClient(server.endpoint) as client:
        await client.run(
            {"reward": 0.5}, rollout_id=rollout_id, attempt_index=0, deadline_ts=soon()
        )


async def _prepare(server, checkpoint_id: str) -> None:
    async with GymClient(server.endpoint) as client:
        await V2Client(client).prepare(checkpoint_id, deadline_ts=soon())


async def _phase(server) -> str:
    async with GymClient(server.endpoint) as client:
        return (await V2Client(client).status(deadline_ts=soon())).phase.value


def test_status_reads_a_v2_server_as_a_table_and_as_json(capsys, v2):
    code, out, err = cli(capsys, "status", v2.url, "--token", "t")
    assert code == 0, err
    assert out.splitlines()[0] == f"Gym {v2.url}"
    fields = {line.split()[0]: line.split()[-1] for line in out.splitlines()[2:] if line.strip()}
    assert (fields["protocol"], fields["phase"], fields["ready_to_commit"]) == ("v2", "idle", "yes")
    assert "ACK" not in out  # v2 has no ACK
    code, out, err = cli(capsys, "status", v2.url, "--token", "t", "--json")
    assert code == 0, err
    assert StatusAnswer.model_validate(json.loads(out)).kind == "agent"


def test_gym_abort_resumes_the_v2_checkpoint_that_holds_the_server(capsys, v2):
    asyncio.run(_prepare(v2, "dead-driver-v2"))
    code, out, err = cli(capsys, "status", v2.url, "--token", "t")
    assert code == 0, err
    held = next(line for line in out.splitlines() if line.startswith("held by checkpoint"))
    assert "dead-driver-v2" in held
    code, out, err = cli(capsys, "gym", "abort", v2.url, "--token", "t", "--checkpoint-id",
                         "dead-driver-v2")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["checkpoint_id"] == "dead-driver-v2"
    assert asyncio.run(_phase(v2)) == "idle"


def test_gym_abort_of_another_v2_checkpoint_id_is_refused(capsys, v2):
    asyncio.run(_prepare(v2, "held-v2"))
    code, out, err = cli(capsys, "gym", "abort", v2.url, "--token", "t", "--checkpoint-id",
                         "typo-v2")  # fmt: skip
    assert (code, out) == (2, "")
    assert "checkpoint_not_held: checkpoint typo-v2 does not hold" in err
    assert "held-v2 does" in err and err.count("\n") == 1
    assert asyncio.run(_phase(v2)) != "idle"  # still held
    code, _, err = cli(capsys, "gym", "abort", v2.url, "--token", "t", "--checkpoint-id",
                       "held-v2")  # fmt: skip
    assert code == 0, err
    assert asyncio.run(_phase(v2)) == "idle"


def test_a_v2_server_serves_metrics(v2):
    asyncio.run(_run_one(v2, "m-v2"))

    async def scrape() -> tuple[int, str]:
        async with aiohttp.ClientSession() as http, http.get(v2.url + "/metrics") as resp:
            return resp.status, await resp.text()

    status, text = asyncio.run(scrape())
    assert status == 200
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert values["gym_runs_started_total"] >= 1 and values["gym_runs_completed_total"] >= 1
    assert any(k.startswith("gym_request_duration_seconds") for k in values)
