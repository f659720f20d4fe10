"""Drive a real pydantic-ai Agent, offline, through RatewardenMiddleware; print what it saw.

Runs inside the pydantic_ai host venv (tests/helpers/hostenv.py), never in the main one:

    python pydantic_ai_agent.py '{"url": "http://127.0.0.1:PORT", "dead_url": ..., "work": ...}'

Every scenario is one agent run (in its own event loop, as `asyncio.run` gives) whose
model is a pydantic-ai `FunctionModel` following a plan: one tool call per turn (or
several at once, which pydantic-ai runs in parallel), then an answer. The model records
every tool result it receives. The tools are plain functions in a `FunctionToolset`
wrapped by `MiddlewareToolset`, as an application wires them, and each appends a line
to its scenario's file so the test counts what really ran. The last line of stdout is a
JSON report: scenario -> {"results": [...], "ran": N, ...}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai_middleware import MiddlewareToolset, ToolDecision
from send_result import AsyncSendResult  # type: ignore[import-not-found,unused-ignore]

from ratewarden.client import AsyncGuard
from ratewarden.integrations.pydantic_ai import RatewardenMiddleware

WORK = Path()
Call = tuple[str, dict[str, Any]]
Plan = list[Call] | list[list[Call]]  # a turn: one call, or calls made together


@dataclass
class Deps:
    user_id: str


def ran(scenario: str) -> Path:
    return WORK / f"{scenario}.ran"


def _record(command: str) -> str:
    with ran(os.environ["SCENARIO"]).open("a") as out:
        out.write(command + "\n")
    return f"ran {command}"


def terminal(command: str) -> str:
    """Run a shell command (recorded, not executed)."""
    if command == "fail":
        raise ModelRetry("the command failed")
    return _record(command)


BUILDS_TOGETHER: list[asyncio.Barrier] = []


async def build(target: str) -> str:
    """Build something (recorded); builds wait inside for each other, two at a time.

    So both calls of a parallel turn are checked before either of them is settled.
    """
    if not BUILDS_TOGETHER:
        BUILDS_TOGETHER.append(asyncio.Barrier(2))
    await asyncio.wait_for(BUILDS_TOGETHER[0].wait(), timeout=10)
    return _record(f"build {target}")


def deploy(target: str) -> str:
    """Deploy somewhere (recorded)."""
    return _record(f"deploy {target}")


def scripted_model(plan: Plan, seen: list[str]) -> FunctionModel:
    """Makes the calls of `plan`, a turn at a time, then answers; `seen` gets the results."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        results = [
            str(part.content)
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart | RetryPromptPart)
        ]
        seen[:] = results
        turn = sum(isinstance(message, ModelResponse) for message in messages)
        if turn < len(plan):
            calls = plan[turn]
            together = calls if isinstance(calls, list) else [calls]
            return ModelResponse(parts=[ToolCallPart(name, args) for name, args in together])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(respond)


async def run_agent(
    scenario: str,
    plan: Plan,
    middleware: RatewardenMiddleware,
    deps: Any,
    handler: Any = None,
) -> dict[str, Any]:
    os.environ["SCENARIO"] = scenario
    ran(scenario).touch()
    seen: list[str] = []
    tools = MiddlewareToolset(
        wrapped=FunctionToolset([terminal, deploy, build]),
        middleware=[middleware],
        permission_handler=handler,
    )
    agent = Agent(scripted_model(plan, seen), deps_type=type(deps), toolsets=[tools])
    result = await agent.run("go", deps=deps)
    lines = ran(scenario).read_text().splitlines()
    return {"results": seen, "ran": len(lines), "output": result.output}


def terminal_plan(count: int) -> Plan:
    return [("terminal", {"command": f"echo {i}"}) for i in range(1, count + 1)]


class NoSettle(RatewardenMiddleware):
    """The control: allows like RatewardenMiddleware, never settles."""

    async def after_tool_call(self, *args: Any, **kwargs: Any) -> Any:
        return args[2]


