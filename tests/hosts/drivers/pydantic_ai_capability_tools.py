"""Drive a real pydantic-ai Agent's tool calls through RatewardenCapability; print what
it saw (models=False: the tool decisions alone, against a tool-only policy).

    python pydantic_ai_capability_tools.py '{"url": ..., "work": ...}'

- `limit`: three `terminal` calls, a turn each: two run, the third is refused and the
  model reads our message as the tool's result;
- `ask`: two `deploy` calls; the second meets an `ask` rule and, without `defer_asks`,
  is refused with its message;
- `deferred`: the same with `defer_asks=True`: the run ends with `DeferredToolRequests`
  (our message in the call's metadata), and once resumed with the approval the call runs.

The last line of stdout is the JSON report.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests, DeferredToolResults
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from ratewarden.client import AsyncGuard
from ratewarden.integrations.pydantic_ai_capability import ASK_METADATA, RatewardenCapability


@dataclass
class Deps:
    user_id: str


def scripted(tool: str, calls: int) -> FunctionModel:
    """Asks for `tool` once a turn, `calls` times, then answers."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(message, ModelResponse) for message in messages)
        if turn < calls:
            return ModelResponse(parts=[ToolCallPart(tool, {"target": f"t{turn + 1}"})])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond)


def tool_results(messages: list[ModelMessage]) -> list[str]:
    return [
        str(part.content)
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]


async def scenario(
    config: dict[str, Any], name: str, tool: str, calls: int, defer: bool = False
) -> dict[str, Any]:
    ran = Path(config["work"]) / f"{name}.ran"

    def record(target: str) -> str:
        with ran.open("a") as out:
            out.write(target + "\n")
        return f"ran {target}"

    def terminal(target: str) -> str:
        """Run a shell command (recorded)."""
        return record(target)

    def deploy(target: str) -> str:
        """Deploy somewhere (recorded)."""
        return record(target)

    guard = AsyncGuard(config["url"], fail="closed")
    capability = RatewardenCapability(guard, models=False, defer_asks=defer)
    agent = Agent(
        scripted(tool, calls),
        deps_type=Deps,
        tools=[terminal, deploy],
        output_type=[str, DeferredToolRequests],
        capabilities=[capability],
    )
    deps = Deps(f"{name}-user")
    report: dict[str, Any] = {}
    try:
        result = await agent.run("Go.", deps=deps)
        if isinstance(result.output, DeferredToolRequests):
            [call] = result.output.approvals
            report["deferred"] = result.output.metadata[call.tool_call_id][ASK_METADATA]
            approvals = DeferredToolResults(approvals={call.tool_call_id: True})
            result = await agent.run(
                deps=deps, message_history=result.all_messages(), deferred_tool_results=approvals
            )
        report["output"] = result.output
        report["results"] = tool_results(result.all_messages())
    finally:
        await guard.aclose()
    report["ran"] = len(ran.read_text().splitlines()) if ran.exists() else 0
    return report


async def main(config: dict[str, Any]) -> dict[str, Any]:
    return {
        "limit": await scenario(config, "limit", "terminal", 3),
        "ask": await scenario(config, "ask", "deploy", 2),
        "deferred": await scenario(config, "deferred", "deploy", 2, defer=True),
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
