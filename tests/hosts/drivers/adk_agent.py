"""Drive a real Google ADK agent, offline, through RatewardenPlugin; print what it saw.

Runs inside the adk host venv (tests/helpers/hostenv.py), never in the main one:

    python adk_agent.py '{"url": "http://127.0.0.1:PORT", "dead_url": ..., "work": ...}'

Every scenario is a real `InMemoryRunner` loop (sessions, plugins, the function-calling
flow) around an `LlmAgent` whose model is a `BaseLlm` subclass following a plan: one
turn of function calls at a time (several calls in a turn run in parallel), then an
answer. The model records every function response it receives. The tools are plain
functions that ADK wraps as `FunctionTool`s, and each appends a line to its scenario's
file, so the test counts what really ran. Nothing here reaches the network: the model
is local, and google-genai is never asked for a client. The last line of stdout is a
JSON report: scenario -> {"results": [...], "ran": N, ...}.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.events import Event
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.adk.tools import FunctionTool
from google.genai import types
from pydantic import Field
from send_result import AsyncSendResult  # type: ignore[import-not-found,unused-ignore]

from ratewarden.client import AsyncGuard
from ratewarden.integrations.adk import RatewardenPlugin

WORK = Path()
SCENARIO = ["none"]  # where the tools record what ran
Call = tuple[str, dict[str, Any]]
Plan = list[list[Call]]  # a turn: the calls the model makes together
CONFIRMATION = "adk_request_confirmation"


def _record(line: str) -> str:
    with (WORK / f"{SCENARIO[0]}.ran").open("a") as out:
        out.write(line + "\n")
    return f"ran {line}"


BUILT = asyncio.Event()  # a build is running: the failing call may now fail


async def terminal(command: str) -> str:
    """Run a shell command (recorded, not executed)."""
    if command == "fail":
        raise RuntimeError("the command failed")
    if command == "fail-once-built":  # fails while a parallel build is still running
        await asyncio.wait_for(BUILT.wait(), timeout=10)
        raise RuntimeError("the command failed")
    return _record(command)


BUILDS_TOGETHER: list[asyncio.Barrier] = []


async def build(target: str) -> str:
    """Build something (recorded); builds wait inside for each other, two at a time.

    So both calls of a parallel turn are checked before either of them is settled.
    `forever` runs until it is cancelled.
    """
    if target == "forever":
        BUILT.set()
        await asyncio.sleep(30)
    if not BUILDS_TOGETHER:
        BUILDS_TOGETHER.append(asyncio.Barrier(2))
    await asyncio.wait_for(BUILDS_TOGETHER[0].wait(), timeout=10)
    return _record(f"build {target}")


def deploy(target: str) -> str:
    """Deploy somewhere (recorded)."""
    return _record(f"deploy {target}")


def publish(target: str) -> str:
    """Publish something (recorded); ADK's own gate asks a human first."""
    return _record(f"publish {target}")


class ScriptedModel(BaseLlm):
    """Calls the functions of `plan`, a turn at a time, then answers "done".

    The turn is the number of model turns in the request's history, so one model serves
    any session; `seen` is every function response of the last request, in order.
    """

    plan: Plan = Field(default_factory=list)
    seen: list[dict[str, Any]] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        parts = [part for content in llm_request.contents for part in content.parts or []]
        self.seen = [dict(p.function_response.response or {}) for p in parts if p.function_response]
        turn = sum(content.role == "model" for content in llm_request.contents)
        if turn < len(self.plan):
            calls = [
                types.Part(
                    function_call=types.FunctionCall(name=name, args=args, id=f"fc-{turn}-{i}")
                )
                for i, (name, args) in enumerate(self.plan[turn])
            ]
            yield LlmResponse(content=types.Content(role="model", parts=calls))
        else:
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text="done")]))


