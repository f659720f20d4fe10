"""Drive a real Strands Agent, offline, with RatewardenHook; print what the model saw.

Runs inside the strands host venv (tests/helpers/hostenv.py), never in the main one:

    python strands_agent.py '{"scenario": "terminal", "work": "/tmp/x", ...}'

The model is scripted (Strands ships none): it asks for one tool per turn, in the
order of its plan, then answers; it records every tool result it receives. The tools
are real: `terminal` is a Strands `@tool` and the MCP tools run in a real MCP server
over stdio, and each appends a line to `ran.txt` so the test counts what really ran.
The last line of stdout is a JSON report.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncGenerator, AsyncIterable
from pathlib import Path
from typing import Any

from send_result import SendResult  # type: ignore[import-not-found,unused-ignore]
from strands import Agent, tool
from strands.models.model import Model

from ratewarden.client import Guard
from ratewarden.integrations.strands import RatewardenHook

USAGE = {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}
MCP_INPUTS: dict[str, dict[str, Any]] = {
    "lookup": {"query": "x"},
    "wipe": {"path": "/tmp/x"},
    "mystery": {"value": "v"},
    "note": {"text": "hi"},
}


class ScriptedModel(Model):
    """Asks for the tools in `plan` (name, input), one per turn, then says `final`."""

    def __init__(
        self,
        plan: list[tuple[str, dict[str, Any]]],
        ids: str = "unique",
        usage: dict[str, int] | None = None,
        config: dict[str, Any] | None = None,
        fail_at: int | None = None,
    ) -> None:
        self.fail_at = fail_at  # the turn at which the provider fails mid-answer
        self.plan = plan
        self.usage = usage or USAGE  # what each answer reports
        self.config = config or {}
        self.ids = ids  # "repeat": every call is `call_0`, as some model servers do
        self.turn = 0
        self.tool_results: list[dict[str, Any]] = []
        self.raw_results: list[dict[str, Any]] = []  # each toolResult's status and content

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return self.config

    def structured_output(
        self, output_model: Any, prompt: Any, system_prompt: str | None = None, **kwargs: Any
    ) -> AsyncGenerator[dict[str, Any], None]:
        raise NotImplementedError

    async def stream(
        self,
        messages: Any,
        tool_specs: Any = None,
        system_prompt: str | None = None,
        **kwargs: Any,
    ) -> AsyncIterable[Any]:
        self._record(messages[-1])
        turn, self.turn = self.turn, self.turn + 1
        yield {"messageStart": {"role": "assistant"}}
        if turn < len(self.plan):
            name, arguments = self.plan[turn]
            use_id = "call_0" if self.ids == "repeat" else f"tooluse_{turn:03d}"
            yield {"contentBlockStart": {"start": {"toolUse": {"name": name, "toolUseId": use_id}}}}
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(arguments)}}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}
        else:
            yield {"contentBlockStart": {"start": {}}}
            yield {"contentBlockDelta": {"delta": {"text": "done"}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}
        if self.fail_at == turn:  # the provider fails mid-answer
            raise RuntimeError("the provider dropped the connection")
        yield {"metadata": {"usage": self.usage, "metrics": {"latencyMs": 1}}}

    def _record(self, message: dict[str, Any]) -> None:
        for block in message.get("content", []):
            result = block.get("toolResult")
            if result is not None:
                text = " ".join(c.get("text", json.dumps(c)) for c in result["content"])
                self.tool_results.append({"status": result["status"], "text": text})
                self.raw_results.append({k: result[k] for k in ("status", "content")})


class NoSettleHook(RatewardenHook):
    """The negative control: checks, but never settles."""

    async def after_tool_call(self, event: Any) -> None:
        return None


def terminal_tool(ran: Path) -> Any:
    @tool
    def terminal(command: str) -> str:
        """Run a shell command.

        Args:
            command: the command line
        """
        with ran.open("a") as out:
            out.write(f"terminal {command}\n")
        return f"ran {command}"

    return terminal


def note_tool(ran: Path) -> Any:
    @tool
    def note(text: str) -> str:
        """Write a note.

        Args:
            text: what to write
        """
        with ran.open("a") as out:
            out.write("note\n")
        return "noted"

    return note


def run_terminal(config: dict[str, Any], ran: Path) -> dict[str, Any]:
    calls = int(config.get("calls", 11))
    model = ScriptedModel([("terminal", {"command": f"echo {i}"}) for i in range(calls)])
    model.ids = config.get("ids", "unique")
    hook_type = RatewardenHook if config.get("settle", True) else NoSettleHook
    # Model calls are the `models` scenario's: here only tool calls reach the daemon.
    hook = hook_type(fail=config.get("fail"), models=False)
    agent = Agent(model=model, tools=[terminal_tool(ran)], hooks=[hook], callback_handler=None)
    result = agent("run my commands", invocation_state={"user_id": config["user"]})
    return report(model, result, hook.guard)


def run_digest(config: dict[str, Any], ran: Path) -> dict[str, Any]:
    """Identical terminal calls, the daemon answering `send_result`: the settles it got."""
    model = ScriptedModel([("terminal", {"command": "gh run view 7"})] * int(config["calls"]))
    transport = SendResult()
    hook = RatewardenHook(guard=Guard(transport=transport), models=False)  # RATEWARDEN_URL
    agent = Agent(model=model, tools=[terminal_tool(ran)], hooks=[hook], callback_handler=None)
    result = agent("poll the run", invocation_state={"user_id": config["user"]})
    found = report(model, result, hook.guard)
    return {**found, "raw_results": model.raw_results, "settles": transport.settles}


def run_mcp(config: dict[str, Any], ran: Path) -> dict[str, Any]:
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from strands.tools.mcp import MCPClient

    server = Path(__file__).with_name("strands_mcp_server.py")
    params = StdioServerParameters(command=sys.executable, args=[str(server), str(ran)])
    model = ScriptedModel([(name, MCP_INPUTS[name]) for name in config["plan"]])
    hook = RatewardenHook(metadata={"note": {"read_only": True, "tags": ["notes"]}}, models=False)
    with MCPClient(lambda: stdio_client(params)) as mcp:
        tools = [*mcp.list_tools_sync(), note_tool(ran)]
        annotations = {t.tool_name: t.tool_spec.get("annotations") for t in tools}
        agent = Agent(model=model, tools=tools, hooks=[hook], callback_handler=None)
        result = agent("look around", invocation_state={"user_id": config["user"]})
    return {**report(model, result, hook.guard), "annotations": annotations}


def run_models(config: dict[str, Any], ran: Path) -> dict[str, Any]:
    """Model calls priced by their usage: a terminal call per turn until the hook refuses
    a model call; the agent's reply is then the refusal (tests/hosts/model_budget.py)."""
    calls = int(config.get("calls", 30))
    plan = [("terminal", {"command": f"echo {i}"}) for i in range(calls)]
    usage = {k: int(v) for k, v in config["usage"].items()}
    model = ScriptedModel(
        plan, usage=usage, config=config.get("model_config", {}), fail_at=config.get("fail_at")
    )
    hook_type = RatewardenHook if config.get("settle", True) else NoModelSettleHook
    hook = hook_type(fail=config.get("fail"))
    agent = Agent(model=model, tools=[terminal_tool(ran)], hooks=[hook], callback_handler=None)
    try:
        result = agent("run my commands", invocation_state={"user_id": config["user"]})
    except Exception as exc:  # a provider failure reaches the caller as Strands raises it
        return {**report_model(model, hook.guard), "error": f"{type(exc).__name__}: {exc}"}
    reply = " ".join(b.get("text", "") for b in result.message.get("content", []))
    return {**report(model, result, hook.guard), "reply": reply, "error": None}


def report_model(model: ScriptedModel, guard: Guard) -> dict[str, Any]:
    return {"tool_results": model.tool_results, "model_turns": model.turn}


class NoModelSettleHook(RatewardenHook):
    """The negative control: checks model calls, never settles them."""

    async def after_model_call(self, event: Any) -> None:
        return None


def report(model: ScriptedModel, result: Any, guard: Guard) -> dict[str, Any]:
    return {
        "tool_results": model.tool_results,
        "model_turns": model.turn,
        "stop_reason": str(result.stop_reason),
        "unreachable": guard.unreachable,
    }


def main() -> None:
    config = json.loads(sys.argv[1])
    ran = Path(config["work"]) / "ran.txt"
    ran.touch()
    runs = {"mcp": run_mcp, "digest": run_digest, "models": run_models}
    run = runs.get(config["scenario"], run_terminal)
    found = run(config, ran)
    found["ran"] = ran.read_text().splitlines()
    print(json.dumps(found))


if __name__ == "__main__":
    main()
