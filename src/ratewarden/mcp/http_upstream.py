"""The gateway's client of a plain `http://` upstream: MCP's streamable HTTP transport on
kept-alive connections (`ratewarden.http.keepalive`).

Why not the SDK's `streamable_http_client` here: it costs the gateway about 1.5 ms of CPU
a call (a task and an httpx2 request per message, its SSE reader), which alone broke the
gateway's 2 ms budget (bench/mcp_overhead.py: 3.3 ms added with it, under 2 without).
The SDK still parses and writes every message (its `jsonrpc_message_adapter` and types);
this only carries them, as the specification's transport says:

- each message to the server is POSTed; its answer is `202` (nothing to say), one JSON
  message, or a stream of server-sent events ending with the request's response;
- the `Mcp-Session-Id` the server gave to `initialize` and the negotiated
  `Mcp-Protocol-Version` go with every later request;
- after `notifications/initialized`, a GET stream carries what the server sends unasked
  (list changes, its own requests), reopened when it ends;
- at the end, the session is DELETEd;
- a 2026-07-28 request (the gateway's channels, stateless.py) is POSTed with the routing
  headers its client sent (`ClientMessageMetadata.headers`), without a session, and is
  cancelled by closing its POST: its `notifications/cancelled` is not sent.

What it leaves out, unlike the SDK's client: resuming a broken event stream from its last
event id (the call's requester gets an error instead), following redirects, and `https://`
(such upstreams keep the SDK's client). A request the server does not answer properly is
answered here with a JSON-RPC error, so the relay settles its call.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
from anyio.abc import ObjectSendStream, TaskGroup
from mcp import types
from mcp.shared.message import ClientMessageMetadata, SessionMessage

from ratewarden.http.keepalive import KeepAlive, Streamed, Unreachable
from ratewarden.http.sse import MAX_EVENT_BYTES, EventReader

__all__ = ["streamable_http"]
log = logging.getLogger("ratewarden.mcp")

SESSION_ID = "mcp-session-id"
PROTOCOL_VERSION = "mcp-protocol-version"
ACCEPT = "application/json, text/event-stream"
HEAD_TIMEOUT_S = 30.0  # for an answer's head; its body (a tool's run) may take any time
GET_RETRY_S = 1.0  # before reopening the GET stream, unless the server says otherwise
GET_ATTEMPTS = 2  # consecutive failures to open it before giving up
DRAIN_S = 1.0  # after a call's response, for its stream to end (then its connection is reused)

Received = ObjectSendStream[SessionMessage | Exception]


@contextlib.asynccontextmanager
async def streamable_http(
    url: str, headers: Mapping[str, str] | None = None
) -> AsyncIterator[tuple[Any, ObjectSendStream[SessionMessage]]]:
    """A session with the MCP server at `url`: its message streams, as the SDK's client
    gives them (what it sends, as `SessionMessage`s or exceptions; what to send it).
    `headers` (the operator's, for this server: an API key) go with every request."""
    received, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](math.inf)
    outgoing, to_send = anyio.create_memory_object_stream[SessionMessage](math.inf)
    session = _Session(KeepAlive(url, dict(headers or {}), HEAD_TIMEOUT_S), received)
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(session.send_all, to_send, tasks)
            try:
                yield incoming, outgoing
            finally:
                tasks.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await session.close()
            await received.aclose()


