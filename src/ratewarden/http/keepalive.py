"""HTTP/1.1 to one server on kept-alive asyncio connections: what the async clients send
their checks and settles to the daemon on, and the MCP gateway its messages to a plain
http:// upstream (`ratewarden.mcp.http_upstream`).

Why not httpx here: a guard asks the daemon before every tool call, and an httpx async
request costs about 0.8 ms of CPU on this project's machines (its transport on anyio, its
URL and model objects), against 0.2 ms for the whole round trip on a bare asyncio
connection; the MCP proxy pays it twice per call (bench/mcp_overhead.py). Answers are
read by httptools (llhttp, the C parser uvicorn reads requests with, installed with it):
a round trip costs 13 us of client CPU here, against 86 us framed by h11. A request's
head is a few formatted lines, its header values refused if they could split it. The
clients keep httpx for what this does not do: `https://`, proxies, in-process transports.

A connection carries one request at a time; idle ones are reused, most recent first. One
the daemon has closed meanwhile (its keep-alive timeout) is noticed when it answers
nothing, and the request is sent once more on a new connection: a check sent twice keeps
its call id, so the daemon answers the second from its record instead of counting twice.

`stream` reads an answer as it arrives (the MCP gateway's server-sent events): the
timeout then bounds the wait for the answer's head only, and the connection is reused
only if the body was read to its end.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import NamedTuple
from urllib.parse import urlsplit

import httptools

from ratewarden.http import head

__all__ = ["KeepAlive", "Streamed", "Unreachable"]

MAX_IDLE = 16  # connections kept for reuse; more are closed when returned
READ_SIZE = 65536


class Unreachable(Exception):
    """No answer: the server could not be reached, broke off, or did not answer in time."""


class _Stale(Exception):
    """The connection was closed before the server answered anything."""


class _Answer:
    """What the parser has read of the answer under way (httptools' callbacks)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.reset()

    def reset(self) -> None:
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.head = self.done = self.keep_alive = False
        self.messages = 0  # begun since the request: more than one, and it is not reused

    def on_message_begin(self) -> None:
        self.messages += 1

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        if self.parser.get_status_code() < 200:  # an informational head: the answer follows
            self.headers = {}
        else:
            self.head = True
            self.keep_alive = self.parser.should_keep_alive()  # (read while in its head)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.done = self.head

    def delimited(self) -> bool:
        """Whether the answer says where its body ends (else the server's close ends it)."""
        return "content-length" in self.headers or "transfer-encoding" in self.headers


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.answer = _Answer()
        self.closed_by_server = False

    async def start(self, request: bytes) -> int:
        """Send one encoded request and read its answer's head: its status."""
        self.answer.reset()
        try:
            self.writer.write(request)
            await self.writer.drain()
        except ConnectionError:
            raise _Stale from None
        received = 0
        while not self.answer.head:
            if received > head.MAX_ANSWER_HEAD_BYTES:
                raise Unreachable(f"an answer whose head passed {head.MAX_ANSWER_HEAD_BYTES} bytes")
            read = await self._read()
            if not read:
                raise _Stale
            received += read
        return self.answer.parser.get_status_code()

    async def body(self) -> AsyncIterator[bytes]:
        """The answer's body, chunk by chunk as it arrives, to its end."""
        answer = self.answer
        while True:
            if answer.chunks:
                chunks, answer.chunks = answer.chunks, []
                for chunk in chunks:
                    yield chunk
            if answer.done:
                return
            if not await self._read():
                if answer.delimited():
                    raise Unreachable("the server closed the connection mid-answer")
                answer.done = self.closed_by_server = True  # its close was the body's end

    async def _read(self) -> int:
        """Feed the parser what has arrived: how many bytes (0 when the server has closed)."""
        try:
            data = await self.reader.read(READ_SIZE)
        except ConnectionError:
            data = b""
        if not data:
            return 0
        try:
            self.answer.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            raise Unreachable(f"a malformed answer: {exc}") from None
        return len(data)

    def reusable(self) -> bool:
        answer = self.answer
        return (
            answer.done and answer.keep_alive and answer.messages == 1 and not self.closed_by_server
        )

    def close(self) -> None:
        self.writer.close()


class Streamed(NamedTuple):
    """An answer being read: its status, its headers (names in lower case), its body."""

    status: int
    headers: dict[str, str]
    body: AsyncIterator[bytes]


class KeepAlive:
    """Requests to the `http://` server at `url` (a path in it prefixes every target),
    each with `headers`, answered within `timeout` seconds. Bound to the event loop that
    first uses it, as asyncio connections are."""

    def __init__(self, url: str, headers: Mapping[str, str], timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"KeepAlive speaks plain http://host[:port] only, not {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.headers = head.checked({"host": parts.netloc.rpartition("@")[2], **headers})
        self.timeout = timeout
        self._idle: list[_Connection] = []

    async def request(
        self, method: str, target: str, body: bytes = b"", content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        """(status, body) of one request; Unreachable when there is no answer."""
        headers = [*self.headers, ("content-length", str(len(body)))]
        if body:
            headers.append(("content-type", content_type))
        try:
            async with asyncio.timeout(self.timeout):
                return await self._send(head.encode(method, self.prefix + target, headers, body))
        except TimeoutError:
            raise self._timed_out() from None

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, target: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[Streamed]:
        """One request whose answer is read as it comes: its head within the timeout, its
        body for as long as it lasts. Unreachable when there is no answer; ValueError for
        a header value holding CR, LF or NUL."""
        sent = [*self.headers, *head.checked(headers or {}), ("content-length", str(len(body)))]
        request = head.encode(method, self.prefix + target, sent, body)
        try:
            async with asyncio.timeout(self.timeout):
                connection, status = await self._open(request)
        except TimeoutError:
            raise self._timed_out() from None
        try:
            yield Streamed(status, connection.answer.headers, connection.body())
        except BaseException:
            connection.close()  # its answer unread: the connection is of no further use
            raise
        self._release(connection)

    async def _send(self, request: bytes) -> tuple[int, bytes]:
        connection, status = await self._open(request)
        try:
            chunks = [chunk async for chunk in connection.body()]
        except BaseException:
            connection.close()
            raise
        self._release(connection)
        return status, b"".join(chunks)

    async def _open(self, request: bytes) -> tuple[_Connection, int]:
        """A connection with `request` sent on it and its answer's head read."""
        reused = bool(self._idle)
        connection = self._idle.pop() if reused else await self._connect()
        try:
            return connection, await self._start(connection, request)
        except _Stale:
            if not reused:
                raise Unreachable("the server closed the connection without answering") from None
            connection = await self._connect()  # once more, on a new connection
            return connection, await self._start(connection, request)

    def _release(self, connection: _Connection) -> None:
        if connection.reusable() and len(self._idle) < MAX_IDLE:
            self._idle.append(connection)
        else:
            connection.close()

    def _timed_out(self) -> Unreachable:
        return Unreachable(f"no answer from {self.host}:{self.port} in {self.timeout} s")

    async def _start(self, connection: _Connection, request: bytes) -> int:
        try:
            return await connection.start(request)
        except _Stale:
            connection.close()
            raise
        except OSError as exc:
            connection.close()
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None
        except BaseException:  # cancelled or timed out mid-request: its state is unknown
            connection.close()
            raise

    async def _connect(self) -> _Connection:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None
        return _Connection(reader, writer)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
            with contextlib.suppress(OSError):
                await connection.writer.wait_closed()
