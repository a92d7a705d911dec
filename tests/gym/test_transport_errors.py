"""The one table from aiohttp's exceptions to the project's typed errors, rule by rule."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from rl_gym_actors.errors import ConnectionLost, DeadlineExceeded, PoolClosed
from rl_gym_actors.gym.transport_errors import map_transport_error

URL = "http://127.0.0.1:1/x"


def _mapped(exc: BaseException, *, closed: bool = False, quick: bool = True):
    return map_transport_error(
        exc, call="GET /x", url=URL, left_s=1.5, label="ep", closed=closed, quick=quick
    )


def _refused() -> aiohttp.ClientConnectorError:
    key = ConnectionKey("127.0.0.1", 1, False, True, None, None, None)
    return aiohttp.ClientConnectorError(key, ConnectionRefusedError(111, "refused"))


@pytest.mark.parametrize("quick", [True, False])
def test_a_timeout_is_deadline_exceeded_and_counts_only_on_quick_calls(quick):
    m = _mapped(TimeoutError(), quick=quick)
    assert isinstance(m.error, DeadlineExceeded) and m.error.url == URL
    assert m.error.detail == "GET /x: no answer within 1.500s"
    assert m.counts is quick


def test_a_refused_connection_is_connection_lost_and_always_counts():
    m = _mapped(_refused(), quick=False)
    assert isinstance(m.error, ConnectionLost) and m.counts
    assert m.error.detail.startswith("GET /x: ClientConnectorError: ")


@pytest.mark.parametrize(
    "exc", [aiohttp.ServerDisconnectedError(), ConnectionResetError(104, "reset")]
)
def test_a_lost_connection_after_sending_never_counts(exc):
    m = _mapped(exc)
    assert isinstance(m.error, ConnectionLost) and not m.counts


@pytest.mark.parametrize(
    "exc", [aiohttp.ServerDisconnectedError(), OSError("x"), RuntimeError("Session is closed")]
)
def test_anything_once_the_pool_is_closed_is_pool_closed(exc):
    m = _mapped(exc, closed=True)
    assert isinstance(m.error, PoolClosed) and not m.counts
    assert str(m.error) == "the session of the GymClient for ep is closed (GET /x)"


def test_what_no_rule_names_propagates():
    assert _mapped(RuntimeError("a bug")) is None
    assert _mapped(ValueError("a bug")) is None
