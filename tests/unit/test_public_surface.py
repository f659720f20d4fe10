"""The public surface: what `ratewarden` exports, the error tree, and `transport=`."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

import ratewarden
import ratewarden.errors
from ratewarden import (
    AsyncGuard,
    CheckRequest,
    CheckResponse,
    ClientError,
    DaemonUnavailable,
    Guard,
    RatewardenError,
)
from ratewarden.client import AsyncClient, Client
from ratewarden.engine import CallIdConflict
from ratewarden.policy import PolicyError, parse_policy
from ratewarden.store import StoreError, StoreURLError, store_from_url
from ratewarden.store.breaker import CircuitOpenError
from ratewarden.store.snapshot import StateFileError
from tests.helpers.app import build_app, serving

EXPORTED = {
    "__version__",
    "Client",
    "AsyncClient",
    "Guard",
    "AsyncGuard",
    "ClientError",
    "DaemonUnavailable",
    "RatewardenError",
    "CheckRequest",
    "CheckResponse",
    "BatchRequest",
    "BatchResponse",
    "ToolMetadata",
    "Violation",
    "LimitState",
    "ModelUsage",
    "SettleRequest",
    "SettleResponse",
    "UsageItem",
    "UsageResponse",
    "ErrorResponse",
    "FieldError",
}


def test_the_exported_members_are_exactly_the_public_surface() -> None:
    assert set(ratewarden.__all__) == EXPORTED
    assert set(ratewarden._EXPORTS) == EXPORTED - {"__version__"}
    for name in EXPORTED:
        assert getattr(ratewarden, name) is not None
    assert ratewarden.Client is Client
    with pytest.raises(AttributeError, match="no attribute 'Engine'"):
        _ = ratewarden.Engine


def test_importing_ratewarden_loads_nothing_of_the_daemon() -> None:
    probe = "import sys, json, ratewarden; print(json.dumps(sorted(sys.modules)))"
    found = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = set(json.loads(found.stdout))
    assert {"fastapi", "redis", "uvicorn", "pydantic_settings", "httpx"} & loaded == set()


@pytest.mark.parametrize(
    "error",
    [
        PolicyError,
        StoreError,
        CircuitOpenError,
        StoreURLError,
        StateFileError,
        CallIdConflict,
        ClientError,
        DaemonUnavailable,
    ],
)
def test_every_error_derives_from_one_base(error: type[Exception]) -> None:
    assert issubclass(error, RatewardenError)
    assert error.__name__ in (ratewarden.errors.__doc__ or "")  # drawn in the tree


def test_errors_raised_in_practice_are_caught_by_the_base() -> None:
    with pytest.raises(RatewardenError):
        parse_policy(b"version: 2\n")
    with pytest.raises(RatewardenError):
        store_from_url("ftp://nowhere")
    with pytest.raises(RatewardenError), Client("http://127.0.0.1:9", timeout=0.2) as client:
        client.check(CheckRequest(user="u", tool="t"))


def test_a_guard_talks_through_the_transport_it_is_given() -> None:
    seen: list[dict[str, object]] = []

    def daemon(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(
            200, json={"decision": "deny", "allowed": False, "call_id": "c", "message": "no"}
        )

    guard = Guard("http://scripted", transport=httpx.MockTransport(daemon))
    answer = guard.check(CheckRequest(user="alice", tool="terminal"))
    assert (answer.decision, answer.message, guard.unreachable) == ("deny", "no", 0)
    assert seen == [{"user": "alice", "tool": "terminal"}]
    guard.close()


POLICY = "version: 1\nrules:\n  - {name: terminal, match: {tool: terminal}, rate: 1/minute}\n"


async def test_an_async_guard_can_ask_a_daemon_in_process() -> None:
    async with serving(build_app(POLICY)) as http:
        transport = http._transport  # the in-process ASGI transport of the running app
        assert isinstance(transport, httpx.ASGITransport)
        guard = AsyncGuard("http://test", transport=transport)
        first = await guard.check(CheckRequest(user="alice", tool="terminal"))
        second = await guard.check(CheckRequest(user="alice", tool="terminal"))
        assert [first.decision, second.decision] == ["allow", "deny"]
        assert isinstance(second, CheckResponse)
        assert second.message.startswith("Rate limit: max 1 terminal calls per minute")
        client = AsyncClient("http://test", transport=transport)
        usage = await client.usage("alice")
        assert usage.limits[0].used == 1
        await client.aclose()
