"""What ratewarden trusts inside other packages, checked against the installed versions.

Where the code subclasses another package's class and relies on how it behaves inside,
imports a private module, or reads a package's data folder, a new release can break it
without changing any documented API: the failure would then show far away (a connection
never timed out, every MCP answer streamed, a 404 for the API docs). Each test here
names one such assumption and where the code makes it, and fails with that name.
pyproject.toml caps each package below the first version not tested: raise a cap only
once this file passes on the new version (and regenerate deploy/requirements.lock).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import socket
from importlib import metadata, resources
from typing import Any

import pytest
from pydantic import BaseModel


def trusted(assumption: str, holds: bool) -> None:
    """Fail naming `assumption` (and the installed versions) when it no longer holds."""
    if not holds:
        versions = ", ".join(
            f"{name} {metadata.version(name)}"
            for name in ("uvicorn", "fastapi", "starlette", "mcp", "redis", "google-re2")
        )
        pytest.fail(f"no longer true: {assumption} (installed: {versions})", pytrace=False)


def parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


# -- uvicorn: service/connections.py subclasses HttpToolsProtocol ---------------------------


def test_uvicorn_httptools_protocol_keeps_the_state_the_connection_guard_reads() -> None:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    where = "service/connections.py GuardedHttpProtocol"
    trusted(
        f"{where}: HttpToolsProtocol(config, server_state, app_state, _loop)",
        parameters(HttpToolsProtocol.__init__) == [
            "self", "config", "server_state", "app_state", "_loop",
        ],
    )  # fmt: skip
    for method in ("connection_made", "connection_lost", "on_response_complete"):
        trusted(
            f"{where}: HttpToolsProtocol defines {method}()",
            method in vars(HttpToolsProtocol),
        )
    report = asyncio.run(_one_request_through(HttpToolsProtocol))
    trusted(
        f"{where}: `connections` is the server state's set, holding each open connection",
        report["shared"] and report["counted_while_open"] and not report["counted_after"],
    )
    trusted(f"{where}: `loop` is the loop given", report["loop"])
    trusted(f"{where}: `cycle` is None before a request", report["no_cycle_yet"])
    trusted(
        f"{where}: while a whole request is answered, `cycle` has more_body False and "
        "response_complete False",
        report["answering"] == (False, False),
    )
    trusted(
        f"{where}: on_response_complete() is called once per answer, cycle.response_complete "
        "then True",
        report["completed"] == 1 and report["complete_after"],
    )


async def _one_request_through(base: type[Any]) -> dict[str, Any]:
    """One GET over a socket pair, served by a subclass of `base` that watches its state."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    seen: dict[str, Any] = {"completed": 0}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        cycle = protocol.cycle
        seen["answering"] = (cycle.more_body, cycle.response_complete)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    class Probe(base):  # type: ignore[misc]
        def on_response_complete(self) -> None:
            super().on_response_complete()
            seen["completed"] += 1
            seen["complete_after"] = self.cycle.response_complete

    loop = asyncio.get_running_loop()
    config = Config(app, http="httptools", lifespan="off", log_config=None)
    state = ServerState()
    protocol = Probe(config, state, {}, loop)
    seen["shared"] = protocol.connections is state.connections
    seen["loop"] = protocol.loop is loop
    seen["no_cycle_yet"] = protocol.cycle is None
    ours, theirs = socket.socketpair()
    with ours, theirs:
        await loop.connect_accepted_socket(lambda: protocol, ours)
        seen["counted_while_open"] = protocol in state.connections
        reader, writer = await asyncio.open_connection(sock=theirs)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 204"), head
        writer.close()
        for _ in range(100):
            if protocol not in state.connections:
                break
            await asyncio.sleep(0.01)
        seen["counted_after"] = protocol in state.connections
    return seen


# -- the MCP SDK: mcp/gateway.py subclasses StreamableHTTPServerTransport -------------------


