"""The command line: ``rl-gym-actors <command> ...``.

Each command registers itself in :data:`COMMANDS` with a function that adds its subparser; the
subparser sets ``func`` (called with the parsed args, returning the exit status). To add a command
(``status`` and ``ledger`` come from :mod:`rl_gym_actors.cli_observe`), write
``add_<name>(subparsers)`` and list it in ``COMMANDS``.

``rl-gym-actors gym serve`` runs a Gym agent server that takes part in checkpoints. Once it
accepts requests it prints exactly one JSON line on stdout::

    {"url": "http://127.0.0.1:PORT", "pid": 1234, "token_source": "flag"}

(``token_source`` is ``flag``, ``env`` or ``generated``; a generated token is printed in the line
as ``token``). SIGTERM and Ctrl-C shut it down cleanly with exit status 0.

``rl-gym-actors gym abort URL --checkpoint-id ID [--token T]`` aborts a checkpoint that holds a
Gym server (ours or a real one): it sends ``resume`` for that id and prints the answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sqlite3
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypedDict

from rl_gym_actors import cli_support
from rl_gym_actors.cli_support import CliError, Parser
from rl_gym_actors.errors import ConfigError

logger = logging.getLogger(__name__)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


DEFAULT_CHECKPOINT_LEASE_S = 60.0


# ---------------------------------------------------------------- gym serve


def add_gym(subparsers: argparse._SubParsersAction) -> None:
    from rl_gym_actors.gym.server import DEFAULT_MAX_BODY_BYTES, ConnectionLimits

    gym = subparsers.add_parser("gym", help="the Gym agent server side")
    gym_sub = gym.add_subparsers(dest="gym_command", required=True, metavar="{serve,abort}")
    serve = gym_sub.add_parser(
        "serve",
        help="serve a Gym agent that takes part in checkpoints",
        description="Serve /run and the checkpoint control plane (docs/PROTOCOL.md).",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    serve.add_argument(
        "--port",
        type=cli_support.port,
        default=0,
        help="port to bind, 0-65535 (default: 0, a free one, printed on the first line)",
    )
    serve.add_argument(
        "--agent",
        default="simulated",
        help="'simulated' (the default: reads reward, sleep_s, fail from each row), a Python "
        "'module:function', or an upstream agent's http(s):// /run URL",
    )
    serve.add_argument(
        "--state-dir",
        default=None,
        help="a directory (created if missing) for replies, receipts, ACK fences and "
        "tombstones (SQLite; with --protocol v2: kept replies, retired marks and committed "
        "answers); without it everything lives in memory",
    )
    serve.add_argument(
        "--token",
        default=None,
        help="control-plane bearer token (else $RL_GYM_CONTROL_TOKEN, else a "
        "random one printed once)",
    )
    serve.add_argument(
        "--allow-faults",
        action="store_true",
        help="honour the fault-injection row fields drop_reply and receipt_delay_s",
    )
    serve.add_argument(
        "--checkpoint-lease-s",
        type=cli_support.seconds_or_zero,
        default=DEFAULT_CHECKPOINT_LEASE_S,
        help="a checkpoint id holds admission until this many seconds past its "
        "deadline_ts with no further call for it; then the server aborts it "
        "(0: no lease; default: %(default)g)",
    )
    serve.add_argument(
        "--checkpoint-root",
        default=None,
        help="confine commit's checkpoint_dir to this directory (relative paths "
        "resolve inside it; anything else is refused with 422)",
    )
    serve.add_argument(
        "--protocol",
        default="agent",
        choices=["agent", "v2", "both"],
        help="checkpoint protocol: agent (/ng-control/v1/agent-checkpoint, ACK and receipts), "
        "v2 (NeMo Gym's /ng-control/v1/checkpoint: episodes, leases, retire/forget, restore), "
        "or both on one server (the v2 participant admits each /run in front of the "
        "agent-checkpoint one, which runs and keeps it)",
    )
    serve.add_argument(
        "--restart-only",
        action="store_true",
        help="(v2, both) an agent that cannot be checkpointed: its runs are reported as "
        "restarts on v2",
    )
    serve.add_argument(
        "--export-every-session",
        action="store_true",
        help="(v2) a commit exports every parked episode, whatever its scope names, as NeMo "
        "Gym's agent participant does (the scope limits only restored ones): on a shared "
        "server, each run's commit answer names the other runs' episodes too",
    )
    serve.add_argument(
        "--hide-restored-pending",
        action="store_true",
        help="(v2) the status does not list the restored episodes whose replacement has not "
        "started (restored_pending), as NeMo Gym's agent participant's status does not",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body taken (default: %(default)d)",
    )
    limits = ConnectionLimits()
    serve.add_argument(
        "--header-timeout-s",
        type=cli_support.seconds,
        default=limits.header_timeout_s,
        help="from a request's first byte, its headers must be in within this many seconds, "
        "else 408 request_header_timeout and the connection closes (default: %(default)g)",
    )
    serve.add_argument(
        "--body-timeout-s",
        type=cli_support.seconds,
        default=limits.body_timeout_s,
        help="from its headers, a request's whole body must be in within this many seconds, "
        "else 408 request_body_timeout (a request read in full has no timeout: a /run lasts "
        "as long as its agent works; default: %(default)g)",
    )
    serve.add_argument(
        "--idle-timeout-s",
        type=cli_support.seconds,
        default=limits.idle_timeout_s,
        help="a connection with no request under way is closed after this many seconds "
        "(default: %(default)g)",
    )
    serve.add_argument(
        "--max-connections",
        type=_positive_int,
        default=limits.max_connections,
        help="open connections taken; one more is answered 503 too_many_connections and closed "
        "(each rollout in flight holds one; default: %(default)d)",
    )
    serve.add_argument(
        "--name",
        default=None,
        help="the agent server's name: capabilities' name (NeMo RL matches a row's agent to "
        "it) and the instance a commit writes, under agent/instance-<sha256(name)>/ as a real "
        "Gym does (unset: 'rl_gym_actors', files in checkpoint_dir itself)",
    )
    serve.add_argument(
        "--http",
        default="auto",
        choices=["auto", "h11", "httptools"],
        help="HTTP implementation (auto: httptools when installed)",
    )
    serve.add_argument(
        "--loop",
        default="auto",
        choices=["auto", "asyncio", "uvloop"],
        help="event loop (auto: uvloop when installed)",
    )
    serve.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error", "critical"],
        help="server log level on stderr (default: %(default)s)",
    )
    serve.set_defaults(func=gym_serve)

    abort = gym_sub.add_parser(
        "abort",
        help="abort the checkpoint that holds a Gym server (resume its id)",
        description="Send resume for --checkpoint-id: admission reopens and the id is spent. "
        "Works against our server and a real NeMo Gym alike.",
    )
    abort.add_argument("url", help="the Gym server's base URL, e.g. http://127.0.0.1:8000")
    abort.add_argument(
        "--checkpoint-id", required=True, help="the id that holds the server (status shows it)"
    )
    cli_support.add_token(abort)
    cli_support.add_timeout(abort, "the server's answer")
    abort.set_defaults(func=gym_abort)


class ParticipantOptions(TypedDict):
    lease_s: float | None
    checkpoint_root: str | None
    name: str | None


def participant_options(args: argparse.Namespace) -> ParticipantOptions:
    """The Participant keyword arguments that ``gym serve`` flags set."""
    return {
        "lease_s": args.checkpoint_lease_s or None,
        "checkpoint_root": args.checkpoint_root,
        "name": args.name,
    }


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def warn_if_exposed(host: str) -> str | None:
    """A server bound beyond loopback: warn on stderr that ``/run`` and ``GET /metrics`` take
    no token (only the control plane does), so that whoever reaches the port can run the
    agent. Returns the warning (None on loopback)."""
    if host in LOOPBACK_HOSTS or host.startswith("127."):
        return None
    text = (
        f"warning: --host {host} serves beyond this machine: /run and GET /metrics take no "
        f"token (only /ng-control/ does), so anyone who reaches the port can run the agent; "
        f"keep it behind a firewall or a proxy that authenticates"
    )
    print(text, file=sys.stderr, flush=True)
    return text


def gym_serve(args: argparse.Namespace) -> int:
    from rl_gym_actors.gym.agent_checkpoint.participant import Participant
    from rl_gym_actors.gym.agent_checkpoint.routes import create_app
    from rl_gym_actors.gym.agents import make_agent
    from rl_gym_actors.gym.clock import fault_clock
    from rl_gym_actors.gym.connections import limits_from_args
    from rl_gym_actors.gym.server import GymServer, resolve_token
    from rl_gym_actors.gym.store import open_store
    from rl_gym_actors.gym.v2.participant import DEFAULT_LEASE_GRACE_S

    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    token, source = resolve_token(args.token)
    warn_if_exposed(args.host)
    if args.state_dir is not None:
        from rl_gym_actors.gym.state_lock import lock_state_dir

        usable_state_dir(args.state_dir)
        try:  # one server per state dir; held until this process exits
            args.state_lock = lock_state_dir(args.state_dir)
        except ConfigError as exc:
            raise CliError(f"{exc}: stop that server, or give another --state-dir") from None
        except OSError as exc:
            raise state_dir_error(args.state_dir, exc) from None
    if args.protocol == "v2":
        from rl_gym_actors.gym.v2.routes import v2_server_from_args

        try:
            server = v2_server_from_args(args, token)
        except ConfigError as exc:
            raise CliError(str(exc)) from None
        except (OSError, sqlite3.Error) as exc:
            raise state_dir_error(args.state_dir, exc) from None
        return _serve_until_stopped(server, token, source, args.loop)
    try:
        agent = make_agent(args.agent)
    except ConfigError as exc:
        raise CliError(f"--agent {args.agent}: {exc}") from None
    try:
        store = open_store(args.state_dir)
    except (OSError, sqlite3.Error) as exc:
        raise state_dir_error(args.state_dir, exc) from None
    try:
        clock = fault_clock(args.allow_faults, os.environ)  # test-only skew, with faults only
    except ValueError as exc:
        store.close()
        raise CliError(str(exc)) from None
    participant = Participant(agent, store, clock=clock, **participant_options(args))
    served: Any = participant
    app_factory: Any = create_app
    if args.protocol == "both":  # the v2 participant in front of this one (gym/both.py)
        from rl_gym_actors.gym import both

        try:
            served = both.both_participant(
                participant,
                lease_grace_s=args.checkpoint_lease_s or DEFAULT_LEASE_GRACE_S,
                restart_only=args.restart_only,
                state_dir=args.state_dir,
            )
        except (OSError, sqlite3.Error) as exc:
            store.close()
            print(f"rl-gym-actors gym serve: {exc}", file=sys.stderr)
            return 2
        app_factory = both.create_app
    extensions = []
    if args.allow_faults:
        from rl_gym_actors.gym.agent_checkpoint.faults import FaultInjector, fault_injection

        extensions.append(fault_injection(FaultInjector(), participant.knows))
    try:
        server = GymServer(
            served,
            token=token,
            app_factory=app_factory,
            host=args.host,
            port=args.port,
            max_body_bytes=args.max_body_bytes,
            extensions=extensions,
            log_level=args.log_level,
            handle_signals=True,
            http=args.http,
            clock=clock,
            limits=limits_from_args(args),
        )
    except OSError as exc:
        store.close()
        raise CliError(
            f"cannot bind {args.host}:{args.port}: {exc.strerror or exc}: pick another --port "
            f"(0: a free one) or --host"
        ) from None

    return _serve_until_stopped(server, token, source, args.loop)


def usable_state_dir(path: str) -> None:
    """Raise a CliError naming the fix unless ``path`` is (or can become) a writable directory."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        raise CliError(
            f"--state-dir {path} is a file, not a directory: give a directory (created if missing)"
        )
    try:
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=target):
            pass
    except OSError as exc:
        raise state_dir_error(path, exc) from None


