"""A real MCP server (the SDK's MCPServer, stdio) for the proxy's tests.

Each tool appends a line to `$MCP_RAN` when it runs, so the tests count what really ran.
`read_file` is annotated read-only, `drop_table` destructive; `terminal` and the others
are unannotated. `interactive` uses what a server asks of its client through the proxy:
progress, an elicitation, and sampling. `shred` starts marked not destructive; `arm`
marks it destructive and tells the client the list changed. `$MCP_STARTED`, if set, gets
a line per process started. Over stdio by default; `--http PORT` serves streamable HTTP
at `http://127.0.0.1:PORT/mcp` (the gateway's URL upstream).
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import SamplingMessage, TextContent, ToolAnnotations
from pydantic import BaseModel

server = MCPServer("ratewarden-test-server")


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
def drop_table(table: str) -> str:
    """Drop a table (pretend)."""
    ran(f"drop_table {table}")
    return f"dropped {table}"


@server.tool()
async def slow_paid(item: str) -> str:
    """A paid call that takes a while."""
    await asyncio.sleep(0.2)
    ran(f"slow_paid {item}")
    return f"bought {item}"


@server.tool()
def deploy(target: str) -> str:
    """Deploy (needs a human's approval by policy)."""
    ran(f"deploy {target}")
    return f"deployed {target}"


@server.tool()
def failing(reason: str) -> str:
    """A tool that fails: an isError result."""
    ran(f"failing {reason}")
    raise ValueError(f"failed: {reason}")


@server.tool()
async def hang(label: str) -> str:
    """Starts, then outlives any test: the client leaves while it runs."""
    ran(f"hang {label} started")
    await asyncio.sleep(60)
    return "never"


def shred(paper: str) -> str:
    """Not destructive until `arm` runs."""
    ran(f"shred {paper}")
    return f"shredded {paper}"


server.add_tool(shred, annotations=ToolAnnotations(destructiveHint=False))


@server.tool(annotations=ToolAnnotations(destructiveHint=False))
async def arm(ctx: Context) -> str:
    """Marks `shred` destructive (for every session of this server) and says so."""
    server.remove_tool("shred")
    server.add_tool(shred, annotations=ToolAnnotations(destructiveHint=True))
    await ctx.session.send_tool_list_changed()  # a session's client (before 2026-07-28)
    await ctx.notify_tools_changed()  # a client listening on 2026-07-28 (subscriptions/listen)
    return "armed"


class Confirm(BaseModel):
    ok: bool


@server.tool()
async def interactive(topic: str, ctx: Context) -> str:
    """Reports progress, asks the user, and samples the client's model."""
    await ctx.report_progress(0.5, 1.0, "half way")
    answer = await ctx.elicit(f"Go on with {topic}?", Confirm)
    sampled = await ctx.session.create_message(
        [SamplingMessage(role="user", content=TextContent(type="text", text=f"about {topic}"))],
        max_tokens=10,
    )
    ran(f"interactive {topic}")
    text = sampled.content.text if isinstance(sampled.content, TextContent) else "?"
    ok = answer.action == "accept" and answer.data is not None and answer.data.ok
    return f"elicited {answer.action} ok={ok}; sampled {text}"


@server.tool()
async def steps(label: str, ctx: Context) -> str:
    """Reports its progress twice, and asks its client nothing."""
    await ctx.report_progress(1.0, 2.0, "one of two")
    await ctx.report_progress(2.0, 2.0, "two of two")
    ran(f"steps {label}")
    return f"stepped {label}"


@server.resource("notes://today")
def notes() -> str:
    return "today's notes"


@server.prompt()
def greet(name: str) -> str:
    return f"Say hello to {name}"


if __name__ == "__main__":
    if os.environ.get("MCP_STARTED"):  # one line per process: the gateway's tests count them
        with open(os.environ["MCP_STARTED"], "a") as started:
            started.write(f"{os.getpid()}\n")
    if sys.argv[1:2] == ["--http"]:  # `--http PORT`: streamable HTTP at /mcp
        server.run("streamable-http", port=int(sys.argv[2]))
    else:
        server.run()
