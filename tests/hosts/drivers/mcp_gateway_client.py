"""The official MCP SDK client against `ratewarden mcp --listen` (the gateway), offline.

Runs in the mcp host venv; argv[1] is a JSON config (`gateway`: its base URL, `header_gateway`:
a second gateway taking users from a header, `tokens`: user -> token, `work`: where the
servers log their runs, `phase`). Each scenario is an SDK `ClientSession` over
`streamable_http_client`, as one user (the bearer token the gateway maps to them), or raw
HTTP where the SDK would hide what is tested. The report, one JSON line on stdout, holds
what the clients received and what the servers' tools wrote.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx2
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

CONFIG: dict[str, Any] = json.loads(sys.argv[1])
WORK = Path(CONFIG["work"])
INIT = {
    "protocolVersion": "2025-11-25",
    "capabilities": {},
    "clientInfo": {"name": "raw", "version": "0"},
}
ACCEPT = {"Accept": "application/json, text/event-stream"}


def text_of(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


def ran(server: str, marker: str) -> list[str]:
    """What `server`'s tools ran whose arguments hold `marker` (servers are shared)."""
    path = WORK / f"{server}.ran"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if marker in line]


def bearer(user: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {CONFIG['tokens'][user]}"}


async def session(
    server: str,
    headers: dict[str, str],
    scenario: Callable[[ClientSession], Awaitable[Any]],
    *,
    base: str | None = None,
    **callbacks: Any,
) -> Any:
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60))
    url = f"{base or CONFIG['gateway']}/{server}/mcp"
    async with (
        http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, **callbacks) as client,
    ):
        await client.initialize()
        return await scenario(client)


async def opened(
    http: httpx2.AsyncClient, url: str, headers: dict[str, str], init: dict[str, Any] = INIT
) -> dict[str, str]:
    """A session opened by raw HTTP (initialize, then initialized): the headers that go
    with each of its requests."""
    answer = await http.post(
        url,
        json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": init},
        headers=headers,
    )
    headers = headers | {
        "mcp-session-id": answer.headers["mcp-session-id"],
        "mcp-protocol-version": "2025-11-25",
    }
    await http.post(
        url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
    )
    return headers


async def calls(client: ClientSession, tool: str, arguments: list[dict[str, Any]]) -> list[Any]:
    results = []
    for args in arguments:
        result = await client.call_tool(tool, args)
        results.append({"text": text_of(result), "is_error": bool(result.is_error)})
    return results


async def limit(user: str = "gw-limit", marker: str = "L") -> dict[str, Any]:
    """Eleven terminal calls under 10/minute (and one at a time), over HTTP."""
    args = [{"command": f"echo {marker}{i}"} for i in range(1, 12)]
    results = await session("demo", bearer(user), lambda c: calls(c, "terminal", args))
    return {"results": results, "ran": ran("demo", f"echo {marker}")}


async def access() -> dict[str, Any]:
    async def scenario(client: ClientSession) -> Any:
        listed = await client.list_tools()
        annotations = {
            tool.name: tool.annotations.model_dump(by_alias=True, exclude_none=True)
            for tool in listed.tools
            if tool.annotations is not None
        }
        drop = await calls(client, "drop_table", [{"table": "gw-users"}])
        read = await calls(client, "read_file", [{"path": "gw-README"}])
        return {"annotations": annotations, "drop": drop, "read": read}

    report = await session("demo", bearer("mcp-demo"), scenario)
    return {**report, "ran": ran("demo", "gw-")}


async def budget(server: str = "demo", user: str = "gw-budget") -> dict[str, Any]:
    async def scenario(client: ClientSession) -> Any:
        bought = await calls(client, "slow_paid", [{"item": f"{user} {i}"} for i in range(3)])
        return bought + await calls(client, "failing", [{"reason": f"{user}-boom"}])

    results = await session(server, bearer(user), scenario)
    return {"results": results, "ran": ran(server, f"{user} ") + ran(server, f"{user}-boom")}


