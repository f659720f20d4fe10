"""The gateway's session-less 2026-07-28 path against a hostile client: requests whose
headers say something other than their body, and resources a client could hold."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from ratewarden.mcp.stateless import MAX_LISTENS
from tests.unit.test_mcp_gateway_stateless import ALICE, serving_gateway

pytestmark = pytest.mark.timeout(120)

ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def call(tool: str, arguments: dict[str, Any], request_id: int = 1) -> dict[str, Any]:
    params = {"name": tool, "arguments": arguments, "_meta": ENVELOPE}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def headers(method: str, name: str | None = None) -> dict[str, str]:
    sent = {
        "accept": "application/json",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": method,
        "authorization": f"Bearer {ALICE}",
    }
    return sent if name is None else {**sent, "mcp-name": name}


async def test_routing_headers_that_disagree_with_the_body_are_refused(tmp_path: Path) -> None:
    # The policy reads the body; a URL server (or a proxy before it) may route by the
    # headers. A request whose headers name another method or tool is refused unsent.
    async with serving_gateway(tmp_path) as served, httpx.AsyncClient(timeout=30) as http:
        body = call("terminal", {"command": "hidden"})
        renamed = await http.post(served.url, json=body, headers=headers("tools/call", "echo"))
        relisted = await http.post(served.url, json=body, headers=headers("tools/list"))
        unnamed = await http.post(served.url, json=body, headers=headers("tools/call"))
        doubled = await http.post(
            served.url,
            json=body,
            headers=[*headers("tools/call", "terminal").items(), ("mcp-name", "echo")],
        )
        honest = await http.post(served.url, json=body, headers=headers("tools/call", "terminal"))
    for refused in (renamed, relisted, unnamed, doubled):
        assert refused.status_code == 400, refused.text
        assert refused.json()["id"] == 1
    assert honest.status_code == 200
    assert served.ran.read_text().splitlines() == ["terminal hidden"]  # the honest one only


def listen(request_id: int) -> dict[str, Any]:
    params = {"notifications": {"toolsListChanged": True}, "_meta": ENVELOPE}
    return {"jsonrpc": "2.0", "id": request_id, "method": "subscriptions/listen", "params": params}


async def test_a_user_cannot_hold_listen_streams_without_bound(tmp_path: Path) -> None:
    """A listen stays open and keeps no channel busy: past MAX_LISTENS, refused (429)."""
    sent = {**headers("subscriptions/listen"), "accept": "application/json, text/event-stream"}
    async with (
        serving_gateway(tmp_path) as served,
        httpx.AsyncClient(timeout=30) as http,
        contextlib.AsyncExitStack() as streams,
    ):
        opened = []
        for n in range(MAX_LISTENS):
            stream = http.stream("POST", served.url, json=listen(n), headers=sent)
            opened.append(await streams.enter_async_context(stream))
        assert {answer.status_code for answer in opened} == {200}
        refused = await http.post(served.url, json=listen(99), headers=sent)
        assert refused.status_code == 429
        assert f"{MAX_LISTENS} listens" in refused.json()["error"]["message"]
        assert refused.json()["id"] == 99
        # A call still gets through: the cap is on listens.
        body = call("terminal", {"command": "still"})
        honest = await http.post(served.url, json=body, headers=headers("tools/call", "terminal"))
        assert honest.status_code == 200
        await opened[0].aclose()  # one closed: room for one more
        with anyio.fail_after(10):
            while True:
                async with http.stream("POST", served.url, json=listen(100), headers=sent) as again:
                    if again.status_code == 200:
                        break
                await anyio.sleep(0.05)


async def test_a_call_in_another_shape_does_not_run_unchecked(tmp_path: Path) -> None:
    """A batch, a notification, a null id, a method in another case: none runs a tool
    past the check (carol's destructive calls are refused, so any that ran got past)."""
    body = call("terminal", {"command": "sneaked"})
    note = {key: value for key, value in body.items() if key != "id"}
    shapes: list[tuple[object, str]] = [
        ([body], "tools/call"),
        ([body, body], "tools/call"),
        (note, "tools/call"),
        ({**body, "id": None}, "tools/call"),
        ({**body, "id": [1]}, "tools/call"),
        ({**body, "method": "Tools/Call"}, "Tools/Call"),
        ({**body, "method": "tools/call\u200b"}, "tools/call"),
        ({**body, "params": {**body["params"], "name": ["terminal"]}}, "tools/call"),
    ]
    async with serving_gateway(tmp_path) as served, httpx.AsyncClient(timeout=30) as http:
        answers = [
            await http.post(served.url, json=shape, headers=headers(method, "terminal"))
            for shape, method in shapes
        ]
    assert all(answer.status_code in {200, 202, 400, 404} for answer in answers), answers
    assert not served.ran.exists(), served.ran.read_text()
