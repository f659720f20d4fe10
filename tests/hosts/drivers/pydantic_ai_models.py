"""Drive a real pydantic-ai Agent, offline, through RatewardenCapability; print what it saw.

Runs inside the pydantic_ai host venv (tests/helpers/hostenv.py):

    python pydantic_ai_models.py '{"url": ..., "work": ..., "model": "gpt-4o",
                                    "usage": {...}, "user": ..., "other": ...}'

The shared scenario of tests/hosts/model_budget.py, with a pydantic-ai `FunctionModel`
named `model` that reports `usage` for every answer (pydantic-ai's `RequestUsage`):

- `drain`: `user`'s runs of one model request each (a text answer), the day's spend read
  from the daemon after each, until a request's maximum cost no longer fits;
- `last`: `user`'s run whose model asks for `terminal` (allowed: what is left still
  covers it) then, after the tool's result, answers: the tool call and the answer after
  it are what the drained budget refuses;
- `streamed`: the same refusal through `agent.run_stream`;
- `small`: `user`'s run with `max_tokens` 1000 and a small usage: its maximum fits what
  is left, so it is asked and settled;
- `fails`: `user`'s run like `small` whose model raises: settled as failed, nothing spent;
- `structured`: `user`'s run with a structured output, refused (`ModelCallRefused`);
- `other`: `other`'s run asking for `terminal` once, then answering;
- `abandoned`: `user`'s streamed run with `max_tokens` 1000, given up (an exception out of
  `run_stream`) after its first chunk of text: what the provider used is unknown, so the
  whole reservation is charged.

The model counts the requests it really received; the tool appends a line per run. The
last line of stdout is the JSON report.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from ratewarden.client import AsyncGuard
from ratewarden.integrations.pydantic_ai_capability import ModelCallRefused, RatewardenCapability

RULE = "daily-spend"


@dataclass
class Deps:
    user_id: str


class Verdict(BaseModel):
    ok: bool


class Script:
    """A scripted model: asks for `terminal` when told to, else answers; counts requests."""

    def __init__(self, usage: dict[str, int], tool_first: bool = False, fail: bool = False):
        self.usage = usage
        self.tool_first = tool_first
        self.fail = fail
        self.requests = 0

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests += 1
        if self.fail:
            raise RuntimeError("the provider is down")
        returns = [
            str(part.content)
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
        ]
        if self.tool_first and not returns:
            part: Any = ToolCallPart("terminal", {"command": "echo hi"})
        elif info.output_tools:
            part = ToolCallPart(info.output_tools[0].name, {"ok": True})
        else:
            part = TextPart(f"answer {self.requests}")
        return ModelResponse(parts=[part], usage=RequestUsage(**self.usage))

    async def stream(self, messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        """Streamed, the scripted model answers in text (pydantic-ai estimates the usage),
        in three chunks."""
        self.requests += 1
        for chunk in (f"answer {self.requests}", " and", " more"):
            yield chunk
            await asyncio.sleep(0)


class GivenUp(Exception):
    """The consumer stops reading a stream."""


async def abandoned(config: dict[str, Any], user: str) -> dict[str, Any]:
    """`user`'s streamed run given up after its first chunk: the reservation while it
    streamed, what giving up charged, and what is still held after."""
    url = config["url"]
    script = Script({"input_tokens": 100, "output_tokens": 50})
    model = FunctionModel(script.respond, stream_function=script.stream, model_name=config["model"])
    guard = AsyncGuard(url, fail="closed")
    agent = Agent(model, deps_type=Deps, capabilities=[RatewardenCapability(guard)])
    before, reserved, chunks = spent(url, user), 0, []
    try:
        async with agent.run_stream(
            "Go.", deps=Deps(user), model_settings={"max_tokens": 1000}
        ) as stream:
            async for text in stream.stream_text(delta=True, debounce_by=None):
                chunks.append(text)
                reserved = spent(url, user, "reserved")
                raise GivenUp
    except GivenUp:
        pass
    finally:
        await guard.aclose()
    return {
        "chunks": chunks,
        "reserved_while_streaming": reserved,
        "charged": spent(url, user) - before,
        "reserved_after": spent(url, user, "reserved"),
    }


def spent(url: str, user: str, field: str = "used") -> int:
    """`user`'s spend (or what is reserved) under the rule today in micro-USD."""
    limits = httpx.get(f"{url}/v1/usage", params={"user": user}, trust_env=False).json()
    used = {item["rule"]: item.get(field) or 0 for item in limits["limits"]}.get(RULE, 0)
    return round(float(used) * 1_000_000)


async def run(
    config: dict[str, Any],
    user: str,
    script: Script,
    *,
    settings: dict[str, Any] | None = None,
    output_type: Any = str,
    streamed: bool = False,
) -> dict[str, Any]:
    work = Path(config["work"])

    def terminal(command: str) -> str:
        """Run a shell command (recorded, not executed)."""
        with (work / f"{user}.ran").open("a") as out:
            out.write(command + "\n")
        return f"ran {command}"

    model = FunctionModel(script.respond, stream_function=script.stream, model_name=config["model"])
    guard = AsyncGuard(config["url"], fail="closed")
    agent = Agent(
        model,
        deps_type=Deps,
        tools=[terminal],
        output_type=output_type,
        capabilities=[RatewardenCapability(guard)],
    )
    report: dict[str, Any] = {}
    try:
        if streamed:
            async with agent.run_stream("Go.", deps=Deps(user)) as stream:
                report["output"] = await stream.get_output()
            return {**report, "requests": script.requests}
        result = await agent.run("Go.", deps=Deps(user), model_settings=settings)
        report["output"] = result.output if isinstance(result.output, str) else "structured"
        report["tool_results"] = [  # what the run recorded, read by the model or not
            str(part.content)
            for message in result.all_messages()
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart) and part.tool_name == "terminal"
        ]
    except ModelCallRefused as refused:
        report["refused"] = refused.message
    except RuntimeError as error:  # the model's own failure, as pydantic-ai raises it
        report["error"] = str(error)
    finally:
        await guard.aclose()
    report["requests"] = script.requests
    ran = work / f"{user}.ran"
    report["ran"] = len(ran.read_text().splitlines()) if ran.exists() else 0
    return report


async def main(config: dict[str, Any]) -> dict[str, Any]:
    url, user, usage = config["url"], config["user"], config["usage"]
    report: dict[str, Any] = {"drain": [], "spent": []}
    # Each request's most (8000 output tokens) must fit what is left: ten-odd fit.
    for _ in range(config["drain"]):
        report["drain"].append(await run(config, user, Script(usage)))
        report["spent"].append(spent(url, user))
    report["other_before"] = spent(url, config["other"])
    report["last"] = await run(config, user, Script(usage, tool_first=True))
    report["spent_after_last"] = spent(url, user)
    report["streamed"] = await run(config, user, Script(usage), streamed=True)
    small = {"input_tokens": 100, "output_tokens": 50}
    report["small"] = await run(config, user, Script(small), settings={"max_tokens": 1000})
    report["spent_after_small"] = spent(url, user)
    small_settings = {"max_tokens": 1000}
    report["fails"] = await run(config, user, Script(small, fail=True), settings=small_settings)
    report["after_fail"] = [spent(url, user), spent(url, user, "reserved")]
    report["structured"] = await run(config, user, Script(usage), output_type=Verdict)
    report["other"] = await run(config, config["other"], Script(usage, tool_first=True))
    report["other_spent"] = spent(url, config["other"])
    report["abandoned"] = await abandoned(config, user)
    return report


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
