"""`ratewarden mcp [flags] -- <server command…>`: an MCP server, its tool calls guarded.

Configured in an MCP client (Claude Desktop, Claude Code, Cursor, VS Code…) in place of
the server's own command. It starts the server as a subprocess (with this process's
environment and working directory), speaks MCP with the client over its own stdin and
stdout, and relays every message both ways (`relay.Relay`), checking each `tools/call`
with the daemon first. The SDK frames and parses the messages (`mcp.server.stdio`,
`mcp.client.stdio`). The server's stderr is this process's stderr.

The user is `--user`, else RATEWARDEN_USER, else the login name; `--url`, `--token` and
`--fail` default to RATEWARDEN_URL, RATEWARDEN_TOKEN and RATEWARDEN_FAIL.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence

from ratewarden.hooks.command import add_client_flags
from ratewarden.vocabulary import ClientSettings, fail_mode

__all__ = ["cli"]
USAGE = (
    "ratewarden mcp [--user U] [--team T] [--url URL] [--token T] [--fail open|closed] "
    "-- COMMAND [ARG...]"
)


MISSING_SDK = "ratewarden mcp needs the MCP SDK, an optional extra: pip install 'ratewarden[mcp]'"


def cli(argv: Sequence[str]) -> int:
    """Run `ratewarden mcp` with `argv` (what follows `mcp`); the exit status."""
    given = list(argv)
    split = given.index("--") if "--" in given else len(given)
    flags, command = given[:split], given[split + 1 :]
    parser = argparse.ArgumentParser(
        prog="ratewarden mcp",
        usage=USAGE,
        description="Start the MCP server COMMAND and relay a client's stdio to it, "
        "checking each tools/call with the ratewarden daemon.",
    )
    add_client_flags(
        parser,
        user_help="who calls (default $RATEWARDEN_USER, else the OS login name)",
        fail_default=None,
    )
    options = parser.parse_args(flags)  # --help, or a bad flag, ends here (exit 2)
    if not command:
        parser.error("give the server's command after --")
    if importlib.util.find_spec("mcp") is None:  # an optional extra: say how to get it
        print(MISSING_SDK, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="ratewarden: %(message)s")
    import anyio

    anyio.run(_serve, options, command)
    return 0


async def _serve(options: argparse.Namespace, command: list[str]) -> None:
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.server.stdio import stdio_server

    from ratewarden.client import AsyncGuard
    from ratewarden.mcp.guard import SessionGuard
    from ratewarden.mcp.relay import Relay

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
