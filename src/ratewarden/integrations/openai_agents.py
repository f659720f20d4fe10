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

Model calls: the SDK's hooks (`on_llm_start`) can watch a model call but not stop it, so
the model is wrapped: `RatewardenModel(model)` delegates to the real `Model`, checking
before `get_response` / `stream_response` and settling after, from the response's
`usage` (input tokens, with the cached and cache-written ones among them, and output
tokens). `ratewarden_run_config()`
wraps every model a run resolves by name (its `model_provider`) and sets the
`call_model_input_filter` that hands the run's context to the models; an agent whose
`model` is a `Model` object wraps it itself:

    agent = Agent(name="assistant", model=RatewardenModel(my_model, name="gpt-4o"))
    await Runner.run(agent, prompt, context={"user_id": "discord:77"},
                     run_config=ratewarden_run_config())

The check names the model (`name`, else the wrapped model's `model` attribute), the
input tokens estimated from the text the request sends (instructions, input items, tool
and handoff definitions, the output schema) and `model_settings.max_tokens`. A refused
call never reaches the model: a run whose output is text ends with our message as its
`final_output`; a run with a structured output gets a refusal from the model
(`ResponseOutputRefusal`), which the SDK raises as `ModelRefusalError` unless
`Runner.run(..., error_handlers={"model_refusal": ...})` turns it into an output.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import inspect
import json
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from ratewarden import vocabulary
from ratewarden.client import AsyncGuard
from ratewarden.integrations._async import LoopGuards, check_call
from ratewarden.integrations._identity import UserLookup, resolve_user
from ratewarden.integrations._lifecycle import NO_RESULT, AdmittedCall
from ratewarden.integrations._model_calls import (
    ModelCall,
    check_model,
    estimated_tokens,
    text_leaves,
)
from ratewarden.vocabulary import CallStatus

try:
    from agents import RunHooks
    from agents.models.interface import Model, ModelProvider
except ImportError:  # the module imports without the SDK; the guardrails need it
    RunHooks = Model = ModelProvider = object

HOST = "openai-agents"  # leads the call id when the SDK gives no tool_call_id

__all__ = [
    "RatewardenModel",
    "RatewardenModelProvider",
    "RatewardenRunHooks",
    "make_ratewarden_guardrail",
    "model_input_filter",
    "ratewarden_guardrail",
    "ratewarden_run_config",
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


# -- model calls ----------------------------------------------------------------------------

MODEL_HOST = "openai-agents-model"  # leads a model call's id
# Input item fields that name rather than say: not input tokens.
_NOT_TEXT = frozenset({"type", "role", "id", "call_id", "status"})
# The run's context, as the model input filter last saw it in this task: the SDK hands
# the filter the context right before it asks the model, in the same task.
_run_context: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "ratewarden_openai_agents_context", default=None
)


def model_input_filter(then: Callable[[Any], Any] | None = None) -> Callable[[Any], Any]:
    """A `RunConfig.call_model_input_filter` that hands the run's context (the user) to
    `RatewardenModel`, then runs `then` (an application's own filter) if given."""

    async def remember_context(data: Any) -> Any:
        _run_context.set(data.context)
        if then is None:
            return data.model_data
        filtered = then(data)
        return await filtered if inspect.isawaitable(filtered) else filtered

    return remember_context


class _ModelGuard:
    """What every model of one configuration shares: the guards and the user lookup."""

    def __init__(self, guard: AsyncGuard | None, user: UserLookup | None, fail: str | None):
        self.guards = LoopGuards(guard, fail)
        self.user = user

    async def check(self, model: object, request: _Request) -> tuple[Any, ModelCall | None]:
        return await check_model(
            self.guards.get(),
            user=resolve_user(_run_context.get(), self.user),
            model=model,
            input_tokens=estimated_tokens(request.texts),
            max_output_tokens=getattr(request.model_settings, "max_tokens", None),
            host=MODEL_HOST,
        )


@dataclasses.dataclass
class _Request:
    """One model request's arguments, as `Model.get_response` takes them."""

    system_instructions: str | None
    input: Any
    model_settings: Any
    tools: list[Any]
    output_schema: Any
    handoffs: list[Any]
    tracing: Any
    options: dict[str, Any]

    def args(self) -> tuple[Any, ...]:
        return (
            self.system_instructions, self.input, self.model_settings, self.tools,
            self.output_schema, self.handoffs, self.tracing,
        )  # fmt: skip

    def texts(self) -> Iterator[str]:
        """The text the request sends: what its input tokens are estimated from."""
        yield self.system_instructions or ""
        yield from text_leaves(self.input, _NOT_TEXT)
        for tool in self.tools:
            yield str(getattr(tool, "name", ""))
            yield str(getattr(tool, "description", ""))
            yield _json(getattr(tool, "params_json_schema", None))
        for handoff in self.handoffs:
            yield str(getattr(handoff, "tool_name", ""))
            yield str(getattr(handoff, "tool_description", ""))
            yield _json(getattr(handoff, "input_json_schema", None))
        if not _plain_text(self.output_schema):
            yield _json(self.output_schema.json_schema())

    def refusal(self, message: str) -> Any:
        """The answer of a refused request: our message as the model's text when the run's
        output is text, else as the model's refusal (`ModelRefusalError` in the SDK)."""
        from agents import ModelResponse, Usage
        from openai.types.responses import (  # type: ignore[import-not-found,unused-ignore]
            ResponseOutputMessage,
            ResponseOutputRefusal,
            ResponseOutputText,
        )

        content: Any = (
            ResponseOutputText(text=message, type="output_text", annotations=[], logprobs=[])
            if _plain_text(self.output_schema)
            else ResponseOutputRefusal(refusal=message, type="refusal")
        )
        said = ResponseOutputMessage(
            id="ratewarden", type="message", role="assistant", status="completed",
            content=[content],
        )  # fmt: skip
        return ModelResponse(output=[said], usage=Usage(), response_id=None)


def _plain_text(output_schema: Any) -> bool:
    return output_schema is None or bool(output_schema.is_plain_text())


def _json(value: object) -> str:
    return "" if value is None else json.dumps(value, separators=(",", ":"), default=str)


def usage_counts(usage: Any) -> dict[str, object] | None:
    """The SDK's `Usage` (or the Responses API's `ResponseUsage`) as the settle's counts;
    None when the provider reported no tokens (the whole reservation is then charged)."""
    if usage is None:
        return None
    input_tokens = getattr(usage, "input_tokens", 0) or 0
    output_tokens = getattr(usage, "output_tokens", 0) or 0
    if not input_tokens and not output_tokens:
        return None
    details = getattr(usage, "input_tokens_details", None)
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_read_tokens": getattr(details, "cached_tokens", 0) or 0,
        "cache_write_tokens": getattr(details, "cache_write_tokens", 0) or 0,
    }


