"""The ``status`` and ``ledger`` commands (``cli.py`` registers them with :func:`add_commands`).

- ``rl-gym-actors status URL [--token T] [--checkpoint-id C] [--json]``: the server's status
  object as a readable table (or its JSON), with the checkpoint holding the server, if any; on
  either protocol (a v2-only server answers its v2 status).
- ``rl-gym-actors ledger [--address ADDR] [--json]``: attaches to the running Ray cluster at
  ``ADDR`` (else ``$RAY_ADDRESS``; with neither it refuses, exit 2, never picking one), finds
  every ledger actor (named ``rlga-ledger-<id>`` in namespace ``rl_gym_actors``) and prints its
  snapshot.

Exit codes and error lines are every command's (:mod:`rl_gym_actors.cli_support`): 0 done, 1 no
answer in time (ledger: no ledger answered), 2 refused or bad input. What is fetched and how it
is drawn is :mod:`rl_gym_actors.observe`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any, TextIO

from rl_gym_actors import cli_support
from rl_gym_actors.actors.runtime import RAY_NAMESPACE
from rl_gym_actors.cli_support import CliError
from rl_gym_actors.core.attempt_book import LedgerSnapshot
from rl_gym_actors.errors import RlGymError
from rl_gym_actors.observe import (
    STATUS_CHECKPOINT_ID,
    V2StatusAnswer,
    fetch_any_status,
    fetch_ledgers,
    snapshot_table,
    status_table,
    v2_status_table,
)


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register ``status`` and ``ledger``; each sets ``func`` to its entry point."""
    p = subparsers.add_parser(
        "status",
        help="print a Gym server's checkpoint status",
        description="A Gym server's checkpoint status: counts, the checkpoint holding it (if "
        "any) and the attempts in a checkpoint's way. " + cli_support.EXIT_CODES_HELP,
    )
    p.add_argument("url", help="the Gym server's base URL, e.g. http://127.0.0.1:8000")
    cli_support.add_token(p)
    p.add_argument(
        "--checkpoint-id",
        default=STATUS_CHECKPOINT_ID,
        help="checkpoint id to ask the status for (any id not yet spent; default: %(default)s)",
    )
    cli_support.add_timeout(p, "an answer")
    p.add_argument(
        "--limit",
        type=cli_support.count,
        default=20,
        help="attempts listed at most, >= 0 (default: %(default)d)",
    )
    p.add_argument("--json", action="store_true", help="print the status object as JSON")
    p.set_defaults(func=status_command)

    p = subparsers.add_parser(
        "ledger",
        help="print the ledgers' snapshots of a running Ray cluster",
        description="Attach to a running Ray cluster and print every rl_gym_actors ledger's "
        "book. Ray's token: $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token. "
        + cli_support.EXIT_CODES_HELP,
    )
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster address, host:port of its GCS (default: $RAY_ADDRESS; one of the "
        "two is needed: the Ray this machine runs may be another user's)",
    )
    cli_support.add_timeout(p, "the cluster and each ledger")
    p.add_argument("--json", action="store_true", help="print the snapshots as JSON")
    p.set_defaults(func=ledger_command)


def _reported(name: str, run: Any) -> Any:
    """Run a command body with ``(args, out, err)``; a CliError becomes its one line on ``err``
    and its exit code (so that the commands can be called in-process, as the tests do)."""

    def command(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None):
        err = err or sys.stderr
        try:
            return run(args, out or sys.stdout)
        except CliError as exc:
            cli_support.print_debug(exc, err)
            print(f"rl-gym-actors {name}: {exc}", file=err)
            return exc.code

    command.__doc__ = run.__doc__
    return command


def _status(args: argparse.Namespace, out: TextIO) -> int:
    """``rl-gym-actors status URL``."""
    endpoint = cli_support.endpoint(args.url, args.token)
    try:
        report = asyncio.run(
            fetch_any_status(endpoint, args.checkpoint_id, timeout_s=args.timeout_s)
        )
    except RlGymError as exc:
        raise cli_support.gym_failure(exc, endpoint.url, args.timeout_s) from None
    if args.json:
        print(json.dumps(report.model_dump(mode="json"), indent=2, sort_keys=True), file=out)
    elif isinstance(report, V2StatusAnswer):
        print(v2_status_table(report, url=endpoint.url, limit=max(0, args.limit)), file=out)
    else:
        print(
            status_table(
                report, url=endpoint.url, checkpoint_id=args.checkpoint_id, limit=max(0, args.limit)
            ),
            file=out,
        )
    return cli_support.EXIT_OK


def _ledger(args: argparse.Namespace, out: TextIO) -> int:
    """``rl-gym-actors ledger``."""
    from rl_gym_actors.ray_attach import UNREACHABLE, RayAttachFailed

    where = args.address or os.environ.get("RAY_ADDRESS") or "this process's Ray"
    try:
        found = fetch_ledgers(args.address, timeout_s=args.timeout_s)
    except RayAttachFailed as exc:
        code = cli_support.EXIT_NO_ANSWER if exc.reason == UNREACHABLE else cli_support.EXIT_REFUSED
        raise CliError(str(exc), code) from None
    except (ConnectionError, RlGymError, RuntimeError, ValueError) as exc:
        raise CliError(
            f"cannot attach to Ray at {where} ({type(exc).__name__}: {cli_support.one_line(exc)}): "
            f"start it (`ray start --head`) or pass --address host:port",
            cli_support.EXIT_NO_ANSWER,
        ) from None
    if not found:
        raise CliError(
            f"no ledger actors on the Ray at {where} (names rlga-ledger-*, namespace "
            f"{RAY_NAMESPACE}): is an Orchestrator running on that cluster?",
            cli_support.EXIT_NO_ANSWER,
        )
    answered = {n: s for n, s in found.items() if isinstance(s, LedgerSnapshot)}
    if args.json:
        print(
            json.dumps(
                {
                    n: (
                        s.model_dump(mode="json") if isinstance(s, LedgerSnapshot) else {"error": s}
                    )
                    for n, s in found.items()
                },
                indent=2,
                sort_keys=True,
            ),
            file=out,
        )
    else:
        blocks = [
            snapshot_table(n, s)
            if isinstance(s, LedgerSnapshot)
            else f"Ledger {n}\n  no answer: {s}"
            for n, s in found.items()
        ]
        print("\n\n".join(blocks), file=out)
    return cli_support.EXIT_OK if answered else cli_support.EXIT_NO_ANSWER


status_command = _reported("status", _status)
ledger_command = _reported("ledger", _ledger)
