"""The async clients' connections to the daemon (ratewarden.http.keepalive), against small
asyncio servers on loopback that each test scripts: one that answers, one that closes
idle connections, one that never answers, one that breaks off mid-answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from ratewarden.client import AsyncClient, ClientError, DaemonUnavailable
from ratewarden.http.head import MAX_ANSWER_HEAD_BYTES
from ratewarden.http.keepalive import KeepAlive, Unreachable
from ratewarden.wire.bodies import CheckRequest
from tests.helpers.redis_server import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[str, bytes] | None:
    """(request line, body) of the next request, None when the client has gone."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode().split("\r\n")
    length = next(
        (int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length")),
        0,
    )
    return lines[0], await reader.readexactly(length)


def answer(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n{extra}"
    return f"{head}content-length: {len(body)}\r\n\r\n".encode() + body


class Server:
    def __init__(self) -> None:
        self.connections = 0
        self.port = 0


@asynccontextmanager
async def serving(handle: Handler) -> AsyncIterator[Server]:
    server = Server()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        try:
            await handle(reader, writer)
        finally:
            writer.close()

    listening = await asyncio.start_server(connected, "127.0.0.1", 0)
    server.port = listening.sockets[0].getsockname()[1]
    async with listening:
        yield server


async def echo_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers each request with its request line and body, on the same connection."""
    while (request := await read_request(reader)) is not None:
        line, body = request
        writer.write(answer(json.dumps({"line": line, "body": body.decode()}).encode()))
        await writer.drain()


async def test_requests_share_one_kept_alive_connection() -> None:
    async with serving(echo_forever) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {"authorization": "Bearer t"}, 5)
        for n in range(5):
            status, body = await wire.request("POST", f"/v1/check?n={n}", b'{"n": %d}' % n)
            assert status == 200
            assert json.loads(body) == {
                "line": f"POST /v1/check?n={n} HTTP/1.1",
                "body": f'{{"n": {n}}}',
            }
        await wire.aclose()
    assert server.connections == 1


async def test_a_path_in_the_url_prefixes_every_request() -> None:
    async with serving(echo_forever) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}/ratewarden/", {}, 5)
        _, body = await wire.request("GET", "/v1/capabilities")
        assert json.loads(body)["line"] == "GET /ratewarden/v1/capabilities HTTP/1.1"
        await wire.aclose()


async def test_a_connection_the_daemon_closed_while_idle_is_replaced_unseen() -> None:
    async def one_answer_then_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        if await read_request(reader) is not None:  # keep-alive promised, then broken
            writer.write(answer(b"{}"))
            await writer.drain()

    async with serving(one_answer_then_close) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 5)
        for _ in range(4):
            assert await wire.request("POST", "/v1/check", b"{}") == (200, b"{}")
            await asyncio.sleep(0.05)  # the server's close reaches the idle connection
        await wire.aclose()
    assert server.connections == 4


async def test_a_frozen_daemon_is_unreachable_after_the_timeout() -> None:
    async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(30)

    async with serving(never_answers) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 0.2)
        with pytest.raises(Unreachable, match="no answer"):
            await wire.request("POST", "/v1/check", b"{}")
        await wire.aclose()


async def test_a_fresh_connection_closed_unanswered_is_not_retried_for_ever() -> None:
    async def hangs_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with serving(hangs_up) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 5)
        with pytest.raises(Unreachable, match="without answering"):
            await wire.request("POST", "/v1/check", b"{}")
    assert server.connections == 1


async def test_an_answer_broken_off_midway_is_unreachable() -> None:
    async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer(b'{"decision": "allow"}')[:-8])
        await writer.drain()

    async with serving(half) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 5)
        with pytest.raises(Unreachable):
            await wire.request("POST", "/v1/check", b"{}")


async def test_nothing_listening_is_unreachable() -> None:
    wire = KeepAlive(f"http://127.0.0.1:{free_port()}", {}, 5)
    with pytest.raises(Unreachable, match="ConnectionRefused"):
        await wire.request("GET", "/healthz")


async def test_a_chunked_answer_is_read_whole() -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            writer.write(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
            await writer.drain()

    async with serving(chunked) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 5)
        assert await wire.request("GET", "/") == (200, b"hello world")
        assert await wire.request("GET", "/") == (200, b"hello world")  # and reused after
        await wire.aclose()
    assert server.connections == 1


async def test_concurrent_requests_get_their_own_answers() -> None:
    async def slow_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            await asyncio.sleep(0.01)
            writer.write(answer(request[1]))
            await writer.drain()

    async with serving(slow_echo) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 5)
        bodies = [b'{"n": %d}' % n for n in range(40)]
        answers = await asyncio.gather(*(wire.request("POST", "/", body) for body in bodies))
        assert [body for _, body in answers] == bodies
        await wire.aclose()


async def test_a_request_cancelled_midway_does_not_poison_the_next() -> None:
    async def late_then_prompt(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = True
        while (request := await read_request(reader)) is not None:
            if first:
                first = False
                await asyncio.sleep(0.5)  # its answer would come after the cancel
            writer.write(answer(request[1]))
            await writer.drain()

    async with serving(late_then_prompt) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 5)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await wire.request("POST", "/", b'"first"')
        # Not the first answer, arriving late on a reused connection: a new connection.
        assert await wire.request("POST", "/", b'"second"') == (200, b'"second"')
        await wire.aclose()
    assert server.connections == 2


def test_only_plain_http_is_spoken() -> None:
    with pytest.raises(ValueError, match="plain http"):
        KeepAlive("https://daemon.example", {}, 1)


# -- through AsyncClient: the daemon's answers and refusals, as before -----------------------


async def test_the_client_maps_refusals_and_outages_as_it_did_over_httpx() -> None:
    async def by_path(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (request := await read_request(reader)) is not None:
            line = request[0]
            if "/v1/check" in line:
                error = {"error": "unauthorized", "message": "bad token", "fields": []}
                writer.write(answer(json.dumps(error).encode(), "401 Unauthorized"))
            else:
                writer.write(answer(b"{}", "503 Service Unavailable"))
            await writer.drain()

    async with serving(by_path) as server:
        client = AsyncClient(f"http://127.0.0.1:{server.port}", token="t")
        with pytest.raises(ClientError, match="bad token") as refused:
            await client.check(CheckRequest(user="u", tool="t"))
        assert refused.value.status == 401
        with pytest.raises(DaemonUnavailable, match="503"):
            await client.usage("u")
        await client.aclose()
    client = AsyncClient(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(DaemonUnavailable):
        await client.check(CheckRequest(user="u", tool="t"))
    await client.aclose()


async def test_a_streamed_answer_comes_as_it_is_sent_and_its_headers_are_read() -> None:
    release = asyncio.Event()

    async def events(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: s1\r\n"
            writer.write(f"{head}transfer-encoding: chunked\r\n\r\n".encode())
            writer.write(b"6\r\nfirst\n\r\n")
            await writer.drain()
            await release.wait()  # the second chunk only once the first was read
            writer.write(b"7\r\nsecond\n\r\n0\r\n\r\n")
            await writer.drain()
            release.clear()

    async with serving(events) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 5)
        for _ in range(2):
            async with wire.stream("POST", "/mcp", b"{}", {"accept": "text/event-stream"}) as got:
                assert got.status == 200
                assert got.headers["mcp-session-id"] == "s1"  # names in lower case
                assert await anext(got.body) == b"first\n"
                release.set()
                assert [chunk async for chunk in got.body] == [b"second\n"]
        await wire.aclose()
    assert server.connections == 1  # read to its end, the connection was reused


async def test_a_stream_left_unread_closes_its_connection() -> None:
    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\nmore\r\n")
            await writer.drain()

    async with serving(endless) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 5)
        for _ in range(2):
            async with wire.stream("GET", "/mcp") as got:
                assert await anext(got.body) == b"more"
        await wire.aclose()
    assert server.connections == 2  # its answer unfinished, a connection is not reused


async def test_a_header_value_that_would_split_the_request_is_refused() -> None:
    with pytest.raises(ValueError, match="'authorization'"):
        KeepAlive("http://127.0.0.1:1", {"authorization": "Bearer t\r\nx-admin: 1"}, 5)
    async with serving(echo_forever) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 5)
        for smuggled in ("s1\nx-admin: 1", "s1\r", "s\x001"):
            with pytest.raises(ValueError, match="'mcp-session-id'"):
                async with wire.stream("POST", "/mcp", b"{}", {"mcp-session-id": smuggled}):
                    pass
        await wire.aclose()
    assert server.connections == 0  # nothing was sent


async def test_an_answer_ended_by_the_close_is_read_whole_and_not_reused() -> None:
    async def close_delimited(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\npart one, part two")
            await writer.drain()

    async with serving(close_delimited) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 5)
        for _ in range(2):
            assert await wire.request("GET", "/") == (200, b"part one, part two")
        await wire.aclose()
    assert server.connections == 2


async def test_an_informational_head_is_passed_over_and_garbage_is_unreachable() -> None:
    async def early_hints(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n")
            writer.write(answer(b'{"ok": true}'))

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: nope\r\n\r\n")
            await writer.drain()

    async with serving(early_hints) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 5)
        async with wire.stream("GET", "/") as got:
            assert got.status == 200
            assert "link" not in got.headers
            assert [chunk async for chunk in got.body] == [b'{"ok": true}']
        await wire.aclose()
    async with serving(garbage) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 5)
        with pytest.raises(Unreachable, match="malformed"):
            await wire.request("GET", "/")
        await wire.aclose()


def endless_head(kind: str) -> Handler:
    """A server whose answer's head never ends: one header value that grows for ever,
    a header after header for ever, or informational heads one after another."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if await read_request(reader) is None:
            return
        opening = {"value": b"200 OK\r\nx-big: ", "headers": b"200 OK\r\n", "informational": b""}
        writer.write(b"HTTP/1.1 " + opening[kind] if opening[kind] else b"")
        n = 0
        with contextlib.suppress(ConnectionError):
            while not reader.at_eof():  # until the client hangs up
                if kind == "value":
                    writer.write(b"a" * 65536)
                elif kind == "headers":
                    writer.write(b"".join(b"x-%d: v\r\n" % (n + i) for i in range(2000)))
                else:
                    writer.write(b"HTTP/1.1 100 Continue\r\nx: y\r\n\r\n" * 2000)
                n += 2000
                await writer.drain()

    return handle


@pytest.mark.parametrize("kind", ["value", "headers", "informational"])
@pytest.mark.parametrize("streamed", [False, True], ids=["request", "stream"])
async def test_an_endless_head_is_refused_at_its_cap_not_read_until_the_timeout(
    kind: str, streamed: bool
) -> None:
    """An MCP upstream (or anything on the daemon's port) that sends an endless head is
    refused once it passes MAX_ANSWER_HEAD_BYTES: before, the head was grown into memory
    (400 MB in 5 s) until the timeout (the gateway's is 30 s)."""
    async with serving(endless_head(kind)) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 60)
        with pytest.raises(Unreachable, match=f"head passed {MAX_ANSWER_HEAD_BYTES} bytes"):
            await (opened(wire) if streamed else wire.request("GET", "/"))
        await wire.aclose()


async def opened(wire: KeepAlive) -> None:
    async with wire.stream("GET", "/"):
        pass


async def test_a_long_head_within_the_cap_is_read() -> None:
    headers = "".join(f"x-{n}: {'v' * 50}\r\n" for n in range(1000))  # about 58 KiB
    assert len(headers) < MAX_ANSWER_HEAD_BYTES

    async def long_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            writer.write(answer(b"{}", extra=headers))

    async with serving(long_head) as server:
        wire = KeepAlive(f"http://127.0.0.1:{server.port}", {}, 5)
        async with wire.stream("GET", "/") as got:
            assert got.status == 200
            assert len(got.headers) == 1002
            assert [chunk async for chunk in got.body] == [b"{}"]
        await wire.aclose()