class RatewardenModel(Model):  # type: ignore[misc,unused-ignore]
    """A `Model` that asks ratewarden before each call of the `model` it wraps.

    `name`: the model's name as priced (default: the wrapped model's `model` attribute);
    `guard`, `user` and `fail` as for `make_ratewarden_guardrail` (the user is read from
    the run's context, which `model_input_filter()` in the run's config hands over: see
    `ratewarden_run_config`). Anything else is the wrapped model's.
    """

    def __init__(
        self,
        model: Any,
        *,
        name: str | None = None,
        guard: AsyncGuard | None = None,
        user: UserLookup | None = None,
        fail: str | None = None,
        _shared: _ModelGuard | None = None,
    ) -> None:
        self.wrapped = model
        found = getattr(model, "model", None)
        self.name = name or (found if isinstance(found, str) else None)
        self._guard = _shared or _ModelGuard(guard, user, fail)

    def __getattr__(self, name: str) -> Any:  # the wrapped model's own attributes
        if "wrapped" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["wrapped"], name)

    async def close(self) -> None:
        await self.wrapped.close()

    async def _cleanup_on_run_end(self, owner: object) -> None:
        await self.wrapped._cleanup_on_run_end(owner)

    def get_retry_advice(self, request: Any) -> Any:
        return self.wrapped.get_retry_advice(request)

    async def get_response(
        self, system_instructions: Any, input: Any, model_settings: Any, tools: Any,
        output_schema: Any, handoffs: Any, tracing: Any, **options: Any,
    ) -> Any:  # fmt: skip
        request = _Request(
            system_instructions, input, model_settings, tools, output_schema, handoffs,
            tracing, options,
        )  # fmt: skip
        answer, call = await self._guard.check(self.name, request)
        if not answer.allowed:
            return request.refusal(answer.message)
        if call is None:
            return await self.wrapped.get_response(*request.args(), **options)
        try:
            response = await self.wrapped.get_response(*request.args(), **options)
        except asyncio.CancelledError:
            await call.settle_unknown()
            raise
        except BaseException:
            await call.settle_failed()
            raise
        await call.settle(usage_counts(response.usage))
        return response

    async def stream_response(
        self, system_instructions: Any, input: Any, model_settings: Any, tools: Any,
        output_schema: Any, handoffs: Any, tracing: Any, **options: Any,
    ) -> AsyncIterator[Any]:  # fmt: skip
        request = _Request(
            system_instructions, input, model_settings, tools, output_schema, handoffs,
            tracing, options,
        )  # fmt: skip
        answer, call = await self._guard.check(self.name, request)
        if not answer.allowed:
            yield _completed(request.refusal(answer.message))
            return
        stream = self.wrapped.stream_response(*request.args(), **options)
        if call is None:
            async for event in stream:
                yield event
            return
        heard = False  # whether the provider said anything: then it may have charged
        usage: dict[str, object] | None = None
        try:
            async for event in stream:
                heard = True
                if getattr(event, "type", None) == "response.completed":
                    usage = usage_counts(getattr(event.response, "usage", None))
                yield event
        except BaseException as stopped:  # an error, closed (GeneratorExit) or cancelled
            if usage is not None:  # after `response.completed`: what it used is known
                await call.settle(usage)
            elif not isinstance(stopped, Exception):  # closed half-read: unknown
                await call.settle_unknown()
            else:
                await (call.settle_unknown(CallStatus.ERROR) if heard else call.settle_failed())
            raise
        await call.settle(usage)


