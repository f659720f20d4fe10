"""An MCP client (the `mcp` SDK's, streamable HTTP) calling tools through ContextForge.

    python contextforge_client.py '<json: url, token, calls: [[tool, args], ...]>'

Connects to the gateway's `/mcp` endpoint with the bearer token, lists the tools, makes
each call in turn, and prints one JSON line: each call's `isError` and text as the client
received them, and the tools listed (the gateway's names and their annotations).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client


def text_of(result: Any) -> str:
    return "\n".join(getattr(part, "text", "") for part in result.content)


async def main(config: dict[str, Any]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {config['token']}"}
    async with (
        streamablehttp_client(config["url"], headers=headers) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        listed = await session.list_tools()
        names = {tool.name: tool.annotations for tool in listed.tools}
        results = []
        for name, args in config["calls"]:  # the gateway's names: `<server>-<tool>`
            result = await session.call_tool(name, args)
            text = text_of(result)
            results.append({"tool": name, "is_error": bool(result.isError), "text": text})
    listed_tools = {
        name: (annotations.model_dump(exclude_none=True) if annotations else None)
        for name, annotations in names.items()
    }
    return {"results": results, "tools": listed_tools}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