def test_mcp_transport_reads_is_json_response_enabled_while_it_answers() -> None:
    from mcp.server import streamable_http
    from mcp.server.streamable_http import StreamableHTTPServerTransport

    where = "mcp/gateway.py _Transport"
    trusted(
        f"{where}: StreamableHTTPServerTransport takes mcp_session_id= and idle_timeout=",
        {"mcp_session_id", "idle_timeout", "is_json_response_enabled"}
        <= set(parameters(StreamableHTTPServerTransport.__init__)),
    )
    assigned, read = _uses_of_attribute(
        inspect.getsource(streamable_http), "StreamableHTTPServerTransport",
        "is_json_response_enabled",
    )  # fmt: skip
    trusted(f"{where}: the SDK sets is_json_response_enabled in __init__", assigned)
    trusted(
        f"{where}: the SDK reads is_json_response_enabled while it handles a request (else "
        "every answer is streamed: slower, never wrong)",
        read,
    )
    for member in ("connect", "terminate", "handle_request", "is_terminated"):
        trusted(
            f"{where}: the transport has {member}",
            hasattr(StreamableHTTPServerTransport, member),
        )
    trusted(
        "mcp/gateway.py: a session's id travels in the mcp-session-id header",
        streamable_http.MCP_SESSION_ID_HEADER == "mcp-session-id",
    )


def test_mcp_transport_takes_the_gateways_choice_per_request() -> None:
    """The gateway's own subclass, built as the gateway builds it."""
    from ratewarden.mcp.gateway import _ANSWER_IN_JSON, _Transport

    transport = _Transport(mcp_session_id="a" * 32, idle_timeout=5.0)
    where = "mcp/gateway.py _Transport"
    trusted(f"{where}: mcp_session_id is kept as given", transport.mcp_session_id == "a" * 32)
    trusted(
        f"{where}: idle_scope exists (None until connect) and is_terminated starts False",
        transport.idle_scope is None and transport.is_terminated is False,
    )
    token = _ANSWER_IN_JSON.set(True)
    try:
        trusted(f"{where}: the property answers per request", transport.is_json_response_enabled)
    finally:
        _ANSWER_IN_JSON.reset(token)


def test_mcp_sdk_names_the_gateway_and_relay_use() -> None:
    from mcp.server.transport_security import RequestBodyLimitMiddleware
    from mcp.shared.message import ServerMessageMetadata, SessionMessage
    from mcp_types import version

    trusted(
        "mcp/gateway.py: RequestBodyLimitMiddleware(app, max_body_size)",
        parameters(RequestBodyLimitMiddleware.__init__) == ["self", "app", "max_body_size"],
    )
    for name in ("MODERN_PROTOCOL_VERSIONS", "HANDSHAKE_PROTOCOL_VERSIONS"):
        versions = getattr(version, name, None)
        trusted(
            f"mcp/gateway.py, mcp/lazy.py: mcp_types.version.{name} is a collection of strings",
            versions is not None and all(isinstance(v, str) for v in versions),
        )
    trusted(
        "mcp/relay.py: SessionMessage(message, metadata=ServerMessageMetadata("
        "related_request_id=...))",
        "metadata" in parameters(SessionMessage)
        and "related_request_id" in parameters(ServerMessageMetadata),
    )


def _uses_of_attribute(source: str, class_name: str, attribute: str) -> tuple[bool, bool]:
    """Whether `class_name`'s __init__ assigns self.`attribute`, and whether another of its
    methods reads it."""
    tree = ast.parse(source)
    (cls,) = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name]
    assigned = read = False
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(method):
            if isinstance(node, ast.Attribute) and node.attr == attribute:
                if isinstance(node.ctx, ast.Store) and method.name == "__init__":
                    assigned = True
                elif isinstance(node.ctx, ast.Load) and method.name != "__init__":
                    read = True
    return assigned, read


# -- FastAPI: service/routes.py subclasses APIRoute and Request ------------------------------


class Body(BaseModel):
    n: int


def test_fastapi_reads_a_json_body_through_request_json() -> None:
    from fastapi import FastAPI, Request
    from fastapi.routing import APIRoute
    from fastapi.testclient import TestClient

    seen: dict[str, Any] = {}

    class Read(Request):
        async def json(self) -> Any:
            seen["read"] = True
            return {"n": 41 + (await self.body()).count(b"1")}

    class Route(APIRoute):
        def get_route_handler(self) -> Any:
            handle = super().get_route_handler()
            seen["annotation"] = self.body_field.field_info.annotation if self.body_field else None

            async def wrapped(request: Request) -> Any:
                return await handle(Read(request.scope, request.receive))

            return wrapped

    app = FastAPI()
    app.router.route_class = Route

    @app.post("/")
    async def post(body: Body) -> dict[str, int]:
        return {"n": body.n}

    answer = TestClient(app).post("/", json={"n": 1})
    where = "service/routes.py _Route, _JSONRequest"
    trusted(
        f"{where}: route.body_field.field_info.annotation is the body's type",
        seen.get("annotation") is Body,
    )
    trusted(
        f"{where}: FastAPI reads a JSON body with request.json() (wire.read_json's caps)",
        seen.get("read") is True and answer.json() == {"n": 42},
    )


