"""A URL upstream that wants an API key, behind the gateway (`--header NAME:HEADER=VALUE`).

In process: a real MCP server (the SDK's `MCPServer` on streamable HTTP, under uvicorn)
that answers 401 to any request without its key, the gateway in front of it on another
loopback port, and the daemon's app behind an `AsyncGuard`. The clients are the SDK's
own, over both eras of the protocol.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio
import httpx
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import TextContent
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ratewarden.client import AsyncGuard
from ratewarden.mcp import upstream as upstreams
from ratewarden.mcp.gateway import Gateway
from ratewarden.mcp.identity import Identities
from ratewarden.mcp.upstream import Header, Upstream, with_headers
from tests.helpers.app import build_app, serving
from tests.helpers.redis_server import free_port

pytestmark = pytest.mark.timeout(120)

KEY = "upstream-key-7f3c9a0e5b2d4c18a6e0"  # what the upstream wants
TOKEN = "token-of-alice-0123456789"
POLICY = """\
version: 1
rules:
  - name: echo-per-minute
    match: {tool: keyed.echo}
    per: [user]
    rate: 100/minute
"""


class KeyedServer:
    """The upstream: one tool, and a 401 for every request without `Bearer KEY`."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.refused = 0
        server = MCPServer("keyed")

        def echo(text: str) -> str:
            self.ran.append(text)
            return f"echo {text}"

        server.add_tool(echo)
        self.app = server.streamable_http_app()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization")
            if given != f"Bearer {KEY}".encode():
                self.refused += 1
                refusal = JSONResponse({"error": "an API key is required"}, status_code=401)
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


@contextlib.asynccontextmanager
async def listening(app: ASGIApp, lifespan: Literal["on", "off"]) -> AsyncIterator[str]:
    """`app` served by uvicorn on a free loopback port, until the block ends."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan=lifespan)
    server = uvicorn.Server(config)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(server.serve)
        while not server.started:
            await anyio.sleep(0.02)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True


@contextlib.asynccontextmanager
async def gateway_to(upstream: Upstream) -> AsyncIterator[str]:
    """The gateway fronting `upstream`; yields its URL for it."""
    async with serving(build_app(POLICY)) as daemon:
        transport = daemon._transport
        assert isinstance(transport, httpx.ASGITransport)
        guard = AsyncGuard("http://test", transport=transport)
        gateway = Gateway([upstream], Identities({TOKEN: "alice"}), guard, idle_timeout=30)
        async with gateway.running(), listening(gateway, "off") as url:
            yield f"{url}/{upstream.name}/mcp"


@contextlib.asynccontextmanager
async def client(url: str, mode: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30)) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode) as connected,
    ):
        yield connected


def text(result: Any) -> str:
    return "".join(part.text for part in result.content if isinstance(part, TextContent))


@pytest.fixture
def keyed() -> KeyedServer:
    return KeyedServer()


@pytest.mark.parametrize("mode", ["legacy", "auto"])  # a session, and 2026-07-28
async def test_with_its_header_the_call_goes_through(
    keyed: KeyedServer, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setenv("KEYED_API_KEY", f"Bearer {KEY}")
    async with listening(keyed, "on") as upstream_url:
        [upstream] = with_headers(
            [Upstream.parse(f"keyed={upstream_url}/mcp")],
            [Header.parse("keyed:Authorization=@env:KEYED_API_KEY")],
        )
        async with gateway_to(upstream) as url, client(url, mode) as alice:
            result = await alice.call_tool("echo", {"text": mode})
    assert (result.is_error, text(result)) == (False, f"echo {mode}")
    assert keyed.ran == [mode]
    assert keyed.refused == 0  # every request carried the key (GET and DELETE too)


async def test_without_it_the_upstream_refuses_and_nothing_runs(keyed: KeyedServer) -> None:
    async with listening(keyed, "on") as upstream_url:
        upstream = Upstream.parse(f"keyed={upstream_url}/mcp")
        async with gateway_to(upstream) as url:
            with pytest.raises(BaseExceptionGroup) as refused:  # the SDK's task groups
                async with client(url, "legacy") as alice:
                    await alice.call_tool("echo", {"text": "no key"})
    assert refused.group_contains(MCPError, match="HTTP 401")  # what the gateway's client saw
    assert keyed.ran == []
    assert keyed.refused > 0


async def test_the_secret_is_never_shown(
    keyed: KeyedServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "Bearer wrong-key-0a1b2c3d4e5f60718293"  # refused: errors get logged
    monkeypatch.setenv("KEYED_API_KEY", secret)
    caplog.set_level(logging.DEBUG)
    shown: list[str] = []
    async with listening(keyed, "on") as upstream_url:
        [upstream] = with_headers(
            [Upstream.parse(f"keyed={upstream_url}/mcp")],
            [Header.parse("keyed:Authorization=@env:KEYED_API_KEY")],
        )
        shown += [repr(upstream), str(upstream)]
        async with gateway_to(upstream) as url:
            for mode in ("legacy", "auto"):
                try:
                    async with client(url, mode) as alice:
                        shown.append(repr(await alice.call_tool("echo", {"text": "x"})))
                except Exception as exc:  # what a client is told
                    shown.append(repr(exc))
    assert keyed.refused > 0
    assert dict(upstream.headers) == {"Authorization": secret}  # it was sent, and refused
    for text_shown in [*shown, caplog.text]:
        assert "wrong-key" not in text_shown


async def test_an_https_upstream_gets_its_headers_through_the_sdk_client() -> None:
    seen: list[dict[str, str]] = []

    @contextlib.asynccontextmanager
    async def fake_client(url: str, *, http_client: httpx2.AsyncClient) -> AsyncIterator[str]:
        seen.append(dict(http_client.headers))
        yield url

    async with upstreams._sdk_client("https://x/mcp", {"X-Api-Key": "k"}, fake_client) as got:
        assert got == "https://x/mcp"
    assert seen[0]["x-api-key"] == "k"


def test_each_header_goes_to_its_server_and_its_value_is_unshown() -> None:
    [upstream] = with_headers(
        [Upstream.parse("web=http://127.0.0.1:1/mcp")],
        [Header.parse("web:X-Api-Key=plain-value"), Header.parse("web:X-Team=a b")],
    )
    assert upstream.headers == (("X-Api-Key", "plain-value"), ("X-Team", "a b"))
    assert "plain-value" not in repr(upstream)
