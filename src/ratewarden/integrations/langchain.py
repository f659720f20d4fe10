"""LangChain v1: an agent middleware that asks ratewarden around every tool call and
every model call.

    from langchain.agents import create_agent
    from ratewarden.integrations.langchain import RatewardenMiddleware

    agent = create_agent(model, tools=[terminal], middleware=[RatewardenMiddleware()])
    agent.invoke({"messages": [...]}, context={"user_id": "discord:77"})

`wrap_tool_call` (`invoke`, `stream`) and `awrap_tool_call` (`ainvoke`, `astream`) check
the call before its tool runs. A refused call never runs: the model gets a `ToolMessage`
with ratewarden's sentence and `status="error"`, e.g.
`Rate limit: max 10 terminal calls per minute (retry in 42s)`. An allowed call that holds
something (a concurrency slot, a budget reservation) is settled when its tool returns,
with its duration and status (`error` for an error `ToolMessage` or a raised exception,
which is re-raised after the settle); when the daemon asks for it (`send_result`: a loop
rule keyed on results), with the digest of what the tool returned, the `ToolMessage`'s
`content` (a `Command`, or another value a tool returns as is, by its text).

`wrap_model_call` (`invoke`) and `awrap_model_call` (`ainvoke`) check each model call
(docs/budgets.md): the model's name (the request's `model` setting, else what LangChain
traces as `ls_model_name`, else the chat model's `model_name`/`model` field), its input
tokens estimated from the text it is sent (system message, messages, tool calls' arguments
and the tools' definitions; LangChain's tokenizers may download or be missing, and the
settle charges what the provider counted), and the most output tokens from the request's
or the chat model's `max_tokens` (`max_output_tokens`, `max_completion_tokens`; else the
policy's default). A refused call never reaches the model: the agent gets an `AIMessage`
with ratewarden's sentence and no tool calls, so the run ends its turn with it (e.g.
`This model call could cost up to 0.09 USD; 0.04 USD is left of today's 1.00 USD
budget: ask for a shorter answer or a smaller model`). An allowed call is settled with
the `usage_metadata` of the answer's `AIMessage` (`input_tokens`, `output_tokens`, and
`input_token_details`' `cache_read` and `cache_creation`); an answer without usage is
charged its whole reservation, and a model that raised is settled as `error` with no
usage (nothing charged) before the exception goes on. A model call the daemon asks a
human about is refused (no interrupt in the middle of a model call). `models=False`
leaves model calls alone.

The user is `user_id` of the run's context (`invoke(..., context=...)`: a dict key or an
attribute), else `config["configurable"]["user_id"]`, else RATEWARDEN_USER or the login
name; or what `user(request)` returns for the `ToolCallRequest` (or `ModelRequest`).
The call id leads with the model's tool-call id; the tool call's `args` go with the check
whenever the daemon's policy reads them.

A rule's `ask`: by default (`ask="deny"`) the call is refused, the message saying a human
must approve it. With `ask="interrupt"` the middleware pauses the run with LangGraph's
`interrupt`, as `HumanInTheLoopMiddleware(interrupt_mode="per_call")` does, with a
`tool_approval` request (the call and ratewarden's message); the agent needs a
checkpointer, and the run goes on with `Command(resume={"type": "approve"})` (or
`{"type": "reject", "message": ...}`). On resume LangGraph runs the tool call again from
its start: ratewarden checks it again, an approval is sent as `approved: true`, and a call
the rules now allow runs without reading the answer.

The module imports without LangChain (ratewarden never imports it); the middleware's
methods import what they return when the agent calls them.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ratewarden import vocabulary
from ratewarden.client import AsyncGuard, ClientError, Guard, unreachable_answer
from ratewarden.integrations._async import LoopGuards, check_call
from ratewarden.integrations._identity import default_user, user_from
from ratewarden.integrations._lifecycle import AdmittedCall, settlement
from ratewarden.integrations._model_calls import (
    estimate_tokens,
    model_check,
    model_settlement,
    must_settle,
    refusal_text,
)
from ratewarden.vocabulary import CallStatus, FailMode, fail_mode
from ratewarden.wire.bodies import CheckRequest, CheckResponse, SettleRequest
from ratewarden.wire.names import check_request

try:
    from langchain.agents.middleware import AgentMiddleware
except ImportError:  # the module imports without LangChain; only create_agent needs it
    AgentMiddleware = object

__all__ = ["ASK_MODES", "RatewardenMiddleware"]

HOST = "langchain"  # leads the call id when a tool call has no id
ASK_MODES = ("deny", "interrupt")
APPROVAL_TYPE = "tool_approval"  # the interrupt value's `type`, as HumanInTheLoopMiddleware's

UserLookup = Callable[[Any], str | None]  # the ToolCallRequest or ModelRequest -> the user
# Where chat models keep the most output tokens a request allows (LangChain's
# `max_tokens`; Google's `max_output_tokens`; OpenAI's newer name), in this order.
MAX_TOKENS_NAMES = ("max_tokens", "max_output_tokens", "max_completion_tokens")
# Where chat models keep their model's name: the per-call setting, then the fields.
MODEL_NAMES = ("model_name", "model", "model_id", "deployment_name")


@dataclass(frozen=True)
class _Call:
    """One tool call, as ratewarden names it."""

    user: str
    tool: str
    call_id: str  # ours, for the daemon, led by the model's tool-call id
    args: object = field(default=None, repr=False)  # never shown

    def request(self, approved: bool) -> CheckRequest:
        return check_request(
            user=self.user, tool=self.tool, call_id=self.call_id, approved=approved, args=self.args
        )


@dataclass(frozen=True)
class _ModelCall:
    """One model call, as ratewarden names it."""

    user: str
    model: str
    input_tokens: int
    max_output_tokens: int | None
    call_id: str

    def request(self) -> CheckRequest:
        return model_check(
            self.user, self.model, self.input_tokens, self.max_output_tokens, self.call_id
        )


class RatewardenMiddleware(AgentMiddleware):  # type: ignore[misc,unused-ignore]
    """Allow, deny or ask for each tool call of a LangChain agent by the daemon's rules.

    `guard`: a `Guard` or an `AsyncGuard` (default: built from RATEWARDEN_URL and
    RATEWARDEN_TOKEN; an `AsyncGuard` per event loop for `ainvoke`). A `Guard` serves
    `ainvoke` too, from a worker thread; an `AsyncGuard` lends its url, token and fail
    mode to the `Guard` that serves `invoke`. `user`: a callable from the
    `ToolCallRequest` (or, for a model call, the `ModelRequest`) to the user id. `fail`:
    "open" (default) or "closed" when the daemon cannot be reached (only without `guard`:
    a guard carries its own). `ask`: "deny" (default) or "interrupt" (LangGraph's
    human-in-the-loop; needs a checkpointer). `models`: check and settle the agent's
    model calls too (default), or only its tool calls.

    List it last among the middleware that wrap tool calls (the innermost, nearest the
    tool): LangGraph runs a paused tool call again from the start on resume, so a
    middleware inside it that interrupts (`HumanInTheLoopMiddleware` per call) would have
    the call checked, and counted, twice.
    """

    def __init__(
        self,
        guard: Guard | AsyncGuard | None = None,
        *,
        user: UserLookup | None = None,
        fail: str | None = None,
        ask: str = "deny",
        models: bool = True,
    ) -> None:
        if guard is not None and fail is not None:
            raise ValueError("give the fail mode to the guard: Guard(fail=...)")
        if ask not in ASK_MODES:
            raise ValueError(f"ask must be one of {ASK_MODES}, got {ask!r}")
        self._fail = FailMode.OPEN if fail is None else fail_mode(fail)
        self._guard = guard
        self._async_guards = LoopGuards(guard if isinstance(guard, AsyncGuard) else None, fail)
        self._sync_guard = guard if isinstance(guard, Guard) else None
        self._sync_lock = threading.Lock()
        self._user = user
        self._ask = ask
        self._models = models

    # -- the hooks ----------------------------------------------------------------------

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Check the call, run it through `handler` if allowed, settle it after."""
        call = self._describe(request)
        guard = self._guard_for_sync()
        answer = _check(guard, call)
        if answer.decision == "ask":
            declined = self._ask_human(request, answer)
            answer = _check(guard, call, approved=True) if declined is None else declined
        if not answer.allowed:
            return refusal(request, answer)
        if not answer.holds:
            return handler(request)
        admitted = AdmittedCall(answer.call_id, guard, send_result=answer.send_result)
        try:
            result = handler(request)
        except BaseException:
            self._settle(guard, admitted.call_id, admitted.settlement(CallStatus.ERROR))
            raise
        self._settle(
            guard, admitted.call_id, admitted.settlement(_status(result), tool_output(result))
        )
        return result

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """`wrap_tool_call` for `ainvoke` and `astream`."""
        call = self._describe(request)
        answer = await self._acheck(call)
        if answer.decision == "ask":
            declined = self._ask_human(request, answer)
            answer = await self._acheck(call, approved=True) if declined is None else declined
        if not answer.allowed:
            return refusal(request, answer)
        if not answer.holds:
            return await handler(request)
        admitted = AdmittedCall(answer.call_id, send_result=answer.send_result)
        try:
            result = await handler(request)
        except BaseException:
            await self._asettle(admitted.call_id, admitted.settlement(CallStatus.ERROR))
            raise
        await self._asettle(
            admitted.call_id, admitted.settlement(_status(result), tool_output(result))
        )
        return result

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Check the model call; ask the model through `handler` if allowed, settle it
        with the answer's usage; refused, the agent gets an `AIMessage` saying why."""
        if not self._models:
            return handler(request)
        call = self._describe_model(request)
        guard = self._guard_for_sync()
        answer = _check_model(guard, call)
        if not answer.allowed:
            return model_refusal(answer, call.model)
        if not must_settle(answer):
            return handler(request)
        admitted = AdmittedCall(answer.call_id, guard)
        try:
            response = handler(request)
        except BaseException:
            self._settle(guard, admitted.call_id, _failed(admitted))
            raise
        self._settle(guard, admitted.call_id, response_settlement(response, admitted))
        return response

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """`wrap_model_call` for `ainvoke` and `astream`."""
        if not self._models:
            return await handler(request)
        call = self._describe_model(request)
        answer = await self._acheck_model(call)
        if not answer.allowed:
            return model_refusal(answer, call.model)
        if not must_settle(answer):
            return await handler(request)
        admitted = AdmittedCall(answer.call_id)
        try:
            response = await handler(request)
        except BaseException:
            await self._asettle(admitted.call_id, _failed(admitted))
            raise
        await self._asettle(admitted.call_id, response_settlement(response, admitted))
        return response

    # -- the parts ----------------------------------------------------------------------

    def _describe(self, request: Any) -> _Call:
        tool_call = request.tool_call
        host_id = tool_call.get("id")
        return _Call(
            user=self._user_of(request),
            tool=str(tool_call.get("name") or "tool"),
            # the model's tool-call id and a fresh suffix: fake and local models reuse ids
            call_id=vocabulary.call_id(HOST, host_id),
            args=tool_call.get("args"),
        )

    def _describe_model(self, request: Any) -> _ModelCall:
        model = getattr(request, "model", None)
        settings = getattr(request, "model_settings", None)
        settings = settings if isinstance(settings, Mapping) else {}
        name = model_name(model, settings)
        return _ModelCall(
            user=self._user_of(request),
            model=name,
            input_tokens=estimate_tokens(input_texts(request)),
            max_output_tokens=max_output_tokens(model, settings),
            call_id=vocabulary.call_id(HOST),
        )

    def _user_of(self, request: Any) -> str:
        """The `user` callable's answer, else the context's or the config's `user_id`."""
        if self._user is not None:
            return self._user(request) or default_user()
        runtime = getattr(request, "runtime", None)
        config = getattr(runtime, "config", None)  # a tool call's ToolRuntime has it
        if not isinstance(config, Mapping):  # a model call's Runtime: the run's config
            config = _run_config()
        configurable = config.get("configurable") if isinstance(config, Mapping) else None
        found = user_from(getattr(runtime, "context", None)) or user_from(configurable)
        return found or default_user()

    def _ask_human(self, request: Any, answer: CheckResponse) -> CheckResponse | None:
        """None when a human approved the call (check it again as approved), else the
        refusal. With `ask="interrupt"` the first pass raises LangGraph's interrupt."""
        message = answer.message or vocabulary.ASK_REASON.format(tool=request.tool_call["name"])
        if self._ask != "interrupt":
            return answer.model_copy(update={"message": vocabulary.needs_approval(message)})
        from langgraph.types import interrupt

        decision = interrupt(approval_request(request, answer, message))
        if _approved(decision):
            return None
        return answer.model_copy(update={"message": declined_message(message, decision)})

    def _guard_for_sync(self) -> Guard:
        """The caller's `Guard`, else one built once (from the `AsyncGuard`'s settings)."""
        with self._sync_lock:
            if self._sync_guard is None:
                given = self._guard
                if isinstance(given, AsyncGuard):
                    self._sync_guard = Guard(given.url, given.token, fail=given.fail)
                else:  # read the environment now, not at import
                    self._sync_guard = Guard(fail=self._fail)
            return self._sync_guard

    async def _acheck(self, call: _Call, approved: bool = False) -> CheckResponse:
        if isinstance(self._guard, Guard):  # blocking: off the event loop
            return await asyncio.to_thread(_check, self._guard, call, approved)
        return await check_call(
            self._async_guards.get(),
            user=call.user,
            tool=call.tool,
            call_id=call.call_id,
            approved=approved,
            args=call.args,
        )

    async def _acheck_model(self, call: _ModelCall) -> CheckResponse:
        if isinstance(self._guard, Guard):  # blocking: off the event loop
            return await asyncio.to_thread(_check_model, self._guard, call)
        guard = self._async_guards.get()
        try:
            return await guard.check(call.request())
        except (ClientError, ValueError) as exc:
            return unreachable_answer(_unsent(call), guard.fail, exc)

    def _settle(self, guard: Guard, call_id: str, settle: SettleRequest) -> None:
        guard.settle(call_id, settle)

    async def _asettle(self, call_id: str, settle: SettleRequest) -> None:
        if isinstance(self._guard, Guard):
            await asyncio.to_thread(self._guard.settle, call_id, settle)
        else:
            await self._async_guards.get().settle(call_id, settle)