def state_dir_error(path: str, exc: BaseException) -> CliError:
    reason = getattr(exc, "strerror", None) or cli_support.one_line(exc)
    return CliError(
        f"--state-dir {path} is not usable ({reason}): give a directory this user can write, "
        f"or leave --state-dir out to keep the state in memory"
    )


def _serve_until_stopped(server: Any, token: str, source: str, loop: str) -> int:
    from rl_gym_actors.gym.server import run_event_loop

    def ready() -> None:
        line = {"url": server.url, "pid": os.getpid(), "token_source": source}
        if source == "generated":
            line["token"] = token
        print(json.dumps(line), flush=True)

    run_event_loop(server.serve(on_ready=ready), loop)
    return 0


def gym_abort(args: argparse.Namespace) -> int:
    import time

    from rl_gym_actors.errors import RlGymError
    from rl_gym_actors.gym.agent_checkpoint.client import GymClient

    endpoint = cli_support.endpoint(args.url, args.token)

    from rl_gym_actors.gym.v2.client import V2Client
    from rl_gym_actors.gym.v2.discover import CheckpointProtocol, discover_protocol

    async def abort() -> dict:
        deadline_ts = time.time() + args.timeout_s
        async with GymClient(endpoint) as client:
            found = await discover_protocol(client, deadline_ts=deadline_ts)
            # on v2, resume (after prepare) and abort are the same call too
            resume = (
                V2Client(client).resume
                if found.protocol is CheckpointProtocol.V2
                else client.resume
            )
            if found.protocol is CheckpointProtocol.V2 and found.status is not None:
                _check_holds(args.checkpoint_id, found.status.checkpoint_id, endpoint.url)
            else:
                from rl_gym_actors.observe import STATUS_CHECKPOINT_ID

                # the token first (capabilities take none): a wrong one is named as such
                await client.status(STATUS_CHECKPOINT_ID, deadline_ts=deadline_ts)
                caps = await client.capabilities(deadline_ts=deadline_ts)
                if caps is not None:  # (a server without capabilities: resumed as asked)
                    _check_holds(args.checkpoint_id, caps.active_checkpoint_id, endpoint.url)
            answer = await resume(args.checkpoint_id, deadline_ts=deadline_ts)
        return answer.model_dump(mode="json", exclude_none=True)

    try:
        answer = asyncio.run(abort())
    except RlGymError as exc:
        raise cli_support.gym_failure(exc, endpoint.url, args.timeout_s) from None
    print(json.dumps({"checkpoint_id": args.checkpoint_id, "url": endpoint.url, **answer}))
    return 0


