"""A URL upstream that echoes the request's headers back (an error page quoting them, a
debugging tool): the operator's `--header` secret must not reach the gateway's clients."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from ratewarden.mcp.upstream import Header, Upstream, with_headers
from tests.unit.test_mcp_gateway_upstream_headers import TOKEN, gateway_to, listening

pytestmark = pytest.mark.timeout(120)

KEY = "echoed-key-5d1e8b2f9a0c4e7b"


async def echoing(scope: Scope, receive: Receive, send: Send) -> None:
    """Every POST refused with a JSON-RPC error quoting its Authorization header."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        event = await receive()
        body += event.get("body", b"")
        if not event.get("more_body"):
            break
    given = dict(scope["headers"]).get(b"authorization", b"").decode()
    request_id = json.loads(body).get("id") if body else None
    error = {"code": -32001, "message": f"key refused: {given!r}", "data": {"got": given}}
    answer = {"jsonrpc": "2.0", "id": request_id, "error": error}
    await JSONResponse(answer, status_code=401)(scope, receive, send)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_server_echoing_the_key_does_not_show_it_to_the_client(mode: str) -> None:
    shown: list[str] = []
    async with listening(echoing, "off") as upstream_url:
        [upstream] = with_headers(
            [Upstream.parse(f"echo={upstream_url}/mcp")],
            [Header.parse(f"echo:Authorization=Bearer {KEY}")],
        )
        async with gateway_to(upstream) as url:
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30)) as http:
                original = http.send

                async def recorded(request: Any, **kwargs: Any) -> Any:
                    answer = await original(request, **kwargs)
                    await answer.aread()
                    shown.append(answer.text)
                    return answer

                http.send = recorded  # type: ignore[method-assign]
                try:
                    transport = streamable_http_client(url, http_client=http)
                    async with Client(transport, mode=mode) as alice:
                        shown.append(repr(await alice.call_tool("x", {})))
                except Exception as exc:  # what the client is told
                    shown.append(repr(exc))
    assert any("key refused" in text for text in shown), shown  # the error did come back
    assert all(KEY not in text for text in shown), shown
