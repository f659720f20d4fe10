"""`ratewarden mcp [flags] -- <server command…>`: an MCP server, its tool calls guarded.

Configured in an MCP client (Claude Desktop, Claude Code, Cursor, VS Code…) in place of
the server's own command. It starts the server as a subprocess (with this process's
environment and working directory), speaks MCP with the client over its own stdin and
stdout, and relays every message both ways (`relay.Relay`), checking each `tools/call`
with the daemon first. The SDK frames and parses the messages (`mcp.server.stdio`,
`mcp.client.stdio`). The server's stderr is this process's stderr.

The user is `--user`, else RATEWARDEN_USER, else the login name (command.py reads the
command line).
"""

from __future__ import annotations

import argparse
import os

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
        async with stdio_server() as client_streams, stdio_client(server) as server_streams:
            await Relay(session, client_streams, server_streams).run()
    finally:
        await guard.aclose()
