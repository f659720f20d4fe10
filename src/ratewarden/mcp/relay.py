"""One MCP session relayed between a client and a server, `tools/call` guarded.

Both sides are the SDK's message streams (`SessionMessage`s, as `stdio_server`,
`stdio_client` and the streamable-HTTP transports give them), so a gateway runs one
`Relay` per client session. Every message passes through as the SDK parsed it, in both
directions: requests, responses, notifications, progress, cancellation, and the server's
own requests to the client (sampling, elicitation, roots) with their answers. The relay
only reads `initialize` (the client's capabilities) and `tools/list` results (the tools'
annotations), and holds each `tools/call` until the daemon allows it; a refused call is
answered by the relay itself with an `isError` result.

The relay adds requests of its own, with ids no SDK uses (`ratewarden-…` strings): a
`tools/list` to the server after `notifications/initialized` and after
`notifications/tools/list_changed` (its answers are not forwarded), and an
`elicitation/create` to the client for an `ask`. While one of those listings is being
read, a `tools/call` waits for it (`LISTING_WAIT_S` at most, once the server is `ready`:
the gateway starts a session's server at its first call), so that a call made at once is
checked with the server's annotations, not as unclassified or with stale ones. On the
2026-07-28 protocol every request carries the client's envelope: the gateway gives the
relay a `stamp` that puts it on the relay's own requests (stateless.py).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream, TaskGroup
from mcp import types
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from mcp_types import PROTOCOL_VERSION_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS as MODERN_VERSIONS

from ratewarden.mcp.guard import GuardAction, RequestId, SessionGuard, Settle, refusal_result

__all__ = ["Relay"]
log = logging.getLogger("ratewarden.mcp")

Incoming = ObjectReceiveStream[SessionMessage | Exception]
Outgoing = ObjectSendStream[SessionMessage]
Stamp = Callable[[types.JSONRPCRequest], SessionMessage]
APPROVE = "approve"  # the elicitation form's one field
LISTING_WAIT_S = 5.0  # the longest a call waits for the server's tools/list to be read
_ASK_SCHEMA = {
    "type": "object",
    "properties": {APPROVE: {"type": "boolean", "title": "Allow this call", "default": False}},
    "required": [APPROVE],
}


class Relay:
    """Passes one session's messages between `client` and `server` streams until either
    side closes; `guard` checks its tool calls."""

    def __init__(
        self,
        guard: SessionGuard,
        client: tuple[Incoming, Outgoing],
        server: tuple[Incoming, Outgoing],
        ready: anyio.Event | None = None,
        stamp: Stamp | None = None,
    ) -> None:
        self.guard = guard
        self._ready = ready  # set once the server can answer (None: it can from the start)
        self._stamp = stamp or SessionMessage  # how the relay's own requests go out
        self._from_client, self._to_client = client
        self._from_server, self._to_server = server
        self._client_lists: set[RequestId] = set()  # the client's tools/list requests
        # The client's `initialize` requests, until the server answers: their params.
        self._initializing: dict[RequestId, Mapping[str, Any] | None] = {}
        self._progress: dict[object, RequestId] = {}  # a request's progress token -> its id
        self._progress_token: dict[RequestId, object] = {}  # and back
        self._own_lists: dict[str, list[dict[str, Any]]] = {}  # ours: the pages so far
        self._asks: dict[str, tuple[anyio.Event, list[types.JSONRPCMessage]]] = {}
        self._listed = anyio.Event()  # set while the catalogue is current (none is listing)
        self._listed.set()
        self._ids = itertools.count(1)
        self._prefix = f"ratewarden-{os.urandom(4).hex()}"

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._pump, self._from_server, self._server_message, tasks)
                await self._pump(self._from_client, self._client_message, tasks)
        finally:
            with anyio.CancelScope(shield=True):
                await self.guard.close()  # calls still out when the session ended
                # Both transports' writers end when their streams close: the process exits.
                await self._to_client.aclose()
                await self._to_server.aclose()

    async def _pump(self, source: Incoming, handle: Any, tasks: TaskGroup) -> None:
        """Handle each message of `source`; when it closes, the session is over (an HTTP
        transport, terminated by the client's DELETE, closes it from the far side)."""
        with contextlib.suppress(anyio.ClosedResourceError):
            async with source:
                async for item in source:
                    if isinstance(item, Exception):  # a line the SDK could not parse
                        log.warning("mcp: dropped an unreadable message: %s", type(item).__name__)
                        continue
                    await handle(item, tasks)
        tasks.cancel_scope.cancel()

    # -- client to server -----------------------------------------------------------------

    async def _client_message(self, item: SessionMessage, tasks: TaskGroup) -> None:
        message = item.message
        if isinstance(message, types.JSONRPCRequest):
            await self._client_request(item, message, tasks)
            return
        answer = isinstance(message, types.JSONRPCResponse | types.JSONRPCError)
        if answer and self._answer_ask(message):
            return
        await self._to_server.send(item)
        if isinstance(message, types.JSONRPCNotification):
            await self._client_notification(message, tasks)

    async def _client_request(
        self, item: SessionMessage, message: types.JSONRPCRequest, tasks: TaskGroup
    ) -> None:
        meta = (message.params or {}).get("_meta")
        if isinstance(meta, Mapping) and isinstance(meta.get("progressToken"), str | int):
            self._progress[meta["progressToken"]] = message.id
            self._progress_token[message.id] = meta["progressToken"]
        if message.method == "tools/call":
            tasks.start_soon(self._call, item, message)
            return
        if message.method == "initialize":
            self._initializing[message.id] = message.params
        elif message.method == "tools/list":
            self._client_lists.add(message.id)
        await self._to_server.send(item)

    async def _client_notification(
        self, message: types.JSONRPCNotification, tasks: TaskGroup
    ) -> None:
        params = message.params or {}
        if message.method == "notifications/cancelled" and "requestId" in params:
            tasks.start_soon(self.guard.cancel, params["requestId"])
        elif message.method == "notifications/initialized":
            await self._list_tools()

    async def _call(self, item: SessionMessage, message: types.JSONRPCRequest) -> None:
        """Check one `tools/call`: forward it, or answer it with the refusal."""
        # A call made as soon as the session starts, or the server's list changes, is
        # checked with the annotations being read, not without or with the old ones.
        if self._ready is not None and not self._ready.is_set():
            await self._ready.wait()  # its start is not the listing's time (lazy.py bounds it)
        if not self._listed.is_set():  # (no cancel scope per call when none is under way)
            with anyio.move_on_after(LISTING_WAIT_S):
                await self._listed.wait()
        ask = functools.partial(self._ask, message.id)
        verdict = await self.guard.check(message.id, message.params or {}, ask)
        if verdict.decision is GuardAction.FORWARD:
            self.guard.sent(message.id)
            await self._to_server.send(item)
            return
        self._answered(message.id)  # by the relay (a refusal), or not at all (cancelled)
        if verdict.decision is GuardAction.REFUSE:
            result = refusal_result(verdict.message)
            if _modern(message):  # a result of that protocol says it is complete
                result["resultType"] = "complete"
            refusal = types.JSONRPCResponse(jsonrpc="2.0", id=message.id, result=result)
            await self._to_client.send(SessionMessage(refusal))

    # -- server to client -----------------------------------------------------------------

    async def _server_message(self, item: SessionMessage, tasks: TaskGroup) -> None:
        message = item.message
        settle = None
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            if await self._own_listing(message):
                return
            settle = self._read_answer(message)
        elif isinstance(message, types.JSONRPCNotification):
            item = self._tagged(item, message)
            if message.method == "notifications/tools/list_changed":
                await self._list_tools()  # before the client hears: its next call waits for it
        await self._to_client.send(item)
        if settle is not None:  # after the answer left: the daemon's round trip is not in its way
            await settle()

    def _tagged(self, item: SessionMessage, message: types.JSONRPCNotification) -> SessionMessage:
        """A server's progress notification, tagged with the request it reports on: over
        HTTP it then goes out on that request's own response stream."""
        token = (message.params or {}).get("progressToken")
        progress = message.method == "notifications/progress" and isinstance(token, str | int)
        request_id = self._progress.get(token) if progress else None  # (a list: unhashable)
        if request_id is None or item.metadata is not None:
            return item
        return SessionMessage(
            message, metadata=ServerMessageMetadata(related_request_id=request_id)
        )

    def _answered(self, request_id: RequestId) -> None:
        """Request `request_id` has its answer: its progress token is done with."""
        token = self._progress_token.pop(request_id, None)
        if token is not None:
            self._progress.pop(token, None)

    def _read_answer(self, message: types.JSONRPCResponse | types.JSONRPCError) -> Settle | None:
        """What an answer to the client's request tells the relay; a tool call's settle."""
        request_id = message.id
        if request_id is None:
            return None
        self._answered(request_id)
        if request_id in self._initializing:
            self._initialized(request_id, accepted=isinstance(message, types.JSONRPCResponse))
        if request_id in self._client_lists:
            self._client_lists.discard(request_id)
            if isinstance(message, types.JSONRPCResponse):
                self.guard.catalog.read(message.result)
        if isinstance(message, types.JSONRPCError):
            return self.guard.finish(request_id, error=True)
        result = message.result
        return self.guard.finish(request_id, error=_is_error(result), result=result)

    def _initialized(self, request_id: RequestId, *, accepted: bool) -> None:
        """The server answered an `initialize`: its capabilities hold only if accepted. Claude
        Code 2.x, whose 2026-07-28 probe the server is slow to answer, tries the old
        handshake with elicitation declared; the server refuses it and the session goes on
        in the new era, which drops an `elicitation/create` sent outside a request: were the
        refused capabilities kept, an ask would wait for ever."""
        params = self._initializing.pop(request_id)
        if accepted:
            self.guard.initialize(params)

    # -- the relay's own requests ---------------------------------------------------------

    async def list_tools(self) -> None:
        """Read the server's tools now (a gateway channel opened after its client listed
        them); the calls that come meanwhile wait for it, as after `initialized`."""
        await self._list_tools()

    def _new_id(self, what: str) -> str:
        return f"{self._prefix}-{what}-{next(self._ids)}"

    async def _list_tools(self, cursor: str | None = None, pages: list[Any] | None = None) -> None:
        """Ask the server for its tools (a page), to read their annotations."""
        request_id = self._new_id("tools")
        self._own_lists[request_id] = pages or []
        if self._listed.is_set():
            self._listed = anyio.Event()
        params = {"cursor": cursor} if cursor else None
        request = types.JSONRPCRequest(
            jsonrpc="2.0", id=request_id, method="tools/list", params=params
        )
        await self._to_server.send(self._stamp(request))

    async def _own_listing(self, message: types.JSONRPCResponse | types.JSONRPCError) -> bool:
        """An answer to the relay's own `tools/list`: read, never forwarded."""
        if not isinstance(message.id, str) or message.id not in self._own_lists:
            return False
        pages = self._own_lists.pop(message.id)
        if isinstance(message, types.JSONRPCError):
            log.warning("mcp: the server refused to list its tools: %s", message.error.message)
        elif isinstance(cursor := message.result.get("nextCursor"), str) and cursor:
            await self._list_tools(cursor, [*pages, message.result])
            return True
        else:
            self.guard.catalog.replace([*pages, message.result])
        if not self._own_lists:
            self._listed.set()
        return True

    async def _ask(self, call: RequestId, tool: str, message: str) -> bool:
        """Ask the user, through the client, whether tools/call `call` may run (over HTTP
        the question goes out on that call's own response stream)."""
        request_id = self._new_id("ask")
        answered: anyio.Event = anyio.Event()
        slot: list[types.JSONRPCMessage] = []
        self._asks[request_id] = (answered, slot)
        params = {
            "mode": "form",
            "message": f"ratewarden: {message}\nAllow this {tool} call?",
            "requestedSchema": _ASK_SCHEMA,
        }
        request = types.JSONRPCRequest(
            jsonrpc="2.0", id=request_id, method="elicitation/create", params=params
        )
        try:
            related = ServerMessageMetadata(related_request_id=call)
            await self._to_client.send(SessionMessage(request, metadata=related))
            await answered.wait()
        finally:
            self._asks.pop(request_id, None)
        return bool(slot) and _approved(slot[0])

    def _answer_ask(self, message: types.JSONRPCResponse | types.JSONRPCError) -> bool:
        """The client's answer to one of the relay's asks (then not forwarded)."""
        waiting = self._asks.get(message.id) if isinstance(message.id, str) else None
        if waiting is None:
            return False
        answered, slot = waiting
        slot.append(message)
        answered.set()
        return True


def _modern(request: types.JSONRPCRequest) -> bool:
    """Whether `request` is of the 2026-07-28 protocol (its envelope names the version)."""
    meta = (request.params or {}).get("_meta")
    return isinstance(meta, Mapping) and meta.get(PROTOCOL_VERSION_META_KEY) in MODERN_VERSIONS


def _is_error(result: Mapping[str, Any]) -> bool:
    return result.get("isError") is True


def _approved(answer: types.JSONRPCMessage) -> bool:
    """An accepted elicitation whose form did not say no."""
    if not isinstance(answer, types.JSONRPCResponse):
        return False
    content = answer.result.get("content")
    said = content.get(APPROVE, True) if isinstance(content, Mapping) else True
    return answer.result.get("action") == "accept" and said is True
