"""The gateway's 2026-07-28 requests: the session-less protocol, one channel per user.

A request of the 2026-07-28 protocol is one POST (header `MCP-Protocol-Version:
2026-07-28`) carrying its own envelope in `params._meta` (the protocol version, the
client's capabilities and info): no `initialize`, no session id, no requests from the
server to the client, and a call is cancelled by closing its response. Claude Code 2.x
speaks it (it opens with `server/discover`, then lists, listens and calls).

The gateway serves each user's such requests to one server through a `Channel`: a
connection of its own to the upstream (a process for a command, the URL's client),
opened at the user's first request and closed once idle (`--idle-timeout`), relayed by
a `relay.Relay` whose `SessionGuard` is the user's, as a session's is. So a channel keeps
what a session keeps: the tools' annotations read from the user's `tools/list` answers
(and read again, with the user's envelope, when a listening user hears the list
changed), and each `tools/call` is checked as the user whose bearer token came with it,
then settled when the server answers. Requests of one channel share its connection, so
the gateway gives each an id of its own (`rw-<n>`) and the client's back on its answer;
a progress token is renamed the same way, and a `subscriptions/listen` stream's frames
carry the client's id again.

- **Answers.** One JSON body, unless something may come before it (a progress token in
  `_meta`, or `subscriptions/listen`, whose answer is a stream), and the client accepts
  an event stream: then the request's notifications go out on its own stream, its answer
  last. A JSON-RPC error is answered with the status the SDK's table gives its code.
- **Bounds.** A channel holds `MAX_LISTENS` listens and `MAX_IN_FLIGHT` requests at once:
  a listen is open by design and keeps no channel busy, so it must be counted somewhere.
- **Gone.** A client that closes its request before the answer has cancelled it: the
  relay hears `notifications/cancelled` for it (the server stops it, the guard settles
  it as cancelled or drops it unchecked), so its concurrency slot is free.
- **Asks.** Nobody can be asked (no `initialize` declared elicitation; the protocol has
  no server-to-client requests): an `ask` is refused saying a person's approval is
  needed (`vocabulary.needs_approval`). A server's own request is answered with an error.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp import types
from mcp.shared.inbound import (
    ERROR_CODE_HTTP_STATUS,
    MCP_METHOD_HEADER,
    MCP_NAME_HEADER,
    MCP_PARAM_HEADER_PREFIX,
    MCP_PROTOCOL_VERSION_HEADER,
    InboundLadderRejection,
    classify_inbound_request,
    find_duplicated_routing_header,
)
from mcp.shared.message import ClientMessageMetadata, SessionMessage
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from ratewarden.mcp.guard import Daemon, SessionGuard
from ratewarden.mcp.relay import Relay
from ratewarden.mcp.upstream import Upstream

__all__ = ["Channel", "StatelessRequest", "read_request"]
log = logging.getLogger("ratewarden.mcp")

LISTEN = "subscriptions/listen"
ENVELOPE = (PROTOCOL_VERSION_META_KEY, CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY)
# The headers a client's request carries for its server (routing, and arguments mirrored
# by Mcp-Param-*): passed on with it. Never its Authorization: that is the gateway's.
ROUTING = (MCP_PROTOCOL_VERSION_HEADER, MCP_METHOD_HEADER, MCP_NAME_HEADER)
PARAM_PREFIX = MCP_PARAM_HEADER_PREFIX.lower()
SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]
PING_S = 15.0  # a comment on a quiet event stream, so a proxy's read timeout keeps it
# A user's requests open at once on one channel. A listen is kept open by design and
# does not keep the channel busy, so without a cap a client could hold streams (and the
# server's side of each) by the thousand; a user's few agents need a handful of each.
MAX_LISTENS = 16
MAX_IN_FLIGHT = 256
TOO_MANY = "ratewarden MCP gateway: {} open on this server for this user; close some first"
NO_BACK_CHANNEL = "the client speaks the session-less MCP protocol: it takes no server requests"


def _error(status: int, code: int, message: str, request_id: object = None) -> Response:
    body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    return JSONResponse(body, status_code=status)


@dataclass(frozen=True)
class StatelessRequest:
    """One 2026-07-28 request as the client sent it."""

    message: dict[str, Any]  # the JSON-RPC request
    headers: dict[str, str]  # those passed on to the server (ROUTING, Mcp-Param-*)
    streamed: bool  # answered as an event stream

    @property
    def method(self) -> str:
        return str(self.message["method"])


def read_request(scope: Scope, body: bytes) -> StatelessRequest | Response:
    """The request in `body`, or the answer refusing it (a notification: 202)."""
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError):
        return _error(400, types.PARSE_ERROR, "Parse error")
    if isinstance(decoded, dict) and "id" not in decoded and isinstance(decoded.get("method"), str):
        # The protocol has no notifications from a client over HTTP (a call is cancelled
        # by closing its stream): acknowledged and dropped, as the SDK's server does.
        return Response(status_code=202)
    try:
        types.JSONRPCRequest.model_validate(decoded)
    except ValueError:
        message = "Body must be a single JSON-RPC request or notification object"
        return _error(400, types.INVALID_REQUEST, message)
    pairs = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]]
    if (twice := find_duplicated_routing_header(pairs)) is not None:
        return _error(400, types.INVALID_REQUEST, f"{twice} header given twice", decoded["id"])
    headers = dict(pairs)
    # The whole ladder, headers too, as the SDK's server runs it: the routing headers go on
    # to a URL server (and whatever routes by them) while the policy reads the body, so a
    # request whose `Mcp-Method` or `Mcp-Name` says something else is refused here.
    verdict = classify_inbound_request(decoded, headers=headers)
    if isinstance(verdict, InboundLadderRejection):
        status = ERROR_CODE_HTTP_STATUS.get(verdict.code, 400)
        return _error(status, verdict.code, verdict.message, decoded["id"])
    accept = headers.get("accept", "")
    may_precede = decoded["method"] == LISTEN or _progress_token(decoded) is not None
    passed = {
        name: value
        for name, value in headers.items()
        if name in ROUTING or name.startswith(PARAM_PREFIX)
    }
    return StatelessRequest(decoded, passed, may_precede and "text/event-stream" in accept)


def _meta(message: Mapping[str, Any]) -> dict[str, Any] | None:
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, Mapping) else None
    return meta if isinstance(meta, dict) else None


def _progress_token(message: Mapping[str, Any]) -> object:
    token = (_meta(message) or {}).get("progressToken")
    return token if isinstance(token, str | int) and not isinstance(token, bool) else None


@dataclass
class _Pending:
    """A request out on the channel: what comes back for it, and the client's names."""

    client_id: types.RequestId
    client_token: object
    listening: bool
    out: MemoryObjectSendStream[types.JSONRPCMessage]
    into: MemoryObjectReceiveStream[types.JSONRPCMessage]