async def passthrough(server: str = "demo", user: str = "gw-pass") -> dict[str, Any]:
    """What a server asks of its client (progress, elicitation, sampling) over HTTP."""
    seen: dict[str, Any] = {}
    progress: list[Any] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        seen["elicit"] = params.message
        return types.ElicitResult(action="accept", content={"ok": True})

    async def on_sample(context: Any, params: types.CreateMessageRequestParams) -> Any:
        block = params.messages[0].content
        seen["sample"] = block.text if isinstance(block, types.TextContent) else "?"
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="fine"), model="m"
        )

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append([value, total, message])

    async def scenario(client: ClientSession) -> Any:
        resources = await client.list_resources()
        read = await client.read_resource("notes://today")
        result = await client.call_tool(
            "interactive", {"topic": f"{user}-dogs"}, progress_callback=on_progress
        )
        return {
            "resources": [str(r.uri) for r in resources.resources],
            "read": [c.text for c in read.contents if isinstance(c, types.TextResourceContents)],
            "interactive": text_of(result),
        }

    report = await session(
        server,
        bearer(user),
        scenario,
        elicitation_callback=on_elicit,
        sampling_callback=on_sample,
    )
    return {**report, "seen": seen, "progress": progress, "ran": ran(server, f"{user}-dogs")}


async def answer_forms(server: str = "demo") -> dict[str, Any]:
    """How a call is answered: an event stream to a client that can be asked (it declared
    elicitation) or to a call that asks for progress, else one JSON body."""
    url = f"{CONFIG['gateway']}/{server}/mcp"
    forms = {}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
        kinds: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
            ("asked", {"elicitation": {}}, {}),
            ("not asked", {}, {}),
            ("not asked, progress", {}, {"_meta": {"progressToken": "p-1"}}),
        ]
        for name, capabilities, extra in kinds:
            init = {**INIT, "capabilities": capabilities}
            headers = await opened(http, url, {**ACCEPT, **bearer("gw-forms")}, init)
            call = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {
                    "name": "read_file",
                    "arguments": {"path": f"gw-forms-{name}"},
                    **extra,
                },
            }
            answer = await http.post(url, json=call, headers=headers)
            kind = answer.headers["content-type"].split(";")[0]
            text = answer.text
            if kind == "text/event-stream":  # the result is the last event's data
                text = [line[5:] for line in text.splitlines() if line.startswith("data:")][-1]
            result = json.loads(text)["result"]
            forms[name] = {"content_type": kind, "text": result["content"][0]["text"]}
            await http.delete(url, headers=headers)
    return forms


async def progress_unasked(server: str = "demo", user: str = "gw-steps") -> dict[str, Any]:
    """A client that cannot be asked still hears the server's progress on its calls (on
    its session's GET stream, as its calls are answered in JSON)."""
    progress: list[Any] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append([value, total, message])

    async def scenario(client: ClientSession) -> Any:
        result = await client.call_tool(
            "steps", {"label": f"{user}-a"}, progress_callback=on_progress
        )
        # Progress and result travel apart: give the GET stream a moment to catch up.
        for _ in range(50):
            if len(progress) == 2:
                break
            await asyncio.sleep(0.1)
        return text_of(result)

    text = await session(server, bearer(user), scenario)
    return {"text": text, "progress": progress, "ran": ran(server, f"{user}-a")}


async def changed(server: str, user: str) -> dict[str, Any]:
    """The server marks `shred` destructive mid-session and says its list changed: the
    gateway reads the list again, and the next call meets the demo-mode rule."""
    notified = asyncio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(getattr(message, "root", message), types.ToolListChangedNotification):
            notified.set()

    async def scenario(client: ClientSession) -> Any:
        before = await calls(client, "shred", [{"paper": f"{user}-1"}])
        armed = await calls(client, "arm", [{}])
        await asyncio.wait_for(notified.wait(), 30)
        await asyncio.sleep(0.5)  # the gateway's own tools/list, sent as it relayed the news
        after = await calls(client, "shred", [{"paper": f"{user}-2"}])
        return {"before": before, "armed": armed, "after": after}

    report = await session(server, bearer(user), scenario, message_handler=on_message)
    return {**report, "ran": ran(server, f"shred {user}")}


async def ask_accepted() -> dict[str, Any]:
    asked: list[str] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})

    results = await session(
        "demo",
        bearer("gw-ask"),
        lambda c: calls(c, "deploy", [{"target": "gw-prod"}]),
        elicitation_callback=on_elicit,
    )
    return {"asked": asked, "results": results, "ran": ran("demo", "gw-prod")}


