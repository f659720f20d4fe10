"""Issue #29 item 2: the MCP guard (the stdio proxy's and the gateway's) settles a call the
daemon answered with `send_result` with the digest of the server's CallToolResult: its
content, structuredContent and isError, not its `_meta`.

The daemon is the real app in process behind `Recorder`, an ASGI wrapper that keeps the
settle bodies the app receives and, when told, marks every check answer `send_result`
(as the engine does for a call a result-keyed loop rule counts). The gateway test runs
the real MCP SDK client against the gateway and the test server.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from ratewarden.arguments import result_digest
from ratewarden.client import AsyncGuard
from ratewarden.mcp.gateway import Gateway
from ratewarden.mcp.guard import GuardAction, SessionGuard
from ratewarden.mcp.identity import Identities
from ratewarden.mcp.upstream import Upstream
from tests.helpers.app import build_app
from tests.helpers.redis_server import free_port

pytestmark = pytest.mark.timeout(120)

POLICY = """\
version: 1
rules:
  - name: one-at-a-time
    match: {tool: [slow, demo.terminal]}
    concurrency: 1
"""
SERVER = Path(__file__).parents[1] / "hosts" / "drivers" / "mcp_server.py"
TOKEN = "token-of-alice-0123456789"


class Recorder:
    """The daemon's ASGI app, keeping the settle bodies it receives; with `send_result`,
    every check answer says so."""

    def __init__(self, app: Any, send_result: bool) -> None:
        self.app, self.send_result = app, send_result
        self.settles: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path.endswith("/settle"):
            body = await _whole_body(receive)
            self.settles.append(json.loads(body or b"{}"))
            receive = _replay(body)
        if path == "/v1/check" and self.send_result:
            send = _marking_send_result(send)
        await self.app(scope, receive, send)


async def _whole_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes) -> Any:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _marking_send_result(send: Any) -> Any:
    start: dict[str, Any] = {}
    chunks: list[bytes] = []

    async def marked(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        answer = json.loads(b"".join(chunks))
        if answer.get("allowed"):
            answer["send_result"] = True
        body = json.dumps(answer).encode()
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return marked


@contextlib.asynccontextmanager
async def recorded(send_result: bool) -> AsyncIterator[tuple[AsyncGuard, Recorder]]:
    app = build_app(POLICY)
    recorder = Recorder(app, send_result)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=recorder)
        yield AsyncGuard("http://test", transport=transport), recorder


async def never_asked(tool: str, message: str) -> bool:
    raise AssertionError("asked")


RESULT = {
    "content": [{"type": "text", "text": "CI run 7: running", "_meta": {"at": "12:00:01"}}],
    "structuredContent": {"state": "running"},
    "isError": False,
    "_meta": {"trace": "t-1"},
}
DIGESTED = {
    "content": [{"type": "text", "text": "CI run 7: running"}],
    "structuredContent": {"state": "running"},
    "isError": False,
}


@pytest.mark.parametrize("send_result", [True, False])
async def test_the_guard_settles_with_the_call_tool_results_digest(send_result: bool) -> None:
    async with recorded(send_result) as (guard, daemon):
        session = SessionGuard(guard, user="u")
        verdict = await session.check(1, {"name": "slow", "arguments": {}}, never_asked)
        assert verdict.decision is GuardAction.FORWARD
        session.sent(1)
        settle = session.finish(1, error=False, result=RESULT)
        assert settle is not None
        await settle()
    [body] = daemon.settles
    assert body["status"] == "ok"
    if send_result:
        assert body["result_digest"] == result_digest(DIGESTED)
    else:
        assert "result_digest" not in body


async def test_another_meta_is_the_same_result_and_an_error_another() -> None:
    async with recorded(True) as (guard, daemon):
        session = SessionGuard(guard, user="u")
        answers = [
            RESULT,
            {**RESULT, "_meta": {"trace": "t-2"}},
            {**RESULT, "isError": True},
        ]
        for n, result in enumerate(answers):
            await session.check(n, {"name": "slow"}, never_asked)
            session.sent(n)
            settle = session.finish(n, error=bool(result["isError"]), result=result)
            assert settle is not None
            await settle()
    first, other_meta, error = (body["result_digest"] for body in daemon.settles)
    assert first == other_meta != error


async def test_a_json_rpc_error_settles_without_a_digest() -> None:
    async with recorded(True) as (guard, daemon):
        session = SessionGuard(guard, user="u")
        await session.check(1, {"name": "slow"}, never_asked)
        session.sent(1)
        settle = session.finish(1, error=True)  # no result: a JSON-RPC error
        assert settle is not None
        await settle()
    [body] = daemon.settles
    assert body["status"] == "error"
    assert "result_digest" not in body


# -- the gateway, with the SDK's client and the test server -----------------------------------


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, send_result: bool) -> AsyncIterator[tuple[str, Recorder]]:
    command = ("/usr/bin/env", f"MCP_RAN={tmp_path / 'ran.txt'}", sys.executable, str(SERVER))
    async with recorded(send_result) as (guard, daemon):
        served = Gateway(
            [Upstream("demo", command=command)],
            Identities({TOKEN: "alice"}),
            guard,
            idle_timeout=30,
        )
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(served, host="127.0.0.1", port=port, lifespan="off"))
        async with served.running(), anyio.create_task_group() as tasks:
            tasks.start_soon(server.serve)
            while not server.started:
                await anyio.sleep(0.02)
            try:
                yield f"http://127.0.0.1:{port}/demo/mcp", daemon
            finally:
                server.should_exit = True


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # session-less, and with a session
@pytest.mark.parametrize("send_result", [True, False])
async def test_the_gateway_settles_with_the_servers_result_digest(
    tmp_path: Path, send_result: bool, mode: str
) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    timeout = httpx2.Timeout(30, read=60)
    async with gateway(tmp_path, send_result) as (url, daemon):
        async with (
            httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
            Client(streamable_http_client(url, http_client=http), mode=mode) as client,
        ):
            results = [await client.call_tool("terminal", {"command": "echo 1"}) for _ in "ab"]
        # Each call was settled before the gateway closed (one at a time: the second ran).
        assert [r.is_error for r in results] == [False, False]
    assert len(daemon.settles) == 2
    for body, result in zip(daemon.settles, results, strict=True):
        if send_result:
            seen = {
                "content": [b.model_dump(mode="json", by_alias=True, exclude_none=True)
                            for b in result.content],
                "structuredContent": result.structured_content,
                "isError": False,
            }  # fmt: skip
            assert body["result_digest"] == result_digest(seen)
        else:
            assert "result_digest" not in body