class Approver:
    """A PermissionHandler that says yes, and remembers what it was asked."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    async def __call__(self, tool_name: str, tool_args: dict[str, Any], reason: str) -> bool:
        self.asked.append([tool_name, reason])
        return True


def scenarios(url: str, dead_url: str) -> dict[str, Any]:
    report: dict[str, Any] = {}
    os.environ["RATEWARDEN_URL"] = url
    default = RatewardenMiddleware()  # from the environment
    report["limit"] = asyncio.run(
        run_agent("limit", terminal_plan(11), default, Deps("discord:77"))
    )
    # The same middleware in a second event loop builds a second client.
    report["second_loop"] = asyncio.run(
        run_agent("second_loop", terminal_plan(1), default, Deps("discord:78"))
    )
    report["no_settle"] = asyncio.run(
        run_agent("no_settle", terminal_plan(2), NoSettle(), Deps("no-settle-user"))
    )
    # Two turns of two parallel builds under a cap of two: the second turn runs only if
    # each call of the first was settled under its own call id.
    builds: Plan = [
        [("build", {"target": "a"}), ("build", {"target": "b"})],
        [("build", {"target": "c"}), ("build", {"target": "d"})],
    ]
    report["parallel"] = asyncio.run(
        run_agent("parallel", builds, RatewardenMiddleware(), Deps("parallel-user"))
    )
    report["tool_error"] = asyncio.run(
        run_agent(
            "tool_error",
            [("terminal", {"command": "fail"}), ("terminal", {"command": "after"})],
            RatewardenMiddleware(),
            {"user_id": "errors-user"},
        )
    )
    report.update(ask_scenarios(url))
    report["tool_call_id"] = asyncio.run(tool_call_id_scenario(url))
    transport = AsyncSendResult()  # the daemon answers send_result: the settles it got
    middleware = RatewardenMiddleware(AsyncGuard(url, transport=transport))
    plan: Plan = [("terminal", {"command": "gh run view 7"})] * 2
    digest = asyncio.run(run_agent("digest", plan, middleware, Deps("digest-user")))
    report["digest"] = {**digest, "settles": transport.settles}

    os.environ["RATEWARDEN_URL"] = dead_url
    report["fail_open"] = asyncio.run(
        run_agent("fail_open", terminal_plan(3), RatewardenMiddleware(), Deps("u-open"))
    )
    closed = RatewardenMiddleware(fail="closed")
    report["fail_closed"] = asyncio.run(
        run_agent("fail_closed", terminal_plan(2), closed, Deps("u-closed"))
    )
    return report


def ask_scenarios(url: str) -> dict[str, Any]:
    """`deploy` allows 1 a minute, then asks: approved by a handler, or blocked without."""

    async def approved() -> dict[str, Any]:
        approver = Approver()
        middleware = RatewardenMiddleware(
            AsyncGuard(url), user=lambda deps: deps["account"]
        )  # an explicit guard, and a user lookup of our own
        plan: Plan = [("deploy", {"target": "a"}), ("deploy", {"target": "b"})]
        outcome = await run_agent("ask_approved", plan, middleware, {"account": "acct-9"}, approver)
        return {**outcome, "asked": approver.asked}

    async def direct() -> dict[str, Any]:
        middleware = RatewardenMiddleware()
        answer = await middleware.before_tool_call("deploy", {}, Deps("acct-9"))
        return {
            "type": type(answer).__name__,
            "is_ask": answer.decision is ToolDecision.ASK,
            "reason": answer.reason,
        }

    plan: Plan = [("deploy", {"target": "a"}), ("deploy", {"target": "b"})]
    return {
        "ask_approved": asyncio.run(approved()),
        "ask_direct": asyncio.run(direct()),
        "ask_no_handler": asyncio.run(
            run_agent("ask_no_handler", plan, RatewardenMiddleware(), Deps("acct-10"))
        ),
    }


async def tool_call_id_scenario(url: str) -> dict[str, Any]:
    """A context carrying the host's tool_call_id: it leads the call id the daemon sees."""
    middleware = RatewardenMiddleware(AsyncGuard(url))
    context = SimpleNamespace(tool_call_id="call_xyz")
    answer = await middleware.before_tool_call("forbidden", {}, Deps("ids-user"), context)
    return {"decision": answer.decision.value, "reason": answer.reason}


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    WORK = Path(config["work"])
    print(json.dumps(scenarios(config["url"], config["dead_url"])))
