"""What every ``rl-gym-actors`` command shares: exit codes, one-line errors, flag types.

Exit codes, the same for every command (``rl-gym-actors --help`` lists them):

- 0: done;
- 1: the other side did not answer in time (a Gym server, a Ray cluster);
- 2: refused or bad input: a flag's value, a URL, a missing or wrong token, a spent or
  conflicting checkpoint id, a state dir that cannot be used, a port that cannot be bound;
- 130: interrupted (Ctrl-C).

Every error is one line on stderr, ``rl-gym-actors <command>: <what went wrong>: <the fix>``,
never a traceback (``RLGA_DEBUG=1`` shows one). A command raises :class:`CliError`; ``main``
prints it. A closed stdout (``... | head -3``) ends the output quietly.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn, TextIO

from rl_gym_actors.config import TOKEN_ENV, GymEndpoint
from rl_gym_actors.errors import (
    CheckpointConflict,
    ConfigError,
    DeadlineExceeded,
    GymError,
    GymUnavailable,
    RlGymError,
    StaleCheckpoint,
    Unauthorized,
)

EXIT_OK = 0
EXIT_NO_ANSWER = 1
EXIT_REFUSED = 2
EXIT_INTERRUPTED = 130
DEBUG_ENV = "RLGA_DEBUG"
DEFAULT_TIMEOUT_S = 10.0

EXIT_CODES_HELP = (
    "exit codes (every command): 0 done; 1 no answer in time (a Gym server, a Ray cluster); "
    "2 refused or bad input (a flag, a URL, a token, a checkpoint id, a state dir, a port); "
    "130 interrupted. Errors are one line on stderr (RLGA_DEBUG=1: with a traceback)."
)
NO_TOKEN = f"no control-plane token: pass --token T or set ${TOKEN_ENV}"


class CliError(Exception):
    """One line for the user and the exit code it ends with."""

    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(one_line(message))
        self.code = code


def one_line(text: object) -> str:
    """``text`` on one line (pydantic and server errors carry newlines)."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line naming ``--help`` (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_REFUSED, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")


# ---------------------------------------------------------------- flag types


def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be 0-65535 (0: a free one), got {value}")
    return value


def count(text: str) -> int:
    """A whole number >= 0 (``status --limit``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def seconds(text: str) -> float:
    return _seconds(text, zero=False)


def seconds_or_zero(text: str) -> float:
    """Seconds where 0 means none (``--checkpoint-lease-s 0``: no lease)."""
    return _seconds(text, zero=True)


def _seconds(text: str, *, zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (value >= 0 if zero else value > 0) or value == float("inf"):
        bound = ">= 0" if zero else "> 0"
        raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
    return value


def add_timeout(parser: argparse.ArgumentParser, what: str) -> None:
    """``--timeout-s S`` (and the older ``--timeout``, hidden) on every command that waits."""
    parser.add_argument(
        "--timeout-s",
        dest="timeout_s",
        type=seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"seconds to wait for {what} (default: %(default)g)",
    )
    parser.add_argument(
        "--timeout",
        dest="timeout_s",
        type=seconds,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )


def add_token(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--token",
        default=None,
        help=f"the Gym server's control-plane bearer token (default: ${TOKEN_ENV})",
    )


def endpoint(url: str, token: str | None, *, need_token: bool = True) -> GymEndpoint:
    """The endpoint a command talks to, or a CliError saying what to fix."""
    token = token or os.environ.get(TOKEN_ENV) or None
    try:
        ep = GymEndpoint(url=url, token=token)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    if need_token and not token:
        raise CliError(NO_TOKEN)
    return ep


def gym_failure(exc: RlGymError, url: str, timeout_s: float) -> CliError:
    """A Gym call's typed failure as one line with its fix and exit code."""
    if isinstance(exc, DeadlineExceeded):
        return CliError(
            f"{url} did not answer within {timeout_s:g}s ({root_cause(exc)}): is "
            f"`rl-gym-actors gym serve` running there? (--timeout-s to wait longer)",
            EXIT_NO_ANSWER,
        )
    if isinstance(exc, GymUnavailable):  # refused, reset, down: it answered nothing at all
        return CliError(
            f"{url} could not be reached ({root_cause(exc)}): is `rl-gym-actors gym serve` "
            f"running there, on that host and port?",
            EXIT_NO_ANSWER,
        )
    if isinstance(exc, Unauthorized):
        return CliError(
            f"{url} refused the control-plane token (401 unauthorized): pass the token the "
            f"server was started with (--token T or ${TOKEN_ENV})"
        )
    if isinstance(exc, CheckpointConflict):
        held = exc.active_checkpoint_id or "another checkpoint"
        return CliError(
            f"{url}: checkpoint {held} holds the server: wait for it, or free it with "
            f"`rl-gym-actors gym abort {url} --checkpoint-id {held}`"
        )
    if isinstance(exc, StaleCheckpoint):
        return CliError(f"{url}: the checkpoint id is spent (stale_checkpoint): use a new id")
    if isinstance(exc, GymError):
        return CliError(f"{url} refused: {_short(exc)}")
    if isinstance(exc, ConfigError):
        return CliError(str(exc))
    return CliError(f"{url}: {type(exc).__name__}: {_short(exc)}")


def root_cause(exc: BaseException) -> str:
    """The innermost exception of ``exc``'s cause chain as ``Type: text``, in full (one line):
    the error that says why, e.g. aiohttp's ``ClientConnectorError: Cannot connect to host
    127.0.0.1:1 ...`` under a ``ConnectionLost``."""
    seen: set[int] = set()
    inner = exc
    while inner.__cause__ is not None and id(inner.__cause__) not in seen:
        seen.add(id(inner))
        inner = inner.__cause__
    text = one_line(inner)
    if inner is not exc:
        text = f"{type(exc).__name__}: {one_line(exc)}; cause {type(inner).__name__}: {text}"
    else:
        text = f"{type(exc).__name__}: {text}"
    return text


def print_debug(exc: BaseException, err: TextIO | None = None) -> None:
    """With ``RLGA_DEBUG=1``: the traceback of what a one-line error stands for (the error it
    was raised from, or while handling), on ``err`` (stderr)."""
    if not debugging():
        return
    import traceback

    original = exc.__cause__ or exc.__context__ or exc
    traceback.print_exception(original, file=err or sys.stderr)


def _short(exc: BaseException, limit: int = 120) -> str:
    text = one_line(exc) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def quiet_closed_stdout() -> None:
    """stdout's reader went away (``| head``): send what is left to /dev/null, so that the
    interpreter's last flush does not complain either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