class _Session:
    def __init__(self, http: KeepAlive, received: Received) -> None:
        self.http = http
        self.received = received
        self.session_id: str | None = None
        self.version: str | None = None
        self._initialize: types.RequestId | None = None  # its answer holds the version
        # The 2026-07-28 requests being answered: each one's POST, to close on a cancel.
        self._stateless: dict[Any, anyio.CancelScope] = {}

    async def send_all(self, messages: Any, tasks: TaskGroup) -> None:
        """POST each message as it comes, each on its own (answers arrive in any order)."""
        async with messages:
            async for item in messages:
                message = item.message
                if self._aborted(message):
                    continue
                headers = _own_headers(item)
                scope = anyio.CancelScope()
                if isinstance(message, types.JSONRPCRequest) and PROTOCOL_VERSION in headers:
                    self._stateless[message.id] = scope  # cancelled by closing its POST
                tasks.start_soon(self._post, message, headers, scope)
                if (
                    isinstance(message, types.JSONRPCNotification)
                    and message.method == "notifications/initialized"
                ):
                    tasks.start_soon(self._listen)

    def _aborted(self, message: types.JSONRPCMessage) -> bool:
        """A `notifications/cancelled` for a 2026-07-28 request: on that protocol a request
        is cancelled by closing its POST (there is no notification to send)."""
        if not isinstance(message, types.JSONRPCNotification):
            return False
        if message.method != "notifications/cancelled":
            return False
        scope = self._stateless.pop((message.params or {}).get("requestId"), None)
        if scope is None:
            return False
        scope.cancel()
        return True

    async def close(self) -> None:
        if self.session_id is not None:
            with contextlib.suppress(Unreachable), anyio.move_on_after(2):
                async with self.http.stream("DELETE", "", headers=self._headers()):
                    pass
        await self.http.aclose()

    def _headers(self, **more: str) -> dict[str, str]:
        headers = dict(more)
        if self.session_id is not None:
            headers[SESSION_ID] = self.session_id
        if self.version is not None:
            headers[PROTOCOL_VERSION] = self.version
        return headers

    # -- one message, POSTed --------------------------------------------------------------

    async def _post(
        self, message: types.JSONRPCMessage, own: dict[str, str], scope: anyio.CancelScope
    ) -> None:
        """POST one message with its own headers (a 2026-07-28 request's routing)."""
        body = message.model_dump_json(by_alias=True, exclude_unset=True).encode()
        request_id = message.id if isinstance(message, types.JSONRPCRequest) else None
        initialize = isinstance(message, types.JSONRPCRequest) and message.method == "initialize"
        if initialize:
            self._initialize = request_id
        headers = {**self._headers(accept=ACCEPT, **{"content-type": "application/json"}), **own}
        try:
            with scope:
                async with self.http.stream("POST", "", body, headers) as answer:
                    if initialize:
                        self.session_id = answer.headers.get(SESSION_ID, self.session_id)
                    await self._read(answer, request_id)
        except (Unreachable, ValueError) as exc:
            log.warning("mcp: an upstream request failed: %s", exc)
            if request_id is not None:
                await self._fail(request_id, types.INTERNAL_ERROR, f"upstream: {exc}")
        finally:
            if request_id is not None and self._stateless.get(request_id) is scope:
                del self._stateless[request_id]

    async def _read(self, answer: Streamed, request_id: types.RequestId | None) -> None:
        kind = answer.headers.get("content-type", "").lower()
        if request_id is None or answer.status == 202:
            async for _ in answer.body:  # read to the end, so the connection is reused
                pass
            if request_id is not None:
                await self._fail(request_id, types.INVALID_REQUEST, "server answered 202")
        elif answer.status >= 400:
            await self._refused(answer, request_id, kind)
        elif kind.startswith("application/json"):
            await self._deliver(await _whole(answer.body), request_id)
        elif kind.startswith("text/event-stream"):
            if not await self._events(answer.body, EventReader(), request_id):
                await self._fail(request_id, types.INTERNAL_ERROR, "stream ended unanswered")
        else:
            await _whole(answer.body)
            await self._fail(request_id, types.INVALID_REQUEST, f"content type {kind!r}")

    async def _refused(self, answer: Streamed, request_id: types.RequestId, kind: str) -> None:
        """A 4xx or 5xx: the JSON-RPC error it carries, else one standing for it."""
        body = await _whole(answer.body)
        if kind.startswith("application/json"):
            with contextlib.suppress(ValueError):
                error = types.jsonrpc_message_adapter.validate_json(body, by_name=False)
                if isinstance(error, types.JSONRPCError):
                    await self._put(
                        types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error.error)
                    )
                    return
        if answer.status == 404 and self.session_id is not None:
            await self._fail(request_id, types.INVALID_REQUEST, "Session terminated")
        else:
            await self._fail(request_id, types.INTERNAL_ERROR, f"HTTP {answer.status}")

    async def _events(
        self, body: AsyncIterator[bytes], reader: EventReader, request_id: types.RequestId | None
    ) -> bool:
        """Deliver each event's message; whether the request's response was among them.
        After the response the stream should end; it is given `DRAIN_S` to (else its
        connection is closed, not reused)."""
        answered = False
        with anyio.CancelScope() as scope:
            async for chunk in body:
                for data in reader.feed(chunk):
                    if await self._deliver(data, request_id) and not answered:
                        answered = True
                        scope.deadline = anyio.current_time() + DRAIN_S
            for data in reader.end():
                answered = await self._deliver(data, request_id) or answered
        return answered

    async def _deliver(self, data: bytes, request_id: types.RequestId | None) -> bool:
        """Pass one message on; whether it answers `request_id`."""
        try:
            message = types.jsonrpc_message_adapter.validate_json(data, by_name=False)
        except ValueError as exc:
            await self.received.send(exc)  # the relay drops what it cannot read
            return False
        answered = isinstance(message, types.JSONRPCResponse | types.JSONRPCError)
        if isinstance(message, types.JSONRPCResponse) and message.id == self._initialize:
            self.version = _version(message.result) or self.version
        await self._put(message)
        return answered and message.id == request_id

    async def _put(self, message: types.JSONRPCMessage) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            await self.received.send(SessionMessage(message))

    async def _fail(self, request_id: types.RequestId, code: int, text: str) -> None:
        error = types.ErrorData(code=code, message=text)
        await self._put(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))

    # -- what the server sends unasked ----------------------------------------------------

    async def _listen(self) -> None:
        """The GET stream, reopened (from its last event) when it ends, until it cannot be
        opened `GET_ATTEMPTS` times running or the server has none (405)."""
        reader, failures = EventReader(), 0
        while failures < GET_ATTEMPTS:
            headers = self._headers(accept="text/event-stream")
            if reader.last_id is not None:
                headers["last-event-id"] = reader.last_id
            try:
                async with self.http.stream("GET", "", headers=headers) as answer:
                    if answer.status != 200:
                        await _whole(answer.body)
                        if answer.status == 405:
                            return
                        failures += 1
                    else:
                        failures = 0
                        await self._events(answer.body, reader, None)
            except (Unreachable, ValueError) as exc:
                log.debug("mcp: the upstream's GET stream broke: %s", exc)
                failures += 1
            await anyio.sleep(GET_RETRY_S if reader.retry_s is None else reader.retry_s)


def _own_headers(item: SessionMessage) -> dict[str, str]:
    """The headers a message carries for its POST (a 2026-07-28 request's routing)."""
    metadata = item.metadata
    headers = metadata.headers if isinstance(metadata, ClientMessageMetadata) else None
    return {name.lower(): value for name, value in (headers or {}).items()}


async def _whole(body: AsyncIterator[bytes]) -> bytes:
    chunks, size = [], 0
    async for chunk in body:
        size += len(chunk)
        if size > MAX_EVENT_BYTES:
            raise ValueError(f"an answer longer than {MAX_EVENT_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _version(result: Mapping[str, Any] | Any) -> str | None:
    """The protocol version an `initialize` result agreed on (else None)."""
    version = result.get("protocolVersion") if isinstance(result, Mapping) else None
    return version if isinstance(version, str) else None