@dataclass
class Channel:
    """One user's session-less requests to one server (module docstring)."""

    user: str
    upstream: Upstream
    daemon: Daemon
    team: str | None = None
    idle_timeout: float | None = 1800.0
    last_used: float = field(default_factory=anyio.current_time)
    closed: bool = False

    def __post_init__(self) -> None:
        self.name = uuid.uuid4().hex
        self._to_relay, self._relay_in = anyio.create_memory_object_stream[
            SessionMessage | Exception
        ](math.inf)
        self._relay_out, self._from_relay = anyio.create_memory_object_stream[SessionMessage](
            math.inf
        )
        self._pending: dict[str, _Pending] = {}
        self._ids = itertools.count(1)
        self._envelope: dict[str, Any] = {}  # the user's latest: for the relay's own requests
        self._relay: Relay | None = None
        self._listed = False  # the channel read the server's tools itself

    @property
    def busy(self) -> bool:
        """Whether a request other than a listen is being answered."""
        return any(not pending.listening for pending in self._pending.values())

    async def run(self, *, task_status: TaskStatus[None]) -> None:
        """Connect to the server (its failure raised before `started`), relay until idle
        or until the server ends, then close: what is still out is settled as abandoned."""
        started = False
        try:
            async with self.upstream.connect() as server:
                guard = SessionGuard(
                    self.daemon,
                    user=self.user,
                    team=self.team,
                    session=self.name,
                    server=self.upstream.name,
                )
                self._relay = Relay(
                    guard, (self._relay_in, self._relay_out), server, stamp=self._stamp
                )
                task_status.started()
                started = True
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._dispatch)
                    tasks.start_soon(self._expire, tasks.cancel_scope)
                    await self._relay.run()
                    tasks.cancel_scope.cancel()
        except Exception as exc:
            if not started:
                raise
            # Only its type: the text of an error about a message may quote the message.
            log.error("mcp: a channel to %s ended by %s", self.upstream.name, type(exc).__name__)
        finally:
            self.closed = True
            for pending in list(self._pending.values()):
                pending.out.close()  # its client is answered that the server went away
            self._pending.clear()
            for stream in (self._to_relay, self._relay_in, self._relay_out, self._from_relay):
                stream.close()

    async def _expire(self, scope: anyio.CancelScope) -> None:
        """End the channel once nothing but listens is in flight for `idle_timeout`."""
        if self.idle_timeout is None:
            return
        while True:
            quiet = anyio.current_time() - self.last_used
            if not self.busy and quiet >= self.idle_timeout:
                scope.cancel()  # the relay settles what is still out as abandoned
                return
            await anyio.sleep(1.0 if self.busy else max(0.5, self.idle_timeout - quiet))

    def _stamp(self, request: types.JSONRPCRequest) -> SessionMessage:
        """A request of the relay's own (its `tools/list`) in the user's envelope."""
        if not self._envelope:
            return SessionMessage(request)
        params = {**(request.params or {}), "_meta": dict(self._envelope)}
        stamped = request.model_copy(update={"params": params})
        headers = {
            MCP_PROTOCOL_VERSION_HEADER: str(self._envelope[PROTOCOL_VERSION_META_KEY]),
            MCP_METHOD_HEADER: request.method,
        }
        return SessionMessage(stamped, metadata=ClientMessageMetadata(headers=headers))

    # -- one request ------------------------------------------------------------------------

    async def answer(
        self, request: StatelessRequest, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Send `request` to the server through the relay and answer its client; a client
        gone before its answer cancels it."""
        if (crowded := self._crowded(request)) is not None:
            await _error(429, types.INTERNAL_ERROR, crowded, request.message["id"])(
                scope, receive, send
            )
            return
        our_id = f"rw-{next(self._ids)}"
        meta = _meta(request.message) or {}
        self._envelope = {key: meta[key] for key in ENVELOPE if key in meta}
        if not self._listed and self._relay is not None:
            # Opened after its client listed the tools, maybe long ago: the channel reads
            # them itself, and a call waits for that (relay.py), so none goes unclassified.
            self._listed = True
            await self._relay.list_tools()
        pending = self._send_on(request, our_id)
        answered = False

        async def respond() -> None:
            nonlocal answered
            if request.streamed:
                await self._stream(pending, send)
            else:
                await self._json(pending, scope, receive, send)
            answered = True

        try:
            async with anyio.create_task_group() as tasks:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tasks.cancel_scope.cancel()  # the client left: stop answering it

                tasks.start_soon(watch)
                await respond()
                tasks.cancel_scope.cancel()
        finally:
            self.last_used = anyio.current_time()
            pending.out.close()
            pending.into.close()
            if self._pending.pop(our_id, None) is not None and not answered:
                with anyio.CancelScope(shield=True):
                    await self._cancel(our_id)

    def _crowded(self, request: StatelessRequest) -> str | None:
        """Why `request` finds no room on the channel (MAX_LISTENS, MAX_IN_FLIGHT), or None."""
        if len(self._pending) >= MAX_IN_FLIGHT:
            return TOO_MANY.format(f"{MAX_IN_FLIGHT} requests")
        if request.method == LISTEN:
            listens = sum(pending.listening for pending in self._pending.values())
            if listens >= MAX_LISTENS:
                return TOO_MANY.format(f"{MAX_LISTENS} listens")
        return None

    def _send_on(self, request: StatelessRequest, our_id: str) -> _Pending:
        message = dict(request.message)
        client_id, client_token = message["id"], _progress_token(message)
        message["id"] = our_id
        meta = _meta(message)
        if meta is not None and client_token is not None:
            params = dict(message["params"])  # renamed: two requests may name the same one
            params["_meta"] = {**meta, "progressToken": our_id}
            message["params"] = params
        out, into = anyio.create_memory_object_stream[types.JSONRPCMessage](math.inf)
        pending = _Pending(client_id, client_token, request.method == LISTEN, out, into)
        self._pending[our_id] = pending
        parsed = types.JSONRPCRequest.model_validate(message)
        metadata = ClientMessageMetadata(headers=dict(request.headers))
        try:
            self._to_relay.send_nowait(SessionMessage(parsed, metadata=metadata))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            out.close()  # the channel closed meanwhile: its client is told the server went
        return pending

    async def _cancel(self, our_id: str) -> None:
        params = {"requestId": our_id, "reason": "the client closed its request"}
        note = types.JSONRPCNotification(
            jsonrpc="2.0", method="notifications/cancelled", params=params
        )
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._to_relay.send_nowait(SessionMessage(note))

    async def _json(self, pending: _Pending, scope: Scope, receive: Receive, send: Send) -> None:
        async for message in pending.into:
            if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
                await self._write(message, scope, receive, send)
                return
        gone = "the MCP server went away before answering"
        await _error(502, types.INTERNAL_ERROR, gone, pending.client_id)(scope, receive, send)

    async def _write(
        self,
        message: types.JSONRPCResponse | types.JSONRPCError,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        status = 200
        if isinstance(message, types.JSONRPCError):
            status = ERROR_CODE_HTTP_STATUS.get(message.error.code, 200)
        body = message.model_dump(mode="json", by_alias=True, exclude_none=True)
        await JSONResponse(body, status_code=status)(scope, receive, send)

    async def _stream(self, pending: _Pending, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        final: types.JSONRPCMessage | None = None
        while final is None:
            with anyio.move_on_after(PING_S):
                try:
                    message = await pending.into.receive()
                except anyio.EndOfStream:
                    break
                chunk = _event(message)
                if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
                    final = message
                    break
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                continue
            await send({"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True})
        if final is None:
            error = types.ErrorData(
                code=types.INTERNAL_ERROR, message="the MCP server went away before answering"
            )
            final = types.JSONRPCError(jsonrpc="2.0", id=pending.client_id, error=error)
        await send({"type": "http.response.body", "body": _event(final), "more_body": False})

    # -- what the relay sends the client ---------------------------------------------------

    async def _dispatch(self) -> None:
        """Each message from the relay to the request it belongs to, in the client's names."""
        async with self._from_relay:
            async for item in self._from_relay:
                message = item.message
                if isinstance(message, types.JSONRPCRequest):
                    await self._refuse(message)  # no back channel: the server is told so
                elif isinstance(message, types.JSONRPCNotification):
                    self._notify(message)
                else:
                    self._resolve(message)

    def _resolve(self, message: types.JSONRPCResponse | types.JSONRPCError) -> None:
        pending = self._pending.get(str(message.id))
        if pending is None:
            return  # answered after its client left
        answer = message.model_copy(update={"id": pending.client_id})
        pending.out.send_nowait(answer)
        pending.out.close()

    def _notify(self, message: types.JSONRPCNotification) -> None:
        params = message.params or {}
        found = params.get("_meta")
        meta: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        token = params.get("progressToken")
        subscription = meta.get(SUBSCRIPTION_ID_META_KEY)
        if message.method == "notifications/progress" and isinstance(token, str):
            pending = self._pending.get(token)
            renamed = {**params, "progressToken": pending.client_token} if pending else params
        elif isinstance(subscription, str):
            pending = self._pending.get(subscription)
            client_id = pending.client_id if pending else None
            renamed = {**params, "_meta": {**meta, SUBSCRIPTION_ID_META_KEY: client_id}}
        else:
            return  # no request of this channel to carry it
        if pending is not None:
            pending.out.send_nowait(message.model_copy(update={"params": renamed}))

    async def _refuse(self, request: types.JSONRPCRequest) -> None:
        error = types.ErrorData(code=types.METHOD_NOT_FOUND, message=NO_BACK_CHANNEL)
        answer = types.JSONRPCError(jsonrpc="2.0", id=request.id, error=error)
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._to_relay.send_nowait(SessionMessage(answer))


def _event(message: types.JSONRPCMessage) -> bytes:
    body = message.model_dump(mode="json", by_alias=True, exclude_none=True)
    return f"event: message\r\ndata: {json.dumps(body, separators=(',', ':'))}\r\n\r\n".encode()
