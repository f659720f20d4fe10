"""A small MCP server (the `mcp` SDK's FastMCP, streamable HTTP) for ContextForge to front.

    python contextforge_server.py <port> <ran-file>

`terminal` appends its command to <ran-file> (one line a run) and answers `ran <command>`;
`broken` fails (an `isError` result); `wipe` is annotated destructive and `look` read-only.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mcp.server.fastmcp import FastMCP
from mcp.types import ToolAnnotations

PORT = int(sys.argv[1])
RAN = Path(sys.argv[2])

server = FastMCP("local", host="127.0.0.1", port=PORT, log_level="WARNING")


@server.tool()
def terminal(command: str) -> str:
    """Run a shell command (here: write it down)."""
    with RAN.open("a") as ran:
        ran.write(f"terminal {command}\n")
    return f"ran {command}"


@server.tool()
def broken(command: str) -> str:
    """A tool that always fails."""
    with RAN.open("a") as ran:
        ran.write(f"broken {command}\n")
    raise RuntimeError("the command failed")


@server.tool(annotations=ToolAnnotations(destructiveHint=True, readOnlyHint=False))
def wipe(path: str) -> str:
    """Delete a path (here: write it down)."""
    with RAN.open("a") as ran:
        ran.write(f"wipe {path}\n")
    return f"wiped {path}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def look(path: str) -> str:
    """Read a path (here: write it down)."""
    with RAN.open("a") as ran:
        ran.write(f"look {path}\n")
    return f"looked at {path}"


if __name__ == "__main__":
    server.run(transport="streamable-http")
