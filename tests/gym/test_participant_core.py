"""The participant's synchronous core and checkpoint fence, without HTTP, asyncio or a clock."""

from __future__ import annotations

import pytest

from rl_gym_actors.errors import (
    AckRejected,
    AdmissionClosed,
    CheckpointConflict,
    CheckpointNotReady,
    DuplicateExecution,
    NotCompleted,
    StaleAttempt,
    StaleCheckpoint,
    UnknownExecution,
)
from rl_gym_actors.gym.agent_checkpoint.core import (
    ParticipantCore,
    PrepareIncomplete,
    Replay,
    Start,
    encode_reply,
)
from rl_gym_actors.gym.fence import CheckpointFence, CheckpointPhase
from rl_gym_actors.gym.store import Execution, FenceRecord, SpentCheckpoint
from rl_gym_actors.protocol import CompletionReceipt, ResumeAnswer
from rl_gym_actors.protocol import ExecutionState as S


def _complete(core: ParticipantCore, key=("r", 0), reply=None) -> CompletionReceipt:
    start = core.begin_run(key)
    assert isinstance(start, Start)
    raw, receipt = encode_reply(key, start.generation, reply or {"id": f"r-{key[0]}"})
    core.finish_run(key, start.generation, raw, receipt)
    return CompletionReceipt.model_validate_json(receipt)


def test_every_transition_queues_its_record_in_order():
    core = ParticipantCore()
    receipt = _complete(core)
    core.acknowledge(receipt)
    core.retire(None, ("t", 0))
    states = [(r.key, r.state) for r in core.take_records()]
    assert states == [
        (("r", 0), S.RUNNING),
        (("r", 0), S.COMPLETED),
        (("r", 0), S.ACKNOWLEDGED),
        (("t", 0), S.TOMBSTONED),
    ]
    assert core.take_records() == []


def test_an_acked_record_drops_the_reply_but_keeps_the_receipt():
    core = ParticipantCore()
    receipt = _complete(core)
    core.acknowledge(receipt)
    e = core.get(("r", 0))
    assert e.reply is None and CompletionReceipt.model_validate_json(e.receipt) == receipt


def test_run_decisions():
    core = ParticipantCore()
    _complete(core, ("c", 0))
    core.begin_run(("run", 0))
    core.retire(None, ("t", 0))
    assert isinstance(core.begin_run(("c", 0)), Replay)
    with pytest.raises(DuplicateExecution):
        core.begin_run(("run", 0))
    with pytest.raises(StaleAttempt):
        core.begin_run(("t", 0))
    core.begin_prepare("c1")
    with pytest.raises(AdmissionClosed):
        core.begin_run(("new", 0))


def test_finish_after_retire_is_stale_and_keeps_the_tombstone():
    core = ParticipantCore()
    start = core.begin_run(("r", 0))
    core.retire("x", ("r", 0))
    raw, receipt = encode_reply(("r", 0), start.generation, {"id": "r"})
    with pytest.raises(StaleAttempt):
        core.finish_run(("r", 0), start.generation, raw, receipt)
    core.fail_run(("r", 0), start.generation)
    assert core.get(("r", 0)).state is S.TOMBSTONED


def test_receipt_errors():
    core = ParticipantCore()
    core.begin_run(("run", 0))
    core.retire(None, ("t", 0))
    with pytest.raises(UnknownExecution) as unknown:
        core.receipt(("x", 0))
    assert unknown.value.status == 404
    with pytest.raises(NotCompleted):
        core.receipt(("run", 0))
    with pytest.raises(StaleAttempt):
        core.receipt(("t", 0))


def test_ack_of_a_tombstoned_key_is_refused():
    core = ParticipantCore()
    receipt = _complete(core)
    core.retire(None, ("t", 0))
    with pytest.raises(AckRejected, match="tombstoned"):
        core.acknowledge(receipt.model_copy(update={"rollout_id": "t"}))


def test_prepare_incomplete_carries_the_report():
    core = ParticipantCore()
    _complete(core)
    core.begin_prepare("c1")
    with pytest.raises(PrepareIncomplete) as refused:
        core.finish_prepare("c1")
    assert refused.value.status == 409 and refused.value.code == "agent_prepare_incomplete"
    assert refused.value.body["completed_unacknowledged"] == 1  # the body is JSON data
    assert "completed_unacknowledged=1" in refused.value.detail


def test_loaded_state_is_counted_and_not_written_again():
    core = ParticipantCore(
        [Execution("a", 0, S.ACKNOWLEDGED, 1, None, b"{}"), Execution("b", 0, S.TOMBSTONED, 0)],
        {"c0": b"{}"},
    )
    assert core.state_of(("a", 0)) is S.ACKNOWLEDGED and core.get(("a", 0)) is None
    assert core.count(S.ACKNOWLEDGED) == 1 and core.count(S.TOMBSTONED) == 1
    assert core.take_records() == []
    with pytest.raises(StaleCheckpoint):
        core.status("c0")


def test_resume_records_the_spent_id_and_the_fence():
    core = ParticipantCore()
    answer = core.resume("c1")
    spent, fence = core.take_records()
    assert spent == SpentCheckpoint("c1", b'{"state":"accepting","released":0}')
    assert fence == FenceRecord(core.fence.state())
    assert core.resume("c1") == answer == ResumeAnswer(state="accepting", released=0)


# ---------------------------------------------------------------- the fence's table


def test_fence_walks_its_phases():
    fence = CheckpointFence()
    assert fence.recorded("c1", "prepare") is None
    fence.advance("c1", "prepare")
    assert (fence.phase, fence.active, fence.admission_open) == (
        CheckpointPhase.PREPARING,
        "c1",
        False,
    )
    fence.advance("c1", "prepare")  # a 409'd prepare, called again
    fence.advance("c1", "prepared", {"ready": True})
    assert fence.recorded("c1", "prepare") == {"ready": True}
    fence.advance("c1", "commit", {"records": 0})
    assert fence.recorded("c1", "commit") == {"records": 0}
    fence.advance("c1", "resume", {"state": "accepting"})
    assert (fence.phase, fence.active, fence.admission_open) == (CheckpointPhase.IDLE, None, True)
    assert fence.recorded("c1", "resume") == {"state": "accepting"}
    for op in ("prepare", "commit", "status"):
        with pytest.raises(StaleCheckpoint):
            fence.recorded("c1", op)


@pytest.mark.parametrize(
    "phase_ops,op,error",
    [
        ([], "commit", CheckpointNotReady),
        ([], "prepared", CheckpointConflict),
        (["prepare"], "commit", CheckpointNotReady),
        (["prepare", "prepared"], "prepared", CheckpointConflict),
        (["prepare", "prepared", "commit"], "prepare", CheckpointConflict),
        (["prepare", "prepared", "commit"], "commit", CheckpointNotReady),
    ],
)
def test_fence_refuses_illegal_transitions_by_name(phase_ops, op, error):
    fence = CheckpointFence()
    for step in phase_ops:
        fence.advance("c1", step, {"step": step})
    before = (fence.phase, fence.active)
    with pytest.raises(error):
        fence.advance("c1", op)
    assert (fence.phase, fence.active) == before


def test_fence_conflict_names_the_active_checkpoint():
    fence = CheckpointFence()
    fence.advance("c1", "prepare")
    with pytest.raises(CheckpointConflict, match="'c1' is preparing"):
        fence.recorded("c2", "prepare")
    fence.check_lenient("c2")  # status/retire: fine
