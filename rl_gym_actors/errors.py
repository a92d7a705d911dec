"""One tree of typed errors, sorted by what the caller should do next.

::

    RlGymError
    ├── ConfigError                 bad input on the Python side: fix the call
    ├── GymError                    a Gym server answered with an error (status, code, detail)
    │   ├── GymRejected             will not succeed if repeated as is
    │   │   ├── StaleAttempt            stale_attempt: the key is ACKed or tombstoned
    │   │   ├── DuplicateExecution      duplicate_execution: the key is running or parked
    │   │   ├── AckRejected             completed_execution_acknowledgement_error
    │   │   ├── NotCompleted            not_completed (receipt of a running key)
    │   │   ├── UnknownExecution        unknown_execution
    │   │   ├── CheckpointConflict      checkpoint_conflict
    │   │   ├── StaleCheckpoint         stale_checkpoint
    │   │   ├── CheckpointNotReady      a commit before a ready prepare
    │   │   ├── Unauthorized            unauthorized
    │   │   ├── InvalidRequest          invalid_request (422) or any other 4xx
    │   │   │   └── RolloutIdRequired       (v2) rollout_id_required (400)
    │   │   ├── InvalidPhase            (v2) invalid_phase: not allowed in the phase
    │   │   ├── RestartInScope          (v2) restart_in_scope: a commit named a restart
    │   │   ├── CheckpointDeadlinePassed (v2) deadline_exceeded: the server saw deadline_ts pass
    │   │   ├── CheckpointStateInvalid  (v2) invalid_checkpoint_state (422): files bad or foreign
    │   │   ├── CheckpointRejected      (v2) checkpoint_error: the base code
    │   │   ├── AgentFailed             agent_failed, or any 5xx to /run: the agent or its server
    │   │   │                           failed, not the row (status and the body's text kept)
    │   │   └── AgentDataFailed         (422) agent_data_failed: the agent failed the row as data
    │   ├── AdmissionClosed         agent_admission_closed, (v2) admission_closed: wait for
    │   │                           resume, then try again
    │   ├── ServerBusy              too_many_connections (503): refused before the request was
    │   │                           read, nothing ran: any call may be sent again, /run too
    │   └── GymServerError          a 5xx with a JSON error body whose code is no known rejection
    ├── GymUnavailable              no usable answer: safe to repeat only if the call is idempotent
    │   ├── ConnectionLost              refused, reset, closed without a response, plain 5xx
    │   ├── DeadlineExceeded            the absolute deadline passed (also a TimeoutError)
    │   └── EndpointDown                marked down after consecutive failures; not sent at all
    ├── ProtocolViolation           an answer that breaks the contract (digest mismatch, bad body)
    ├── CheckpointFailed            the checkpoint gate gave up; ``blockers`` says on what
    │   └── GymStateLost                a Gym server lost sealed results it held (``lost``)
    ├── LedgerLost                  the ledger actor is gone and Ray could not bring it back
    ├── IllegalTransition           a state machine got an event its table has no entry for (a bug)
    ├── EndpointCheckFailed         start(): an endpoint is down or refuses our token
    ├── PoolClosed                  the orchestrator or its pool was shut down
    ├── AgentDataError              an agent raises it: the row is bad (terminal, never retried)
    ├── AgentTransientError         an agent raises it: not the row's fault (tried again)
    └── RayStartFailed              a local Ray did not come up within its tries

Every error pickles with all its fields (Ray re-raises errors in the caller), and every error
that comes from a foreign library is raised ``from`` it at the boundary.
"""

from __future__ import annotations

from typing import Any


def _rebuild(cls: type[RlGymError], message: str, fields: dict[str, Any]) -> RlGymError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(fields)
    return err


class RlGymError(Exception):
    """Base of every error this library raises."""

    def __reduce__(self):  # keep every field across pickling (Ray re-raises in the caller)
        return (_rebuild, (type(self), str(self), dict(self.__dict__)))


class ConfigError(RlGymError, ValueError):
    """A bad argument or setting on the Python side."""


