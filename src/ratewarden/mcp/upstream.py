"""An upstream MCP server of the gateway: a URL, or a command started per session.

Parsed from `--server NAME=TARGET` without the SDK (the command line is read before the
optional `mcp` extra is known to be there); `connect` imports it.

A URL upstream may be given headers of its own (`--header NAME:HEADER=VALUE`: an API key
the server wants), sent with every request to it. VALUE is taken as written, or read at
start from the environment (`@env:VAR`) or from a file (`@file:PATH`, one trailing line
break dropped), so that a secret need not be on the command line, where `ps` shows it.
A value is never shown: not in an error, a log line, `--help` or a repr, nor in what the
server answers (an error page echoing the request's headers): `_scrubbed`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ratewarden.mcp.relay import Incoming, Outgoing

__all__ = ["SERVER_NAME", "Header", "Upstream", "with_headers"]

# A server's name leads its tools' names to the daemon (`files.delete_file`) and its
# path on the gateway (`/files/mcp`): no dot, slash or space.
SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")  # an HTTP token (RFC 9110)
# Visible ASCII, space and tab: nothing that ends a header line or reads differently.
HEADER_VALUE = re.compile(r"[\t\x20-\x7e]{0,8192}")
# What the transport itself sends: a header of the operator's would contradict it.
TRANSPORT_HEADERS = frozenset({
    "host", "content-length", "content-type", "transfer-encoding", "connection", "accept",
    "last-event-id", "mcp-session-id", "mcp-protocol-version", "mcp-method", "mcp-name",
})  # fmt: skip
FROM_ENV, FROM_FILE = "@env:", "@file:"
# A header value's part shorter than this is not taken for a secret (`X-Team: a b`), so
# not hidden in what the server answers; a key or a token is longer.
SECRET_MIN = 8
REDACTED = "[redacted]"


@dataclass(frozen=True)
class Header:
    """One `--header NAME:HEADER=VALUE`: a header for server NAME (its value unshown)."""

    server: str
    name: str
    value: str = field(repr=False)

    @classmethod
    def parse(cls, text: str) -> Header:
        # Nothing is quoted back unless it is a valid name: a misplaced '=' (curl's
        # `Authorization: Bearer …` style) would put a secret where a name was expected.
        target, sep, given = text.partition("=")
        server, colon, name = target.partition(":")
        if not sep or not colon or not SERVER_NAME.fullmatch(server):
            raise ValueError("expected NAME:HEADER=VALUE, NAME a --server's (text not shown)")
        if not HEADER_NAME.fullmatch(name):
            raise ValueError(
                f"server {server!r}: the header name is not an HTTP token (letters, digits and "
                "!#$%&'*+-.^_`|~; text not shown)"
            )
        if name.lower() in TRANSPORT_HEADERS or name.lower().startswith("mcp-param-"):
            raise ValueError(f"server {server!r}: {name} is the transport's own header")
        value = _value(given, f"{server}:{name}")
        if not HEADER_VALUE.fullmatch(value):
            raise ValueError(
                f"{server}:{name}: the value has a control character (CR, LF, NUL...), "
                "a character outside ASCII, or is over 8192 characters"
            )
        return cls(server, name, value)


def _value(given: str, which: str) -> str:
    """VALUE as written, or from the environment or a file (read now)."""
    if given.startswith(FROM_ENV):
        variable = given.removeprefix(FROM_ENV)
        value = os.environ.get(variable)
        if not variable or not value:
            raise ValueError(f"{which}: the environment variable {variable!r} is not set")
        return value
    if given.startswith(FROM_FILE):
        path = Path(given.removeprefix(FROM_FILE))
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{which}: cannot read {str(path)!r}: {type(exc).__name__}") from None
        return text.removesuffix("\n").removesuffix("\r")
    return given


@dataclass(frozen=True)
class Upstream:
    """One server the gateway fronts: an MCP URL, or a command it starts per session."""

    name: str
    url: str | None = None
    command: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # `Header`s: unshown

    @classmethod
    def parse(cls, text: str) -> Upstream:
        """`NAME=http(s)://…` or `NAME=COMMAND ARGS…` (split as a shell would)."""
        name, sep, target = text.partition("=")
        if not sep or not SERVER_NAME.fullmatch(name):
            raise ValueError(
                f"expected NAME=URL or NAME=COMMAND, NAME of 1-64 letters, digits, _ or -; "
                f"got {text!r}"
            )
        target = target.strip()
        if target.startswith(("http://", "https://")):
            return cls(name, url=target)
        try:
            command = tuple(shlex.split(target))
        except ValueError as exc:
            raise ValueError(f"server {name!r}: {exc} in {target!r}") from None
        if not command:
            raise ValueError(f"server {name!r}: give a URL or a command after '='")
        return cls(name, command=command)

    def connect(self) -> AbstractAsyncContextManager[tuple[Incoming, Outgoing]]:
        """A new session with this server: its message streams."""
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        from ratewarden.mcp.http_upstream import streamable_http

        session: AbstractAsyncContextManager[tuple[Incoming, Outgoing]]
        if self.url is not None and self.url.startswith("http://"):
            # the SDK's client costs a call 1.5 ms
            session = streamable_http(self.url, dict(self.headers))
        elif self.url is not None:
            session = _sdk_client(self.url, dict(self.headers), streamable_http_client)
        else:
            # The whole environment, as for the stdio proxy (the SDK's default passes few).
            params = StdioServerParameters(
                command=self.command[0], args=list(self.command[1:]), env=dict(os.environ)
            )
            session = stdio_client(params)
        if secrets := _secrets(self.headers):
            session = _scrubbed(session, secrets)
        return session


def with_headers(upstreams: Sequence[Upstream], headers: Sequence[Header]) -> list[Upstream]:
    """`upstreams`, each URL one with its `headers`; ValueError for a header of a server
    not among them, of a command server, or given twice."""
    servers = {upstream.name: upstream for upstream in upstreams}
    given: dict[str, dict[str, Header]] = {}
    for header in headers:
        upstream = servers.get(header.server)
        if upstream is None:
            raise ValueError(f"{header.server}:{header.name}: no --server {header.server}")
        if upstream.url is None:
            raise ValueError(
                f"{header.server}:{header.name}: server {header.server!r} is a command; "
                "headers go to URL servers (a command reads its own environment)"
            )
        theirs = given.setdefault(header.server, {})
        if header.name.lower() in theirs:
            raise ValueError(f"{header.server}:{header.name}: given twice")
        theirs[header.name.lower()] = header
    return [
        replace(u, headers=tuple((h.name, h.value) for h in given.get(u.name, {}).values()))
        for u in upstreams
    ]


@contextlib.asynccontextmanager
async def _sdk_client(url: str, headers: dict[str, str], client: Any) -> AsyncIterator[Any]:
    """The SDK's client of `url` (https), each request with `headers`."""
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with (
        create_mcp_http_client(headers=headers) as http,
        client(url, http_client=http) as streams,
    ):
        yield streams