class CheckpointNotHeld(cli_support.CliError):
    """``gym abort --checkpoint-id ID`` for a checkpoint that does not hold the server (a
    mistyped id, or one already resumed): nothing is sent, so the id is not spent. Exit 2."""


def _check_holds(asked: str, holding: str | None, url: str) -> None:
    """Refuse to resume ``asked`` on a server that says ``holding`` holds it instead (resume
    spends any id it is given: a mistyped one would be spent and the real one left holding)."""
    if holding == asked:
        return
    now = f"{holding} does (gym abort --checkpoint-id {holding})" if holding else "none does"
    raise CheckpointNotHeld(
        f"checkpoint_not_held: checkpoint {asked} does not hold {url}, {now}; nothing was "
        f"resumed and {asked} is not spent"
    )


# ---------------------------------------------------------------- the entry point


def add_observe(subparsers: argparse._SubParsersAction) -> None:
    from rl_gym_actors.cli_observe import add_commands

    add_commands(subparsers)  # status, ledger


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [add_gym, add_observe]


def build_parser() -> argparse.ArgumentParser:
    from rl_gym_actors import __version__

    parser = Parser(
        prog="rl-gym-actors",
        description="Keep RL training on Ray from losing track of Gym environment work.",
        epilog=cli_support.EXIT_CODES_HELP,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every failure ends as one line on stderr and an exit code
    (:mod:`rl_gym_actors.cli_support`)."""
    args = build_parser().parse_args(argv)
    name = " ".join(
        filter(None, ["rl-gym-actors", args.command, getattr(args, "gym_command", None)])
    )
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()
        return code
    except KeyboardInterrupt:
        return cli_support.EXIT_INTERRUPTED
    except BrokenPipeError:
        cli_support.quiet_closed_stdout()
        return cli_support.EXIT_OK
    except CliError as exc:
        cli_support.print_debug(exc)
        print(f"{name}: {exc}", file=sys.stderr)
        return exc.code
    except Exception as exc:
        if cli_support.debugging():
            raise
        print(
            f"{name}: unexpected {type(exc).__name__}: {cli_support.one_line(exc)} "
            f"(set {cli_support.DEBUG_ENV}=1 for the traceback)",
            file=sys.stderr,
        )
        return cli_support.EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main())
