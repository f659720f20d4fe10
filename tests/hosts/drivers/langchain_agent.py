"""Drive a real LangChain v1 agent, offline, through RatewardenMiddleware; print what it saw.

Runs inside the langchain host venv (tests/helpers/hostenv.py), never in the main one:

    python langchain_agent.py '{"url": "http://127.0.0.1:PORT", "dead_url": ..., "work": ...}'

Every scenario is a `create_agent` loop (LangGraph underneath) whose model is a
`GenericFakeChatModel` subclass following a plan: one tool call per turn (or several at
once, which LangGraph runs side by side), then an answer. The model records every tool
result it receives. The tools are plain `@tool` functions, each appending a line to its
scenario's file so the test counts what really ran. Scenarios run through `invoke`
(`wrap_tool_call`) or `ainvoke` (`awrap_tool_call`). The last line of stdout is a JSON
report: scenario -> {"results": [...], "ran": N, ...}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import ToolException, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import Field
from send_result import SendResult  # type: ignore[import-not-found,unused-ignore]

from ratewarden.client import AsyncGuard, Guard
from ratewarden.integrations.langchain import RatewardenMiddleware

WORK = Path()
Call = tuple[str, dict[str, Any]]
Plan = list[Any]  # a turn: one Call, or a list of Calls made together


def ran(scenario: str) -> Path:
    return WORK / f"{scenario}.ran"


def _record(line: str) -> str:
    with ran(os.environ["SCENARIO"]).open("a") as out:
        out.write(line + "\n")
    return f"ran {line}"


@tool
def terminal(command: str) -> str:
    """Run a shell command (recorded, not executed)."""
    if command == "fail":
        raise ToolException("the command failed")  # handled: an error ToolMessage
    if command == "crash":
        raise RuntimeError("the tool crashed")  # not handled: the run fails
    return _record(command)


terminal.handle_tool_error = True  # a ToolException becomes the tool's error result


@tool
def deploy(target: str) -> str:
    """Deploy somewhere (recorded)."""
    return _record(f"deploy {target}")


@tool
def build(target: str) -> str:
    """Build something (recorded)."""
    return _record(f"build {target}")


TOOLS = [terminal, deploy, build]


class ScriptedModel(GenericFakeChatModel):
    """Makes the calls of `plan`, a turn at a time, then answers; `seen` gets the tool
    results it was given, as the model reads them."""

    plan: list[Any]
    seen: list[str] = Field(default_factory=list)
    disable_streaming: bool = True

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:  # type: ignore[override]
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.seen = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
        turn = sum(isinstance(m, AIMessage) for m in messages)
        if turn >= len(self.plan):
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content="done"))])
        calls = self.plan[turn] if isinstance(self.plan[turn], list) else [self.plan[turn]]
        tool_calls = [
            {"name": name, "args": args, "id": f"call_{turn}_{i}", "type": "tool_call"}
            for i, (name, args) in enumerate(calls)
        ]
        message = AIMessage(content="", tool_calls=tool_calls)
        return ChatResult(generations=[ChatGeneration(message=message)])


def model_for(plan: Plan) -> ScriptedModel:
    return ScriptedModel(messages=iter(()), plan=plan)


def terminal_plan(count: int, *, start: int = 1) -> Plan:
    return [("terminal", {"command": f"echo {i}"}) for i in range(start, start + count)]


def outcome(scenario: str, model: ScriptedModel, state: Any) -> dict[str, Any]:
    lines = ran(scenario).read_text().splitlines()
    last = state["messages"][-1] if isinstance(state, dict) and state.get("messages") else None
    errors = [m.content for m in state.get("messages", []) if _is_error(m)]
    return {
        "results": model.seen,
        "ran": len(lines),
        "output": getattr(last, "content", None),
        "errors": errors,
    }


def _is_error(message: Any) -> bool:
    return isinstance(message, ToolMessage) and message.status == "error"


def start(scenario: str) -> None:
    os.environ["SCENARIO"] = scenario
    ran(scenario).touch()


def run_sync(
    scenario: str, plan: Plan, middleware: RatewardenMiddleware, **invoke: Any
) -> dict[str, Any]:
    """One agent run through `invoke` (the middleware's `wrap_tool_call`)."""
    start(scenario)
    model = model_for(plan)
    agent = create_agent(model, tools=TOOLS, middleware=[middleware])
    state = agent.invoke({"messages": [{"role": "user", "content": "go"}]}, **invoke)
    return outcome(scenario, model, state)


async def run_async(
    scenario: str, plan: Plan, middleware: RatewardenMiddleware, **invoke: Any
) -> dict[str, Any]:
    """One agent run through `ainvoke` (the middleware's `awrap_tool_call`)."""
    start(scenario)
    model = model_for(plan)
    agent = create_agent(model, tools=TOOLS, middleware=[middleware])
    state = await agent.ainvoke({"messages": [{"role": "user", "content": "go"}]}, **invoke)
    return outcome(scenario, model, state)


def configurable(user: str) -> dict[str, Any]:
    return {"config": {"configurable": {"user_id": user}}}


class NoSettle(RatewardenMiddleware):
    """The control: allows like RatewardenMiddleware, never settles."""

    def _settle(self, *args: Any) -> None:
        return None

    async def _asettle(self, *args: Any) -> None:
        return None


# -- the scenarios ------------------------------------------------------------------------


def limit_scenarios() -> dict[str, Any]:
    """Eleven terminal calls under 10/minute, through invoke and ainvoke; a second user."""
    default = RatewardenMiddleware()  # from the environment
    report = {
        "limit": run_sync("limit", terminal_plan(11), default, context={"user_id": "discord:77"}),
        "second_user": run_sync(
            "second_user", terminal_plan(1), default, context={"user_id": "discord:78"}
        ),
        # The user from config["configurable"], and the async path.
        "limit_async": asyncio.run(
            run_async("limit_async", terminal_plan(11), default, **configurable("discord:88"))
        ),
        "no_settle": run_sync(
            "no_settle", terminal_plan(2), NoSettle(), context={"user_id": "no-settle"}
        ),
        "no_settle_async": asyncio.run(
            run_async("no_settle_async", terminal_plan(2), NoSettle(), **configurable("no-sa"))
        ),
    }
    # Two turns of two calls at once under a cap of two: the second turn runs only if
    # each call of the first was settled under its own call id.
    builds: Plan = [
        [("build", {"target": "a"}), ("build", {"target": "b"})],
        [("build", {"target": "c"}), ("build", {"target": "d"})],
    ]
    report["parallel"] = run_sync("parallel", builds, default, context={"user_id": "par"})
    report["parallel_async"] = asyncio.run(
        run_async("parallel_async", builds, default, **configurable("par-async"))
    )
    return report


def error_scenarios() -> dict[str, Any]:
    """A tool's handled error (an error ToolMessage) and a crash (raised): both settled."""
    middleware = RatewardenMiddleware()
    failing: Plan = [("terminal", {"command": "fail"}), ("terminal", {"command": "after"})]
    report = {
        "tool_error": run_sync("tool_error", failing, middleware, context={"user_id": "err"}),
        "tool_error_async": asyncio.run(
            run_async("tool_error_async", failing, middleware, **configurable("err-async"))
        ),
    }
    for name, runner in (("crash", _crash_sync), ("crash_async", _crash_async)):
        report[name] = runner(middleware, f"{name}-user")
    return report


def _crash_sync(middleware: RatewardenMiddleware, user: str) -> dict[str, Any]:
    try:
        run_sync(
            "crash", [("terminal", {"command": "crash"})], middleware, context={"user_id": user}
        )
    except RuntimeError as exc:
        raised = str(exc)
    else:
        raised = ""
    after = run_sync("crash", terminal_plan(1), middleware, context={"user_id": user})
    return {"raised": raised, **after}


def _crash_async(middleware: RatewardenMiddleware, user: str) -> dict[str, Any]:
    async def both() -> dict[str, Any]:
        crash: Plan = [("terminal", {"command": "crash"})]
        try:
            await run_async("crash_async", crash, middleware, **configurable(user))
        except RuntimeError as exc:
            raised = str(exc)
        else:
            raised = ""
        after = await run_async("crash_async", terminal_plan(1), middleware, **configurable(user))
        return {"raised": raised, **after}

    return asyncio.run(both())


DEPLOYS: Plan = [("deploy", {"target": "a"}), ("deploy", {"target": "b"})]


def ask_scenarios(url: str) -> dict[str, Any]:
    """`deploy` allows 1 a minute, then asks: approved or rejected through LangGraph's
    interrupt, or refused when no approval path is configured."""
    return {
        "ask_approved": _ask_interrupt_sync(url),
        "ask_rejected": asyncio.run(_ask_interrupt_async(url)),
        "ask_no_path": run_sync(
            "ask_no_path", DEPLOYS, RatewardenMiddleware(), context={"user_id": "acct-10"}
        ),
        "ask_no_path_async": asyncio.run(
            run_async("ask_no_path_async", DEPLOYS, RatewardenMiddleware(), **configurable("a11"))
        ),
    }


def _ask_interrupt_sync(url: str) -> dict[str, Any]:
    """A sync Guard given, the user from a callable; the human approves."""
    start("ask_approved")
    middleware = RatewardenMiddleware(
        Guard(url), user=lambda request: request.runtime.context["account"], ask="interrupt"
    )
    model = model_for(DEPLOYS)
    agent = create_agent(model, tools=TOOLS, middleware=[middleware], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": str(uuid.uuid4())}}
    context = {"account": "acct-9"}
    paused = agent.invoke(
        {"messages": [{"role": "user", "content": "go"}]}, config, context=context
    )
    ran_before = len(ran("ask_approved").read_text().splitlines())
    pending = paused.get("__interrupt__") or []  # none: the report says so
    state = paused
    if pending:
        state = agent.invoke(Command(resume={"type": "approve"}), config, context=context)
    return {
        **outcome("ask_approved", model, state),
        "interrupts": [p.value for p in pending],
        "ran_before_resume": ran_before,
    }


async def _ask_interrupt_async(url: str) -> dict[str, Any]:
    """An AsyncGuard given, the user from the config; the human rejects, saying why."""
    start("ask_rejected")
    middleware = RatewardenMiddleware(AsyncGuard(url), ask="interrupt")
    model = model_for(DEPLOYS)
    agent = create_agent(model, tools=TOOLS, middleware=[middleware], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": str(uuid.uuid4()), "user_id": "acct-12"}}
    paused = await agent.ainvoke({"messages": [{"role": "user", "content": "go"}]}, config)
    pending = paused.get("__interrupt__") or []  # none: the report says so
    state = paused
    if pending:
        # Answered by the interrupts' ids, as several pending interrupts are.
        reject = {"type": "reject", "message": "not during the freeze"}
        state = await agent.ainvoke(Command(resume={p.id: reject for p in pending}), config)
    return {**outcome("ask_rejected", model, state), "interrupts": [p.value for p in pending]}


def fail_scenarios() -> dict[str, Any]:
    """RATEWARDEN_URL points where nothing listens. Failing closed, model calls are
    left alone (`models=False`: langchain_models.py fails them closed), so the tool
    calls are what meets the fail mode."""
    return {
        "fail_open": run_sync(
            "fail_open", terminal_plan(3), RatewardenMiddleware(), context={"user_id": "u-open"}
        ),
        "fail_open_async": asyncio.run(
            run_async(
                "fail_open_async", terminal_plan(2), RatewardenMiddleware(), **configurable("o")
            )
        ),
        "fail_closed": run_sync(
            "fail_closed",
            terminal_plan(2),
            RatewardenMiddleware(fail="closed", models=False),
            context={"user_id": "u-closed"},
        ),
        "fail_closed_async": asyncio.run(
            run_async(
                "fail_closed_async",
                terminal_plan(2),
                RatewardenMiddleware(fail="closed", models=False),
                **configurable("c"),
            )
        ),
    }


def result_scenarios(url: str) -> dict[str, Any]:
    """Two identical calls with the same result, through invoke and ainvoke: each settle
    carries the digest of the ToolMessage's content."""
    report = {}
    plan = [("terminal", {"command": "gh run view 7"})] * 2
    for name, runner in (("result_digest", run_sync), ("result_digest_async", run_async)):
        transport = SendResult()
        middleware = RatewardenMiddleware(Guard(url, transport=transport))
        context = {"context": {"user_id": f"{name}-user"}}
        if runner is run_sync:
            found = run_sync(name, plan, middleware, **context)
        else:
            found = asyncio.run(run_async(name, plan, middleware, **context))
        report[name] = {**found, "settles": transport.settles}
    return report


def scenarios(url: str, dead_url: str) -> dict[str, Any]:
    os.environ["RATEWARDEN_URL"] = url
    report = limit_scenarios()
    report.update(error_scenarios())
    report.update(ask_scenarios(url))
    report.update(result_scenarios(url))
    report["call_id"] = run_sync(
        "call_id", [("forbidden", {})], RatewardenMiddleware(), context={"user_id": "ids-user"}
    )
    os.environ["RATEWARDEN_URL"] = dead_url
    report.update(fail_scenarios())
    return report


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    WORK = Path(config["work"])
    print(json.dumps(scenarios(config["url"], config["dead_url"])))
