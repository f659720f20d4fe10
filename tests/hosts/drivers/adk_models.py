"""Spend a user's day on model calls through a real Google ADK runner, offline.

Runs inside the adk host venv (tests/helpers/hostenv.py), never in the main one:

    python adk_models.py '{"url": URL, "work": DIR, "model": "gpt-4o", "usage": {...}}'

The scenario of tests/hosts/model_budget.py: `InMemoryRunner`s with `RatewardenPlugin()`
(models and tools) around an `LlmAgent` whose model is a scripted `BaseLlm` instance
named `model` (`llm_request.model`), answering every call with an `LlmResponse` whose
`usage_metadata` reports `usage` in google-genai's names (`prompt_token_count` with the
cached part in `cached_content_token_count`, `candidates_token_count`). It counts the
calls that reached it. After each run the driver reads what the daemon says the user
spent (`spent`, micro-USD) and holds (`reserved`). Nothing reaches the network. The last
line of stdout is the JSON report.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import httpx
from google.adk.agents import LlmAgent
from google.adk.agents.run_config import RunConfig, StreamingMode
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.genai import types
from pydantic import Field

from ratewarden.client import AsyncGuard
from ratewarden.integrations.adk import RatewardenPlugin

WORK = Path()
URL = ""
RULE = "daily-spend"


def terminal(command: str) -> str:
    """Run a shell command (recorded, not executed)."""
    with (WORK / "terminal.ran").open("a") as out:
        out.write(command + "\n")
    return f"ran {command}"


class ScriptedModel(BaseLlm):
    """Calls terminal once per command of `plan`, a turn at a time, then answers "done";
    every answer reports `usage` (None: no usage_metadata). `fail` raises instead;
    `chunks` streams that many partial answers (each with the usage so far) first;
    `together` waits for that many calls in flight at once before answering."""

    plan: list[str] = Field(default_factory=list)
    usage: dict[str, int] | None = None
    fail: bool = False
    chunks: int = 0
    together: int = 0
    calls: int = 0  # the calls that reached the model
    requested_max: list[int | None] = Field(default_factory=list)  # max_output_tokens

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.calls += 1
        config = llm_request.config
        self.requested_max.append(config.max_output_tokens if config else None)
        if self.together:
            await _together(self.together)
        if self.fail:
            raise RuntimeError("the provider is down")
        turn = sum(content.role == "model" for content in llm_request.contents)
        for chunk in range(self.chunks):
            yield LlmResponse(
                content=types.Content(role="model", parts=[types.Part(text=f"thinking {chunk}")]),
                partial=True,
                usage_metadata=self._usage(fraction=chunk + 1, of=self.chunks + 1),
            )
        if turn < len(self.plan):
            call = types.FunctionCall(
                name="terminal", args={"command": self.plan[turn]}, id=f"fc-{turn}"
            )
            content = types.Content(role="model", parts=[types.Part(function_call=call)])
        else:
            content = types.Content(role="model", parts=[types.Part(text="done")])
        yield LlmResponse(content=content, usage_metadata=self._usage())

    def _usage(
        self, fraction: int = 1, of: int = 1
    ) -> types.GenerateContentResponseUsageMetadata | None:
        if self.usage is None:
            return None
        given = self.usage
        return types.GenerateContentResponseUsageMetadata(
            prompt_token_count=given["input_tokens"],
            cached_content_token_count=given.get("cache_read_tokens", 0),
            candidates_token_count=given["output_tokens"] * fraction // of,
            total_token_count=given["input_tokens"] + given["output_tokens"] * fraction // of,
        )


IN_FLIGHT: dict[int, asyncio.Barrier] = {}


async def _together(count: int) -> None:
    barrier = IN_FLIGHT.setdefault(count, asyncio.Barrier(count))
    await asyncio.wait_for(barrier.wait(), timeout=10)


def budget(user: str) -> dict[str, int]:
    """What the daemon says `user` spent and holds under the rule, in micro-USD."""
    found = httpx.get(f"{URL}/v1/usage", params={"user": user}, trust_env=False)
    limits = {item["rule"]: item for item in found.raise_for_status().json()["limits"]}
    item = limits.get(RULE, {})
    return {
        "spent": round(float(item.get("used") or 0) * 1_000_000),
        "reserved": round(float(item.get("reserved") or 0) * 1_000_000),
    }


class Host:
    """One runner: the plugin, an agent with `model` and the terminal tool."""

    def __init__(
        self,
        model: ScriptedModel,
        plugin: RatewardenPlugin | None = None,
        max_output_tokens: int | None = None,
    ) -> None:
        self.model = model
        config = None
        if max_output_tokens is not None:
            config = types.GenerateContentConfig(max_output_tokens=max_output_tokens)
        agent = LlmAgent(
            name="assistant", model=model, tools=[terminal], generate_content_config=config
        )
        self.runner = InMemoryRunner(agent=agent, plugins=[plugin or RatewardenPlugin()])

    async def run(self, user: str, *, stream: bool = False) -> dict[str, Any]:
        """A session of `user`: one message, the run to its end; what it ended with."""
        service = self.runner.session_service
        session = await service.create_session(app_name=self.runner.app_name, user_id=user)
        message = types.Content(role="user", parts=[types.Part(text="go")])
        mode = StreamingMode.SSE if stream else StreamingMode.NONE
        before = self.model.calls
        texts: list[str] = []
        metadata: list[Any] = []
        responses: list[dict[str, Any]] = []  # the function responses of the run
        raised = None
        try:
            async for event in self.runner.run_async(
                user_id=user,
                session_id=session.id,
                new_message=message,
                run_config=RunConfig(streaming_mode=mode),
            ):
                if event.partial:
                    continue
                responses.extend(dict(r.response or {}) for r in event.get_function_responses())
                parts = event.content.parts if event.content else None
                texts.extend(p.text for p in parts or [] if p.text)
                if event.custom_metadata:
                    metadata.append(event.custom_metadata)
        except Exception as exc:  # a model error ADK lets through ends the run
            raised = f"{type(exc).__name__}: {exc}"
        return {
            "texts": texts,
            "output": texts[-1] if texts else None,
            "metadata": metadata,
            "tool_results": responses,
            "model_calls": self.model.calls - before,
            "raised": raised,
            **budget(user),
        }


def scripted(model: str, usage: dict[str, int] | None, **fields: Any) -> ScriptedModel:
    return ScriptedModel(model=model, usage=usage, **fields)


async def scenarios(model: str, usage: dict[str, int], dead_url: str) -> dict[str, Any]:
    report: dict[str, Any] = {"bob_before": budget("bob")}
    # alice: nine model calls, each answering at once.
    answers = Host(scripted(model, usage))
    report["drain"] = [await answers.run("alice") for _ in range(9)]
    # The tenth asks for terminal: allowed, it spends; the tool call is refused by the
    # budget (0.05 > what is left); the eleventh model call could cost more than is left.
    turn = Host(scripted(model, usage, plan=["echo 1"]))
    report["turn"] = await turn.run("alice")
    report["refused"] = await answers.run("alice")
    # A runner guarding only tools: its tool call meets the same budget.
    tools_only = Host(scripted(model, usage, plan=["echo 2"]), RatewardenPlugin(models=False))
    report["tools_only"] = await tools_only.run("alice")
    # Asking for a shorter answer (max_output_tokens) fits in what is left.
    small = {"input_tokens": 1_000, "output_tokens": 500, "cache_read_tokens": 0}
    shorter = Host(scripted(model, small), max_output_tokens=1_000)
    report["shorter"] = await shorter.run("alice")
    report["shorter"]["requested"] = shorter.model.requested_max
    # bob: untouched by alice's day; his model calls and his tool call go through.
    report["bob"] = await Host(scripted(model, usage, plan=["echo 3"])).run("bob")
    # carol: the provider fails; the call is settled with nothing used.
    report["failed"] = await Host(scripted(model, usage, fail=True)).run("carol")
    # dave: an answer without usage is charged its whole reservation.
    report["no_usage"] = await Host(scripted(model, None)).run("dave")
    # erin: a streamed answer (two partial responses, then the final one): one settle.
    report["streamed"] = await Host(scripted(model, usage, chunks=2)).run("erin", stream=True)
    # frank and gina: one runner, two model calls in flight at once, each settled as its.
    both = Host(scripted(model, usage, together=2))
    frank, gina = await asyncio.gather(both.run("frank"), both.run("gina"))
    report["concurrent"] = {"frank": frank, "gina": gina}
    # The daemon unreachable: failing closed, the model call is refused (the agent
    # answers why); failing open, it goes through unsettled.
    closed = RatewardenPlugin(AsyncGuard(dead_url, fail="closed"))
    report["fail_closed"] = await Host(scripted(model, usage), closed).run("henry")
    opened = RatewardenPlugin(AsyncGuard(dead_url))
    report["fail_open"] = await Host(scripted(model, usage), opened).run("henry")
    report["ran"] = (WORK / "terminal.ran").read_text().splitlines()
    return report


async def token_rate(model: str, usage: dict[str, int]) -> dict[str, Any]:
    """Under a token rate alone (no budget holds anything): three model calls of tara,
    the tokens of each settle counted, so that the third is refused."""
    host = Host(scripted(model, usage))
    return {"token_rate": [await host.run("tara") for _ in range(3)]}


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    WORK = Path(config["work"])
    URL = config["url"]
    (WORK / "terminal.ran").touch()
    os.environ["RATEWARDEN_URL"] = URL
    if config.get("token_rate"):
        print(json.dumps(asyncio.run(token_rate(config["model"], config["usage"]))))
    else:
        print(
            json.dumps(asyncio.run(scenarios(config["model"], config["usage"], config["dead_url"])))
        )