# -- what the agent gets ------------------------------------------------------------------


def refusal(request: Any, answer: CheckResponse) -> Any:
    """The `ToolMessage` the model gets in place of the tool's result."""
    from langchain_core.messages import ToolMessage

    tool_call = request.tool_call
    name = str(tool_call.get("name") or "tool")
    return ToolMessage(
        content=answer.message or vocabulary.REFUSED.format(tool=name),
        tool_call_id=str(tool_call.get("id") or ""),
        name=name,
        status="error",
    )


def model_refusal(answer: CheckResponse, model: str) -> Any:
    """The `AIMessage` the agent gets in place of the model's answer: ratewarden's
    sentence and no tool calls, so the agent ends its turn with it."""
    from langchain_core.messages import AIMessage

    rules = sorted({violation.rule for violation in answer.violations})
    return AIMessage(
        content=refusal_text(answer, model),
        response_metadata={"ratewarden": {"decision": answer.decision, "rules": rules}},
    )


def approval_request(request: Any, answer: CheckResponse, message: str) -> dict[str, Any]:
    """The interrupt's value: HumanInTheLoopMiddleware's per-call `tool_approval` request
    (the call as the model made it, ratewarden's message as the description), plus what
    ratewarden decided."""
    tool_call = request.tool_call
    return {
        "type": APPROVAL_TYPE,
        "tool_call_id": str(tool_call.get("id") or ""),
        "name": str(tool_call.get("name") or "tool"),
        "args": dict(tool_call.get("args") or {}),
        "description": message,
        "ratewarden": {
            "decision": answer.decision,
            "message": message,
            "rules": sorted({violation.rule for violation in answer.violations}),
            "retry_after": answer.retry_after,
        },
    }