async def ask_on_the_call_stream() -> dict[str, Any]:
    """A client that opens no GET stream (raw HTTP) still gets the ask: on the stream of
    the call it is about, where it answers it, then reads the call's result."""
    url = f"{CONFIG['gateway']}/demo/mcp"
    headers = {**ACCEPT, **bearer("gw-ask-raw")}
    init = {**INIT, "capabilities": {"elicitation": {}}}
    seen: list[str] = []
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=60)) as http:
        headers = await opened(http, url, headers, init)
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "deploy", "arguments": {"target": "gw-raw"}},
        }
        result: dict[str, Any] = {}
        try:
            async with (
                asyncio.timeout(30),  # the stream stays open (pings) while nothing comes
                http.stream("POST", url, json=call, headers=headers) as answer,
            ):
                async for line in answer.aiter_lines():
                    if not line.startswith("data:") or not line[5:].strip():
                        continue
                    message = json.loads(line[5:])
                    seen.append(message.get("method") or f"result of {message.get('id')}")
                    if message.get("method") == "elicitation/create":
                        reply = {"action": "accept", "content": {"approve": True}}
                        await http.post(
                            url,
                            json={"jsonrpc": "2.0", "id": message["id"], "result": reply},
                            headers=headers,
                        )
                    elif message.get("id") == 1:
                        result = message["result"]
                        break
        except TimeoutError:
            seen.append("nothing more in 30 s")
        await http.delete(url, headers=headers)
    return {"seen": seen, "is_error": result.get("isError", False), "ran": ran("demo", "gw-raw")}


async def web() -> dict[str, Any]:
    """The server behind a URL: its tools reach the daemon as `web.<tool>`."""
    args = [{"command": f"echo W{i}"} for i in range(1, 4)]
    results = await session("web", bearer("gw-web"), lambda c: calls(c, "terminal", args))
    return {"results": results, "ran": ran("web", "echo W")}


async def arguments(server: str) -> dict[str, Any]:
    """A call an args rule refuses by its arguments, and one it lets through."""
    user = f"gw-{server}-args"
    args = [{"command": "rm -rf / --no-preserve-root"}, {"command": f"ls /{user}"}]
    # Issue 25: the same command padded past the wire's caps is still refused (a body
    # nested past them the gateway refuses itself, unread: test_mcp_gateway_limits.py).
    pads: list[dict[str, Any]] = [{"pad": "x" * 70_000}, {"escapes": ["\u0001" * 100] * 500}]
    args += [{"command": "rm -rf / --no-preserve-root", **pad} for pad in pads]
    results = await session(server, bearer(user), lambda c: calls(c, "terminal", args))
    return {"results": results, "ran": ran(server, user) + ran(server, "rm -rf")}


async def unidentified() -> dict[str, Any]:
    """Requests with no user are refused before any server sees them."""
    report: dict[str, Any] = {}
    body = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT}
    url = f"{CONFIG['gateway']}/demo/mcp"
    async with httpx2.AsyncClient(timeout=10) as http:
        for name, headers in {
            "none": {},
            "wrong": {"Authorization": "Bearer not-a-token-of-this-gateway"},
            "header_only": {"X-User": "mallory"},  # this gateway believes no header
        }.items():
            answer = await http.post(url, json=body, headers={**ACCEPT, **headers})
            report[name] = {
                "status": answer.status_code,
                "body": answer.json(),
                "www_authenticate": answer.headers.get("www-authenticate"),
            }
        unknown = await http.post(
            f"{CONFIG['gateway']}/nowhere/mcp", json=body, headers={**ACCEPT, **bearer("gw-limit")}
        )
        report["unknown_server"] = {"status": unknown.status_code, "body": unknown.json()}
        # The session-less protocol: its user from the token too, on every request; and
        # an `initialize` sent as one of its requests is refused (it has no envelope).
        modern = {**ACCEPT, "MCP-Protocol-Version": "2026-07-28"}
        for name, headers in {
            "modern": modern,
            "modern_initialize": {**modern, **bearer("gw-limit")},
        }.items():
            answer = await http.post(url, json=body, headers=headers)
            report[name] = {"status": answer.status_code, "body": answer.json()}
    try:
        await session("demo", {}, lambda c: c.list_tools())
        report["sdk"] = "connected"
    except Exception as exc:  # what an SDK client reports when refused at connect
        while isinstance(exc, ExceptionGroup):  # the SDK's task groups wrap it
            exc = exc.exceptions[0]
        report["sdk"] = f"{type(exc).__name__}: {exc}"
    return report


