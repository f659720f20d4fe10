"""Drive a real OpenAI Agents SDK run, offline, through RatewardenModel; print what it saw.

Runs inside the openai_agents host venv (tests/helpers/hostenv.py):

    python openai_agents_models.py '{"url": ..., "work": ..., "model": "gpt-4o",
                                      "usage": {...}, "user": ..., "other": ...}'

The shared scenario of tests/hosts/model_budget.py. The model is the SDK's
`agents.testing.ScriptedModel` reporting `usage` for every answer (the SDK's `Usage`,
cached tokens in `input_tokens_details`), wrapped in `RatewardenModel` (priced as
`model`); the run's config is `ratewarden_run_config`, the user in the run's context; the
`terminal` tool has ratewarden's guardrails.

- `drain`: `user`'s runs of one answer each, the day's spend read after each;
- `last`: `user`'s run whose model asks for `terminal` then answers: the tool call and
  the answer after it are what the drained budget refuses;
- `streamed`: the same refusal through `Runner.run_streamed`;
- `small`: `user`'s run with `max_tokens` 1000 and a small usage, allowed and settled;
- `fails`: `user`'s run like `small` whose model raises: settled as failed, nothing spent;
- `structured`: `user`'s run with a structured output: refused as the model's refusal
  (`ModelRefusalError`), and with an `error_handlers["model_refusal"]` as the output;
- `other`: `other`'s streamed run asking for `terminal` once, then answering, its agent's
  model named (`"gpt-4o"`): `ratewarden_run_config` wraps what the run's provider resolves;
- `half_read`: `user`'s model call streamed from `RatewardenModel` itself and closed after
  its first event: what it used is unknown, so its whole reservation is charged;
- `closed_after_completion`: `other`'s, closed right after `response.completed`: its
  usage is known, so that is what is charged.

The last line of stdout is the JSON report.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import httpx
from agents import (
    Agent,
    ModelProvider,
    ModelRefusalError,
    ModelSettings,
    RunConfig,
    Runner,
    ToolCallOutputItem,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from agents.models.interface import ModelTracing
from agents.testing import ScriptedModel, assistant_message, function_call
from openai.types.responses.response_usage import (  # type: ignore[import-not-found]
    InputTokensDetails,
    OutputTokensDetails,
)
from pydantic import BaseModel

from ratewarden.client import AsyncGuard
from ratewarden.integrations.openai_agents import (
    RatewardenModel,
    make_ratewarden_guardrail,
    ratewarden_run_config,
    ratewarden_settle_guardrail,
)

RULE = "daily-spend"


class Verdict(BaseModel):
    ok: bool


def sdk_usage(usage: dict[str, int]) -> Usage:
    return Usage(
        requests=1,
        input_tokens=usage["input_tokens"],
        output_tokens=usage["output_tokens"],
        total_tokens=usage["input_tokens"] + usage["output_tokens"],
        input_tokens_details=InputTokensDetails(
            cached_tokens=usage.get("cache_read_tokens", 0),
            cache_write_tokens=usage.get("cache_write_tokens", 0),
        ),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
    )


class Provider(ModelProvider):
    """Resolves every model name to the scripted model."""

    def __init__(self, model: ScriptedModel) -> None:
        self.model = model

    def get_model(self, model_name: str | None) -> ScriptedModel:
        return self.model


def spent(url: str, user: str, field: str = "used") -> int:
    """`user`'s spend (or what is reserved) under the rule today in micro-USD."""
    limits = httpx.get(f"{url}/v1/usage", params={"user": user}, trust_env=False).json()
    used = {item["rule"]: item.get(field) or 0 for item in limits["limits"]}.get(RULE, 0)
    return round(float(used) * 1_000_000)


