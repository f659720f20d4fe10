"""The gateway serving the session-less 2026-07-28 protocol beside the session protocols.

In process: the gateway on a loopback port (uvicorn), the daemon's app behind an
`AsyncGuard` (no sockets), and the test MCP server (tests/hosts/drivers/mcp_server.py) as
the gateway's command upstream. The clients are the MCP SDK's own: `Client` with
`mode="auto"` probes `server/discover` and speaks 2026-07-28 (as Claude Code 2.x does);
`mode="legacy"` opens a session with `initialize`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import TextContent

from ratewarden.client import AsyncGuard
from ratewarden.mcp.gateway import Gateway
from ratewarden.mcp.identity import Identities
from ratewarden.mcp.upstream import Upstream
from tests.helpers.app import build_app, serving
from tests.helpers.redis_server import free_port

pytestmark = pytest.mark.timeout(120)

SERVER = Path(__file__).parents[1] / "hosts" / "drivers" / "mcp_server.py"
TOKENS = {
    "token-of-alice-0123456789": "alice",
    "token-of-bob-000123456789": "bob",
    "token-of-carol-0123456789": "carol",  # the one user whose destructive calls are refused
}
ALICE, BOB, CAROL = list(TOKENS)
RATE = "Rate limit: max 3 terminal calls per minute"
ASK = "deploy needs a human's approval"
APPROVAL_NEEDED = "A human must approve this call before it can run"
NO_DESTRUCTIVE = "No destructive tools here"
POLICY = f"""\
version: 1
tools:
  demo.terminal: {{label: terminal}}
rules:
  - name: terminal-per-minute
    match: {{tool: demo.terminal}}
    per: [user]
    rate: 3/minute
  - name: one-at-a-time          # a call after a call passes only once the first settled
    match: {{tool: [demo.terminal, demo.hang]}}
    per: [user, tool]
    concurrency: 1
  - name: deploy-asks
    match: {{tool: demo.deploy}}
    ask: "{ASK}"
  - name: no-destructive
    match: {{tool: "demo.*", destructive: true, user: carol}}  # unclassified matches too
    deny: "{NO_DESTRUCTIVE}"
