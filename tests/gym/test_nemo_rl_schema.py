"""Our server against the strict schema of NeMo RL's Gym checkpoint client.

The models below are written here from the shapes that client validates (capabilities,
completion receipts with the optional model-lineage pair); like the client's, they refuse
unknown fields, so an (ext) field of ours in the wrong place fails these tests.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import nemo_rl_checkpoint_models as models

from rl_gym_actors.gym.agents import LineagedReply, simulated_agent
from rl_gym_actors.protocol import ModelLineage, capture_key
from rl_gym_actors.testing.gym_process import GymServerThread

StrictCapabilities = models.Capabilities
StrictReceipt = models.Receipt


async def lineaged_agent(row):
    """The simulated agent, naming the model call its reply ended with."""
    reply = await simulated_agent(row)
    key = capture_key(row["_ng_rollout_id"], row.get("_ng_attempt_index", 0))
    return LineagedReply(
        reply, ModelLineage(manifest_capture_key=key, terminal_model_call_id=f"call-{key}")
    )


async def test_capabilities_validate_in_every_phase(wire):
    caps = StrictCapabilities.model_validate((await wire.capabilities()).json)
    assert caps.component == "responses_api_agents" and caps.phase == "idle"
    assert caps.checkpoint_mode == "export_restore"
    assert "completed_result_acknowledgement" in caps.features
    assert caps.active_checkpoint_id is None
    assert (await wire.prepare("cp-n1")).status == 200
    caps = StrictCapabilities.model_validate((await wire.capabilities()).json)
    assert (caps.phase, caps.active_checkpoint_id) == ("prepared", "cp-n1")
    await wire.resume("cp-n1")


async def test_completion_receipt_is_the_bare_receipt_and_receipt_keeps_its_state(wire):
    await wire.run("rN")
    prefix = "/ng-control/v1/agent-checkpoint"
    params = {"rollout_id": "rN", "attempt_index": "0"}
    bare = await wire.request("GET", prefix + "/completion-receipt", params=params)
    receipt = StrictReceipt.model_validate(bare.json)  # NeMo RL PR #4093 validates it bare
    assert receipt.manifest_capture_key is None and "manifest_capture_key" not in bare.json
    ours = await wire.request("GET", prefix + "/receipt", params=params)
    assert ours.json == {"state": "completed", "completion_receipt": bare.json}  # (ext)
    # no receipt to give: the real participant's 409 completed_execution_acknowledgement_error
    none = await wire.request(
        "GET", prefix + "/completion-receipt", params={"rollout_id": "rZ", "attempt_index": "0"}
    )
    assert (none.status, none.code) == (409, "completed_execution_acknowledgement_error")


async def test_pr_4093_control_bodies_with_schema_version_are_accepted(wire, tmp_path):
    prefix = "/ng-control/v1/agent-checkpoint"
    body = {"schema_version": 1, "checkpoint_id": "pr-1", "deadline_ts": time.time() + 30}
    retire = {**body, "rollout_id": "rX", "attempt_index": 0}
    assert (await wire.request("POST", prefix + "/retire", body=retire)).status == 200
    assert (await wire.request("POST", prefix + "/prepare", body=body)).status == 200
    commit = {**body, "checkpoint_dir": str(tmp_path)}
    assert (await wire.request("POST", prefix + "/commit", body=commit)).status == 200
    caps = StrictCapabilities.model_validate((await wire.capabilities()).json)
    assert caps.phase == "committed_paused"
    assert (await wire.request("POST", prefix + "/resume", body=body)).status == 200
    bad = await wire.request("POST", prefix + "/prepare", body={**body, "schema_version": 2})
    assert (bad.status, bad.code) == (422, "invalid_request")


async def test_lineage_fields_pass_through_receipt_status_and_ack(wire_for):
    with GymServerThread(agent=lineaged_agent) as srv:
        wire = wire_for(srv)
        await wire.run("rL", 2)
        got = (await wire.receipt("rL", 2)).json["completion_receipt"]
        receipt = StrictReceipt.model_validate(got)
        assert (receipt.manifest_capture_key, receipt.terminal_model_call_id) == (
            "rL-a2",
            "call-rL-a2",
        )
        [listed] = (await wire.status()).json["completed_unacknowledged_attempts"]
        assert listed["completion_receipt"] == got
        # an ACK must carry the pair as issued; without it the receipt differs
        without = {
            k: v
            for k, v in got.items()
            if k not in ("manifest_capture_key", "terminal_model_call_id")
        }
        refused = await wire.ack(without)
        assert refused.code == "completed_execution_acknowledgement_error"
        assert (await wire.ack(got)).json == {"acknowledged": True, "idempotent": False}


async def test_a_receipt_with_half_the_lineage_pair_is_refused(wire):
    receipt = await wire.complete("rH")
    got = await wire.ack({**receipt, "manifest_capture_key": "rH"})
    assert (got.status, got.code) == (422, "invalid_request")
    # nulls for both are the same as neither (as NeMo RL sends them)
    ok = await wire.ack({**receipt, "manifest_capture_key": None, "terminal_model_call_id": None})
    assert ok.json == {"acknowledged": True, "idempotent": False}


async def test_a_named_server_speaks_pr_4093_field_for_field(wire_for, tmp_path):
    """Named for its agent server, the server answers every call of NeMo RL's checkpoint
    client in that client's models, and a commit / restore round trip passes its
    continuation checks (files where it looks: agent/instance-<sha256(name)>/)."""
    with GymServerThread(args=["--name", "math_agent"]) as srv:
        wire = wire_for(srv)
        caps = StrictCapabilities.model_validate((await wire.capabilities()).json)
        assert caps.name == "math_agent" and "agent_continuation_index_v1" in caps.features
        await wire.complete("rP")
        st = models.AgentStatus.model_validate((await wire.status("pr-1")).json)
        assert (
            st.checkpoint_id == "pr-1" and st.completed_unacknowledged_attempts[0].generation == 1
        )
        assert (await wire.prepare("pr-1")).code == "agent_prepare_incomplete"
        await wire.ack(st.completed_unacknowledged_attempts[0].completion_receipt.model_dump())
        prepared = models.AgentPrepare.model_validate((await wire.prepare("pr-1")).json)
        assert prepared.ready_to_commit and prepared.selected_boundaries == []
        got = (await wire.commit("pr-1", tmp_path)).json
        commit = models.AgentCommit.model_validate(got)
        where = f"agent/instance-{hashlib.sha256(b'math_agent').hexdigest()}/manifest.json"
        ident = {"server_name": "math_agent", "component": "responses_api_agents"}
        ident["participant_name"] = "math_agent"
        result = models.CommitResult.model_validate(
            {
                "checkpoint_id": "pr-1",
                "participants": [
                    {
                        "participant": ident,
                        "payload": got,
                        "manifest": {
                            "participant": ident,
                            "relative_path": where,
                            "manifest_digest": commit.manifest_digest,
                        },
                    }
                ],
            }
        )
        assert models.continuations(Path(tmp_path), result) == []  # nothing parked: no roots
        assert (await wire.resume("pr-1")).json == {"state": "accepting", "released": 0}
        # restore from idle: checked files, admission closed until resume, the same index
        restored = await wire.restore("pr-r", tmp_path)
        answer = models.AgentRestore.model_validate(restored.json)
        assert answer.continuation_index == commit.continuation_index
        assert answer.source_checkpoint_id == "pr-1"
        assert (await wire.capabilities()).json["phase"] == "restored_paused"
        assert (await wire.run("rQ")).code == "agent_admission_closed"
        assert (await wire.restore("pr-r", tmp_path)).json == restored.json  # a repeat
        models.AgentResume.model_validate((await wire.resume("pr-r")).json)
        assert (await wire.run("rQ")).status == 200
        # another instance's directory is not this one's checkpoint
        (tmp_path / "other").mkdir()
        refused = await wire.restore("pr-x", tmp_path / "other")
        assert (refused.status, refused.code) == (409, "restore_failed")