def declined_message(message: str, decision: object) -> str:
    """ratewarden's reason and that the call needs a human's approval, then the reviewer's
    own words, in brackets, when a rejection gave some."""
    refusal = vocabulary.needs_approval(message)
    reason = decision.get("message") if isinstance(decision, Mapping) else None
    return (
        f"{refusal} ({reason.strip()})" if isinstance(reason, str) and reason.strip() else refusal
    )


def _approved(decision: object) -> bool:
    """`{"type": "approve"}` (HumanInTheLoopMiddleware's decision) or `True`."""
    if isinstance(decision, Mapping):
        return decision.get("type") == "approve"
    return decision is True


# -- the daemon ---------------------------------------------------------------------------


def _check(guard: Guard, call: _Call, approved: bool = False) -> CheckResponse:
    """The daemon's decision; a request it refuses is answered by the fail mode."""
    try:
        return guard.check(call.request(approved))
    except (ClientError, ValueError) as exc:  # bad input or auth: the agent must go on
        unsent = CheckRequest.model_construct(user=call.user, tool=call.tool, call_id=call.call_id)
        return unreachable_answer(unsent, guard.fail, exc)


def _check_model(guard: Guard, call: _ModelCall) -> CheckResponse:
    """The daemon's decision on a model call; a request it refuses: the fail mode."""
    try:
        return guard.check(call.request())
    except (ClientError, ValueError) as exc:
        return unreachable_answer(_unsent(call), guard.fail, exc)


