"""The official MCP SDK client against `ratewarden mcp -- python mcp_server.py`, offline.

Runs in the mcp host venv (`mcp` 2.3.0 and ratewarden installed); argv[1] is a JSON config
(`ratewarden`: the venv's command, `python`, `server`, `url`, `dead_url`, `work`). Each
scenario is a session of its own (a proxy process of its own, for its own user); the
report, one JSON line on stdout, holds what the client received and what the server's
tools wrote.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

CONFIG: dict[str, Any] = json.loads(sys.argv[1])
WORK = Path(CONFIG["work"])


def text_of(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


def ran_lines(name: str) -> list[str]:
    path = WORK / f"{name}.ran"
    return path.read_text().splitlines() if path.exists() else []


class Session:
    """A client session through the proxy, as user `user`, its tools' log `name`.ran."""

    def __init__(self, name: str, user: str, *, url: str | None = None, **callbacks: Any):
        self.name = name
        flags = ["--user", user, "--url", url or CONFIG["url"], *callbacks.pop("flags", [])]
        self.params = StdioServerParameters(
            command=CONFIG["ratewarden"],
            args=["mcp", *flags, "--", CONFIG["python"], CONFIG["server"]],
            env={"MCP_RAN": str(WORK / f"{name}.ran"), "RATEWARDEN_FAIL": ""},
        )
        self.callbacks = callbacks

    async def run(self, scenario: Any) -> Any:
        async with (
            stdio_client(self.params) as (read, write),
            ClientSession(read, write, **self.callbacks) as session,
        ):
            await session.initialize()
            return await scenario(session)


async def calls(session: ClientSession, tool: str, arguments: list[dict[str, Any]]) -> list[Any]:
    results = []
    for args in arguments:
        result = await session.call_tool(tool, args)
        results.append({"text": text_of(result), "is_error": bool(result.is_error)})
    return results


async def limit() -> dict[str, Any]:
    """Eleven terminal calls under 10/minute, one at a time (a concurrency-1 rule too)."""
    args = [{"command": f"echo {i}"} for i in range(1, 12)]
    results = await Session("limit", "mcp-limit").run(lambda s: calls(s, "terminal", args))
    return {"results": results, "ran": ran_lines("limit")}


async def access() -> dict[str, Any]:
    async def scenario(session: ClientSession) -> Any:
        listed = await session.list_tools()  # the client's listing passes through unchanged
        annotations = {
            tool.name: tool.annotations.model_dump(by_alias=True, exclude_none=True)
            for tool in listed.tools
            if tool.annotations is not None
        }
        drop = await calls(session, "drop_table", [{"table": "users"}])
        read = await calls(session, "read_file", [{"path": "README"}])
        return {"annotations": annotations, "drop": drop, "read": read}

    report = await Session("access", "mcp-demo").run(scenario)
    return {**report, "ran": ran_lines("access")}


async def budget() -> dict[str, Any]:
    args = [{"item": f"thing {i}"} for i in range(3)]
    failing = [{"reason": "boom"}]

    async def scenario(session: ClientSession) -> Any:
        return await calls(session, "slow_paid", args) + await calls(session, "failing", failing)

    results = await Session("budget", "mcp-budget").run(scenario)
    return {"results": results, "ran": ran_lines("budget")}


async def passthrough() -> dict[str, Any]:
    progress: list[Any] = []
    seen: dict[str, Any] = {}

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        seen["elicit"] = params.message
        return types.ElicitResult(action="accept", content={"ok": True})

    async def on_sample(context: Any, params: types.CreateMessageRequestParams) -> Any:
        seen["sample"] = params.messages[0].content.text
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="fine"), model="fake"
        )

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append([value, total, message])

    async def scenario(session: ClientSession) -> Any:
        resources = await session.list_resources()
        read = await session.read_resource("notes://today")
        prompts = await session.list_prompts()
        prompt = await session.get_prompt("greet", {"name": "Ada"})
        result = await session.call_tool(
            "interactive", {"topic": "cats"}, progress_callback=on_progress
        )
        return {
            "resources": [str(item.uri) for item in resources.resources],
            "read": [
                item.text for item in read.contents if isinstance(item, types.TextResourceContents)
            ],
            "prompts": [item.name for item in prompts.prompts],
            "prompt": [
                m.content.text for m in prompt.messages if isinstance(m.content, types.TextContent)
            ],
            "interactive": text_of(result),
        }

    session = Session(
        "passthrough", "mcp-pass", elicitation_callback=on_elicit, sampling_callback=on_sample
    )
    report = await session.run(scenario)
    return {**report, "progress": progress, "seen": seen, "ran": ran_lines("passthrough")}


async def ask_accepted() -> dict[str, Any]:
    asked: list[str] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"approve": True})

    session = Session("ask_accepted", "mcp-ask-yes", elicitation_callback=on_elicit)
    results = await session.run(lambda s: calls(s, "deploy", [{"target": "prod"}]))
    return {"results": results, "asked": asked, "ran": ran_lines("ask_accepted")}


