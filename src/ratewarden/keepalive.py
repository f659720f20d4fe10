"""HTTP/1.1 to one server on kept-alive asyncio connections, framed by h11: what the
async clients send their checks and settles to the daemon on, and the MCP gateway its
messages to a plain http:// upstream (`ratewarden.mcp.streamable`).

Why not httpx here: a guard asks the daemon before every tool call, and an httpx async
request costs about 0.8 ms of CPU on this project's machines (its transport on anyio, its
URL and model objects), against 0.2 ms for the whole round trip on a bare asyncio
connection; the MCP proxy pays it twice per call (bench/mcp_overhead.py). h11 (what
httpx's own transport frames HTTP/1.1 with) still reads and writes every message. The
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

import h11

__all__ = ["KeepAlive", "Streamed", "Unreachable"]

MAX_IDLE = 16  # connections kept for reuse; more are closed when returned
READ_SIZE = 65536


class Unreachable(Exception):
    """No answer: the daemon could not be reached, broke off, or did not answer in time."""


class _Stale(Exception):
    """The connection was closed before the daemon answered anything."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)

    async def start(self, request: bytes) -> h11.Response:
        """Send one encoded request and read its answer's head."""
        try:
            self.writer.write(request)
            await self.writer.drain()
        except ConnectionError:
            raise _Stale from None
        while True:
            event = await self._next(answered=False)
            if isinstance(event, h11.Response):
                return event  # (an informational 1xx head is passed over)

    async def body(self) -> AsyncIterator[bytes]:
        """The answer's body, chunk by chunk as it arrives, to its end."""
        while True:
            event = await self._next(answered=True)
            if isinstance(event, h11.Data):
                yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return

    async def _next(self, *, answered: bool) -> h11.Event:
        while (event := self.h11.next_event()) is h11.NEED_DATA:
            try:
                data = await self.reader.read(READ_SIZE)
            except ConnectionError:
                data = b""
            if not data and not answered:
                raise _Stale
            self.h11.receive_data(data)
        if isinstance(event, h11.ConnectionClosed):
            raise Unreachable("the server closed the connection mid-answer")
        if event is h11.PAUSED:  # (only after an answer's end, which ends every read)
            raise Unreachable("the server sent more than its answer")
        return event  # type: ignore[return-value]  # (NEED_DATA and PAUSED are handled)

    def encode(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> bytes:
        head = h11.Request(method=method, target=target, headers=headers)
        parts = [self.h11.send(head), self.h11.send(h11.Data(data=body)) if body else None]
        return b"".join(part for part in [*parts, self.h11.send(h11.EndOfMessage())] if part)

    def reusable(self) -> bool:
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False

    def close(self) -> None:
        self.writer.close()


class Streamed(NamedTuple):
    """An answer being read: its status, its headers (names in lower case), its body."""

    status: int
    headers: dict[str, str]
    body: AsyncIterator[bytes]


class KeepAlive:
    """Requests to the `http://` daemon at `url` (a path in it prefixes every target),
    each with `headers`, answered within `timeout` seconds. Bound to the event loop that
    first uses it, as asyncio connections are."""

    def __init__(self, url: str, headers: Mapping[str, str], timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"KeepAlive speaks plain http://host[:port] only, not {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.prefix = parts.path.rstrip("/")
        host = parts.netloc.rpartition("@")[2]
        self.headers = [("host", host), *headers.items()]
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
                return await self._send(method, self.prefix + target, headers, body)
        except TimeoutError:
            raise self._timed_out() from None

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, target: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[Streamed]:
        """One request whose answer is read as it comes: its head within the timeout, its
        body for as long as it lasts. Unreachable when there is no answer."""
        sent = [*self.headers, *(headers or {}).items(), ("content-length", str(len(body)))]
        try:
            async with asyncio.timeout(self.timeout):
                connection, head = await self._open(method, self.prefix + target, sent, body)
        except TimeoutError:
            raise self._timed_out() from None
        fields = {
            name.decode("latin-1").lower(): value.decode("latin-1") for name, value in head.headers
        }
        try:
            yield Streamed(head.status_code, fields, self._guarded(connection.body()))
        except BaseException:
            connection.close()  # its answer unread: the connection is of no further use
            raise
        self._release(connection)

    async def _send(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, bytes]:
        connection, head = await self._open(method, target, headers, body)
        try:
            chunks = [chunk async for chunk in self._guarded(connection.body())]
        except BaseException:
            connection.close()
            raise
        self._release(connection)
        return head.status_code, b"".join(chunks)

    async def _open(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[_Connection, h11.Response]:
        """A connection with the request sent on it and its answer's head read."""
        reused = bool(self._idle)
        connection = self._idle.pop() if reused else await self._connect()
        try:
            return connection, await self._exchange(connection, method, target, headers, body)
        except _Stale:
            if not reused:
                raise Unreachable("the server closed the connection without answering") from None
            connection = await self._connect()  # once more, on a new connection
            return connection, await self._exchange(connection, method, target, headers, body)

    async def _guarded(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        try:
            async for chunk in body:
                yield chunk
        except (OSError, h11.ProtocolError) as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None

    def _release(self, connection: _Connection) -> None:
        if connection.reusable() and len(self._idle) < MAX_IDLE:
            self._idle.append(connection)
        else:
            connection.close()

    def _timed_out(self) -> Unreachable:
        return Unreachable(f"no answer from {self.host}:{self.port} in {self.timeout} s")

    async def _exchange(
        self,
        connection: _Connection,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> h11.Response:
        try:
            return await connection.start(connection.encode(method, target, headers, body))
        except _Stale:
            connection.close()
            raise
        except (OSError, h11.ProtocolError) as exc:
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