def _unsent(call: _ModelCall) -> CheckRequest:
    return CheckRequest.model_construct(user=call.user, tool=call.model, call_id=call.call_id)


def _run_config() -> Mapping[str, Any] | None:
    """The config of the LangGraph run this code runs in (None outside of one)."""
    try:
        from langgraph.config import get_config

        config: Mapping[str, Any] = get_config()
    except (ImportError, RuntimeError):
        return None
    return config


# -- what a model call is -------------------------------------------------------------


def model_name(model: Any, settings: Mapping[str, Any]) -> str:
    """The model's name: the request's `model` setting, LangChain's own reading of it
    (`ls_model_name`), a name field, else the chat model's type."""
    given = settings.get("model")
    if isinstance(given, str) and given:
        return given
    found = _ls_params(model, settings).get("ls_model_name")
    if isinstance(found, str) and found:
        return found
    for attribute in MODEL_NAMES:
        value = getattr(model, attribute, None)
        if isinstance(value, str) and value:
            return value
    kind = getattr(model, "_llm_type", None)
    return kind if isinstance(kind, str) and kind else type(model).__name__


def max_output_tokens(model: Any, settings: Mapping[str, Any]) -> int | None:
    """The most output tokens this request allows: the request's setting, else the chat
    model's; None (the policy's default) when neither says."""
    for source in (settings, _ls_params(model, settings)):
        for key in (*MAX_TOKENS_NAMES, "ls_max_tokens"):
            value = source.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    for attribute in MAX_TOKENS_NAMES:
        value = getattr(model, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _ls_params(model: Any, settings: Mapping[str, Any]) -> Mapping[str, Any]:
    """LangChain's tracing params of the model (its name and max tokens), or nothing."""
    read = getattr(model, "_get_ls_params", None)
    if not callable(read):
        return {}
    try:
        params = read(**settings)
    except Exception:  # a provider's own override: never worth the model call
        return {}
    return params if isinstance(params, Mapping) else {}


def input_texts(request: Any) -> Iterator[str]:
    """The text the model is sent: the system message, every message (a tool call's
    arguments too) and the tools' definitions. Images and other blocks are left out:
    the estimate is of text."""
    system = getattr(request, "system_message", None)
    if system is not None:
        yield _text(system)
    for message in getattr(request, "messages", None) or ():
        yield _text(message)
        for tool_call in getattr(message, "tool_calls", None) or ():
            yield _json(tool_call.get("name"), tool_call.get("args"))
    for tool in getattr(request, "tools", None) or ():
        if isinstance(tool, Mapping):
            yield _json(tool)
        else:
            args = getattr(tool, "args", None)
            yield _json(getattr(tool, "name", ""), getattr(tool, "description", ""), args)


def _text(message: Any) -> str:
    """A message's text: its string content, or the text blocks of a list of them."""
    content = getattr(message, "content", message)
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, Mapping) and isinstance(block.get("text"), str):
            parts.append(block["text"])
    return "".join(parts)


