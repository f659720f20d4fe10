"""Drive a real CrewAI Crew, offline, through RatewardenHooks; print what the model saw.

Runs inside the crewai host venv (tests/helpers/hostenv.py), never in the main one:

    python crewai_agent.py '{"url": "http://127.0.0.1:PORT", "dead_url": ..., "work": ...}'

Every scenario is one `crew.kickoff` (or `akickoff`) of a one-agent, one-task Crew whose
LLM is CrewAI's own OpenAI provider (`LLM(model="openai/fake-model", base_url=...)`)
talking to a fake chat-completions server on 127.0.0.1. The server follows a plan: a
turn of tool calls per request (several at once, which CrewAI runs in parallel threads),
then a final answer; it records every request, so a scenario's `results` are the
`role: tool` messages of the last request: exactly what the model received. The `react`
scenario uses a `BaseLLM` subclass without function calling instead, so CrewAI takes its
text (ReAct) path; there `results` are the `Observation:` texts it sent back.

The tools are CrewAI `@tool`s; each appends a line to its scenario's file so the test
counts what really ran. stdin holds the answers for `console_approval` (CrewAI's
`request_human_input` reads it). The last line of stdout is a JSON report:
scenario -> {"results": [...], "ran": N, "output": ...}.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# Before CrewAI is imported: nothing may try the network.
for _name in ("CREWAI_DISABLE_TELEMETRY", "CREWAI_DISABLE_TRACKING", "OTEL_SDK_DISABLED"):
    os.environ[_name] = "true"
os.environ["CREWAI_DISABLE_VERSION_CHECK"] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"

from crewai import LLM, Agent, Crew, Task  # noqa: E402
from crewai.hooks import (  # noqa: E402
    register_before_tool_call_hook,
    unregister_before_tool_call_hook,
)
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from crewai.tools import tool  # noqa: E402
from pydantic import Field  # noqa: E402
from send_result import SendResult  # type: ignore[import-not-found,unused-ignore]  # noqa: E402

from ratewarden.client import Guard  # noqa: E402
from ratewarden.integrations.crewai import RatewardenHooks, console_approval  # noqa: E402

WORK = Path()
MODEL = "fake-model"
Call = tuple[str, dict[str, Any]]
Plan = list[list[Call]]  # a turn: the calls the model makes together


# -- the tools --------------------------------------------------------------------------


def ran(scenario: str) -> Path:
    return WORK / f"{scenario}.ran"


def _record(line: str) -> str:
    with ran(os.environ["SCENARIO"]).open("a") as out:
        out.write(line + "\n")
    return f"ran {line}"


@tool("terminal")
def terminal(command: str) -> str:
    """Run a shell command (recorded, not executed)."""
    if command == "fail":
        raise RuntimeError("the command failed")
    return _record(command)


@tool("deploy")
def deploy(target: str) -> str:
    """Deploy somewhere (recorded)."""
    return _record(f"deploy {target}")


BUILDS_TOGETHER = threading.Barrier(2)


@tool("build")
def build(target: str) -> str:
    """Build something (recorded); builds of a turn wait inside for each other.

    So both calls of a parallel turn are checked before either of them is settled.
    """
    BUILDS_TOGETHER.wait(timeout=10)
    return _record(f"build {target}")


TOOLS = [terminal, deploy, build]
# CrewAI's text path repeats the tool list after every few results: not the tool's result.
TOOLS_REMINDER = "\n\n\nYou ONLY have access to the following tools"


# -- the fake model ---------------------------------------------------------------------


class FakeModel:
    """A chat-completions server's brain: the calls of `plan`, a turn per request."""

    def __init__(self) -> None:
        self.plan: Plan = []
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def reset(self, plan: Plan) -> None:
        with self.lock:
            self.plan, self.requests = plan, []

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.requests.append(body)
        messages = body.get("messages", [])
        turn = sum(1 for m in messages if m.get("role") == "assistant" and m.get("tool_calls"))
        if not body.get("tools") or turn >= len(self.plan):
            return {"role": "assistant", "content": "done"}
        calls = [
            {
                "id": f"call_{turn}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for i, (name, args) in enumerate(self.plan[turn])
        ]
        return {"role": "assistant", "content": None, "tool_calls": calls}

    def received(self) -> list[str]:
        """The tool results of the last request: what the model was given."""
        last = self.requests[-1]["messages"] if self.requests else []
        return [str(m.get("content")) for m in last if m.get("role") == "tool"]


def serve(model: FakeModel) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not self.path.rstrip("/").endswith("/chat/completions") or body.get("stream"):
                self._json({"error": {"message": f"not served: {self.path}"}}, 404)
                return
            message = model.answer(body)
            finish = "tool_calls" if message.get("tool_calls") else "stop"
            self._json(
                {
                    "id": f"chatcmpl-{time.monotonic_ns()}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": MODEL,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
                }
            )

        def _json(self, payload: dict[str, Any], status: int = 200) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class ReactModel(BaseLLM):
    """A scripted LLM without function calling: CrewAI's text (ReAct) tool path."""

    script: list[Call] = Field(default_factory=list)
    seen: list[Any] = Field(default_factory=list)

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        self.seen = list(messages) if isinstance(messages, list) else [messages]
        done = len(self.received())
        if done >= len(self.script):
            return "Thought: I now know the final answer\nFinal Answer: done"
        name, tool_args = self.script[done]
        return f"Thought: next\nAction: {name}\nAction Input: {json.dumps(tool_args)}"

    def supports_function_calling(self) -> bool:
        return False

    def received(self) -> list[str]:
        """The tool results CrewAI sent back: each in an assistant turn, after
        `Observation: ` (the system prompt explains the format with that word too)."""
        texts = (str(m.get("content", "")) for m in self.seen if m.get("role") == "assistant")
        found = [t.split("\nObservation: ", 1)[1] for t in texts if "\nObservation: " in t]
        return [text.split(TOOLS_REMINDER, 1)[0] for text in found]


# -- running a crew ---------------------------------------------------------------------


class ToolHooks(RatewardenHooks):
    """RatewardenHooks on tool calls only: model calls are crewai_models.py's."""

    def __init__(self, **options: Any) -> None:
        super().__init__(models=False, **options)


class Host:
    def __init__(self, model: FakeModel, base_url: str) -> None:
        self.model = model
        self.base_url = base_url

    def crew(self, llm: Any) -> Crew:
        agent = Agent(
            role="operator",
            goal="run what you are asked to",
            backstory="a careful operator",
            llm=llm,
            tools=TOOLS,
            max_iter=40,
        )
        task = Task(description="Do the work.", expected_output="done", agent=agent)
        return Crew(agents=[agent], tasks=[task])

    def run(
        self,
        scenario: str,
        plan: Plan,
        hooks: ToolHooks,
        inputs: dict[str, str] | None = None,
        *,
        use_async: bool = False,
        then: Callable[[Any], bool | None] | None = None,
    ) -> dict[str, Any]:
        """One kickoff with `hooks` registered (and `then`, a before hook after ours);
        what the model got and what the tools did."""
        os.environ["SCENARIO"] = scenario
        ran(scenario).touch()
        self.model.reset(plan)
        llm = LLM(model=f"openai/{MODEL}", base_url=self.base_url, api_key="sk-fake")
        crew = self.crew(llm)
        with hooks:
            if then is not None:
                register_before_tool_call_hook(then)
            try:
                if use_async:
                    output = asyncio.run(crew.akickoff(inputs=inputs))
                else:
                    output = crew.kickoff(inputs=inputs)
            finally:
                if then is not None:
                    unregister_before_tool_call_hook(then)
        return self.outcome(scenario, self.model.received(), output)

    def run_react(
        self, scenario: str, script: list[Call], hooks: ToolHooks, inputs: dict[str, str]
    ) -> dict[str, Any]:
        os.environ["SCENARIO"] = scenario
        ran(scenario).touch()
        llm = ReactModel(model="fake-react", script=script)
        with hooks:
            output = self.crew(llm).kickoff(inputs=inputs)
        return self.outcome(scenario, llm.received(), output)

    @staticmethod
    def outcome(scenario: str, results: list[str], output: Any) -> dict[str, Any]:
        lines = ran(scenario).read_text().splitlines()
        return {"results": results, "ran": len(lines), "output": str(output)}


def terminal_plan(count: int, first: int = 1) -> Plan:
    return [[("terminal", {"command": f"echo {i}"})] for i in range(first, first + count)]


def deploys(count: int) -> Plan:
    return [[("deploy", {"target": chr(ord("a") + i)})] for i in range(count)]


class NoSettle(ToolHooks):
    """The control: checks like RatewardenHooks, never settles."""

    def after_tool_call(self, context: Any) -> str | None:
        pending = self._take(context.tool_input)
        return pending.refusal if pending is not None else None


class Approver:
    """An `approve` that says yes, and remembers what it was asked."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    def __call__(self, context: Any, reason: str) -> bool:
        self.asked.append([context.tool_name, reason])
        return True


# -- the scenarios ----------------------------------------------------------------------


def scenarios(host: Host, url: str, dead_url: str) -> dict[str, Any]:
    os.environ["RATEWARDEN_URL"] = url
    run = host.run
    report: dict[str, Any] = {
        "limit": run("limit", terminal_plan(11), ToolHooks(), {"user_id": "discord:77"}),
        "second_user": run("second_user", terminal_plan(1), ToolHooks(), {"user_id": "discord:78"}),
        "no_settle": run("no_settle", terminal_plan(2), NoSettle(), {"user_id": "no-settle"}),
        "parallel": run(
            "parallel",
            [
                [("build", {"target": "a"}), ("build", {"target": "b"})],
                [("build", {"target": "c"}), ("build", {"target": "d"})],
            ],
            ToolHooks(),
            {"user_id": "parallel-user"},
        ),
        "tool_error": run(
            "tool_error",
            [[("terminal", {"command": "fail"})], [("terminal", {"command": "after"})]],
            ToolHooks(),
            {"user_id": "errors-user"},
        ),
        "async": run(
            "async", terminal_plan(11), ToolHooks(), {"user_id": "async-user"}, use_async=True
        ),
        "react": host.run_react(
            "react",
            [("terminal", {"command": f"echo {i}"}) for i in range(1, 12)],
            ToolHooks(user="react-user"),  # a fixed user id
            {"user_id": "not-this-one"},
        ),
        "no_inputs": run("no_inputs", terminal_plan(1), ToolHooks()),  # RATEWARDEN_USER
        # Allowed by us, then blocked by a hook registered after ours: settled as
        # `blocked`, so the one-at-a-time slot is free for the next call.
        "blocked_later": run(
            "blocked_later",
            terminal_plan(2),
            ToolHooks(),
            {"user_id": "blocked-later"},
            then=lambda context: False if context.tool_input["command"] == "echo 1" else None,
        ),
    }
    report.update(ask_scenarios(host, url))
    report["register_twice"] = register_twice()
    transport = SendResult()  # the daemon answers send_result: the settles it got
    hooks = ToolHooks(guard=Guard(url, transport=transport))
    found = run("digest", terminal_plan(2), hooks, {"user_id": "digest-user"})
    report["digest"] = {**found, "settles": transport.settles}

    os.environ["RATEWARDEN_URL"] = dead_url
    report["fail_open"] = run("fail_open", terminal_plan(3), ToolHooks(), {"user_id": "u1"})
    closed = ToolHooks(fail="closed")
    report["fail_closed"] = run("fail_closed", terminal_plan(2), closed, {"user_id": "u2"})
    return report


def ask_scenarios(host: Host, url: str) -> dict[str, Any]:
    """`deploy` allows 1 a minute, then asks: an approver, CrewAI's console, or nobody."""
    approver = Approver()
    by_account: Callable[[Any], str | None] = lambda context: context.crew._inputs["account"]  # noqa: E731
    approving = ToolHooks(guard=Guard(url), user=by_account, approve=approver)
    approved = host.run("ask_approved", deploys(2), approving, {"account": "acct-9"})
    console = ToolHooks(approve=console_approval)
    return {
        "ask_approved": {**approved, "asked": approver.asked},
        "ask_no_approver": host.run(
            "ask_no_approver", deploys(2), ToolHooks(), {"user_id": "acct-10"}
        ),
        # stdin: "approve", then "no"
        "ask_console": host.run("ask_console", deploys(2), console, {"user_id": "acct-11"}),
        "ask_console_declined": host.run(
            "ask_console_declined", deploys(2), console, {"user_id": "acct-12"}
        ),
    }


def register_twice() -> str:
    with ToolHooks():
        try:
            RatewardenHooks().register()
        except RuntimeError as exc:
            return str(exc)
    return "registered twice"


def main(config: dict[str, Any]) -> dict[str, Any]:
    model = FakeModel()
    server = serve(model)
    base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        return scenarios(Host(model, base_url), config["url"], config["dead_url"])
    finally:
        server.shutdown()


if __name__ == "__main__":
    settings = json.loads(sys.argv[1])
    WORK = Path(settings["work"])
    print(json.dumps(main(settings)))