class GymError(RlGymError):
    """A Gym server answered with an error body ``{"error": {"code", "detail"}}``."""

    code: str = "gym_error"

    def __init__(
        self,
        detail: str = "",
        *,
        status: int = 0,
        code: str | None = None,
        url: str = "",
        body: Any = None,
    ) -> None:
        self.status = status
        self.code = code or type(self).code
        self.detail = detail
        self.url = url
        self.body = body
        super().__init__(f"{self.code} ({status}) {url}: {detail}".strip())


class GymRejected(GymError):
    """The server refused the call; repeating it unchanged will not help."""


class StaleAttempt(GymRejected):
    code = "stale_attempt"


class DuplicateExecution(GymRejected):
    code = "duplicate_execution"


class AckRejected(GymRejected):
    code = "completed_execution_acknowledgement_error"


class NotCompleted(GymRejected):
    code = "not_completed"


class UnknownExecution(GymRejected):
    code = "unknown_execution"


class CheckpointConflict(GymRejected):
    """Another checkpoint id holds the server. ``active_checkpoint_id`` names it when the server
    said (None when it did not): resume it (``Orchestrator.abort_checkpoint``) to free the
    server."""

    code = "checkpoint_conflict"

    def __init__(
        self,
        detail: str = "",
        *,
        status: int = 0,
        code: str | None = None,
        url: str = "",
        body: Any = None,
        active_checkpoint_id: str | None = None,
    ) -> None:
        if active_checkpoint_id is None and isinstance(body, dict):
            inner = body.get("error")
            for place in (body, inner if isinstance(inner, dict) else {}):
                named = place.get("active_checkpoint_id")
                if isinstance(named, str) and named:
                    active_checkpoint_id = named
                    break
        self.active_checkpoint_id = active_checkpoint_id
        super().__init__(detail, status=status, code=code, url=url, body=body)


class StaleCheckpoint(GymRejected):
    code = "stale_checkpoint"


class CheckpointNotReady(GymRejected):
    code = "checkpoint_not_prepared"


class Unauthorized(GymRejected):
    code = "unauthorized"


class InvalidRequest(GymRejected):
    code = "invalid_request"


class AgentFailed(GymRejected):
    """``/run`` answered ``agent_failed`` or any 5xx: the agent or its server failed. ``status``
    and ``detail`` (the error text) say how; the key did not complete."""

    code = "agent_failed"


class AgentDataFailed(GymRejected):
    """``/run`` answered 422 ``agent_data_failed``: the agent failed the row as data (it raised
    :class:`AgentDataError`, or an exception that is no infrastructure failure). Repeating the
    row fails the same way, so it is not tried again; ``detail`` is the agent's error text."""

    code = "agent_data_failed"


class AdmissionClosed(GymError):
    """Admission is closed between prepare and resume: wait for resume and try again."""

    code = "agent_admission_closed"


class RolloutIdRequired(InvalidRequest):
    """(v2) Agent work without a rollout id, which a checkpoint could not record or retire."""

    code = "rollout_id_required"


class InvalidPhase(GymRejected):
    """(v2) The operation is not allowed in the participant's phase (resume first, or prepare)."""

    code = "invalid_phase"


class RestartInScope(GymRejected):
    """(v2) A commit's scope named an episode the participant reported as a restart."""

    code = "restart_in_scope"


class CheckpointDeadlinePassed(GymRejected):
    """(v2) The server found the request's ``deadline_ts`` passed (before or during its I/O)."""

    code = "deadline_exceeded"


class CheckpointStateInvalid(GymRejected):
    """(v2) A participant's checkpoint files are missing, corrupt, or another checkpoint's."""

    code = "invalid_checkpoint_state"


class CheckpointRejected(GymRejected):
    """(v2) A checkpoint rejection with the base code ``checkpoint_error``."""

    code = "checkpoint_error"


class ServerBusy(GymError):
    """503 ``too_many_connections``: the server holds as many connections as it takes and
    refused this one before reading its request, so nothing ran (not the agent, not a control
    step). Infrastructure, not the row: any call may be sent again, a ``/run`` with the same key
    too; the clients do so within the call's deadline."""

    code = "too_many_connections"


class GymServerError(GymError):
    """The server failed (5xx) and said so in a JSON error body with a code that is no known
    rejection. Like a lost answer: an idempotent call may be repeated."""

    code = "server_error"


