"""The command line: ``rl-gym-actors <command> ...``.

Each command registers itself in :data:`COMMANDS` with a function that adds its subparser; the
subparser sets ``func`` (called with the parsed args, returning the exit status). To add a command
(``status`` and ``ledger`` come from :mod:`rl_gym_actors.observe`), write ``add_<name>(subparsers)``
and list it in ``COMMANDS``.

``rl-gym-actors gym serve`` runs a Gym agent server that takes part in checkpoints. Once it
accepts requests it prints exactly one JSON line on stdout::

    {"url": "http://127.0.0.1:PORT", "pid": 1234, "token_source": "flag"}

(``token_source`` is ``flag``, ``env`` or ``generated``; a generated token is printed in the line
as ``token``). SIGTERM and Ctrl-C shut it down cleanly with exit status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence

from rl_gym_actors.errors import ConfigError

logger = logging.getLogger(__name__)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


# ---------------------------------------------------------------- gym serve

def add_gym(subparsers: argparse._SubParsersAction) -> None:
    from rl_gym_actors.gym.server import DEFAULT_MAX_BODY_BYTES

    gym = subparsers.add_parser("gym", help="the Gym agent server side")
    gym_sub = gym.add_subparsers(dest="gym_command", required=True, metavar="{serve}")
    serve = gym_sub.add_parser(
        "serve", help="serve a Gym agent that takes part in checkpoints",
        description="Serve /run and the checkpoint control plane (PROTOCOL.md).")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=0, help="0 (the default) picks a free port")
    serve.add_argument("--agent", default="simulated",
                       help="'simulated', a Python 'module:function', or an upstream agent's "
                            "http(s):// /run URL")
    serve.add_argument("--state-dir", default=None,
                       help="keep replies, receipts, ACK fences and tombstones here (SQLite); "
                            "without it everything lives in memory")
    serve.add_argument("--token", default=None,
                       help="control-plane bearer token (else $RL_GYM_CONTROL_TOKEN, else a "
                            "random one printed once)")
    serve.add_argument("--allow-faults", action="store_true",
                       help="honour the fault-injection row fields drop_reply and receipt_delay_s")
    serve.add_argument("--max-body-bytes", type=_positive_int, default=DEFAULT_MAX_BODY_BYTES)
    serve.add_argument("--log-level", default="warning",
                       choices=["debug", "info", "warning", "error", "critical"])
    serve.set_defaults(func=gym_serve)


def gym_serve(args: argparse.Namespace) -> int:
    from rl_gym_actors.gym.agents import make_agent
    from rl_gym_actors.gym.participant import Participant
    from rl_gym_actors.gym.server import GymServer, resolve_token
    from rl_gym_actors.gym.store import open_store

    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token, source = resolve_token(args.token)
    faults = None
    if args.allow_faults:
        from rl_gym_actors.testing.faults import FaultInjector

        faults = FaultInjector()
    try:
        agent = make_agent(args.agent)
        store = open_store(args.state_dir)
    except (ConfigError, OSError) as exc:
        print(f"rl-gym-actors gym serve: {exc}", file=sys.stderr)
        return 2
    participant = Participant(agent, store)
    try:
        server = GymServer(participant, token=token, host=args.host, port=args.port,
                           max_body_bytes=args.max_body_bytes, faults=faults,
                           log_level=args.log_level, handle_signals=True)
    except OSError as exc:
        store.close()
        print(f"rl-gym-actors gym serve: cannot bind {args.host}:{args.port}: {exc}",
              file=sys.stderr)
        return 2

    def ready() -> None:
        line = {"url": server.url, "pid": os.getpid(), "token_source": source}
        if source == "generated":
            line["token"] = token
        print(json.dumps(line), flush=True)

    asyncio.run(server.serve(on_ready=ready))
    return 0


# ---------------------------------------------------------------- the entry point

def add_observe(subparsers: argparse._SubParsersAction) -> None:
    from rl_gym_actors.observe import add_commands

    add_commands(subparsers)          # status, ledger


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [add_gym, add_observe]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rl-gym-actors",
        description="Keep RL training on Ray from losing track of Gym environment work.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