def _json(*parts: Any) -> str:
    try:
        return json.dumps(parts, default=str, ensure_ascii=False)
    except (TypeError, ValueError):  # a circular or otherwise unwritable value
        return ""


# -- what a model call used -----------------------------------------------------------


def response_settlement(response: Any, admitted: AdmittedCall) -> SettleRequest:
    """The settle of a model call that answered `response` (a `ModelResponse`, an
    `AIMessage` or an `ExtendedModelResponse`): the usage its messages report; without
    any, a plain `ok`, which charges the call its whole reservation."""
    duration = admitted.elapsed_ms()
    found = [
        usage
        for message in _messages(response)
        if isinstance(usage := getattr(message, "usage_metadata", None), Mapping)
    ]
    if not found:
        return settlement(CallStatus.OK, duration)
    details = [d for u in found if isinstance(d := u.get("input_token_details"), Mapping)]
    return model_settlement(
        _sum(u.get("input_tokens") for u in found),
        _sum(u.get("output_tokens") for u in found),
        _sum(d.get("cache_read") for d in details),
        _sum(d.get("cache_creation") for d in details),
        duration_ms=duration,
    )


def _messages(response: Any) -> list[Any]:
    inner = getattr(response, "model_response", response)  # an ExtendedModelResponse
    result = getattr(inner, "result", None)  # a ModelResponse
    return list(result) if isinstance(result, list) else [inner]


def _sum(values: Iterator[Any] | Any) -> int:
    """The sum of the counts that are ints (a provider's None or junk counts 0)."""
    return sum(v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0)


def _failed(admitted: AdmittedCall) -> SettleRequest:
    """A model call that raised: it used nothing the provider reported."""
    return model_settlement(status=CallStatus.ERROR, duration_ms=admitted.elapsed_ms())


def tool_output(result: Any) -> Any:
    """What the tool returned, as the model reads it: a `ToolMessage`'s `content`, else the
    value itself (a `Command`, digested by its text)."""
    content = getattr(result, "content", None)
    return result if content is None else content


def _status(result: Any) -> CallStatus:
    """`error` for a ToolMessage with that status (a tool's handled error), else `ok`."""
    failed = getattr(result, "status", None) == "error"  # a ToolMessage's own status
    return CallStatus.ERROR if failed else CallStatus.OK