"""


@dataclass
class Served:
    url: str  # the gateway's `demo` server
    daemon: httpx.AsyncClient  # the daemon's app, in process
    ran: Path  # a line per tool run

    async def used(self, user: str, rule: str) -> float:
        usage = (await self.daemon.get("/v1/usage", params={"user": user})).json()
        return float(sum(item["used"] for item in usage["limits"] if item["rule"] == rule))


@contextlib.asynccontextmanager
async def serving_gateway(tmp_path: Path, url_upstream: bool = False) -> AsyncIterator[Served]:
    """The gateway and the daemon, for one test (a fixture's setup and teardown run in
    different tasks, which anyio's task groups refuse); the test server as a command, or
    already listening on streamable HTTP (`url_upstream`)."""
    # The server's environment: the gateway's own, as for every command upstream.
    command = ("/usr/bin/env", f"MCP_RAN={tmp_path / 'ran.txt'}", sys.executable, str(SERVER))
    async with serving(build_app(POLICY)) as daemon, listening_server(command, url_upstream) as url:
        transport = daemon._transport
        assert isinstance(transport, httpx.ASGITransport)
        guard = AsyncGuard("http://test", transport=transport)
        upstream = Upstream("demo", url=url) if url else Upstream("demo", command=command)
        gateway = Gateway([upstream], Identities(TOKENS), guard, idle_timeout=30)
        port = free_port()
        config = uvicorn.Config(gateway, host="127.0.0.1", port=port, lifespan="off")
        server = uvicorn.Server(config)
        async with gateway.running(), anyio.create_task_group() as tasks:
            tasks.start_soon(server.serve)
            while not server.started:
                await anyio.sleep(0.02)
            try:
                yield Served(f"http://127.0.0.1:{port}/demo/mcp", daemon, tmp_path / "ran.txt")
            finally:
                server.should_exit = True


@contextlib.asynccontextmanager
async def listening_server(command: tuple[str, ...], wanted: bool) -> AsyncIterator[str | None]:
    """The test server on streamable HTTP (its URL), if `wanted`; else None."""
    if not wanted:
        yield None
        return
    port = free_port()
    process = await anyio.open_process([*command, "--http", str(port)])
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        async with httpx.AsyncClient() as http:
            with anyio.fail_after(30):
                while True:
                    with contextlib.suppress(httpx.HTTPError):
                        await http.get(url, timeout=1)
                        break
                    await anyio.sleep(0.1)
        yield url
    finally:
        process.terminate()
        await process.wait()
        await process.aclose()


@contextlib.asynccontextmanager
async def client(served: Served, token: str, mode: str = "auto") -> AsyncIterator[Client]:
    """The SDK's client of the gateway's `demo` server, with `token` on every request."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http:
        transport = streamable_http_client(served.url, http_client=http)
        async with Client(transport, mode=mode) as connected:
            yield connected


def text(result: Any) -> str:
    return "".join(part.text for part in result.content if isinstance(part, TextContent))


async def test_the_sdk_client_speaks_the_session_less_protocol(tmp_path: Path) -> None:
    async with serving_gateway(tmp_path) as served:
        async with client(served, ALICE) as alice:
            assert alice.protocol_version == "2026-07-28"
            first = await alice.call_tool("terminal", {"command": "echo 1"})
        assert (first.is_error, text(first)) == (False, "ran echo 1")


async def test_each_call_is_checked_as_the_tokens_user_and_settled(tmp_path: Path) -> None:
    async with serving_gateway(tmp_path) as served:
        async with client(served, ALICE) as alice, client(served, BOB) as bob:
            results = [
                await alice.call_tool("terminal", {"command": f"echo {n}"}) for n in range(4)
            ]
            bobs = await bob.call_tool("terminal", {"command": "echo bob"})
        # Three ran one after another (one at a time: each was settled), the fourth refused.
        assert [r.is_error for r in results] == [False, False, False, True]
        assert text(results[3]).startswith(RATE)
        assert bobs.is_error is False  # Bob's own counter
        assert await served.used("alice", "terminal-per-minute") == 3
        assert await served.used("alice", "one-at-a-time") == 0
        assert await served.used("bob", "terminal-per-minute") == 1


@pytest.mark.parametrize("url_upstream", [False, True], ids=["command", "url"])
async def test_a_call_is_checked_with_the_tools_annotations_unlisted_by_the_client(
    tmp_path: Path, url_upstream: bool
) -> None:
    """The channel reads the server's tools itself, in the client's envelope: a call made
    before the client listed anything is checked with its annotations, not unclassified."""
    async with (
        serving_gateway(tmp_path, url_upstream) as served,
        client(served, CAROL) as carol,
    ):
        dropped = await carol.call_tool("drop_table", {"table": "users"})
        read = await carol.call_tool("read_file", {"path": "notes"})
    assert dropped.is_error is True
    assert text(dropped).startswith(NO_DESTRUCTIVE)
    assert (read.is_error, text(read)) == (False, "contents of notes")
    assert served.ran.read_text().splitlines() == ["read_file notes"]


async def test_a_listening_client_hears_the_list_changed_and_the_policy_follows(
    tmp_path: Path,
) -> None:
    """`subscriptions/listen` is relayed on its own event stream; when the server says
    its tools changed, the channel reads them again (in the client's envelope) before the
    client hears it, so the next call is checked with the new annotations."""
    async with (
        serving_gateway(tmp_path) as served,
        client(served, CAROL) as carol,
        carol.listen(tools_list_changed=True) as changes,
    ):
        before = await carol.call_tool("shred", {"paper": "a"})
        armed = await carol.call_tool("arm", {})  # shred becomes destructive
        with anyio.fail_after(10):
            event = await changes.__anext__()
        after = await carol.call_tool("shred", {"paper": "b"})
    assert (before.is_error, armed.is_error) == (False, False)
    assert type(event).__name__ == "ToolsListChanged"
    assert after.is_error is True
    assert text(after).startswith(NO_DESTRUCTIVE)
    assert served.ran.read_text().splitlines() == ["shred a"]


async def test_every_request_needs_its_token(tmp_path: Path) -> None:
    async with serving_gateway(tmp_path) as served:
        envelope = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        }
        call: dict[str, Any] = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "terminal", "arguments": {"command": "x"}, "_meta": envelope},
        }
        headers = {
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": "tools/call",
            "mcp-name": "terminal",
        }
        async with httpx.AsyncClient(timeout=30) as http:
            # Alice has used the server: nothing of that lets a request without a token in.
            allowed = await http.post(
                served.url, json=call, headers={**headers, "authorization": f"Bearer {ALICE}"}
            )
            for authorization in ({}, {"authorization": "Bearer not-a-token"}):
                refused = await http.post(
                    served.url, json=call, headers={**headers, **authorization}
                )
                assert refused.status_code == 401
                assert "unidentified client" in refused.json()["error"]["message"]
            bearer = {"authorization": f"Bearer {ALICE}"}
            no_envelope = {**call, "params": {"name": "terminal", "arguments": {}}}
            bare = await http.post(served.url, json=no_envelope, headers={**headers, **bearer})
            mismatch = {**headers, **bearer, "mcp-protocol-version": "2026-07-28"}
            other = {**envelope, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}
            wrong = {**call, "params": {**call["params"], "_meta": other}}
            mismatched = await http.post(served.url, json=wrong, headers=mismatch)
            listening = await http.get(served.url, headers={**headers, **bearer})
            note = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 1},
            }
            noted = await http.post(served.url, json=note, headers={**headers, **bearer})
        assert allowed.status_code == 200
        assert allowed.json()["id"] == 1  # the client's own id, whatever the gateway sent on
        assert allowed.json()["result"]["content"][0]["text"] == "ran x"
        assert bare.status_code == 400
        assert "_meta" in bare.json()["error"]["message"]
        assert mismatched.status_code == 400
        assert listening.status_code == 405  # no GET stream on this protocol
        assert noted.status_code == 202
        assert served.ran.read_text().splitlines() == ["terminal x"]  # only the allowed one ran