async def ask_declined() -> dict[str, Any]:
    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="decline")

    session = Session("ask_declined", "mcp-ask-no", elicitation_callback=on_elicit)
    results = await session.run(lambda s: calls(s, "deploy", [{"target": "prod"}]))
    return {"results": results, "ran": ran_lines("ask_declined")}


async def ask_without_elicitation() -> dict[str, Any]:
    session = Session("ask_none", "mcp-ask-none")  # no callback: no elicitation capability
    results = await session.run(lambda s: calls(s, "deploy", [{"target": "prod"}]))
    return {"results": results, "ran": ran_lines("ask_none")}


async def fail_modes() -> dict[str, Any]:
    args = [{"command": "echo 1"}, {"command": "echo 2"}]
    report = {}
    for mode in ("open", "closed"):
        name = f"fail_{mode}"
        session = Session(name, "mcp-fail", url=CONFIG["dead_url"], flags=["--fail", mode])
        results = await session.run(lambda s: calls(s, "terminal", args))
        report[mode] = {"results": results, "ran": ran_lines(name)}
    return report


async def cancelled() -> dict[str, Any]:
    """A slow call the client gives up on (the SDK sends notifications/cancelled), then
    another: under one-at-a-time, the second runs only if the cancel settled the first."""

    async def scenario(session: ClientSession) -> Any:
        try:
            await session.call_tool("slow_paid", {"item": "late"}, read_timeout_seconds=0.05)
            first = "answered"
        except Exception as exc:  # the SDK's timeout error
            first = type(exc).__name__
        await asyncio.sleep(0.5)  # the server's handler would have ended by now anyway
        return {"first": first, "second": await calls(session, "slow_paid", [{"item": "next"}])}

    report = await Session("cancelled", "mcp-cancel").run(scenario)
    return {**report, "ran": ran_lines("cancelled")}


async def abandoned() -> dict[str, Any]:
    """A client that leaves (closes the proxy's stdin) while its call runs, without a
    cancel: the proxy settles the call as the session ends. Raw stdio, so that no SDK
    session sends its courtesy cancel first."""
    session = Session("abandoned", "mcp-abandon")
    params = session.params
    messages = [
        types.JSONRPCRequest(
            jsonrpc="2.0", id=0, method="initialize",
            params={"protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"}},
        ),
        types.JSONRPCNotification(jsonrpc="2.0", method="notifications/initialized"),
        types.JSONRPCRequest(
            jsonrpc="2.0", id=1, method="tools/call",
            params={"name": "hang", "arguments": {"label": "left"}},
        ),
    ]  # fmt: skip
    process = await asyncio.create_subprocess_exec(
        params.command,
        *params.args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        env={**os.environ, **(params.env or {})},
    )
    assert process.stdin is not None
    for message in messages:
        process.stdin.write(message.model_dump_json(by_alias=True, exclude_unset=True).encode())
        process.stdin.write(b"\n")
    await process.stdin.drain()
    while not ran_lines("abandoned"):  # the call reached the tool: it is in flight
        await asyncio.sleep(0.05)
    process.stdin.close()  # the client is gone
    code = await asyncio.wait_for(process.wait(), timeout=60)
    return {"exit": code, "ran": ran_lines("abandoned")}


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


async def padded() -> dict[str, Any]:
    """Issue 25: `rm -rf /` padded past the wire's caps, each way, then an `echo` padded
    alike, then one padded call four times under a loop rule."""
    pads: dict[str, Any] = {
        "large": {"pad": "x" * 70_000},
        "deep": {"deep": nested(40)},
        "many": {"many": list(range(5_000))},
        "escapes": {"escapes": ["\u0001" * 100] * 500},
    }
    rm = [{"command": "rm -rf /", **pad} for pad in pads.values()]
    echo = [{"command": "echo fine", **pad} for pad in pads.values()]
    loop = [{"command": "echo again", "pad": "y" * 70_000}] * 4
    return {
        "names": list(pads),
        "rm": await Session("padded", "mcp-padded").run(lambda s: calls(s, "terminal", rm)),
        "echo": await Session("padded", "mcp-padded").run(lambda s: calls(s, "terminal", echo)),
        "loop": await Session("loop", "mcp-padded-loop").run(lambda s: calls(s, "terminal", loop)),
        "ran": ran_lines("padded"),
    }


async def main() -> None:
    report = {
        "padded": await padded(),  # first: `limit`'s minute is read at the end
        "limit": await limit(),
        "access": await access(),
        "budget": await budget(),
        "passthrough": await passthrough(),
        "ask_accepted": await ask_accepted(),
        "ask_declined": await ask_declined(),
        "ask_none": await ask_without_elicitation(),
        "fail": await fail_modes(),
        "cancelled": await cancelled(),
        "abandoned": await abandoned(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
