"""Why something failed, as one typed taxonomy: :class:`FailureKind`.

Every failed call and every outcome without a result names its kind, and everything that decides
what to do about a failure reads the kind's properties, never a message:

- ``is_transport``: infrastructure, not the row's fault. It follows NeMo RL's rule for an HTTP
  answer: any 5xx, and a 4xx that may pass when repeated (a conflict with a checkpoint, a key
  still running), are infrastructure; a trainer re-dispatches the row. A lost connection, a
  deadline, a dead actor and an abandoned rollout are infrastructure too.
- ``is_data``: the failure describes the row itself (a refused request, an answer that breaks
  the contract for it, a reply that cannot become a result, an agent that failed the row as
  data); repeating the row fails again, so nothing tries it again.
- ``repeat``: who repeats a failed idempotent call (:class:`Repeat`): nobody; the call's retry
  decider at once (a lost connection, a 5xx, one try's timeout); or its caller later, once the
  server's state changed (a checkpoint in the way, a key not completed yet). ``may_pass``: either.
- ``is_timeout``: a deadline ran out (infrastructure that NeMo RL sees as a ``TimeoutError``).

Adding a failure path is one row of :class:`FailureKind` (its code, whether it is
infrastructure, who repeats it, and the exception classes that raise it).
:func:`failure_kind` sorts any exception by that table.
"""

from __future__ import annotations

from enum import Enum

from rl_gym_actors import errors

_BY_ERROR: dict[type[BaseException], FailureKind] = {}


class Repeat(str, Enum):
    """Who repeats a failed idempotent call, if anyone."""

    NO = "no"  # repeating it as is will not help
    IN_CALL = "in_call"  # the call's retry decider repeats it at once, with backoff
    LATER = "later"  # the caller repeats the step later: the server must change first


class FailureKind(str, Enum):
    """The kind of a failure; see the module docstring. The value is the kind's code."""

    transport: bool
    repeat: Repeat
    _raised_by: tuple[type[BaseException], ...]

    def __new__(
        cls, code: str, transport: bool, repeat: Repeat, *raised_by: type[BaseException]
    ) -> FailureKind:
        member = str.__new__(cls, code)
        member._value_ = code
        member.transport = transport
        member.repeat = repeat
        member._raised_by = raised_by
        return member

    # name = (code, infrastructure?, who repeats it, the exceptions that raise it)
    LOST = ("connection_lost", True, Repeat.IN_CALL, errors.ConnectionLost, errors.GymUnavailable)
    SERVER_ERROR = ("server_error", True, Repeat.IN_CALL, errors.GymServerError)
    BUSY = ("too_many_connections", True, Repeat.IN_CALL, errors.ServerBusy)  # refused before
    # the request was read: nothing ran, so even /run (never retried otherwise) is sent again
    AGENT_FAILED = ("agent_failed", True, Repeat.NO, errors.AgentFailed)  # any 5xx to /run:
    # the rollout gives the row its next try (up to max_tries)
    DEADLINE = ("deadline_exceeded", True, Repeat.IN_CALL, errors.DeadlineExceeded, TimeoutError)
    ENDPOINT_DOWN = ("endpoint_down", True, Repeat.NO, errors.EndpointDown)  # not sent at all
    LEDGER_LOST = ("ledger_lost", True, Repeat.NO, errors.LedgerLost)
    ADMISSION_CLOSED = ("agent_admission_closed", True, Repeat.LATER, errors.AdmissionClosed)
    CONFLICT = (
        "checkpoint_conflict",
        True,
        Repeat.LATER,
        errors.CheckpointConflict,
        errors.InvalidPhase,
    )
    NOT_COMPLETED = ("not_completed", True, Repeat.LATER, errors.NotCompleted)
    STALE = ("stale_attempt", True, Repeat.NO, errors.StaleAttempt)
    DUPLICATE = ("duplicate_execution", True, Repeat.NO, errors.DuplicateExecution)
    UNKNOWN = ("unknown_execution", True, Repeat.NO, errors.UnknownExecution)
    ACTOR_DIED = ("actor_died", True, Repeat.NO)  # a rollout actor's process died
    POOL_CLOSED = ("pool_closed", True, Repeat.NO, errors.PoolClosed)
    ABANDONED = ("abandoned", True, Repeat.NO)  # the batch stopped early
    INTERNAL = ("internal_error", True, Repeat.NO)  # an unexpected exception (a bug)
    PROTOCOL = ("protocol_violation", False, Repeat.LATER, errors.ProtocolViolation)
    REJECTED = ("rejected", False, Repeat.NO, errors.GymRejected, errors.ConfigError)  # a 4xx
    AGENT_DATA = ("agent_data_failed", False, Repeat.NO, errors.AgentDataFailed)  # the agent
    # failed the row as data: terminal, never tried again
    INVALID_REPLY = ("invalid_reply", False, Repeat.NO)  # the reply cannot become a result
    FORGOTTEN = ("forgotten_rollout", False, Repeat.NO)  # sealed before, no longer remembered:
    # another try would seal it twice

    @property
    def may_pass(self) -> bool:
        """Whether repeating the same idempotent call (at once or later) may succeed."""
        return self.repeat is not Repeat.NO

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
