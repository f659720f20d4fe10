"""pydantic-ai capabilities (pydantic-ai 1.74 and later): one `RatewardenCapability` that
asks ratewarden before every model request and every tool call of an agent.

    from pydantic_ai import Agent
    from ratewarden.integrations.pydantic_ai_capability import RatewardenCapability

    agent = Agent("openai:gpt-4o", deps_type=Deps, capabilities=[RatewardenCapability()])
    await agent.run(prompt, deps=Deps(user_id="discord:77"))

The user is `deps.user_id` (a key of a dict, or an attribute), or what `user(deps)`
returns, as for the pydantic-ai-middleware adapter (`integrations.pydantic_ai`).

Model requests (`wrap_model_request`, streamed or not): the check names the request's
model (`model.model_name`), its input tokens estimated from the text it sends (the
messages, the instructions, the tool definitions: pydantic-ai counts tokens before a
request only by asking the provider) and its `max_tokens` setting (none: the policy's
`defaults.max_output_tokens`). The settle sends the response's `usage` (pydantic-ai's
`RequestUsage` uses genai-prices' names: input tokens with the cached ones, output,
cache read, cache write); a request that raised is settled as failed (nothing used), a
stream abandoned half-read as cancelled (its whole reservation charged). A refused
request never reaches the model: the agent gets a model response whose text is our
message, so a run with text output ends with it as its output (`result.output`:
`Budget exceeded for model calls: ...`). A run whose output must be structured (an
output type other than `str`) could not take that text as its output, so there the
request raises `ModelCallRefused` (its `message` ours) out of `agent.run`.

Tool calls (`wrap_tool_execute`) are decided as the middleware adapter decides them:
a refused call never runs and the model gets our message as the tool's result; an
allowed one is settled when the tool returns or raises. A rule with `on_exceed: ask`
is a refusal with the same message, unless `defer_asks=True`: the call then raises
pydantic-ai's `ApprovalRequired` (our message in its metadata, `ratewarden_message`),
the run ends with `DeferredToolRequests` (the agent's output types must allow it), and
when it is resumed with the approval the call is checked again as approved and runs.

The module imports without pydantic-ai (ratewarden never imports it); the hooks import
what they build when the framework calls them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from ratewarden import vocabulary
from ratewarden.client import AsyncGuard
from ratewarden.integrations._async import LoopGuards, check_call, log
from ratewarden.integrations._identity import UserLookup, resolve_user
from ratewarden.integrations._lifecycle import AdmittedCall
from ratewarden.integrations._model_calls import check_model, estimated_tokens, text_leaves
from ratewarden.vocabulary import CallStatus

try:
    from pydantic_ai.capabilities import AbstractCapability
except ImportError:  # the module imports without pydantic-ai; only Agent(...) needs it
    AbstractCapability = object

__all__ = ["ModelCallRefused", "RatewardenCapability"]
HOST = "pydantic-ai"  # leads the call id when a tool call has no id of its own
MODEL_HOST = "pydantic-ai-model"  # leads a model call's id
ASK_METADATA = "ratewarden_message"  # ApprovalRequired's metadata key for an ask's message
# Message fields that name rather than say: not input tokens.
_NOT_TEXT = frozenset({"part_kind", "kind", "tool_call_id", "timestamp", "id", "provider_name"})


class ModelCallRefused(RuntimeError):
    """A model request ratewarden refused, in a run whose output cannot be text.

    `message` is the daemon's (`This model call could cost up to 0.41 USD; ...`), for the
    application to show its user; `decision` is "deny"."""

    def __init__(self, message: str, decision: str = "deny") -> None:
        super().__init__(message)
        self.message = message
        self.decision = decision


class RatewardenCapability(AbstractCapability):  # type: ignore[misc,unused-ignore]
    """Check each model request and tool call with the daemon, for the user in `deps`.

    `guard`: an `AsyncGuard` (default: one per event loop from RATEWARDEN_URL and
    RATEWARDEN_TOKEN); `user`: a callable from deps to the user id (default: the
    `user_id` key or attribute of deps, else RATEWARDEN_USER or the login name); `fail`:
    "open" (default) or "closed" when the daemon cannot be reached (only without `guard`);
    `models` and `tools`: guard model requests, tool calls (both by default);
    `defer_asks`: an `ask` raises `ApprovalRequired` instead of refusing.
    """

    def __init__(
        self,
        guard: AsyncGuard | None = None,
        *,
        user: UserLookup | None = None,
        fail: str | None = None,
        models: bool = True,
        tools: bool = True,
        defer_asks: bool = False,
    ) -> None:
        self._guards = LoopGuards(guard, fail)
        self._user = user
        self._models = models
        self._tools = tools
        self._defer_asks = defer_asks

    # -- model requests ------------------------------------------------------------------

    async def wrap_model_request(
        self, ctx: Any, *, request_context: Any, handler: Callable[[Any], Awaitable[Any]]
    ) -> Any:
        if not self._models:
            return await handler(request_context)
        model_name = getattr(request_context.model, "model_name", None)
        settings = request_context.model_settings or {}
        answer, call = await check_model(
            self._guards.get(),
            user=resolve_user(getattr(ctx, "deps", None), self._user),
            model=model_name,
            input_tokens=estimated_tokens(lambda: request_texts(request_context)),
            max_output_tokens=settings.get("max_tokens"),
            host=MODEL_HOST,
        )
        if not answer.allowed:
            return refusal(request_context, answer.message, model_name)
        if call is None:
            return await handler(request_context)
        try:
            response = await handler(request_context)
        except asyncio.CancelledError:
            await call.settle_unknown()
            raise
        except BaseException:
            await call.settle_failed()
            raise
        await call.settle(response_usage(response))
        return response

    # -- tool calls ----------------------------------------------------------------------

    async def wrap_tool_execute(
        self,
        ctx: Any,
        *,
        call: Any,
        tool_def: Any,
        args: Any,
        handler: Callable[[Any], Awaitable[Any]],
    ) -> Any:
        if not self._tools:
            return await handler(args)
        tool = call.tool_name
        guard = self._guards.get()
        user = resolve_user(getattr(ctx, "deps", None), self._user)
        call_id = vocabulary.call_id(HOST, getattr(call, "tool_call_id", None))
        approved = bool(getattr(ctx, "tool_call_approved", False)) and self._defer_asks
        answer = await check_call(
            guard, user=user, tool=tool, call_id=call_id, approved=approved, args=args
        )
        if answer.decision == "ask" and self._defer_asks:
            from pydantic_ai.exceptions import ApprovalRequired

            raise ApprovalRequired(metadata={ASK_METADATA: answer.message})
        if not answer.allowed:
            if approved:  # a deny rule filled up since the person approved it
                log.warning("approved %s call refused: %s", tool, answer.message)
            return answer.message  # the tool's result, as the model reads it
        if not (answer.holds or not answer.degraded):
            return await handler(args)
        admitted = AdmittedCall(answer.call_id or call_id, guard, send_result=answer.send_result)
        try:
            result = await handler(args)
        except asyncio.CancelledError:
            await guard.settle(admitted.call_id, admitted.settlement(CallStatus.CANCELLED))
            raise
        except BaseException:  # ModelRetry too: the tool ran and asked for another try
            await guard.settle(admitted.call_id, admitted.settlement(CallStatus.ERROR))
            raise
        await guard.settle(admitted.call_id, admitted.settlement(CallStatus.OK, result))
        return result


def request_texts(request_context: Any) -> Iterator[str]:
    """The text a model request sends, as far as the hook sees it: every message part's
    content (tool calls' arguments and tool returns as JSON), the instructions, and the
    tool definitions (names, descriptions, JSON schemas)."""
    for message in request_context.messages:
        instructions = getattr(message, "instructions", None)
        if isinstance(instructions, str):
            yield instructions
        for part in getattr(message, "parts", ()):
            yield from part_texts(part)
    parameters = request_context.model_request_parameters
    for tool in [*parameters.function_tools, *parameters.output_tools]:
        yield tool.name
        yield tool.description or ""
        yield json.dumps(tool.parameters_json_schema, separators=(",", ":"), default=str)


def part_texts(part: Any) -> Iterator[str]:
    """One message part's text: what its model sees of it."""
    for method in ("args_as_json_str", "model_response_str"):
        spell = getattr(part, method, None)
        if callable(spell):
            yield str(spell())
            return
    if getattr(part, "part_kind", None) == "retry-prompt":
        yield str(part.model_response())
        return
    yield from text_leaves(getattr(part, "content", None), _NOT_TEXT)


def response_usage(response: Any) -> dict[str, object] | None:
    """A `ModelResponse`'s `RequestUsage` as the settle's counts; None when the provider
    reported none (the whole reservation is then charged)."""
    usage = getattr(response, "usage", None)
    has_values = getattr(usage, "has_values", None)
    if usage is None or not callable(has_values) or not has_values():
        return None
    fields = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    return {field: getattr(usage, field, 0) for field in fields}


def refusal(request_context: Any, message: str, model_name: object) -> Any:
    """What a refused request answers: a model response saying `message` when the run's
    output can be plain text, else `ModelCallRefused` (raised)."""
    from pydantic_ai.messages import ModelResponse, TextPart

    parameters = request_context.model_request_parameters
    if not parameters.allow_text_output or parameters.output_object is not None:
        raise ModelCallRefused(message)
    name = model_name if isinstance(model_name, str) else None
    return ModelResponse(parts=[TextPart(content=message)], model_name=name)