async def run(
    config: dict[str, Any],
    user: str,
    usage: dict[str, int],
    *,
    tool_first: bool = False,
    streamed: bool = False,
    settings: ModelSettings | None = None,
    output_type: Any = None,
    on_refusal: Any = None,
    fail: bool = False,
    by_name: bool = False,
) -> dict[str, Any]:
    work = Path(config["work"])
    guard = AsyncGuard(config["url"], fail="closed")

    @function_tool(
        tool_input_guardrails=[make_ratewarden_guardrail(guard)],
        tool_output_guardrails=[ratewarden_settle_guardrail],
    )
    def terminal(command: str) -> str:
        """Run a shell command (recorded, not executed)."""
        with (work / f"{user}.ran").open("a") as out:
            out.write(command + "\n")
        return f"ran {command}"

    steps: list[Any] = (
        [[function_call("terminal", {"command": "echo hi"}, call_id="call_1")]]
        if tool_first
        else []
    )
    answer = '{"ok": true}' if output_type else f"answer {len(steps) + 1}"
    steps.append(RuntimeError("the provider is down") if fail else [assistant_message(answer)])
    scripted = ScriptedModel(steps, default_usage=sdk_usage(usage))
    # By name, the run's config wraps what its provider resolves; else the agent's model
    # is a Model object, wrapped by hand.
    model: Any = (
        config["model"] if by_name else RatewardenModel(scripted, name=config["model"], guard=guard)
    )
    agent = Agent(
        name="assistant",
        model=model,
        tools=[terminal],
        model_settings=settings or ModelSettings(),
        output_type=output_type,
    )
    options: dict[str, Any] = {
        "context": {"user_id": user},
        "run_config": ratewarden_run_config(
            RunConfig(model_provider=Provider(scripted)), guard=guard
        ),
    }
    if on_refusal is not None:
        options["error_handlers"] = {"model_refusal": on_refusal}
    report: dict[str, Any] = {}
    try:
        if streamed:
            result: Any = Runner.run_streamed(agent, "Go.", **options)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, "Go.", **options)
        output = result.final_output
        report["output"] = output if isinstance(output, str) else repr(output)
        report["tool_results"] = [
            str(item.output) for item in result.new_items if isinstance(item, ToolCallOutputItem)
        ]
    except ModelRefusalError as refused:
        report["refused"] = refused.refusal
    except RuntimeError as error:  # the model's own failure, as the SDK raises it
        report["error"] = str(error)
    finally:
        await guard.aclose()
    report["requests"] = len(scripted.calls)
    ran = work / f"{user}.ran"
    report["ran"] = len(ran.read_text().splitlines()) if ran.exists() else 0
    return report


async def closed_early(config: dict[str, Any], user: str, after: str | None) -> dict[str, Any]:
    """`user`'s streamed model call, its stream closed (`aclose`, as a consumer that stops
    reading) after its first event, or after the event of type `after`: the reservation
    while it streamed, what the close charged, and what is still held after."""
    url = config["url"]
    guard = AsyncGuard(url, fail="closed")
    usage = {"input_tokens": 100, "output_tokens": 50}
    scripted = ScriptedModel([[assistant_message("half")]], default_usage=sdk_usage(usage))
    model = RatewardenModel(scripted, name=config["model"], guard=guard, user=lambda _: user)
    before = spent(url, user)
    stream: AsyncGenerator[Any, None] = model.stream_response(  # an async generator
        None, "Go.", ModelSettings(max_tokens=1000), [], None, [], ModelTracing.DISABLED,
        previous_response_id=None, conversation_id=None, prompt=None,
    )  # type: ignore[assignment]  # fmt: skip
    seen = [getattr(await anext(stream), "type", None)]
    while after is not None and seen[-1] != after:
        seen.append(getattr(await anext(stream), "type", None))
    reserved = spent(url, user, "reserved")
    await stream.aclose()
    await guard.aclose()
    return {
        "seen": seen,
        "reserved_while_streaming": reserved,
        "charged": spent(url, user) - before,
        "reserved_after": spent(url, user, "reserved"),
    }


async def main(config: dict[str, Any]) -> dict[str, Any]:
    set_tracing_disabled(True)
    url, user, usage = config["url"], config["user"], config["usage"]
    report: dict[str, Any] = {"drain": [], "spent": []}
    for _ in range(config["drain"]):
        report["drain"].append(await run(config, user, usage))
        report["spent"].append(spent(url, user))
    report["other_before"] = spent(url, config["other"])
    report["last"] = await run(config, user, usage, tool_first=True)
    report["spent_after_last"] = spent(url, user)
    report["streamed"] = await run(config, user, usage, streamed=True)
    small = {"input_tokens": 100, "output_tokens": 50}
    report["small"] = await run(config, user, small, settings=ModelSettings(max_tokens=1000))
    report["spent_after_small"] = spent(url, user)
    failing = {"settings": ModelSettings(max_tokens=1000), "fail": True}
    report["fails"] = await run(config, user, small, **failing)
    report["after_fail"] = [spent(url, user), spent(url, user, "reserved")]
    report["structured"] = await run(config, user, usage, output_type=Verdict)
    report["handled"] = await run(
        config,
        user,
        usage,
        output_type=Verdict,
        on_refusal=lambda data: {"final_output": Verdict(ok=False)},
    )
    report["spent_at_end"] = spent(url, user)
    other = {"tool_first": True, "streamed": True, "by_name": True}
    report["other"] = await run(config, config["other"], usage, **other)
    report["other_spent"] = spent(url, config["other"])
    report["half_read"] = await closed_early(config, user, None)
    report["closed_after_completion"] = await closed_early(
        config, config["other"], "response.completed"
    )
    return report


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
