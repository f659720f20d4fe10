"""A real MCP server (the SDK's MCPServer, stdio) with one tool, `ci_status`, whose answer
changes every second call and then settles (drivers/ci_status.py); each call counted in
`$CI_COUNTER`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

sys.path.insert(0, str(Path(__file__).parent))
from ci_status import next_answer  # type: ignore[import-not-found,unused-ignore]

server = MCPServer("ratewarden-ci-server")


@server.tool()
def ci_status(run: str) -> str:
    """The state of a CI run."""
    return str(next_answer(Path(os.environ["CI_COUNTER"])))


if __name__ == "__main__":
    server.run()