class Host:
    """One runner (agent, scripted model, plugins), run for one user or another."""

    def __init__(self, *plugins: Any) -> None:
        self.model = ScriptedModel(model="scripted")
        gated = FunctionTool(publish, require_confirmation=True)
        tools = [terminal, deploy, build, gated]
        agent = LlmAgent(name="assistant", model=self.model, tools=tools)
        self.runner = InMemoryRunner(agent=agent, plugins=list(plugins))

    async def run(
        self, scenario: str, user: str, plan: Plan, state: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """A new session of `user` whose model follows `plan`."""
        SCENARIO[0] = scenario
        (WORK / f"{scenario}.ran").touch()
        self.model.plan, self.model.seen = plan, []
        service = self.runner.session_service
        session = await service.create_session(
            app_name=self.runner.app_name, user_id=user, state=state
        )
        message = types.Content(role="user", parts=[types.Part(text="go")])
        return await self._turn(scenario, user, session.id, message)

    async def answer(self, outcome: dict[str, Any], confirmed: bool) -> dict[str, Any]:
        """The human's answer to the confirmation the run paused on (if it paused)."""
        if len(outcome["confirmations"]) != 1:
            return outcome  # the test says what is wrong
        [request] = outcome["confirmations"]
        response = types.FunctionResponse(
            name=CONFIRMATION, id=request["id"], response={"confirmed": confirmed}
        )
        message = types.Content(role="user", parts=[types.Part(function_response=response)])
        return await self._turn(outcome["scenario"], outcome["user"], outcome["session"], message)

    async def _turn(
        self, scenario: str, user: str, session: str, message: types.Content
    ) -> dict[str, Any]:
        events: list[Event] = []
        error = None
        try:
            async for event in self.runner.run_async(
                user_id=user, session_id=session, new_message=message
            ):
                events.append(event)
        except Exception as exc:  # a tool error ADK lets through ends the run
            error = f"{type(exc).__name__}: {exc}"
        lines = (WORK / f"{scenario}.ran").read_text().splitlines()
        return {
            "scenario": scenario,
            "user": user,
            "session": session,
            "results": self.model.seen,  # what the model received, in order
            "responses": _responses(events),  # this turn's function responses
            "confirmations": _confirmations(events),
            "answered": _answered(events),
            "ran": len(lines),
            "error": error,
        }


def _responses(events: list[Event]) -> list[dict[str, Any]]:
    return [dict(r.response or {}) for e in events for r in e.get_function_responses()]


def _confirmations(events: list[Event]) -> list[dict[str, Any]]:
    """The confirmation requests the run paused on."""
    return [
        {"id": call.id, "hint": (call.args or {})["toolConfirmation"]["hint"]}
        for event in events
        for call in event.get_function_calls()
        if call.name == CONFIRMATION
    ]


def _answered(events: list[Event]) -> bool:
    """Whether the model spoke last (it did not, when the run paused)."""
    texts = [p.text for e in events if e.content for p in e.content.parts or [] if p.text]
    return bool(texts) and texts[-1] == "done"


def terminal_plan(*commands: str) -> Plan:
    return [[("terminal", {"command": command})] for command in commands]


def echoes(count: int) -> Plan:
    return terminal_plan(*(f"echo {i}" for i in range(1, count + 1)))


class NoSettle(RatewardenPlugin):
    """The control: allows like RatewardenPlugin, never settles."""

    async def after_tool_callback(self, **kwargs: Any) -> None:
        return None


async def scenarios(url: str, dead_url: str) -> dict[str, Any]:
    report: dict[str, Any] = {}
    host = Host(RatewardenPlugin())  # the guard from RATEWARDEN_URL
    report["limit"] = await host.run("limit", "discord:77", echoes(11))
    # The same runner and plugin, a session of another user.
    report["second_user"] = await host.run("second_user", "discord:78", echoes(2))
    report["args"] = await host.run("args", "args-user", terminal_plan("rm -rf /", "echo ok"))
    report["no_settle"] = await Host(NoSettle(name="no-settle")).run(
        "no_settle", "no-settle-user", echoes(2)
    )
    builds: Plan = [
        [("build", {"target": "a"}), ("build", {"target": "b"})],
        [("build", {"target": "c"}), ("build", {"target": "d"})],
    ]
    report["parallel"] = await host.run("parallel", "parallel-user", builds)
    report["tool_error"] = await host.run("tool_error", "errors-user", terminal_plan("fail"))
    report["after_error"] = await host.run("after_error", "errors-user", terminal_plan("after"))
    cancelled: Plan = [
        [("build", {"target": "forever"}), ("terminal", {"command": "fail-once-built"})]
    ]
    report["cancelled"] = await host.run("cancelled", "cancel-user", cancelled)
    report.update(await ask_scenarios(url))
    transport = AsyncSendResult()  # the daemon answers send_result: the settles it got
    digest = Host(RatewardenPlugin(AsyncGuard(url, transport=transport)))
    found = await digest.run("digest", "digest-user", terminal_plan(*["gh run view 7"] * 2))
    report["digest"] = {**found, "settles": transport.settles}

    report["fail_open"] = await Host(RatewardenPlugin(AsyncGuard(dead_url))).run(
        "fail_open", "u-open", echoes(3)
    )
    report["fail_closed"] = await Host(
        RatewardenPlugin(AsyncGuard(dead_url, fail="closed"), models=False)
    ).run("fail_closed", "u-closed", echoes(2))
    return report


async def ask_scenarios(url: str) -> dict[str, Any]:
    """`deploy` allows 1 a minute, then asks: confirmed, rejected, or not asked at all."""
    # An explicit guard, and a user lookup of our own: the account in the session state.
    plugin = RatewardenPlugin(AsyncGuard(url), user=lambda ctx: ctx.state.get("account"))
    host = Host(plugin)
    plan: Plan = [[("deploy", {"target": "a"})], [("deploy", {"target": "b"})]]
    report: dict[str, Any] = {}
    for outcome, confirmed in (("approved", True), ("rejected", False)):
        state = {"account": f"acct-{outcome}"}
        paused = await host.run(f"ask_{outcome}", f"user-{outcome}", plan, state)
        answered = await host.answer(paused, confirmed)
        report[f"ask_{outcome}"] = {"paused": paused, "answered": answered}
    no_confirm = Host(RatewardenPlugin(confirm=False))
    report["ask_no_confirm"] = await no_confirm.run("ask_no_confirm", "acct-none", plan)
    # The tool's own confirmation (require_confirmation), not ours: it approves nothing
    # of ratewarden's, and its rejection is the gate's to tell.
    publish_plan: Plan = [[("publish", {"target": "site"})]]
    for outcome, confirmed in (("approved", True), ("rejected", False)):
        user = f"publisher-{outcome}"
        paused = await host.run(f"own_{outcome}", user, publish_plan, {"account": user})
        answered = await host.answer(paused, confirmed)
        report[f"own_{outcome}"] = {"paused": paused, "answered": answered}
    return report


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    WORK = Path(config["work"])
    print(json.dumps(asyncio.run(scenarios(config["url"], config["dead_url"]))))