def _secrets(headers: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """What of the operator's header values must never reach a client: each value, and
    each of its words long enough to be a key (`Bearer KEY` echoed as `KEY`), also as JSON
    writes them inside a string (a quote or backslash escaped), longest first."""
    found: set[str] = set()
    for _, value in headers:
        for part in (value, *value.split()):
            if len(part) >= SECRET_MIN:
                found |= {part, json.dumps(part)[1:-1]}
    return tuple(sorted(found, key=len, reverse=True))


@contextlib.asynccontextmanager
async def _scrubbed(
    session: AbstractAsyncContextManager[tuple[Incoming, Outgoing]], secrets: tuple[str, ...]
) -> AsyncIterator[tuple[Incoming, Outgoing]]:
    """`session` with every message from the server cleared of `secrets`: a server (or a
    proxy before it) that echoes a request's headers in an error or a result must not
    hand the operator's key to the gateway's clients. Messages are only re-read when one
    holds a secret."""
    import anyio
    from mcp import types
    from mcp.shared.message import SessionMessage

    async with session as (incoming, outgoing):
        send, receive = anyio.create_memory_object_stream[SessionMessage | Exception](math.inf)

        async def forward() -> None:
            gone = (anyio.ClosedResourceError, anyio.BrokenResourceError)  # the relay ended
            with contextlib.suppress(*gone):
                await _forward_scrubbed()

        async def _forward_scrubbed() -> None:
            async with incoming, send:
                async for item in incoming:
                    await send.send(scrub(item))

        def scrub(item: SessionMessage | Exception) -> SessionMessage | Exception:
            if isinstance(item, Exception):  # an unreadable line: the relay logs its type
                if any(secret in str(item) for secret in secrets):
                    return ValueError(f"a message from the server ({type(item).__name__})")
                return item
            text = item.message.model_dump_json(by_alias=True, exclude_unset=True)
            if not any(secret in text for secret in secrets):
                return item
            for secret in secrets:
                text = text.replace(secret, REDACTED)
            message = types.jsonrpc_message_adapter.validate_json(text)
            return SessionMessage(message, metadata=item.metadata)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(forward)
            try:
                yield receive, outgoing
            finally:
                tasks.cancel_scope.cancel()
