"""Drive a real OpenAI Agents SDK run, offline, through ratewarden's guardrails.

Runs inside the openai_agents host venv (tests/helpers/hostenv.py), never in the main one:

    python openai_agents_run.py '{"url": "http://127.0.0.1:PORT", "dead_url": ..., "work": ...}'

Every scenario is one `Runner.run` (in its own event loop, as `asyncio.run` gives) of an
agent whose model is the SDK's `agents.testing.ScriptedModel`: one function call per
turn (or several, which the SDK runs in parallel), then an answer. What the model
received is read back from the input of its last call. The tools are real function
tools and each appends a line to its scenario's file, so the test counts what really ran.
The last line of stdout is a JSON report: scenario -> {"results": [...], "ran": N, ...}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents import Agent, FunctionTool, RunHooks, Runner, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message, function_call
from send_result import AsyncSendResult  # type: ignore[import-not-found,unused-ignore]

from ratewarden.client import AsyncGuard
from ratewarden.integrations.openai_agents import (
    RatewardenRunHooks,
    make_ratewarden_guardrail,
    ratewarden_guardrail,
    ratewarden_settle_guardrail,
)

WORK = Path()


@dataclass
class Context:
    user_id: str


def _record(command: str) -> str:
    with (WORK / f"{os.environ['SCENARIO']}.ran").open("a") as out:
        out.write(command + "\n")
    return f"ran {command}"


@function_tool(
    tool_input_guardrails=[ratewarden_guardrail],
    tool_output_guardrails=[ratewarden_settle_guardrail],
)
def terminal(command: str) -> str:
    """Run a shell command (recorded, not executed)."""
    if command == "fail":
        raise RuntimeError("the command failed")
    return _record(command)


def guarded(
    guardrail: Any, *, settle: bool = False, name: str = "terminal", together: int = 1
) -> FunctionTool:
    """The same tool with other guardrails (the decorator, called as a function).

    `together`: each call waits inside the tool until that many calls are in it, so
    parallel calls are all checked before any of them is settled.
    """
    barrier: asyncio.Barrier | None = None

    async def run_command(command: str) -> str:
        """Run a shell command (recorded, not executed)."""
        nonlocal barrier
        barrier = barrier or asyncio.Barrier(together)
        await asyncio.wait_for(barrier.wait(), timeout=10)
        return _record(command)

    return function_tool(
        run_command,
        name_override=name,
        tool_input_guardrails=[guardrail],
        tool_output_guardrails=[ratewarden_settle_guardrail] if settle else None,
    )


async def run_agent(
    scenario: str,
    tool: FunctionTool,
    commands: list[str],
    context: Any,
    hooks: RunHooks[Any] | None = None,
    per_turn: int = 1,
) -> dict[str, Any]:
    """`commands`, `per_turn` calls a turn (run in parallel), call ids `call_1`, `call_2`..."""
    os.environ["SCENARIO"] = scenario
    ran = WORK / f"{scenario}.ran"
    ran.touch()
    calls = [
        function_call(tool.name, {"command": command}, call_id=f"call_{i}")
        for i, command in enumerate(commands, 1)
    ]
    steps: list[Any] = [calls[i : i + per_turn] for i in range(0, len(calls), per_turn)]
    model = ScriptedModel([*steps, [assistant_message("done")]])
    agent = Agent(name="assistant", model=model, tools=[tool])
    result = await Runner.run(agent, "go", context=context, hooks=hooks, max_turns=len(steps) + 2)
    model.assert_complete()
    last_input = model.calls[-1].input
    results = [
        item["output"]
        for item in last_input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    return {
        "results": results,
        "ran": len(ran.read_text().splitlines()),
        "output": result.final_output,
        "guardrails": [g.output.output_info for g in result.tool_input_guardrail_results],
    }


async def one_call_runs(count: int) -> dict[str, Any]:
    """`count` runs of one call each, all with the call id `call_1`.

    The SDK refuses a call id reused within a run, but a scripted or self-hosted model
    starts its ids afresh each run: the daemon must still count every call.
    """
    results: list[str] = []
    for i in range(1, count + 1):
        one = await run_agent("repeat_ids", terminal, [f"echo {i}"], Context("repeat-user"))
        results += one["results"]
    return {**one, "results": results}


def commands(count: int) -> list[str]:
    return [f"echo {i}" for i in range(1, count + 1)]


def result_scenarios(url: str) -> dict[str, Any]:
    """Two identical calls, the daemon answering `send_result`, settled by the output
    guardrail or by the run hooks: the settle bodies the daemon got."""
    report = {}
    for name in ("digest_guardrail", "digest_hooks"):
        transport = AsyncSendResult()
        check = make_ratewarden_guardrail(AsyncGuard(url, transport=transport))
        by_hooks = name == "digest_hooks"
        tool = guarded(check, settle=not by_hooks)
        hooks = RatewardenRunHooks() if by_hooks else None
        found = asyncio.run(
            run_agent(name, tool, ["gh run view 7"] * 2, Context(f"{name}-user"), hooks=hooks)
        )
        report[name] = {**found, "settles": transport.settles}
    return report


def scenarios(url: str, dead_url: str) -> dict[str, Any]:
    os.environ["RATEWARDEN_URL"] = url
    report = {
        "limit": asyncio.run(run_agent("limit", terminal, commands(11), Context("discord:77"))),
        "repeat_ids": asyncio.run(one_call_runs(11)),
        "tool_error": asyncio.run(
            run_agent("tool_error", terminal, ["fail", "after"], {"user_id": "errors-user"})
        ),
        "hooks": asyncio.run(
            run_agent(
                "hooks",
                guarded(ratewarden_guardrail),
                commands(3),
                {"user_id": "hooks-user"},
                hooks=RatewardenRunHooks(),
            )
        ),
        # Two turns of two parallel calls under a cap of two: the second turn runs only
        # if each call of the first was settled under its own call id.
        "parallel": asyncio.run(
            run_agent(
                "parallel",
                guarded(ratewarden_guardrail, settle=True, name="build", together=2),
                ["a", "b", "c", "d"],
                Context("parallel-user"),
                per_turn=2,
            )
        ),
        "no_settle": asyncio.run(
            run_agent("no_settle", guarded(ratewarden_guardrail), commands(2), Context("no-settle"))
        ),
    }
    own_guard = make_ratewarden_guardrail(AsyncGuard(url), user=lambda context: context["account"])
    report["factory"] = asyncio.run(
        run_agent("factory", guarded(own_guard, settle=True), commands(2), {"account": "acct-9"})
    )
    report["ask"] = asyncio.run(
        run_agent(
            "ask",
            guarded(make_ratewarden_guardrail(), name="deploy"),
            ["a", "b"],
            Context("ask-user"),
        )
    )

    report.update(result_scenarios(url))

    os.environ["RATEWARDEN_URL"] = dead_url
    report["fail_open"] = asyncio.run(
        run_agent("fail_open", guarded(make_ratewarden_guardrail()), commands(3), Context("u"))
    )
    closed = make_ratewarden_guardrail(fail="closed")
    report["fail_closed"] = asyncio.run(
        run_agent("fail_closed", guarded(closed), commands(2), Context("u"))
    )
    return report


if __name__ == "__main__":
    set_tracing_disabled(True)  # offline: nothing to export traces to
    config = json.loads(sys.argv[1])
    WORK = Path(config["work"])
    print(json.dumps(scenarios(config["url"], config["dead_url"]), default=str))
