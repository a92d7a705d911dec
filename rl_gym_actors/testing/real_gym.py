"""A stand-in that makes our Gym server answer the way a real NeMo Gym server does.

docs/PROTOCOL.md (section 7, "How a real Gym server differs") lists where a real Gym's answers
differ from ours; a client must cope with both. :class:`RealGymStandIn` is a small reverse proxy in
front of one of our servers that rewrites its answers into the real Gym's forms:

- no (ext) routes: ``GET .../receipt``, ``GET .../completion-receipt`` (the first real
  participant has no per-key receipt route), ``POST .../retire-batch`` and ``GET .../lease``
  (no store epoch) answer 404 ``{"detail": "Not Found"}``, and the ``x-gym-replayed`` and
  ``x-gym-completion-receipt`` headers are dropped;
- ``GET /ng-control/v1/capabilities`` answers without a token as a real Gym's control plane
  does (its ``ControlCapabilities`` plus the fence's ``phase``, ``active_checkpoint_id`` and
  ``deadline_ts``), with only the features a real agent participant lists
  (:data:`REAL_FEATURES`): no (ext) feature, no route names;
- the prepare 409 ``agent_prepare_incomplete`` carries only ``error`` (counts in its detail),
  no ``report``;
- 401 answers ``{"detail": "..."}``; 422 answers FastAPI's default ``{"detail": [{...}]}``;
- the caller of a ``/run`` that a ``retire`` (sent through this proxy) cancelled gets a 500
  whose body is the JSON string ``"RuntimeError('No response returned.')"`` instead of a 409
  (a real Gym's agent server finds no response from the cancelled handler);
- an agent that raises (a data failure or a transient one alike: a real Gym has no
  ``agent_data_failed``): the caller gets a 500 whose body is the exception's repr as a JSON
  string (``agent_error="repr"``, the default, as behind Gym's exception middleware) or plain
  ``Internal Server Error`` (``agent_error="plain"``), with no ``agent_failed`` code. Our server
  behind the proxy tombstones the key, which a retire cannot tell from a real Gym that stored
  nothing: both answer ``{"retired": false, "tombstoned": true}``. (A second ``/run`` of that
  same key, with no retire between, would run the agent again on a real Gym and is
  ``stale_attempt`` here; the RL side retires first and never does it.)
- while a prepare is in progress (``state`` is ``preparing``), ``status`` lists each running
  attempt with the state ``park_requested`` (the counts stay as they are).

It counts what it answers per path (``calls``, and the body bytes in ``bytes_out``): how much
status traffic a client costs. A failure to reach the server answers a plain-text 502. It runs
in a thread with its own event loop, on 127.0.0.1, as a context manager with ``.url``, ``.token``
and ``.endpoint``.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import aiohttp
from aiohttp import web

from rl_gym_actors.config import GymEndpoint
from rl_gym_actors.gym.answers import RETIRED_RUN_BODY
from rl_gym_actors.gym.transport import KEEPALIVE_S
from rl_gym_actors.protocol import (
    ATTEMPT_INDEX_FIELD,
    CAPABILITIES_PATH,
    CONTINUATION_INDEX_FEATURE,
    CONTROL_PREFIX,
    ROLLOUT_ID_FIELD,
)
from rl_gym_actors.testing.loop_thread import LoopThread

HOST = "127.0.0.1"
_EXT_ROUTES = (
    CONTROL_PREFIX + "/receipt",
    CONTROL_PREFIX + "/completion-receipt",  # only later real participants have it
    CONTROL_PREFIX + "/retire-batch",
    CONTROL_PREFIX + "/lease",  # our fence and store epoch
)
_FORWARDED_HEADERS = ("Authorization", "Content-Type", "Accept")
#: what a real Gym's agent participant lists in its capabilities' ``features``
REAL_FEATURES = ("completed_result_acknowledgement", CONTINUATION_INDEX_FEATURE)
#: the fields of a real Gym's capabilities answer (ControlCapabilities + the fence's snapshot)
_CAPABILITY_FIELDS = (
    "component",
    "name",
    "schema_version",
    "admission_states",
    "checkpoint_mode",
    "concurrency_contract",
    "multi_process",
    "instance_role",
    "features",
    "phase",
    "active_checkpoint_id",
    "deadline_ts",
)


def _json(status: int, body: Any) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(body).encode(), content_type="application/json"
    )


def _error_of(raw: bytes) -> tuple[dict[str, Any], str | None, str]:
    try:
        body = json.loads(raw)
    except ValueError:
        return {}, None, ""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return body if isinstance(body, dict) else {}, None, ""
    return body, err.get("code"), str(err.get("detail", ""))


def _park_requested(report: dict[str, Any]) -> dict[str, Any]:
    """A status while preparing, as a real Gym lists it: running attempts are park_requested."""
    if report.get("state") != "preparing":
        return report
    out = dict(report)
    for name in ("executions", "blocking_attempts"):
        if isinstance(report.get(name), list):
            out[name] = [
                {**a, "state": "park_requested"}
                if isinstance(a, dict) and a.get("state") == "running"
                else a
                for a in report[name]
            ]
    return out


class RealGymStandIn(LoopThread):
    """A reverse proxy that answers like a real Gym server (see the module docstring)."""

    _thread_name = "real-gym-stand-in"
    _what = "stand-in"

    def __init__(
        self, upstream: GymEndpoint, *, start_timeout_s: float = 10.0, agent_error: str = "repr"
    ) -> None:
        if agent_error not in ("repr", "plain"):
            raise ValueError(f"agent_error must be 'repr' or 'plain', got {agent_error!r}")
        super().__init__(start_timeout_s=start_timeout_s)
        self.upstream = upstream
        self.token = upstream.token
        self.agent_error = agent_error
        self.retired_while_running = 0  # runs answered with "No response returned." (500)
        self.agent_failures = 0  # agent errors answered as a real Gym does
        self.calls: Counter[str] = Counter()  # path -> requests answered
        self.bytes_out: Counter[str] = Counter()  # path -> body bytes answered
        self._running_keys: set[tuple[str, int]] = set()
        self._cancelled_keys: set[tuple[str, int]] = set()

    @property
    def endpoint(self) -> GymEndpoint:
        if self.url is None:
            raise RuntimeError("the stand-in is not started")
        return GymEndpoint(url=self.url, token=self.token)

    async def _main(self, ready: threading.Event) -> None:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(keepalive_timeout=KEEPALIVE_S),
            timeout=aiohttp.ClientTimeout(total=None),
        ) as session:
            app = web.Application(client_max_size=64 << 20)

            async def forward(request: web.Request) -> web.StreamResponse:
                return await self._forward(session, request)

            app.router.add_route("*", "/{tail:.*}", forward)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, HOST, 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            self.url = f"http://{host}:{port}"
            ready.set()
            try:
                await self._stopped()
            finally:
                await runner.cleanup()

    async def _forward(
        self, session: aiohttp.ClientSession, request: web.Request
    ) -> web.StreamResponse:
        response = await self._answer(session, request)
        self.calls[request.path] += 1
        body = getattr(response, "body", None)
        self.bytes_out[request.path] += len(body) if isinstance(body, bytes) else 0
        return response

    async def _answer(
        self, session: aiohttp.ClientSession, request: web.Request
    ) -> web.StreamResponse:
        path = request.path
        if path in _EXT_ROUTES:
            return _json(404, {"detail": "Not Found"})
        raw_in = await request.read()
        key = self._run_key(raw_in) if path == "/run" else None
        if key is not None:
            self._running_keys.add(key)
        elif path == CONTROL_PREFIX + "/retire":
            # noted before forwarding: the cancelled run may answer before the retire does
            self._note_retire(raw_in)
        headers = {h: request.headers[h] for h in _FORWARDED_HEADERS if h in request.headers}
        try:
            async with session.request(
                request.method,
                self.upstream.url + request.path_qs,
                data=raw_in or None,
                headers=headers,
            ) as resp:
                raw, status = await resp.read(), resp.status
                content_type = resp.content_type
        except aiohttp.ClientError as exc:
            if key is not None and request.transport is not None:
                # the server dropped a /run without answering: so does a real Gym (no answer)
                request.transport.close()
            return web.Response(status=502, text=f"Bad Gateway: {type(exc).__name__}")
        finally:
            if key is not None:
                self._running_keys.discard(key)
        body, code, detail = _error_of(raw)
        if (
            key is not None
            and status == 409
            and code == "stale_attempt"
            and key in self._cancelled_keys
        ):
            self._cancelled_keys.discard(key)
            self.retired_while_running += 1
            return _json(500, RETIRED_RUN_BODY)
        if key is not None and (status, code) in (
            (500, "agent_failed"),
            (422, "agent_data_failed"),
        ):
            self.agent_failures += 1
            if self.agent_error == "plain":
                return web.Response(status=500, text="Internal Server Error")
            return _json(500, detail)  # the repr, as a JSON string
        if path == CAPABILITIES_PATH and status == 200 and isinstance(body, dict):
            caps = {k: body.get(k) for k in _CAPABILITY_FIELDS}
            upstream = body.get("features") or []
            caps["features"] = [f for f in REAL_FEATURES if f in upstream]
            return _json(200, caps)
        if path == CONTROL_PREFIX + "/status" and status == 200:
            return _json(200, _park_requested(body))
        if status == 401:
            return _json(401, {"detail": detail or "Unauthorized"})
        if status == 422:
            return _json(
                422,
                {
                    "detail": [
                        {"type": "value_error", "loc": ["body"], "msg": detail, "input": None}
                    ]
                },
            )
        if status == 409 and code == "agent_prepare_incomplete":
            return _json(409, {"error": body["error"]})
        # the x-gym-replayed header (ext) is not passed on: only the body is
        return web.Response(status=status, body=raw, content_type=content_type or None)

    @staticmethod
    def _run_key(raw: bytes) -> tuple[str, int] | None:
        try:
            row = json.loads(raw)
            return (row[ROLLOUT_ID_FIELD], int(row.get(ATTEMPT_INDEX_FIELD, 0)))
        except (ValueError, KeyError, TypeError):
            return None

    def _note_retire(self, raw_in: bytes) -> None:
        try:
            req = json.loads(raw_in)
            key = (req["rollout_id"], int(req["attempt_index"]))
        except (ValueError, KeyError, TypeError):
            return
        if key in self._running_keys:
            self._cancelled_keys.add(key)
