"""Spend a user's day on model calls through a real LangChain v1 agent, offline.

Runs inside the langchain host venv (tests/helpers/hostenv.py), never in the main one:

    python langchain_models.py '{"url": URL, "work": DIR, "model": "gpt-4o", "usage": {...}}'

The scenario of tests/hosts/model_budget.py: `create_agent` loops with
`RatewardenMiddleware()` (models and tools), whose chat model is a scripted
`BaseChatModel` named `model` (its `model_name`, as ChatOpenAI's) answering every call
with an `AIMessage` whose `usage_metadata` reports `usage` (LangChain's names: the
cached part in `input_token_details.cache_read`). It counts the calls that reached it.
After each run the driver reads what the daemon says the user spent (`spent`, micro-USD)
and holds (`reserved`). The last line of stdout is the JSON report.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from pydantic import Field

from ratewarden.integrations.langchain import RatewardenMiddleware

WORK = Path()
URL = ""
RULE = "daily-spend"


@tool
def terminal(command: str) -> str:
    """Run a shell command (recorded, not executed)."""
    with (WORK / "terminal.ran").open("a") as out:
        out.write(command + "\n")
    return f"ran {command}"


class ScriptedModel(BaseChatModel):
    """Asks for `plan`'s tool calls a turn at a time, then answers "done"; every answer
    reports `usage` (None: no usage_metadata). `fail` raises instead of answering."""

    model_name: str = "gpt-4o"
    max_tokens: int | None = None
    plan: list[str] = Field(default_factory=list)  # terminal commands, one per turn
    usage: dict[str, int] | None = None
    fail: bool = False
    calls: int = 0  # the calls that reached the model

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:  # type: ignore[override]
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.calls += 1
        if self.fail:
            raise RuntimeError("the provider is down")
        turn = sum(isinstance(m, AIMessage) for m in messages)
        tool_calls = []
        if turn < len(self.plan):
            tool_calls = [
                {
                    "name": "terminal",
                    "args": {"command": self.plan[turn]},
                    "id": f"call_{turn}",
                    "type": "tool_call",
                }
            ]
        message = AIMessage(
            content="" if tool_calls else "done",
            tool_calls=tool_calls,
            usage_metadata=self._usage_metadata(),
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _usage_metadata(self) -> Any:
        if self.usage is None:
            return None
        given = self.usage
        return {
            "input_tokens": given["input_tokens"],
            "output_tokens": given["output_tokens"],
            "total_tokens": given["input_tokens"] + given["output_tokens"],
            "input_token_details": {"cache_read": given.get("cache_read_tokens", 0)},
        }


def budget(user: str) -> dict[str, int]:
    """What the daemon says `user` spent and holds under the rule, in micro-USD."""
    found = httpx.get(f"{URL}/v1/usage", params={"user": user}, trust_env=False)
    limits = {item["rule"]: item for item in found.raise_for_status().json()["limits"]}
    item = limits.get(RULE, {})
    return {
        "spent": round(float(item.get("used") or 0) * 1_000_000),
        "reserved": round(float(item.get("reserved") or 0) * 1_000_000),
    }


def run(
    user: str,
    model: ScriptedModel,
    *,
    is_async: bool = False,
    middleware: RatewardenMiddleware | None = None,
    by_config: bool = False,
) -> dict[str, Any]:
    """One agent run of `user` (in the run's context, or `by_config` in its config's
    `configurable`): what it ended with, what the model and tools saw, and the user's
    budget after it."""
    agent = create_agent(model, tools=[terminal], middleware=[middleware or RatewardenMiddleware()])
    start = {"messages": [{"role": "user", "content": "go"}]}
    given: dict[str, Any] = {"context": {"user_id": user}}
    if by_config:
        given = {"config": {"configurable": {"user_id": user}}}
    before = model.calls
    raised = None
    state: Any = {}
    try:
        if is_async:
            state = asyncio.run(agent.ainvoke(start, **given))
        else:
            state = agent.invoke(start, **given)
    except RuntimeError as exc:
        raised = str(exc)
    messages = state.get("messages", []) if isinstance(state, dict) else []
    last = messages[-1] if messages else None
    return {
        "output": getattr(last, "content", None),
        "last_tool_calls": len(getattr(last, "tool_calls", None) or []),
        "last_metadata": getattr(last, "response_metadata", None) or {},
        "tool_results": [str(m.content) for m in messages if isinstance(m, ToolMessage)],
        "model_calls": model.calls - before,
        "raised": raised,
        **budget(user),
    }


def scenarios(model_name: str, usage: dict[str, int], dead_url: str) -> dict[str, Any]:
    def scripted(**fields: Any) -> ScriptedModel:
        return ScriptedModel(model_name=model_name, usage=fields.pop("usage", usage), **fields)

    report: dict[str, Any] = {"bob_before": budget("bob")}
    # alice: nine model calls, each answering at once, through invoke then ainvoke.
    report["drain"] = [run("alice", scripted(), is_async=index >= 5) for index in range(9)]
    # The tenth asks for terminal: allowed, it spends; the tool call is refused by the
    # budget (0.05 > what is left); the eleventh model call could cost more than is left.
    report["turn"] = run("alice", scripted(plan=["echo 1"]))
    report["refused_async"] = run("alice", scripted(), is_async=True)
    # A service guarding only tools: its tool call meets the same budget.
    report["tools_only"] = run(
        "alice", scripted(plan=["echo 2"]), middleware=RatewardenMiddleware(models=False)
    )
    # Asking for a shorter answer (the chat model's max_tokens) fits in what is left.
    small = {"input_tokens": 1_000, "output_tokens": 500, "cache_read_tokens": 0}
    report["shorter"] = run("alice", scripted(max_tokens=1_000, usage=small))
    # bob (named in the config, not the context): untouched by alice's day; his model
    # calls and his tool call go through.
    report["bob"] = run("bob", scripted(plan=["echo 3"]), is_async=True, by_config=True)
    # carol: the provider fails; both paths settle the call with nothing used.
    report["failed"] = run("carol", scripted(fail=True))
    report["failed_async"] = run("carol", scripted(fail=True), is_async=True)
    # dave: an answer without usage is charged its whole reservation.
    report["no_usage"] = run("dave", scripted(usage=None))
    # The daemon unreachable: failing closed, the model call is refused (the agent
    # reads why); failing open, it goes through unsettled.
    os.environ["RATEWARDEN_URL"] = dead_url
    report["fail_closed"] = run("erin", scripted(), middleware=RatewardenMiddleware(fail="closed"))
    report["fail_open"] = run("erin", scripted(), is_async=True)
    report["ran"] = (WORK / "terminal.ran").read_text().splitlines()
    return report


def token_rate(model_name: str, usage: dict[str, int]) -> dict[str, Any]:
    """Under a token rate alone (no budget holds anything): three model calls of tara,
    the tokens of each settle counted, so that the third is refused."""
    runs = [run("tara", ScriptedModel(model_name=model_name, usage=usage)) for _ in range(3)]
    return {"token_rate": runs}


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    WORK = Path(config["work"])
    URL = config["url"]
    (WORK / "terminal.ran").touch()
    os.environ["RATEWARDEN_URL"] = URL
    if config.get("token_rate"):
        print(json.dumps(token_rate(config["model"], config["usage"])))
    else:
        print(json.dumps(scenarios(config["model"], config["usage"], config["dead_url"])))
