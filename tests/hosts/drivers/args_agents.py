"""Drive terminal calls with chosen commands through a real agent framework, offline.

Runs inside one host venv (tests/helpers/hostenv.py): strands, pydantic_ai or
openai_agents, with that framework's ratewarden adapter built from RATEWARDEN_URL.

    python args_agents.py '{"host": "strands", "user": "u", "commands": [...], "work": ...}'

Each host's own driver beside this file holds its scripted model and its `terminal` tool
(which records the command in a file instead of running it); this one only gives them a
plan of commands. The last line of stdout is a JSON report: `results`, what the model
received for each call, in order, and `ran`, the commands the tool really got.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any


def strands(config: dict[str, Any], work: Path) -> dict[str, Any]:
    from strands import Agent
    from strands_agent import ScriptedModel, terminal_tool

    from ratewarden.integrations.strands import RatewardenHook

    ran = work / "ran.txt"
    ran.touch()
    model = ScriptedModel([("terminal", {"command": command}) for command in config["commands"]])
    agent = Agent(
        model=model, tools=[terminal_tool(ran)], hooks=[RatewardenHook()], callback_handler=None
    )
    agent("run my commands", invocation_state={"user_id": config["user"]})
    commands = [line.removeprefix("terminal ") for line in ran.read_text().splitlines()]
    return {"results": [r["text"] for r in model.tool_results], "ran": commands}


def pydantic_ai(config: dict[str, Any], work: Path) -> dict[str, Any]:
    import pydantic_ai_agent as driver

    from ratewarden.integrations.pydantic_ai import RatewardenMiddleware

    driver.WORK = work
    plan = [("terminal", {"command": command}) for command in config["commands"]]
    deps = driver.Deps(config["user"])
    outcome = asyncio.run(driver.run_agent("args", plan, RatewardenMiddleware(), deps))
    return {"results": outcome["results"], "ran": driver.ran("args").read_text().splitlines()}


def openai_agents(config: dict[str, Any], work: Path) -> dict[str, Any]:
    import openai_agents_run as driver
    from agents import set_tracing_disabled

    set_tracing_disabled(True)  # offline: nothing to export traces to
    driver.WORK = work
    context = driver.Context(config["user"])
    outcome = asyncio.run(driver.run_agent("args", driver.terminal, config["commands"], context))
    return {"results": outcome["results"], "ran": (work / "args.ran").read_text().splitlines()}


HOSTS = {"strands": strands, "pydantic_ai": pydantic_ai, "openai_agents": openai_agents}


if __name__ == "__main__":
    given = json.loads(sys.argv[1])
    print(json.dumps(HOSTS[given["host"]](given, Path(given["work"]))))
