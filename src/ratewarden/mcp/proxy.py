"""`ratewarden mcp [flags] -- <server command…>`: an MCP server, its tool calls guarded.

Configured in an MCP client (Claude Desktop, Claude Code, Cursor, VS Code…) in place of
the server's own command. It starts the server as a subprocess (with this process's
environment and working directory), speaks MCP with the client over its own stdin and
stdout, and relays every message both ways (`relay.Relay`), checking each `tools/call`
with the daemon first. The SDK frames and parses the messages (`mcp.server.stdio`,
`mcp.client.stdio`). The server's stderr is this process's stderr.

The user is `--user`, else RATEWARDEN_USER, else the login name (cli.py reads the
command line).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import stat
import sys
from typing import Any

from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.server.stdio import stdio_server

from ratewarden.client import AsyncGuard
from ratewarden.mcp.guard import SessionGuard
from ratewarden.mcp.relay import Relay
from ratewarden.vocabulary import ClientSettings, fail_mode

__all__ = ["run"]


async def run(options: argparse.Namespace, command: list[str]) -> None:
    """Relay this process's stdio to the server `command` starts, until either ends."""
    settings = ClientSettings.read()
    fail = settings.fail if options.fail is None else fail_mode(options.fail)
    guard = AsyncGuard(options.url, options.token, timeout=options.timeout, fail=fail)
    user = options.user or settings.user_or_login()
    session = SessionGuard(guard, user=user, team=options.team)
    # The server gets this process's whole environment (the SDK's default passes a few
    # variables only), as it would had the client started it.
    server = StdioServerParameters(
        command=command[0], args=command[1:], env=dict(os.environ), cwd=os.getcwd()
    )
    try:
        stdin, stdout = await _pipes()
        async with (
            stdio_server(stdin, stdout) as client_streams,
            stdio_client(server) as server_streams,
        ):
            await Relay(session, client_streams, server_streams).run()
    finally:
        await guard.aclose()


LINE_LIMIT = 64 * 1024 * 1024  # bytes of one message from the client


class _Lines:
    """The client's messages, a line each, read on the event loop: the SDK's default
    stdin reads each line in a worker thread, a thread hop per message both ways (about
    a third of what the proxy added to a call; bench/mcp_overhead.py)."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        line = await self.reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", "replace")


class _Out:
    """Writes to the client, without a thread: a pipe the loop waits on when full."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer

    async def write(self, text: str) -> None:
        self.writer.write(text.encode())

    async def flush(self) -> None:
        await self.writer.drain()


async def _pipes() -> tuple[Any, Any]:
    """Stdin and stdout as the SDK's stdio_server reads and writes them, on the loop
    when both are pipes (as MCP clients give them); else (a terminal, a file) None and
    None: the SDK's own."""
    if not all(stat.S_ISFIFO(os.fstat(fd).st_mode) for fd in (0, 1)):
        return None, None
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, sys.stdout.buffer
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    return _Lines(reader), _Out(writer)
