"""The official MCP SDK client polls `ci_status` through `ratewarden mcp` (stdio), offline.

Runs in the mcp host venv; argv[1] is a JSON config (`ratewarden`, `python`, `server`,
`url`, `work`, `user`, `polls`). One session polls the same run `polls` times; the report
(one JSON line) holds each answer's text and error flag.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

CONFIG: dict[str, Any] = json.loads(sys.argv[1])


async def main() -> dict[str, Any]:
    params = StdioServerParameters(
        command=CONFIG["ratewarden"],
        args=[
            "mcp",
            "--user",
            CONFIG["user"],
            "--url",
            CONFIG["url"],
            "--",
            CONFIG["python"],
            CONFIG["server"],
        ],
        env={"CI_COUNTER": str(Path(CONFIG["work"]) / "mcp.count"), "RATEWARDEN_FAIL": ""},
    )
    results = []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        for _ in range(CONFIG["polls"]):
            result = await session.call_tool("ci_status", {"run": "42"})
            text = "".join(b.text for b in result.content if isinstance(b, types.TextContent))
            results.append({"text": text, "is_error": bool(result.is_error)})
    return {"results": results}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