async def hijack() -> dict[str, Any]:
    """Bob presents Alice's session id: the session answers as if it did not exist."""
    url = f"{CONFIG['gateway']}/demo/mcp"
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT}
    listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    async with httpx2.AsyncClient(timeout=30) as http:
        opened = await http.post(url, json=init, headers={**ACCEPT, **bearer("gw-alice")})
        session_id = opened.headers["mcp-session-id"]
        same = {"mcp-session-id": session_id, "mcp-protocol-version": "2025-11-25"}
        await http.post(
            url,
            json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers={**ACCEPT, **bearer("gw-alice"), **same},
        )
        bob = await http.post(url, json=listing, headers={**ACCEPT, **bearer("gw-bob"), **same})
        alice = await http.post(url, json=listing, headers={**ACCEPT, **bearer("gw-alice"), **same})
        other_server = await http.post(
            f"{CONFIG['gateway']}/web/mcp",
            json=listing,
            headers={**ACCEPT, **bearer("gw-alice"), **same},
        )
        await http.delete(url, headers={**bearer("gw-alice"), **same})
    return {
        "bob": bob.status_code,
        "alice": alice.status_code,
        "other_server": other_server.status_code,
    }


async def by_header() -> dict[str, Any]:
    """The second gateway believes the front proxy's header (from loopback)."""
    args = [{"command": "echo H1"}]
    results = await session(
        "demo",
        {"X-User": "gw-carol"},
        lambda c: calls(c, "terminal", args),
        base=CONFIG["header_gateway"],
    )
    # The peer is the socket's: an X-Forwarded-For header does not make the loopback
    # proxy someone else (were it believed, a peer could pose as a trusted proxy).
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT}
    async with httpx2.AsyncClient(timeout=30) as http:
        forwarded = await http.post(
            f"{CONFIG['header_gateway']}/demo/mcp",
            json=init,
            headers={**ACCEPT, "X-User": "gw-carol", "X-Forwarded-For": "203.0.113.9"},
        )
        if "mcp-session-id" in forwarded.headers:
            await http.delete(
                f"{CONFIG['header_gateway']}/demo/mcp",
                headers={
                    "X-User": "gw-carol",
                    "mcp-session-id": forwarded.headers["mcp-session-id"],
                },
            )
    return {"results": results, "ran": ran("demo", "echo H1"), "forwarded": forwarded.status_code}


async def left(how: str, server: str = "demo") -> dict[str, Any]:
    """A client whose call is running when it goes: `delete` ends its session (DELETE),
    `drop` just disconnects (the session ends at the gateway's idle timeout). Raw HTTP,
    so that no SDK session sends its courtesy cancel first."""
    url = f"{CONFIG['gateway']}/{server}/mcp"
    user = f"gw-{how}" if server == "demo" else f"gw-{server}-{how}"
    headers = {**ACCEPT, **bearer(user)}
    label = f"{user}-left"
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120)) as http:
        headers = await opened(http, url, headers)
        call = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "hang", "arguments": {"label": label}},
        }

        async def post_call() -> None:
            async with http.stream("POST", url, json=call, headers=headers) as answer:
                async for _ in answer.aiter_bytes():
                    pass

        task = asyncio.create_task(post_call())
        while not ran(server, label):  # the call reached the tool: it is in flight
            await asyncio.sleep(0.05)
        task.cancel()  # the client stops reading: the connection goes
        await asyncio.gather(task, return_exceptions=True)
        if how == "delete":
            deleted = await http.delete(url, headers=headers)
            return {"deleted": deleted.status_code, "ran": ran(server, label)}
    return {"ran": ran(server, label)}


async def main() -> None:
    if CONFIG["phase"] == "one daemon gone":
        report = {"limit": await limit(), "fresh": await limit("gw-fresh", "F")}
    else:
        report = {
            "limit": await limit(),
            "access": await access(),
            "budget": await budget(),
            "passthrough": await passthrough(),
            "ask_accepted": await ask_accepted(),
            "ask_on_the_call_stream": await ask_on_the_call_stream(),
            "answer_forms": await answer_forms(),
            "web_answer_forms": await answer_forms("web"),
            "progress_unasked": await progress_unasked(),
            "web_progress_unasked": await progress_unasked("web", "gw-web-steps"),
            "web": await web(),
            # The URL upstream, on the gateway's own streamable HTTP client, carries all
            # that the command upstream does.
            "web_budget": await budget("web", "gw-web-budget"),
            "web_passthrough": await passthrough("web", "gw-web-pass"),
            "web_deleted": await left("delete", "web"),
            "demo_changed": await changed("demo", "gw-demo-changed"),
            "web_changed": await changed("web", "gw-web-changed"),
            "demo_args": await arguments("demo"),
            "web_args": await arguments("web"),
            "unidentified": await unidentified(),
            "hijack": await hijack(),
            "by_header": await by_header(),
            "deleted": await left("delete"),
            "dropped": await left("drop"),
        }
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
