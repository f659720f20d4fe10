"""The gateway's own client of a URL upstream (`ratewarden.mcp.http_upstream`) against small
scripted HTTP servers, each answering as a careless or hostile upstream would.

Runs in the mcp host venv (the SDK's types parse every message). For each case, a client
sends `initialize` (and, where the case needs it, a `tools/call`) through the transport and
reports what came back on its read stream, and what the server received: one JSON line.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from mcp import types
from mcp.shared.message import SessionMessage

from ratewarden.http.sse import MAX_EVENT_BYTES
from ratewarden.mcp.http_upstream import streamable_http

Answer = Callable[[str, dict[str, str], bytes], Awaitable[bytes]]
INIT_RESULT = {
    "protocolVersion": "2025-11-25",
    "capabilities": {},
    "serverInfo": {"name": "scripted", "version": "0"},
}


def http(status: str, body: bytes, kind: str = "application/json", extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: {kind}\r\n{extra}content-length: {len(body)}"
    return f"{head}\r\n\r\n".encode() + body


def event(message: dict[str, Any]) -> bytes:
    return b"event: message\r\ndata: " + json.dumps(message).encode() + b"\r\n\r\n"


def result(request_id: object, value: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


async def serve(answer: Answer, seen: list[dict[str, Any]]) -> tuple[asyncio.Server, int]:
    """A server that reads each request and writes what `answer` makes of it."""

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, *fields = head.decode("latin-1").split("\r\n")
                headers = {
                    name.lower(): value.strip()
                    for name, _, value in (f.partition(":") for f in fields if f)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                seen.append({"line": line, "headers": headers})
                writer.write(await answer(line.split()[0], headers, body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(connected, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def initialize_answer(session_id: str = "s-1") -> bytes:
    body = json.dumps(result(0, INIT_RESULT)).encode()
    return http("200 OK", body, extra=f"mcp-session-id: {session_id}\r\n")


async def exchange(answer: Answer) -> dict[str, Any]:
    """initialize, notifications/initialized, then one tools/call: what the client got
    (every message up to each request's answer), and what the server was sent."""
    seen: list[dict[str, Any]] = []
    server, port = await serve(answer, seen)
    got: list[Any] = []
    async with server, streamable_http(f"http://127.0.0.1:{port}/mcp") as (incoming, outgoing):
        call = {"name": "echo", "arguments": {}}
        for request_id, method, params in [(0, "initialize", None), (1, "tools/call", call)]:
            request = types.JSONRPCRequest(
                jsonrpc="2.0", id=request_id, method=method, params=params
            )
            await outgoing.send(SessionMessage(request))
            while True:
                item = await asyncio.wait_for(incoming.receive(), 10)
                message = item.message if isinstance(item, SessionMessage) else item
                answered = isinstance(message, types.JSONRPCResponse | types.JSONRPCError)
                got.append(
                    message.model_dump(by_alias=True, exclude_none=True)
                    if answered
                    else type(message).__name__
                )
                if answered and message.id == request_id:
                    break
            if method == "initialize":
                initialized = types.JSONRPCNotification(
                    jsonrpc="2.0", method="notifications/initialized"
                )
                await outgoing.send(SessionMessage(initialized))
    return {"got": got, "seen": seen}


def scripted(call_answer: Callable[[dict[str, str], bytes], bytes]) -> Answer:
    """initialize answered properly; anything else answered by `call_answer`; DELETE 200."""

    async def answer(method: str, headers: dict[str, str], body: bytes) -> bytes:
        if method == "DELETE":
            return http("200 OK", b"")
        if method == "GET":
            return http("405 Method Not Allowed", b"")
        if json.loads(body).get("method") == "initialize":
            return initialize_answer()
        return call_answer(headers, body)

    return answer


async def main() -> None:
    call_result = result(1, {"content": [{"type": "text", "text": "ok"}], "isError": False})
    cases: dict[str, Answer] = {
        "json": scripted(lambda h, b: http("200 OK", json.dumps(call_result).encode())),
        "sse": scripted(
            lambda h, b: http(
                "200 OK",
                b": a comment\r\n\r\nid: 7\r\ndata:\r\n\r\n" + event(call_result),
                "text/event-stream",
            )
        ),
        "accepted": scripted(lambda h, b: http("202 Accepted", b"")),
        "gone": scripted(lambda h, b: http("404 Not Found", b"no such session", "text/plain")),
        "jsonrpc_error": scripted(
            lambda h, b: http(
                "400 Bad Request",
                json.dumps(
                    {"jsonrpc": "2.0", "id": None, "error": {"code": -32602, "message": "bad"}}
                ).encode(),
            )
        ),
        "huge_event": scripted(
            lambda h, b: http(
                "200 OK", b"data: " + b"x" * (MAX_EVENT_BYTES + 10) + b"\n\n", "text/event-stream"
            )
        ),
        "unanswered": scripted(
            lambda h, b: http(
                "200 OK",
                event({"jsonrpc": "2.0", "method": "notifications/message", "params": {}}),
                "text/event-stream",
            )
        ),
        "garbage": scripted(lambda h, b: b"HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n"),
    }
    report = {name: await exchange(answer) for name, answer in cases.items()}

    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
