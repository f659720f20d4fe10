"""`ratewarden mcp --listen HOST:PORT --server NAME=TARGET…`: one MCP gateway for a team.

A streamable-HTTP MCP endpoint per upstream server, at `/NAME/mcp`: a client configures
`http://gateway:PORT/files/mcp` where it would have configured the `files` server. Each
client session gets a session of its own with the upstream (a subprocess for a command,
an MCP session for a URL), relayed message for message by `relay.Relay` as the stdio
proxy relays it, so resources, prompts, progress, elicitation and sampling pass through
unchanged, and each `tools/call` is checked first. The daemon hears the tool as
`NAME.tool` (`files.delete_file`): a policy targets one server's tools with a glob
(`tool: "files.*"`), while the client still sees the tool's own name.

Who calls is decided before anything reaches an upstream, on every request:
- a bearer token from the tokens file (`--tokens`), mapped to its user; or
- with `--user-header H`, header H as set by a front proxy that authenticated the user,
  believed only from the proxy's addresses (`--trusted-proxy`, loopback by default).
A request with neither is answered 401 (a JSON-RPC error saying what to send); a session
is bound to the user and server that opened it, and answers 404 to anyone else.

Each request is answered as an event stream when something may come before its answer:
always to a client that can be asked (it declared form elicitation in `initialize`: an
ask goes out on the stream of the call it is about), and to a request that asked for
progress (`_meta.progressToken`: the server's progress on it goes out there). Any other
request is answered with one JSON body, which costs the gateway far less (no event
stream with its tasks and timers: bench/mcp_overhead.py). The SDK's transport takes the
choice per session; `_Transport` takes it per request (`_ANSWER_IN_JSON`).

This speaks both eras of the protocol. The versions with an `initialize` handshake and a
session id (what the SDK's `ClientSession` speaks) get a session each, as above. A
request of the session-less 2026-07-28 protocol (header `MCP-Protocol-Version:
2026-07-28`, its envelope in `params._meta`; Claude Code 2.x speaks it) is one POST
answered on its own, through its user's channel to the server (stateless.py): the user
is still its bearer token's, each call is still checked and settled by a `SessionGuard`
of that user's, a request its client closes is cancelled (its slot freed), and an ask is
refused saying a person must approve, since nobody can be asked on that protocol. The
channels count against `--max-sessions` with the sessions.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.transport_security import RequestBodyLimitMiddleware
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from ratewarden.http import connections
from ratewarden.http.readahead import read_body, replay
from ratewarden.http.settings import ConnectionSettings
from ratewarden.mcp.cli import DEFAULT_MAX_BODY
from ratewarden.mcp.daemons import DaemonPool
from ratewarden.mcp.guard import Daemon, SessionGuard, can_elicit
from ratewarden.mcp.identity import Identities
from ratewarden.mcp.lazy import Greetings, lazily
from ratewarden.mcp.relay import Relay
from ratewarden.mcp.stateless import Channel, read_request
from ratewarden.mcp.upstream import SERVER_NAME, Upstream
from ratewarden.vocabulary import ClientSettings, fail_mode
from ratewarden.wire.bodies import MAX_ARGS_DEPTH
from ratewarden.wire.bounded import TooManyItems, too_deep, too_many_items

__all__ = ["Gateway", "run"]
log = logging.getLogger("ratewarden.mcp")

ROUTE = re.compile(rf"/({SERVER_NAME.pattern})/mcp/?")
# Reading JSON makes a Python object of every item, and the SDK reads each body whole: 2 MB
# of 500 000 small items held the gateway's event loop 1.1-2.2 s (issue 25, item 7). So a
# body is held to the daemon's caps on its items and depth (wire/bodies.py), counted on its bytes
# before anything reads it; a call's arguments sit two levels down (a message, its params).
MAX_DEPTH = MAX_ARGS_DEPTH + 2
PROTOCOL_HEADER = "mcp-protocol-version"
REALM = 'Bearer realm="ratewarden-mcp"'


# -- the gateway ------------------------------------------------------------------------


def _error(
    status: int, message: str, code: int = -32600, headers: dict[str, str] | None = None
) -> Response:
    """A JSON-RPC error with no id, as the SDK answers what it refuses over HTTP."""
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


# Whether the request being handled (its task) is answered with one JSON body.
_ANSWER_IN_JSON: ContextVar[bool] = ContextVar("ratewarden_mcp_answer_in_json", default=False)


class _Transport(StreamableHTTPServerTransport):  # type: ignore[misc]  # (mcp: untyped here)
    """The SDK's transport, answering in JSON or with an event stream request by request.

    The SDK reads `is_json_response_enabled` while it handles a request (in that request's
    task) and in its message router (its own task, where this reads False: a message about
    a request goes to that request's stream, which only a streamed request is sent). Were
    the SDK to stop reading it, every request would be streamed: slower, never wrong.
    """

    @property
    def is_json_response_enabled(self) -> bool:
        return _ANSWER_IN_JSON.get()

    @is_json_response_enabled.setter
    def is_json_response_enabled(self, value: bool) -> None:
        pass  # the SDK sets it once, for the session; the gateway chooses per request


@dataclass
class _Session:
    transport: _Transport
    user: str
    server: str
    can_be_asked: bool  # its client declared form elicitation: every answer is streamed
    last_used: float = field(default_factory=anyio.current_time)  # when a POST last ended
    posts: int = 0  # POSTs being answered: a call may be among them

    @contextlib.contextmanager
    def answering(self, method: str) -> Iterator[None]:
        """While one of its requests is answered: a POST (a call, maybe) in flight keeps
        the session from being closed to make room for its user's next one."""
        if method != "POST":  # a GET stream only listens; a DELETE ends it anyway
            yield
            return
        self.posts += 1
        try:
            yield
        finally:
            self.posts -= 1
            self.last_used = anyio.current_time()


class Gateway:
    """The ASGI app; `running()` holds the sessions' task group while it serves."""

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        identities: Identities,
        daemon: Daemon,
        *,
        team: str | None = None,
        max_sessions: int = 200,
        max_user_sessions: int = 10,
        max_body: int = DEFAULT_MAX_BODY,
        idle_timeout: float | None = 1800.0,
    ) -> None:
        self.upstreams = {upstream.name: upstream for upstream in upstreams}
        self.identities, self.daemon, self.team = identities, daemon, team
        self.max_sessions, self.idle_timeout = max_sessions, idle_timeout
        self.max_user_sessions = max_user_sessions
        self._sessions: dict[str, _Session] = {}
        self._opening: Counter[str] = Counter()  # sessions being opened, by user
        self._greetings: Greetings = {}  # each upstream's answer to initialize (lazy.py)
        # The session-less protocol's: each user's channel to each server (stateless.py).
        self._channels: dict[tuple[str, str], Channel] = {}
        self._opening_channel = anyio.Lock()
        self._tasks: TaskGroup | None = None
        self._limited = RequestBodyLimitMiddleware(self._mcp, max_body)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            try:
                yield
            finally:
                tasks.cancel_scope.cancel()  # every session ends; its calls are settled
                self._tasks = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/healthz":
            body = {
                "status": "ok",
                "sessions": len(self._sessions),
                "channels": len(self._channels),
            }
            await JSONResponse(body)(scope, receive, send)
            return
        await self._limited(scope, receive, send)

    async def _mcp(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = self._refusal(scope)
        if answer is not None:
            await answer(scope, receive, send)
            return
        session_id = dict(scope["headers"]).get(MCP_SESSION_ID_HEADER.encode())
        if session_id is None:
            await self._open(scope, receive, send)
        else:
            await self._continue(session_id.decode("latin-1"), scope, receive, send)

    def _refusal(self, scope: Scope) -> Response | None:
        """The answer to a request refused before any session sees it, or None."""
        matched = ROUTE.fullmatch(scope["path"])
        if matched is None or matched[1] not in self.upstreams:
            fronted = ", ".join(f"/{name}/mcp" for name in sorted(self.upstreams))
            return _error(404, f"No MCP server at {scope['path']!r}; this gateway serves {fronted}")
        scope["ratewarden.server"] = matched[1]
        user = self.identities.user_of(scope)
        if user is None:
            return _error(
                401,
                "ratewarden MCP gateway: unidentified client. Send 'Authorization: Bearer "
                "<token>' with a token the gateway's operator gave you.",
                headers={"WWW-Authenticate": REALM},
            )
        scope["ratewarden.user"] = user
        return None

    async def _continue(self, session_id: str, scope: Scope, receive: Receive, send: Send) -> None:
        session = self._sessions.get(session_id)
        owner = (scope["ratewarden.user"], scope["ratewarden.server"])
        if session is None or (session.user, session.server) != owner:
            # Another user's session answers as one that does not exist.
            await _error(404, "Session not found")(scope, receive, send)
            return
        with session.answering(scope["method"]):
            await _answer(session.transport, session.can_be_asked, scope, receive, send)
        if session.transport.is_terminated:  # the client ended it (DELETE)
            await self._discard(session_id, session.transport)

    async def _open(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = dict(scope["headers"]).get(PROTOCOL_HEADER.encode(), b"").decode("latin-1")
        if version in MODERN_PROTOCOL_VERSIONS:
            await self._stateless(scope, receive, send)
            return
        user = scope["ratewarden.user"]
        self._opening[user] += 1  # before any wait: a user's opens at once count each other
        try:
            refusal = await self._room_for(user)
            if refusal is not None:
                await refusal(scope, receive, send)
            else:
                await self._start(scope, receive, send)
        finally:
            self._opening[user] -= 1
            if not self._opening[user]:
                del self._opening[user]

    async def _stateless(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One request of the session-less protocol, answered through its user's channel
        to the server (stateless.py)."""
        if scope["method"] != "POST":  # no GET stream, no DELETE: nothing is kept to end
            await Response(status_code=405, headers={"Allow": "POST"})(scope, receive, send)
            return
        body = await read_body(receive)
        if body is None:
            return  # the client left before its request arrived
        if (refusal := _unread(body)) is not None:
            await refusal(scope, receive, send)
            return
        request = read_request(scope, body)
        if isinstance(request, Response):  # refused, or a notification (202)
            await request(scope, receive, send)
            return
        channel = await self._channel(scope["ratewarden.user"], scope["ratewarden.server"])
        if isinstance(channel, Response):
            await channel(scope, receive, send)
            return
        await channel.answer(request, scope, receive, send)

    async def _channel(self, user: str, server: str) -> Channel | Response:
        """`user`'s channel to `server`, opened if need be; or the answer refusing it."""
        async with self._opening_channel:  # one channel per user and server
            channel = self._channels.get((user, server))
            if channel is not None and not channel.closed:
                return channel
            if len(self._sessions) + len(self._channels) >= self.max_sessions:
                return _error(503, "Too many open sessions", -32603)
            upstream = self.upstreams[server]
            channel = Channel(
                user, upstream, self.daemon, team=self.team, idle_timeout=self.idle_timeout
            )
            assert self._tasks is not None
            try:
                await self._tasks.start(self._run_channel, channel)
            except Exception as exc:  # the server could not be started or reached
                log.error("mcp: server %s: %s: %s", upstream.name, type(exc).__name__, exc)
                message = f"MCP server {upstream.name!r} is unavailable: {type(exc).__name__}"
                return _error(502, message, -32603)
            return channel

    async def _run_channel(self, channel: Channel, *, task_status: TaskStatus[None]) -> None:
        key = (channel.user, channel.upstream.name)
        self._channels[key] = channel
        try:
            await channel.run(task_status=task_status)
        finally:
            if self._channels.get(key) is channel:
                del self._channels[key]

    async def _room_for(self, user: str) -> Response | None:
        """Room for the session `user` is opening (counted in `_opening`): their idle
        session unused longest is closed if they are at their cap; else None, or the
        answer refusing it."""
        theirs = [(key, held) for key, held in self._sessions.items() if held.user == user]
        at_cap = len(theirs) + self._opening[user] > self.max_user_sessions
        idle = [(key, held) for key, held in theirs if held.posts == 0] if at_cap else []
        if at_cap and not idle:
            message = (
                f"ratewarden MCP gateway: you have {self.max_user_sessions} sessions open, "
                "each answering a request; end one (DELETE) or wait for one to finish"
            )
            return _error(429, message, -32603)
        # Nothing is closed for an open the gateway's own cap refuses anyway.
        opened = len(self._sessions) + len(self._channels) + self._opening.total()
        if opened - len(idle[:1]) > self.max_sessions:
            return _error(503, "Too many open sessions", -32603)
        if idle:
            key, oldest = min(idle, key=lambda pair: pair[1].last_used)
            await self._discard(key, oldest.transport)
        return None

    async def _start(self, scope: Scope, receive: Receive, send: Send) -> None:
        upstream = self.upstreams[scope["ratewarden.server"]]
        body = await read_body(receive)
        if body is None:
            return  # the client left before its request arrived: nobody to answer
        if (refusal := _unread(body)) is not None:
            await refusal(scope, receive, send)
            return
        params = _params(body)
        transport = _Transport(mcp_session_id=uuid.uuid4().hex, idle_timeout=self.idle_timeout)
        session_id = transport.mcp_session_id
        assert session_id is not None
        assert self._tasks is not None
        user, version = scope["ratewarden.user"], params.get("protocolVersion")
        try:
            await self._tasks.start(self._run, transport, upstream, user, version)
        except Exception as exc:  # the server could not be started or reached
            log.error("mcp: server %s: %s: %s", upstream.name, type(exc).__name__, exc)
            message = f"MCP server {upstream.name!r} is unavailable: {type(exc).__name__}"
            await _error(502, message, -32603)(scope, receive, send)
            return
        asked = can_elicit(params.get("capabilities"))
        session = self._sessions[session_id] = _Session(transport, user, upstream.name, asked)
        answering = functools.partial(_answer, transport, asked, body=body)
        with session.answering(scope["method"]):
            status = await _status_of(answering, scope, receive, send)
        if status is None or status >= 400:  # not an initialize that succeeded
            await self._discard(session_id, transport)

    async def _run(
        self,
        transport: _Transport,
        upstream: Upstream,
        user: str,
        version: object,
        *,
        task_status: TaskStatus[None],
    ) -> None:
        """One session, from its opening to its end (DELETE, idle, gateway stop). Its
        server starts at its first request that needs it, or at once when only the server
        can answer its `initialize` (lazy.py)."""
        session_id = transport.mcp_session_id
        assert session_id is not None
        started = False
        try:
            async with lazily(upstream, self._greetings) as server, transport.connect() as client:
                if not server.greeted(version):
                    await server.connect_now()
                task_status.started()
                started = True
                guard = SessionGuard(
                    self.daemon, user=user, team=self.team, session=session_id, server=upstream.name
                )
                from_client, to_client = client
                relay = Relay(
                    guard, (server.watching(from_client), to_client), server.streams, server.ready
                )
                with transport.idle_scope or anyio.CancelScope():
                    await relay.run()
        except Exception as exc:
            if not started:
                raise  # `_open` answers 502
            # One session's failure (its server died) ends that session, not the gateway.
            # Only its type: the text of an error about a message may quote the message.
            log.error("mcp: a session on %s ended by %s", upstream.name, type(exc).__name__)
        finally:
            await self._discard(session_id, transport)

    async def _discard(self, session_id: str, transport: _Transport) -> None:
        self._sessions.pop(session_id, None)  # first: its id answers 404 from now on
        if not transport.is_terminated:
            with anyio.CancelScope(shield=True):
                await transport.terminate()


def _params(body: bytes) -> dict[str, Any]:
    """The `params` of the JSON-RPC message in `body`; {} for anything else (which the
    transport refuses, whatever the gateway made of it)."""
    try:
        message = json.loads(body)
    except ValueError:
        return {}
    params = message.get("params") if isinstance(message, dict) else None
    return params if isinstance(params, dict) else {}


def _unread(body: bytes) -> Response | None:
    """The refusal of a body over the caps on its items or depth, counted on its bytes
    (in C, a few passes) before anything parses it; None for any other."""
    if too_many_items(body):
        problem = f"a message of {TooManyItems()}"
    elif too_deep(body, MAX_DEPTH):
        problem = f"a message nested more than {MAX_DEPTH} levels deep"
    else:
        return None
    return _error(413, f"ratewarden MCP gateway: {problem}, refused unread")


async def _answer(
    transport: _Transport,
    can_be_asked: bool,
    scope: Scope,
    receive: Receive,
    send: Send,
    body: bytes | None = None,
) -> None:
    """Hand one request of a session to its transport, answered in JSON unless something
    may come before the answer (module docstring); `body`: already read."""
    if scope["method"] != "POST":  # the GET stream, the DELETE: as the SDK answers them
        await transport.handle_request(scope, receive, send)
        return
    if body is None:
        if (body := await read_body(receive)) is None:
            return  # the client left before its request arrived
        if (refusal := _unread(body)) is not None:
            await refusal(scope, receive, send)
            return
    in_json = not can_be_asked and not _asks_for_progress(body)
    token = _ANSWER_IN_JSON.set(in_json)
    try:
        if in_json:
            await _unless_gone(transport.handle_request, scope, body, receive, send)
        else:  # an event stream notices a client gone by itself
            await transport.handle_request(scope, replay(body, receive), send)
    finally:
        _ANSWER_IN_JSON.reset(token)


def _asks_for_progress(body: bytes) -> bool:
    """Whether the request in `body` carries a progress token (read only if it may)."""
    if b"progressToken" not in body:
        return False
    meta = _params(body).get("_meta")
    return isinstance(meta, dict) and isinstance(meta.get("progressToken"), str | int)


async def _unless_gone(app: Any, scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
    """Run `app` for one request whose `body` was read, cancelled if its client
    disconnects before its answer.

    An answer in JSON is written only when the call is over, and until then nothing reads
    the request: a client gone mid-call went unnoticed, its request stayed in flight, and
    its session never idled out (its call never settled). So the request is watched here
    while `app` answers. (Once an answer is complete, the server reports the request as
    disconnected too; `app` is then left to finish what it does after answering, such as
    passing a notification on after its 202.)
    """
    gone = anyio.Event()
    given = answered = False

    async def replayed() -> Any:  # the body, then the disconnect once it comes
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def sending(message: Any) -> None:
        nonlocal answered
        await send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            answered = True

    async with anyio.create_task_group() as tasks:

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if not answered:  # the client left: stop waiting for its answer
                gone.set()
                tasks.cancel_scope.cancel()

        tasks.start_soon(watch)
        await app(scope, replayed, sending)
        tasks.cancel_scope.cancel()


async def _status_of(app: Any, scope: Scope, receive: Receive, send: Send) -> int | None:
    """Run `app` for one request; the HTTP status it answered (None: it answered none)."""
    status: int | None = None

    async def watch(message: Any) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    await app(scope, receive, watch)
    return status


async def run(options: argparse.Namespace, identities: Identities) -> None:
    """Serve until SIGINT or SIGTERM; then every session ends and its calls are settled."""
    import uvicorn

    settings = ClientSettings.read()
    fail = settings.fail if options.fail is None else fail_mode(options.fail)
    daemons = DaemonPool(
        options.url or [settings.url], options.token or settings.token,
        timeout=options.timeout, fail=fail,
    )  # fmt: skip
    gateway = Gateway(
        options.servers,
        identities,
        daemons,
        team=options.team,
        max_sessions=options.max_sessions,
        max_user_sessions=options.max_user_sessions,
        max_body=options.max_body_bytes,
        idle_timeout=options.idle_timeout,
    )
    host, port = options.listen
    # The daemon's guard against sockets that never finish a request, and its cap on open
    # connections (RATEWARDEN_REQUEST_TIMEOUT_S, RATEWARDEN_MAX_CONNECTIONS).
    connections.install(ConnectionSettings())
    config = uvicorn.Config(
        gateway,
        host=host,
        port=port,
        lifespan="off",
        log_level="warning",
        access_log=False,
        proxy_headers=False,  # a front proxy is trusted by --trusted-proxy, not by uvicorn
        http=connections.GuardedHttpProtocol,
    )
    try:
        async with gateway.running():
            await uvicorn.Server(config).serve()
    finally:
        await daemons.aclose()
