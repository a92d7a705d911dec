"""Why something failed, as one typed taxonomy: :class:`FailureKind`.

Every failed call and every outcome without a result names its kind, and everything that decides
what to do about a failure reads the kind's properties, never a message:

- ``is_transport``: infrastructure, not the row's fault. It follows NeMo RL's rule for an HTTP
  answer: any 5xx, and a 4xx that may pass when repeated (a conflict with a checkpoint, a key
  still running), are infrastructure; a trainer re-dispatches the row. A lost connection, a
  deadline, a dead actor and an abandoned rollout are infrastructure too.
- ``is_data``: the failure describes the row itself (a refused request, an answer that breaks
  the contract for it, a reply that cannot become a result); repeating the row fails again.
- ``may_pass``: repeating the same idempotent call a little later may succeed.
- ``is_timeout``: a deadline ran out (infrastructure that NeMo RL sees as a ``TimeoutError``).

Adding a failure path is one row of :class:`FailureKind` (its code, whether it is
infrastructure, whether it may pass, and the exception classes that raise it).
:func:`failure_kind` sorts any exception by that table.
"""

from __future__ import annotations

from enum import Enum

from rl_gym_actors import errors

_BY_ERROR: dict[type[BaseException], "FailureKind"] = {}


class FailureKind(str, Enum):
    """The kind of a failure; see the module docstring. The value is the kind's code."""

    transport: bool
    may_pass: bool

    def __new__(cls, code: str, transport: bool, may_pass: bool,
                *raised_by: type[BaseException]) -> "FailureKind":
        member = str.__new__(cls, code)
        member._value_ = code
        member.transport = transport
        member.may_pass = may_pass
        member._raised_by = raised_by
        return member

    # name              code                       infra  may pass  raised as
    LOST = ("connection_lost", True, True, errors.ConnectionLost, errors.GymUnavailable)
    SERVER_ERROR = ("server_error", True, True, errors.GymServerError)
    AGENT_FAILED = ("agent_failed", True, False, errors.AgentFailed)                   # a 5xx
    DEADLINE = ("deadline_exceeded", True, True, errors.DeadlineExceeded, TimeoutError)
    ENDPOINT_DOWN = ("endpoint_down", True, False, errors.EndpointDown)   # not sent at all
    LEDGER_LOST = ("ledger_lost", True, False, errors.LedgerLost)
    ADMISSION_CLOSED = ("agent_admission_closed", True, True, errors.AdmissionClosed)
    CONFLICT = ("checkpoint_conflict", True, True, errors.CheckpointConflict)
    NOT_COMPLETED = ("not_completed", True, True, errors.NotCompleted)
    STALE = ("stale_attempt", True, False, errors.StaleAttempt)
    DUPLICATE = ("duplicate_execution", True, False, errors.DuplicateExecution)
    UNKNOWN = ("unknown_execution", True, False, errors.UnknownExecution)
    ACTOR_DIED = ("actor_died", True, False)              # a rollout actor's process died
    POOL_CLOSED = ("pool_closed", True, False, errors.PoolClosed)
    ABANDONED = ("abandoned", True, False)                # the batch stopped early
    INTERNAL = ("internal_error", True, False)            # an unexpected exception (a bug)
    PROTOCOL = ("protocol_violation", False, True, errors.ProtocolViolation)
    REJECTED = ("rejected", False, False, errors.GymRejected, errors.ConfigError)      # a 4xx
    INVALID_REPLY = ("invalid_reply", False, False)       # the reply cannot become a result

    @property
    def is_transport(self) -> bool:
        """Infrastructure: the row is not at fault; a trainer may re-dispatch it."""
        return self.transport

    @property
    def is_data(self) -> bool:
        """The failure describes the row: repeating it would fail the same way."""
        return not self.transport

    @property
    def is_timeout(self) -> bool:
        return self is FailureKind.DEADLINE


for _kind in FailureKind:
    for _cls in _kind._raised_by:
        _BY_ERROR[_cls] = _kind
del _kind, _cls


def failure_kind(exc: BaseException) -> FailureKind:
    """The kind of an exception: that of the nearest class in its MRO the table names;
    ``INTERNAL`` for an exception no row names."""
    for cls in type(exc).__mro__:
        kind = _BY_ERROR.get(cls)
        if kind is not None:
            return kind
    return FailureKind.INTERNAL