# -- fastapi-offline: service/apidocs.py serves its static/ folder ---------------------------


def test_fastapi_offline_ships_swagger_ui_in_its_static_folder() -> None:
    from ratewarden.service.apidocs import ASSETS, VENDORED

    folder = resources.files(VENDORED[0]).joinpath(VENDORED[1])
    for name, (origin, _) in ASSETS.items():
        if origin == VENDORED:
            file = folder.joinpath(name)
            trusted(
                f"service/apidocs.py: fastapi_offline/static/{name} is shipped",
                file.is_file() and len(file.read_bytes()) > 1000,
            )


# -- google-re2: policy/conditions.py calls the binding's own RE2 ----------------------------


def test_re2_binding_answers_as_conditions_call_it() -> None:
    import re2  # type: ignore[import-untyped]
    from re2 import _re2

    where = "policy/conditions.py"
    options = re2.Options()
    for name in ("max_mem", "log_errors", "never_capture"):
        trusted(f"{where}: re2.Options has {name}", hasattr(options, name))
    options.never_capture = True
    compiled = _re2.RE2(b"ab+c", options)
    trusted(f"{where}: re2._re2.RE2(pattern bytes, options).ok()", compiled.ok())
    trusted(
        f"{where}: ProgramSize() and ReverseProgramSize() are instruction counts",
        compiled.ProgramSize() > 0 and compiled.ReverseProgramSize() > 0,
    )
    anywhere, whole = _re2.RE2.Anchor.UNANCHORED, _re2.RE2.Anchor.ANCHOR_BOTH
    text = b"xxabbbc"
    trusted(
        f"{where}: Match(anchor, text, 0, len)[0][0] is group 0's start, -1 without a match",
        compiled.Match(anywhere, text, 0, len(text))[0][0] == 2
        and compiled.Match(whole, text, 0, len(text))[0][0] == -1,
    )
    broken = _re2.RE2(b"a(", options)
    trusted(
        f"{where}: a bad pattern is not ok() and error() says why",
        not broken.ok() and bool(broken.error()),
    )


# -- redis-py: store/coalesce.py writes and reads one pooled connection itself ---------------


def test_redis_connection_api_the_script_pipeline_uses() -> None:
    from redis.asyncio.connection import AbstractConnection, Connection, ConnectionPool

    where = "store/coalesce.py"
    required = [
        p.name
        for p in inspect.signature(ConnectionPool.get_connection).parameters.values()
        if p.name != "self" and p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    trusted(f"{where}: pool.get_connection() takes no argument", required == [])
    for method in ("ensure_connection", "release"):
        trusted(
            f"{where}: pool.{method}(connection)",
            parameters(getattr(ConnectionPool, method))[:2] == ["self", "connection"],
        )
    trusted(
        f"{where}: connection.send_packed_command(packed, check_health=False)",
        "check_health" in parameters(AbstractConnection.send_packed_command),
    )
    trusted(
        f"{where}: connection.read_response() needs no argument",
        all(
            p.default is not p.empty
            for p in inspect.signature(AbstractConnection.read_response).parameters.values()
            if p.name != "self"
        ),
    )
    connection = Connection(socket_timeout=1.5)
    connection.socket_timeout = None
    trusted(
        f"{where}: a connection's socket_timeout can be set (None: replies awaited without a "
        "deadline), and read_response() reads it",
        connection.socket_timeout is None
        and "self.socket_timeout" in inspect.getsource(AbstractConnection.read_response),
    )


# -- Python's own regular-expression parser: policy/automaton.py ----------------------------


def test_python_regex_parser_names_the_automaton_reads() -> None:
    from re import _constants, _parser  # type: ignore[attr-defined,unused-ignore]

    names = [
        "ANY", "AT", "AT_BEGINNING", "AT_BEGINNING_STRING", "BRANCH", "CATEGORY", "IN",
        "LITERAL", "MAXREPEAT", "MAX_REPEAT", "MIN_REPEAT", "NEGATE", "NOT_LITERAL", "RANGE",
        "SRE_FLAG_DOTALL", "SRE_FLAG_IGNORECASE", "SRE_FLAG_MULTILINE", "SUBPATTERN",
    ]  # fmt: skip
    missing = [name for name in names if not hasattr(_constants, name)]
    trusted(f"policy/automaton.py: re._constants has {missing or names}", not missing)
    trusted("policy/automaton.py: re._parser.parse(text)", callable(_parser.parse))
