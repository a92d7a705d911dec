"""The failure taxonomy: one kind per failure, read by everything that decides what to do."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from rl_gym_actors import errors
from rl_gym_actors.failures import FailureKind, failure_kind
from rl_gym_actors.outcome import Outcome


@pytest.mark.parametrize(
    "exc, kind",
    [
        (errors.AdmissionClosed("x", status=409), FailureKind.ADMISSION_CLOSED),
        (errors.StaleAttempt("x", status=409), FailureKind.STALE),
        (errors.DuplicateExecution("x", status=409), FailureKind.DUPLICATE),
        (errors.CheckpointConflict("x", status=409), FailureKind.CONFLICT),
        (errors.NotCompleted("x", status=409), FailureKind.NOT_COMPLETED),
        (errors.UnknownExecution("x", status=404), FailureKind.UNKNOWN),
        (errors.AgentFailed("x", status=500), FailureKind.AGENT_FAILED),
        (errors.GymServerError("x", status=500), FailureKind.SERVER_ERROR),
        (errors.ServerBusy("x", status=503), FailureKind.BUSY),
        (errors.DeadlineExceeded("x"), FailureKind.DEADLINE),
        (TimeoutError("x"), FailureKind.DEADLINE),
        (errors.ConnectionLost("x"), FailureKind.LOST),
        (errors.Unauthorized("x", status=401), FailureKind.REJECTED),
        (errors.InvalidRequest("x", status=422), FailureKind.REJECTED),
        (errors.ConfigError("x"), FailureKind.REJECTED),
        (errors.ProtocolViolation("x"), FailureKind.PROTOCOL),
        (errors.PoolClosed("x"), FailureKind.POOL_CLOSED),
        (RuntimeError("bug"), FailureKind.INTERNAL),
        (asyncio.CancelledError(), FailureKind.INTERNAL),
    ],
)
def test_failure_kind_sorts_the_error_tree(exc, kind):
    assert failure_kind(exc) is kind


def test_every_kind_is_transport_or_data_and_has_a_unique_code():
    for kind in FailureKind:
        assert kind.is_transport != kind.is_data
        assert FailureKind(kind.value) is kind
    assert [k for k in FailureKind if k.is_timeout] == [FailureKind.DEADLINE]


@pytest.mark.parametrize("status", [500, 502, 503, 504])
def test_any_5xx_answer_is_infrastructure(status):
    for code in (None, "agent_failed", "no_such_code"):
        assert failure_kind(errors.gym_error(status, code)).is_transport


def test_a_4xx_is_data_unless_it_may_pass_or_names_the_key_state():
    for status, code in (
        (400, None),
        (401, None),
        (404, None),
        (413, None),
        (422, None),
        (409, "completed_execution_acknowledgement_error"),
    ):
        assert failure_kind(errors.gym_error(status, code)).is_data, (status, code)
    for code in ("agent_admission_closed", "checkpoint_conflict", "not_completed"):
        kind = failure_kind(errors.gym_error(409, code))
        assert kind.is_transport and kind.may_pass, code


def test_every_wire_code_has_a_kind_of_its_own_class():
    for code, cls in errors.ERROR_BY_CODE.items():
        assert failure_kind(cls("x", status=409)) is not FailureKind.INTERNAL, code


def test_an_outcome_carries_its_kind_across_pickling_and_json():
    out = Outcome(
        rollout_id="r1",
        status="failed",
        reason="agent_failed: boom",
        failure=FailureKind.AGENT_FAILED,
    )
    again = pickle.loads(pickle.dumps(out))
    assert again.failure is FailureKind.AGENT_FAILED and again.failure.is_transport
    assert Outcome.model_validate_json(out.model_dump_json()).failure is FailureKind.AGENT_FAILED
