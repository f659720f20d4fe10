"""The MCP server of bench/mcp_overhead.py: one tool, `echo`, that answers at once (MCP SDK's
MCPServer). Over stdio by default; `--http PORT` serves streamable HTTP at /mcp."""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("ratewarden-bench")


@server.tool()
def echo(text: str) -> str:
    """Answers with its argument."""
    return text


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", port=int(sys.argv[2]))
    else:
        server.run()
