"""A gateway session's upstream, started at the first request that needs it.

Each session of a command upstream holds a server process (about 70 MB), and a client may
open a session it never uses: so opening one starts nothing. The session's `initialize`
is answered with the greeting this upstream gave an earlier session asking the same
protocol version (`Greetings`); `ping` is answered here; the client's
`notifications/initialized` and the relay's own `tools/list` wait. The first request of
the client's that needs the server (any but `initialize` and `ping`) starts it: the
client's `initialize` is sent as the client sent it (its answer, already given, is read
and dropped), then what waited, in order. From then on messages pass straight through.

A greeting that is not known yet (the first session of a server, or a protocol version
not asked before) is the server's own: the session starts it at once, as every session
did before (`connect_now`: a server that cannot start is a 502), and keeps its answer for
later sessions. Only the protocol versions the SDK knows are kept, so a client naming
made-up versions gets no bigger table, only sessions that start at once (each of them
one of the user's few: `--max-user-sessions`).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from mcp import types
from mcp.shared.message import SessionMessage
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from ratewarden.mcp.relay import Incoming, Outgoing
from ratewarden.mcp.upstream import Upstream

__all__ = ["Greetings", "LazyServer", "lazily"]
log = logging.getLogger("ratewarden.mcp")

Greetings = dict[tuple[str, str], dict[str, Any]]  # (server, version asked) -> its result
GREETING_TIMEOUT_S = 30.0  # for a server started late to start and answer initialize
WITHOUT_SERVER = frozenset({"initialize", "ping"})  # the requests answered before it starts
# Notifications wait for the server in memory: past this many, it starts and takes them.
MAX_HELD = 64


@contextlib.asynccontextmanager
async def lazily(upstream: Upstream, greetings: Greetings) -> AsyncIterator[LazyServer]:
    """`upstream` for one session, started when needed until the session ends."""
    async with anyio.create_task_group() as tasks:
        server = LazyServer(upstream, greetings, tasks)
        tasks.start_soon(server.start_when_needed)
        try:
            yield server
        finally:
            tasks.cancel_scope.cancel()  # the server's process ends with the session


class LazyServer:
    """The server side of a session, as the relay reads and writes it (`streams`), with
    the client side watched (`watching`) for the first request that needs the server."""

    def __init__(self, upstream: Upstream, greetings: Greetings, tasks: TaskGroup) -> None:
        self.upstream, self.greetings, self._tasks = upstream, greetings, tasks
        # What the relay reads before the server speaks: greetings, pings' answers, errors.
        self._early_out, self._early = anyio.create_memory_object_stream[
            SessionMessage | Exception
        ](math.inf)
        self._server: tuple[Incoming, Outgoing] | None = None  # connected
        self._through = False  # greeted: messages pass straight through
        self._hello: SessionMessage | None = None  # the client's initialize
        self._answered = False  # ... answered from `greetings`
        self._held: list[SessionMessage] = []  # what waits for the server, in order
        self._needed = anyio.Event()
        self.ready = anyio.Event()  # the server answers (or failed to start: errors answer)
        self._failure: str | None = None

    @property
    def streams(self) -> tuple[Incoming, Outgoing]:
        return _FromServer(self), _ToServer(self)  # type: ignore[return-value]

    def watching(self, client: Incoming) -> Incoming:
        """The client's messages, unchanged; the first that needs the server starts it."""
        return _FromClient(client, self)  # type: ignore[return-value]

    def greeted(self, version: object) -> bool:
        """Whether an initialize asking `version` is answered without the server."""
        return (self.upstream.name, str(version)) in self.greetings

    async def connect_now(self) -> None:
        """Start the server now (its failure raised here)."""
        self._server = await self._tasks.start(self._connected)

    def need(self, item: SessionMessage) -> None:
        """A message from the client: a request other than initialize or ping starts it."""
        message = item.message
        if isinstance(message, types.JSONRPCRequest) and message.method not in WITHOUT_SERVER:
            self._needed.set()

    # -- before the server speaks -----------------------------------------------------------

    async def hold(self, item: SessionMessage) -> None:
        """A message the relay sends before the server is greeted."""
        message = item.message
        request = isinstance(message, types.JSONRPCRequest)
        if request and message.method == "ping":
            await self._answer(types.JSONRPCResponse(jsonrpc="2.0", id=message.id, result={}))
        elif self._failure is not None:  # nothing waits for a server that could not start
            if request:
                await self._fail(message.id)
        elif request and message.method == "initialize" and self._hello is None:
            self._hello = item
            await self._greet_from_memory(message)
        else:
            self._held.append(item)
            if len(self._held) > MAX_HELD:
                self._needed.set()

    async def _greet_from_memory(self, hello: types.JSONRPCRequest) -> None:
        greeting = self.greetings.get((self.upstream.name, str(_version(hello))))
        if greeting is None:
            self._needed.set()  # only the server knows what to answer
            return
        self._answered = True
        await self._answer(types.JSONRPCResponse(jsonrpc="2.0", id=hello.id, result=greeting))

    async def _answer(self, message: types.JSONRPCMessage) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await self._early_out.send(SessionMessage(message))

    async def _fail(self, request_id: types.RequestId) -> None:
        error = types.ErrorData(code=types.INTERNAL_ERROR, message=self._failure or "")
        await self._answer(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))

    # -- starting it --------------------------------------------------------------------------

    async def start_when_needed(self) -> None:
        await self._needed.wait()
        try:
            with anyio.fail_after(GREETING_TIMEOUT_S):
                if self._server is None:
                    self._server = await self._tasks.start(self._connected)
                await self._greet(*self._server)
        except Exception as exc:  # the server could not be started, or did not answer
            log.error("mcp: server %s: %s", self.upstream.name, type(exc).__name__)
            self._failure = (
                f"MCP server {self.upstream.name!r} is unavailable: {type(exc).__name__}"
            )
            await self._fail_held()
        finally:
            self.ready.set()

    async def _connected(self, *, task_status: TaskStatus[tuple[Incoming, Outgoing]]) -> None:
        async with self.upstream.connect() as server:
            task_status.started(server)
            await anyio.sleep_forever()

    async def _greet(self, incoming: Incoming, outgoing: Outgoing) -> None:
        """The client's initialize to the server, its answer read (and kept, and passed
        on unless it was given already), then what waited; then straight through."""
        assert self._hello is not None  # a request that needs the server comes after it
        hello = self._hello.message
        assert isinstance(hello, types.JSONRPCRequest)
        await outgoing.send(self._hello)
        async for item in incoming:
            answer = item.message if isinstance(item, SessionMessage) else None
            if not isinstance(answer, types.JSONRPCResponse | types.JSONRPCError):
                await self._early_out.send(item)  # what a server says before its answer
                continue
            if answer.id != hello.id:
                continue  # (nothing else was asked of it yet)
            self._remember(hello, answer)
            if not self._answered:
                await self._early_out.send(item)
            break
        else:
            raise anyio.EndOfStream
        while self._held:  # what comes meanwhile is held too: sent in its turn
            await outgoing.send(self._held.pop(0))
        self._through = True
        self._early_out.close()  # the relay reads on from the server itself

    def _remember(self, hello: types.JSONRPCRequest, answer: types.JSONRPCMessage) -> None:
        version = _version(hello)
        if isinstance(answer, types.JSONRPCResponse) and version in HANDSHAKE_PROTOCOL_VERSIONS:
            self.greetings.setdefault((self.upstream.name, str(version)), answer.result)

    async def _fail_held(self) -> None:
        held, self._held = self._held, []
        for item in held:
            if isinstance(item.message, types.JSONRPCRequest):
                await self._fail(item.message.id)
        if self._hello is not None and not self._answered:
            await self._fail(self._hello.message.id)


