"""A real MCP server over stdio whose tools carry ToolAnnotations, for the Strands driver.

Run by `strands_agent.py` inside the strands host venv (the `mcp` package comes with
strands-agents). Each tool appends its name to the file named by argv[1], so the test
counts what really ran.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

RAN = Path(sys.argv[1])
server = MCPServer("ratewarden-test")


def _ran(name: str) -> str:
    with RAN.open("a") as out:
        out.write(f"{name}\n")
    return f"{name} done"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup(query: str) -> str:
    """Look something up (read-only)."""
    return _ran("lookup")


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
def wipe(path: str) -> str:
    """Delete a path (destructive)."""
    return _ran("wipe")


@server.tool()
def mystery(value: str) -> str:
    """A tool its server did not classify."""
    return _ran("mystery")


if __name__ == "__main__":
    server.run("stdio")
