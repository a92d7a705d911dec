"""Before attaching to a running Ray cluster: does anything answer there, and does it take this
client's token?

``ray.init(address=...)`` against a cluster that refuses the token (Ray 2.60's token
authentication) or that is not there retries for about 20 s and logs a line per try from Ray's
C++ core on stderr. :func:`check_ray_address` asks the cluster's GCS for its cluster id once,
with the token Ray itself would send (``$RAY_AUTH_TOKEN``, ``$RAY_AUTH_TOKEN_PATH`` or
``~/.ray/auth_token``), and raises :class:`RayAttachFailed` with a typed ``reason`` at once.
When Ray's modules for that are missing (another Ray version), it checks nothing.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from rl_gym_actors.errors import RlGymError

UNREACHABLE = "unreachable"
TOKEN_REFUSED = "token_refused"
NO_TOKEN = "no_token"
NO_ADDRESS = "no_address"
AUTH_MODE_ENV = "RAY_AUTH_MODE"
TOKEN_HELP = (
    "set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token) to the cluster's token: "
    "`ray get-auth-token` on its head node prints it (RAY_AUTH_MODE=token is set for you once "
    "the token is taken; a plain ray.init needs it set by hand)"
)


class RayAttachFailed(RlGymError):
    """The Ray cluster at ``address`` cannot be attached to; ``reason`` is one of
    ``unreachable``, ``token_refused``, ``no_token``, ``no_address`` (none was given, and
    nothing picks one: see :func:`require_address`)."""

    def __init__(self, message: str, *, address: str = "", reason: str = UNREACHABLE) -> None:
        super().__init__(message)
        self.address = address
        self.reason = reason


def check_ray_address(address: str, timeout_s: float = 10.0) -> None:
    """Raise RayAttachFailed unless the GCS at ``host:port`` answers this client. A cluster that
    takes this client's token only with it turns token authentication on for this process (as
    ``RAY_AUTH_MODE=token`` would), so that ``ray.init`` sends it too. Addresses that are not
    ``host:port`` (``auto``, ``ray://...``) are left to Ray."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return
    try:
        import grpc  # type: ignore[import-untyped]  # Ray's own dependency, no stubs
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:  # no gRPC stubs of Ray's: only whether anything listens there
        _listening(address, host or "127.0.0.1", int(port), timeout_s)
        return
    try:  # Ray 2.60's token authentication; older Rays have none
        from ray._raylet import (  # type: ignore[attr-defined]
            AuthenticationTokenLoader,
            Config,
        )
    except ImportError:
        AuthenticationTokenLoader = Config = None
    request_type = getattr(gcs_service_pb2, "GetClusterIdRequest", None)  # generated code
    if request_type is None:
        _listening(address, host or "127.0.0.1", int(port), timeout_s)
        return
    loader: Any = AuthenticationTokenLoader.instance() if AuthenticationTokenLoader else None
    has_token = bool(loader is not None and loader.has_token(ignore_auth_mode=True))
    channel = grpc.insecure_channel(f"{host or '127.0.0.1'}:{port}")
    stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
    request = request_type()

    def ask(metadata: tuple[tuple[str, str], ...]) -> Any:
        try:
            stub.GetClusterId(request, timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            return exc.code()
        return None

    try:
        code = ask(())
        if code == grpc.StatusCode.UNAUTHENTICATED and has_token:
            code = ask(tuple(loader.get_token_for_http_header().items()))
            if code is None and AUTH_MODE_ENV not in os.environ and Config is not None:
                os.environ[AUTH_MODE_ENV] = "token"  # ray.init sends the token too
                Config.initialize("")
    finally:
        channel.close()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        what = "refused this client's token" if has_token else "needs a token"
        raise RayAttachFailed(
            f"Ray at {address} {what} (token authentication): {TOKEN_HELP}",
            address=address,
            reason=TOKEN_REFUSED if has_token else NO_TOKEN,
        )
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        raise RayAttachFailed(
            f"nothing answers as Ray at {address} within {timeout_s:g}s: start it "
            f"(`ray start --head --port={port}`) or give the address `ray status` shows",
            address=address,
            reason=UNREACHABLE,
        )
    # any other answer: a GCS is there; ray.init handles the rest


def require_address(address: str | None) -> str:
    """The address to attach to: ``address``, else ``$RAY_ADDRESS``; with neither, raise
    :class:`RayAttachFailed` (``no_address``). Ray's own ``address="auto"`` takes whatever
    cluster this machine runs, which on a shared machine may be another user's: a command
    that only looks at a cluster must be told which one."""
    chosen = address or os.environ.get("RAY_ADDRESS")
    if not chosen:
        raise RayAttachFailed(
            "no Ray cluster named: pass --address host:port (the GCS address `ray start "
            "--head` printed, or `ray status` shows) or set RAY_ADDRESS; nothing is picked "
            "by itself, since the Ray this machine runs may be another user's",
            reason=NO_ADDRESS,
        )
    return chosen


def check_env_address(timeout_s: float = 10.0) -> None:
    """Before an orchestrator attaches to ``$RAY_ADDRESS`` (no Ray in this process yet): the
    same check as :func:`check_ray_address`, so that a token in ``~/.ray/auth_token`` is enough
    (token mode is turned on for this process when the cluster takes it) and a cluster that
    refuses it, or is not there, raises :class:`RayAttachFailed` at once instead of Ray's 20 s
    of retries and a raw ``ConnectionError``."""
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        return
    import ray

    if not ray.is_initialized():
        check_ray_address(address, timeout_s)


def _listening(address: str, host: str, port: int, timeout_s: float) -> None:
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise RayAttachFailed(
            f"nothing answers as Ray at {address} ({exc.strerror or exc}): start it "
            f"(`ray start --head --port={port}`) or give the address `ray status` shows",
            address=address,
            reason=UNREACHABLE,
        ) from None