def _completed(response: Any) -> Any:
    """`response` as the one event of a stream: `response.completed`."""
    from openai.types.responses import (  # type: ignore[import-not-found,unused-ignore]
        Response,
        ResponseCompletedEvent,
    )

    whole = Response(
        id="ratewarden", created_at=0, model="ratewarden", object="response",
        output=response.output, tool_choice="none", tools=[], top_p=None,
        parallel_tool_calls=False, status="completed",
    )  # fmt: skip
    return ResponseCompletedEvent(type="response.completed", response=whole, sequence_number=0)


class RatewardenModelProvider(ModelProvider):  # type: ignore[misc,unused-ignore]
    """A `ModelProvider` whose models are the `provider`'s, each a `RatewardenModel`."""

    def __init__(self, provider: Any, *, _shared: _ModelGuard) -> None:
        self.provider = provider
        self._shared = _shared

    def get_model(self, model_name: str | None) -> Any:
        model = self.provider.get_model(model_name)
        if isinstance(model, RatewardenModel):
            return model
        found = getattr(model, "model", None)
        name = found if isinstance(found, str) else model_name
        return RatewardenModel(model, name=name, _shared=self._shared)

    async def aclose(self) -> None:
        await self.provider.aclose()


def ratewarden_run_config(
    run_config: Any = None,
    *,
    guard: AsyncGuard | None = None,
    user: UserLookup | None = None,
    fail: str | None = None,
) -> Any:
    """`run_config` (default: a new `RunConfig`) with every model call checked: the models
    its provider resolves by name wrapped, its `model` too when that is a `Model`, and the
    filter that hands the run's context to them before the application's own filter."""
    from agents import RunConfig

    config = run_config if run_config is not None else RunConfig()
    shared = _ModelGuard(guard, user, fail)
    model = config.model
    if model is not None and not isinstance(model, str | RatewardenModel):
        model = RatewardenModel(model, _shared=shared)
    return dataclasses.replace(
        config,
        model=model,
        model_provider=RatewardenModelProvider(config.model_provider, _shared=shared),
        call_model_input_filter=model_input_filter(config.call_model_input_filter),
    )


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