async def test_an_ask_is_refused_saying_a_person_must_approve(tmp_path: Path) -> None:
    async with serving_gateway(tmp_path) as served:
        async with client(served, ALICE) as alice:
            result = await alice.call_tool("deploy", {"target": "prod"})
        assert result.is_error is True
        assert ASK in text(result)
        assert APPROVAL_NEEDED in text(result)
        assert not served.ran.exists()


async def test_a_call_whose_client_leaves_frees_its_slot(tmp_path: Path) -> None:
    async with serving_gateway(tmp_path) as served:
        async with client(served, ALICE) as alice:
            with anyio.move_on_after(2):  # the SDK cancels by closing the call's POST
                await alice.call_tool("hang", {"label": "left"})
            assert served.ran.read_text().splitlines() == ["hang left started"]
            with anyio.fail_after(10):
                while await served.used("alice", "one-at-a-time"):
                    await anyio.sleep(0.05)
            # The slot is free: the next call runs (one at a time would refuse it otherwise).
            with anyio.move_on_after(1):
                await alice.call_tool("hang", {"label": "again"})
        assert served.ran.read_text().splitlines() == ["hang left started", "hang again started"]


async def test_a_raw_client_that_hangs_up_frees_its_slot(tmp_path: Path) -> None:
    async with serving_gateway(tmp_path) as served:
        async with client(served, ALICE) as alice:
            await alice.list_tools()  # the channel is open
            # A plain HTTP client gives up mid-call: the gateway sees the disconnect.
            envelope = {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
            }
            call = {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {"name": "hang", "arguments": {"label": "raw"}, "_meta": envelope},
            }
            headers = {
                "accept": "application/json",
                "mcp-protocol-version": "2026-07-28",
                "mcp-method": "tools/call",
                "mcp-name": "hang",
                "authorization": f"Bearer {ALICE}",
            }
            async with httpx.AsyncClient() as http:
                with contextlib.suppress(httpx.ReadTimeout):
                    await http.post(served.url, json=call, headers=headers, timeout=1)
            with anyio.fail_after(10):
                while await served.used("alice", "one-at-a-time"):
                    await anyio.sleep(0.05)
            with anyio.move_on_after(1):  # let in: its slot was free
                await alice.call_tool("hang", {"label": "again"})
        assert served.ran.read_text().splitlines() == ["hang raw started", "hang again started"]


async def test_the_session_protocols_still_work(tmp_path: Path) -> None:
    async with serving_gateway(tmp_path) as served:
        async with client(served, BOB, mode="legacy") as bob:
            assert bob.protocol_version != "2026-07-28"
            results = [await bob.call_tool("terminal", {"command": f"s{n}"}) for n in range(4)]
            asked = await bob.call_tool("deploy", {"target": "prod"})  # declares no elicitation
        assert [r.is_error for r in results] == [False, False, False, True]
        assert text(results[3]).startswith(RATE)
        assert APPROVAL_NEEDED in text(asked)
        assert await served.used("bob", "one-at-a-time") == 0
