"""A v2 Gym server (``gym serve --protocol v2``) in a background thread, for tests.

Same interface as :class:`~rl_gym_actors.testing.gym_process.GymServerThread`: ``start()``,
``url``, ``token``, ``endpoint``, ``stop()``, ``kill()``, ``restart()`` (same port when free),
context manager; ``participant`` is the live
:class:`~rl_gym_actors.gym.v2.participant.V2Participant`. ``agent`` is a ``--agent`` value or an
async callable (``row -> reply`` or ``(row, steps) -> reply``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from rl_gym_actors.testing.gym_process import (
    HOST,
    START_TIMEOUT_S,
    InProcessServer,
)


class V2ServerThread(InProcessServer):
    """``kill()`` is a stop without grace: a v2 participant keeps nothing."""

    token: str  # always given

    def __init__(
        self,
        agent: Any = "simulated",
        token: str = "test-token",
        args: Sequence[str] = (),
        lease_grace_s: float | None = None,
        allow_faults: bool = False,
        extensions: Sequence[Any] = (),
    ) -> None:
        self.agent = agent
        self.extensions = list(extensions)  # more gym.web.Extension (e.g. testing.hold)
        self.allow_faults = allow_faults  # the ``drop_reply`` row field, as on the agent server
        self.faults: Any = None
        self.token = token
        self.args = list(args)
        self.lease_grace_s = lease_grace_s
        self.url: str | None = None
        self.server: Any = None
        self._port = 0
        self._thread: threading.Thread | None = None

    def _build(self, port: int) -> None:
        from rl_gym_actors.cli import build_parser
        from rl_gym_actors.gym.connections import limits_from_args
        from rl_gym_actors.gym.server import GymServer
        from rl_gym_actors.gym.v2.participant import V2Participant
        from rl_gym_actors.gym.v2.routes import create_app
        from rl_gym_actors.gym.v2.stepped import make_step_agent

        cli = build_parser().parse_args(["gym", "serve", "--protocol", "v2", *self.args])
        participant = V2Participant(
            make_step_agent(self.agent),
            lease_grace_s=self.lease_grace_s or cli.checkpoint_lease_s or 600.0,
            restart_only=cli.restart_only,
            export_every_session=cli.export_every_session,
            hide_restored_pending=cli.hide_restored_pending,
        )
        extensions = list(self.extensions)
        if self.allow_faults:
            from rl_gym_actors.gym.agent_checkpoint.faults import FaultInjector, fault_injection

            table = participant.table

            def known(key: tuple[str, int]) -> bool:
                live = table.live.get(key[0])
                running = live is not None and live.episode_id.attempt == key[1]
                return running or key[1] in table.kept.get(key[0], {})

            self.faults = self.faults or FaultInjector()
            extensions.append(fault_injection(self.faults, known))
        self.server = GymServer(
            participant,
            token=self.token,
            app_factory=create_app,
            extensions=extensions,
            host=HOST,
            port=port,
            graceful_s=2.0,
            limits=limits_from_args(cli),
        )
        self.url = self.server.url
        self._port = self.server.port

    def restart(self, timeout_s: float = START_TIMEOUT_S) -> V2ServerThread:
        self.kill()
        return self.start(timeout_s)