def _version(hello: types.JSONRPCRequest) -> object:
    return (hello.params or {}).get("protocolVersion")


class _FromClient:
    """The client's messages; each request that needs the server starts it."""

    def __init__(self, client: Incoming, server: LazyServer) -> None:
        self._client, self._server = client, server

    async def __aenter__(self) -> _FromClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    def __aiter__(self) -> _FromClient:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            item = await self._client.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None
        if not self._server._through and isinstance(item, SessionMessage):
            self._server.need(item)
        return item


class _FromServer:
    """What the relay reads from the server: the early answers, then the server's own."""

    def __init__(self, server: LazyServer) -> None:
        self._server = server

    async def __aenter__(self) -> _FromServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._server._early.aclose()
        if self._server._server is not None:
            await self._server._server[0].aclose()

    def __aiter__(self) -> _FromServer:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self._server._early.receive()
        except anyio.EndOfStream:
            pass
        assert self._server._server is not None  # the early stream closes once greeted
        try:
            return await self._server._server[0].receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


class _ToServer:
    """What the relay sends the server: held until it is greeted, then sent on."""

    def __init__(self, server: LazyServer) -> None:
        self._server = server

    async def send(self, item: SessionMessage) -> None:
        if self._server._through:
            assert self._server._server is not None
            await self._server._server[1].send(item)
        else:
            await self._server.hold(item)

    async def aclose(self) -> None:
        if self._server._server is not None:
            await self._server._server[1].aclose()
