"""OpenAI Agents SDK: a tool input guardrail that asks ratewarden, and a settle after the tool.

    from agents import Agent, Runner, function_tool
    from ratewarden.integrations.openai_agents import (
        ratewarden_guardrail,
        ratewarden_settle_guardrail,
    )

    @function_tool(
        tool_input_guardrails=[ratewarden_guardrail],
        tool_output_guardrails=[ratewarden_settle_guardrail],
    )
    def terminal(command: str) -> str: ...

    await Runner.run(agent, prompt, context={"user_id": "discord:77"})

The user is `user_id` of the run's context object (a dict key or an attribute), or what
`user(context)` returns; the call's `tool_arguments` go with the check whenever the
daemon's policy reads them. A refused call never runs; the model gets our message as the
tool's output: `Rate limit: max 10 terminal calls per minute (retry in 42s)`. The SDK's
guardrails cannot ask a person, so a rule's `ask` is a refusal here too.

Guardrails get no word when the tool ends, so the settle that frees concurrency slots and
charges budget estimates comes from `ratewarden_settle_guardrail` (a tool *output*
guardrail) or, for every tool at once, `Runner.run(..., hooks=RatewardenRunHooks())`
(`on_tool_end`). Without either, slots are freed only when their lease times out. Both
pass the tool's output, whose digest the settle carries when the daemon asks for it
(`send_result`: a loop rule keyed on results). The
module imports without the SDK (ratewarden never imports it); the guardrails are built
at first use.
"""

from __future__ import annotations

import weakref
from typing import Any

from ratewarden import vocabulary
from ratewarden.client import AsyncGuard
from ratewarden.integrations._async import LoopGuards, check_call
from ratewarden.integrations._identity import UserLookup, resolve_user
from ratewarden.integrations._lifecycle import NO_RESULT, AdmittedCall
from ratewarden.vocabulary import CallStatus

try:
    from agents import RunHooks
except ImportError:  # the module imports without the SDK; the guardrails need it
    RunHooks = object

HOST = "openai-agents"  # leads the call id when the SDK gives no tool_call_id

__all__ = [
    "RatewardenRunHooks",
    "make_ratewarden_guardrail",
    "ratewarden_guardrail",
    "ratewarden_settle_guardrail",
    "settle_tool_call",
]


# Allowed calls by their ToolContext: the SDK hands the same object to the input and
# output guardrails and to on_tool_end, and a call that never finishes is forgotten with it.
_admitted: weakref.WeakKeyDictionary[Any, AdmittedCall] = weakref.WeakKeyDictionary()


class _Check:
    """The guardrail function: one daemon check per tool call."""

    def __init__(self, guard: AsyncGuard | None, user: UserLookup | None, fail: str | None):
        self._guards = LoopGuards(guard, fail)
        self._user = user

    async def __call__(self, data: Any) -> Any:
        from agents import ToolGuardrailFunctionOutput

        tool_context = data.context
        guard = self._guards.get()
        user = resolve_user(getattr(tool_context, "context", None), self._user)
        call_id = vocabulary.call_id(HOST, getattr(tool_context, "tool_call_id", None))
        # The SDK hands over the model's arguments as JSON text, as the model wrote them.
        arguments = getattr(tool_context, "tool_arguments", None)
        answer = await check_call(
            guard, user=user, tool=tool_context.tool_name, call_id=call_id, args=arguments
        )
        info = answer.model_dump(include={"decision", "call_id", "degraded", "retry_after"})
        if not answer.allowed:
            return ToolGuardrailFunctionOutput.reject_content(answer.message, output_info=info)
        if answer.holds or not answer.degraded:  # a fail-open one holds only what it lists
            _admitted[tool_context] = AdmittedCall(call_id, guard, send_result=answer.send_result)
        return ToolGuardrailFunctionOutput.allow(output_info=info)


def make_ratewarden_guardrail(
    guard: AsyncGuard | None = None,
    *,
    user: UserLookup | None = None,
    fail: str | None = None,
    name: str = "ratewarden",
) -> Any:
    """A `ToolInputGuardrail` asking the daemon before the tool runs.

    `guard`: an `AsyncGuard` (default: one per event loop from RATEWARDEN_URL and
    RATEWARDEN_TOKEN); `user`: a callable from the run context to the user id (default:
    its `user_id` key or attribute, else RATEWARDEN_USER or the login name); `fail`:
    "open" (default) or "closed" when the daemon cannot be reached (only without `guard`:
    an `AsyncGuard` carries its own). List it last among a tool's input guardrails: a
    guardrail after it that rejects a call it allowed leaves the call's slot held until
    its lease times out.
    """
    from agents import ToolInputGuardrail

    return ToolInputGuardrail(guardrail_function=_Check(guard, user, fail), name=name)


async def settle_tool_call(
    context: Any, status: str = CallStatus.OK, result: Any = NO_RESULT
) -> None:
    """Report the end of the tool call whose `ToolContext` this is (no-op if not ours),
    with what the tool returned (its digest goes when the daemon asked for it)."""
    try:
        admitted = _admitted.pop(context, None)
    except TypeError:  # not weak-referenceable, so never one of ours
        return
    if admitted is None:
        return
    await admitted.guard.settle(admitted.call_id, admitted.settlement(status, result))


async def _settle_output(data: Any) -> Any:
    from agents import ToolGuardrailFunctionOutput

    await settle_tool_call(data.context, result=data.output)
    return ToolGuardrailFunctionOutput.allow()


class RatewardenRunHooks(RunHooks):  # type: ignore[misc,unused-ignore]
    """Run hooks that settle every guarded tool call in `on_tool_end`.

    An alternative to listing `ratewarden_settle_guardrail` on each tool; subclass it (and
    call `super().on_tool_end`) to add hooks of your own.
    """

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: object) -> None:
        await settle_tool_call(context, result=result)


def _make_settle_guardrail() -> Any:
    from agents import ToolOutputGuardrail

    return ToolOutputGuardrail(guardrail_function=_settle_output, name="ratewarden_settle")


# Declared for type checkers and `__all__`; the values come from `__getattr__`.
ratewarden_guardrail: Any
ratewarden_settle_guardrail: Any
_DEFAULTS = {
    "ratewarden_guardrail": make_ratewarden_guardrail,
    "ratewarden_settle_guardrail": _make_settle_guardrail,
}


def __getattr__(name: str) -> Any:
    """`ratewarden_guardrail` and `ratewarden_settle_guardrail`, built at first use."""
    make = _DEFAULTS.get(name)
    if make is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    built = globals()[name] = make()  # the SDK is imported here, once
    return built
