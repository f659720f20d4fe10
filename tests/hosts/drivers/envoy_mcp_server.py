"""A real MCP server (the SDK's MCPServer over streamable HTTP at /mcp) behind Envoy, for
tests/hosts/test_envoy.py: `python envoy_mcp_server.py PORT`.

Each tool appends a line to `$MCP_RAN` when it runs, so the test counts what really ran.
`read_file` is annotated read-only and `delete_file` destructive, but Envoy forwards no
annotations: ratewarden learns them from the policy's tools catalogue.
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("ratewarden-envoy-test-server")


def ran(line: str) -> None:
    with open(os.environ["MCP_RAN"], "a") as out:
        out.write(line + "\n")


@server.tool()
def terminal(command: str) -> str:
    """Run a shell command (pretend)."""
    ran(f"terminal {command}")
    return f"ran {command}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def read_file(path: str) -> str:
    """Read a file (pretend)."""
    ran(f"read_file {path}")
    return f"contents of {path}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
def delete_file(path: str) -> str:
    """Delete a file (pretend)."""
    ran(f"delete_file {path}")
    return f"deleted {path}"


if __name__ == "__main__":
    server.run("streamable-http", port=int(sys.argv[1]))