class GymUnavailable(RlGymError):
    """No usable answer came back. Safe to repeat only when the call is idempotent."""

    def __init__(self, detail: str = "", *, url: str = "") -> None:
        self.detail = detail
        self.url = url
        super().__init__(f"{url}: {detail}" if url else detail)


class ConnectionLost(GymUnavailable):
    """Refused, reset, or closed without a response; or a plain (non-JSON) 5xx."""


class DeadlineExceeded(GymUnavailable, TimeoutError):
    """The call's absolute deadline passed before an answer came."""


class EndpointDown(GymUnavailable):
    """The endpoint failed several calls in a row (refused, or no answer) and is marked down
    until a background probe reaches it again; the call was not sent. ``cause`` is the last
    failure as its type and message (``cause_type``, ``cause``)."""

    def __init__(
        self, detail: str = "", *, url: str = "", cause: str = "", cause_type: str = ""
    ) -> None:
        self.cause = cause
        self.cause_type = cause_type
        super().__init__(detail, url=url)


class ProtocolViolation(RlGymError):
    """An answer that breaks the wire contract (a digest that does not match, a malformed body)."""


class CheckpointFailed(RlGymError):
    """The checkpoint gate gave up. ``blockers`` lists what was still in the way, per endpoint;
    the message ends with what they say (:func:`blockers_cause`), so that a checkpoint that ran
    out of time names why (another run's held results, a checkpoint holding the server).

    ``released``: how many results Gym let go of for this checkpoint before it failed (ACKed
    in the gate's release; 0 when it failed before that). Each of them is in the layer's part
    under ``restore_from`` (the checkpoint's dir; None when its part was never written): that
    dir is a valid restore source, and after a failure that released anything the only one
    that holds those results, so a restarting trainer must restore from it (or a later one),
    never from an earlier one. :attr:`released_any` says whether it did."""

    def __init__(
        self,
        message: str,
        *,
        checkpoint_id: str = "",
        blockers: dict[str, Any] | None = None,
        released: int = 0,
        restore_from: str | None = None,
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.blockers = blockers or {}
        self.released = released
        self.restore_from = restore_from
        cause = blockers_cause(self.blockers)
        super().__init__(f"{message}; in the way: {cause}" if cause else message)

    @property
    def released_any(self) -> bool:
        return self.released > 0


def blockers_cause(blockers: dict[str, Any]) -> str:
    """One line of what ``CheckpointFailed.blockers`` says stood in the way, per endpoint: the
    checkpoint holding it, the attempts running or completed un-ACKed there, how many of them
    another run's, and the way out for those."""
    parts: list[str] = []
    foreign_seen = False
    for label, entry in blockers.items():
        if not isinstance(entry, dict):
            continue
        said: list[str] = []
        held_by = entry.get("active_checkpoint_id")
        if held_by:
            said.append(f"checkpoint {held_by} holds the server")
        attempts = [a for a in entry.get("attempts") or [] if isinstance(a, dict)]
        if attempts:
            states: dict[str, int] = {}
            for a in attempts:
                state = str(a.get("state", "?"))
                states[state] = states.get(state, 0) + 1
            foreign = sum(1 for a in attempts if a.get("foreign"))
            foreign_seen = foreign_seen or foreign > 0
            by_state = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
            whose = f", {foreign} of them another run's" if foreign else ""
            said.append(f"{len(attempts)} attempts ({by_state}{whose})")
        if said:
            parts.append(f"{label}: " + " and ".join(said))
    if not parts:
        return ""
    text = "; ".join(parts)
    if foreign_seen:
        text += (
            " (another run's results are released by its own checkpoint; a run that used "
            "ack='on_seal' holds none; checkpoint(..., sweep_foreign=True) clears those of a "
            "run that is gone)"
        )
    return text


class GymStateLost(CheckpointFailed):
    """A Gym server no longer holds sealed results the ledger's book has as completed and
    un-ACKed there (restarted on an empty or other state dir, or without one): ``lost`` maps
    each such endpoint to how many. Nothing was ACKed or committed; the results are the
    trainer's (handed out, and in the checkpoint's part), and the book counts them settled, so
    the next checkpoint can commit. ``epochs`` maps each endpoint whose (ext) store epoch
    changed (it forgot what it held, even if nothing was held) to ``(before, after)``."""

    def __init__(
        self,
        message: str,
        *,
        checkpoint_id: str = "",
        blockers: dict[str, Any] | None = None,
        lost: dict[str, int] | None = None,
        epochs: dict[str, tuple[str, str]] | None = None,
        released: int = 0,
        restore_from: str | None = None,
    ) -> None:
        self.lost = lost or {}
        self.epochs = epochs or {}
        super().__init__(
            message,
            checkpoint_id=checkpoint_id,
            blockers=blockers,
            released=released,
            restore_from=restore_from,
        )


class LedgerLost(RlGymError):
    """The ledger actor died and Ray did not restart it (restarts used up, or no answer in
    time). ``cause`` names what the caller saw. A new Orchestrator is the way back."""

    def __init__(self, message: str, *, cause: str = "") -> None:
        self.cause = cause
        super().__init__(message)


class IllegalTransition(RlGymError):
    """A state machine got an event that its transition table has no entry for: a bug in the
    caller, never worth repeating. ``state`` and ``event`` name the pair (``phase`` is
    ``state`` for the machines whose states are called phases)."""

    def __init__(self, message: str, *, state: str = "", event: str = "") -> None:
        self.state = state
        self.event = event
        super().__init__(message)

    @property
    def phase(self) -> str:
        return self.state


class EndpointCheckFailed(RlGymError):
    """``Orchestrator.start()`` found a Gym endpoint down, refusing the control token, or
    answering no status. ``endpoint`` is its URL; ``error`` the name of the error it gave."""

    def __init__(self, message: str, *, endpoint: str = "", error: str = "") -> None:
        self.endpoint = endpoint
        self.error = error
        super().__init__(message)


class PoolClosed(RlGymError):
    """The orchestrator or its actor pool is shut down."""


class AgentDataError(RlGymError):
    """Raised by an agent: this row cannot be rolled out (a bad prompt, a task that does not
    parse). The server answers 422 ``agent_data_failed``; the row fails at once with
    ``failure.is_data`` and is never tried again. The message is the reason the trainer sees."""


class AgentTransientError(RlGymError):
    """Raised by an agent: this try failed for a reason that is not the row's (a model server
    that did not answer, a sandbox that did not start). The server answers 500 ``agent_failed``;
    the rollout tries the row again (``TryPolicy.max_tries``), then fails it with
    ``failure.is_transport``."""


class RayStartFailed(RlGymError):
    """A local Ray did not come up in ``tries`` starts (Ray gives its raylet a fixed 30 s to
    register, which a machine loaded by other work can miss). Each failed start's processes were
    stopped; the last start's error is the ``__cause__``."""

    def __init__(self, message: str, *, tries: int) -> None:
        super().__init__(message)
        self.tries = tries


# code on the wire -> the exception class a client raises for it
ERROR_BY_CODE: dict[str, type[GymError]] = {
    cls.code: cls
    for cls in (
        StaleAttempt,
        DuplicateExecution,
        AckRejected,
        NotCompleted,
        UnknownExecution,
        CheckpointConflict,
        StaleCheckpoint,
        CheckpointNotReady,
        Unauthorized,
        InvalidRequest,
        AgentFailed,
        AgentDataFailed,
        AdmissionClosed,
        ServerBusy,
        RolloutIdRequired,
        InvalidPhase,
        RestartInScope,
        CheckpointDeadlinePassed,
        CheckpointStateInvalid,
        CheckpointRejected,
    )
}
ERROR_BY_CODE["admission_closed"] = AdmissionClosed  # v2's name for agent_admission_closed


def gym_error(
    status: int, code: str | None, detail: str = "", *, url: str = "", body: Any = None
) -> GymError:
    """The typed error for an error answer. Unknown codes map by status."""
    cls = ERROR_BY_CODE.get(code or "")
    if cls is None:
        if status == 401:
            cls = Unauthorized
        elif status in (400, 404, 413, 415, 422):
            cls = InvalidRequest
        elif status >= 500:
            cls = GymServerError
        else:
            cls = GymRejected
    return cls(detail, status=status, code=code or cls.code, url=url, body=body)
