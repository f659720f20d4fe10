"""Google ADK: a plugin that asks ratewarden before every tool call and settles after it.

    from google.adk.runners import InMemoryRunner
    from ratewarden.integrations.adk import RatewardenPlugin

    runner = InMemoryRunner(agent=agent, plugins=[RatewardenPlugin()])

The user is the session's `user_id` (`tool_context.user_id`), or what `user(tool_context)`
returns; the call's arguments go with the check whenever the daemon's policy reads them.
A refused call never runs: `before_tool_callback` returns `{"error": <our message>}`,
which ADK hands to the model as the function response, e.g.
`{"error": "Rate limit: max 10 terminal calls per minute (retry in 42s)"}`.

A rule with `on_exceed: ask` goes through ADK's tool confirmation: the call asks for one
(`tool_context.request_confirmation`, the daemon's reason as the hint) and pauses the run,
as ADK's own `require_confirmation` gate does; the app answers the
`adk_request_confirmation` call, and ADK runs the call again with the answer. Confirmed,
it is checked again with `approved: true`, so it is counted and audited as approved;
rejected, it is refused with the daemon's reason. A confirmation the tool asked for itself
(`require_confirmation`) approves nothing of ratewarden's. With `confirm=False`, or in a
context that cannot ask (no function call id), an `ask` is a refusal saying a human must
approve the call.

An allowed call is settled in `after_tool_callback` (duration, `ok`, and the digest of the
tool's response when the daemon asks for it, `send_result`; `blocked` and no charge when
the call only paused for a confirmation) or released by
`on_tool_error_callback` (`error`, also when the call was cancelled). Each call has a
`ToolContext` of its own, so parallel calls are settled one by one. The call id is led by
the model's function call id. The module imports without ADK (ratewarden never imports
it); the plugin needs it.

Model calls (docs/budgets.md): `before_model_callback` checks each one, naming the
request's model (`llm_request.model`), its input tokens estimated from the text it is
sent (system instruction, contents' text, function calls and responses, the tools'
declarations: counting them would be a call to the provider), and the most output tokens
from `config.max_output_tokens` (else the policy's default). Refused, the model is
skipped: the callback returns an `LlmResponse` whose text is ratewarden's sentence, which
the agent answers with, ending its turn. Allowed, the call is settled by
`after_model_callback` with the response's `usage_metadata`: `prompt_token_count` (and
`tool_use_prompt_token_count`) in, of which `cached_content_token_count` read from the
cache, `candidates_token_count` and `thoughts_token_count` out. A streamed call is
settled by its first response that is not `partial` (with the last usage a partial one
reported, if it reports none); a response without usage is charged the whole
reservation. `on_model_error_callback` settles a call that raised as `error`, with what
its stream had reported (else nothing), and lets the error through; `after_run_callback`
releases, uncharged, the calls another plugin or the agent's own before-model callback
answered in the model's place. The before, after and error callbacks of one model call
share its response event's `EventActions`, which pairs them: parallel agents' calls
are settled one by one. The user is the session's `user_id` (or `user(callback_context)`).
`models=False` leaves model calls alone.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ratewarden import vocabulary
from ratewarden.client import AsyncGuard, ClientError, unreachable_answer
from ratewarden.integrations._async import LoopGuards, check_call
from ratewarden.integrations._identity import UserLookup, resolve_user
from ratewarden.integrations._lifecycle import NO_RESULT, AdmittedCall, settlement
from ratewarden.integrations._model_calls import (
    estimate_tokens,
    model_check,
    model_settlement,
    must_settle,
    refusal_text,
)
from ratewarden.vocabulary import CallStatus
from ratewarden.wire.bodies import CheckRequest, CheckResponse, SettleRequest

try:
    from google.adk.plugins import BasePlugin
except ImportError:  # the module imports (and the plugin builds) without ADK

    class BasePlugin:  # type: ignore[no-redef]
        """What RatewardenPlugin needs of ADK's BasePlugin: a name."""

        def __init__(self, name: str) -> None:
            self.name = name


__all__ = ["RatewardenPlugin"]
HOST = "adk"  # leads the call id when a call has no function call id
# The function call ADK makes for a confirmation request (google.adk.utils.
# _function_call_names.REQUEST_CONFIRMATION_FUNCTION_CALL_NAME, a private module).
CONFIRMATION_CALL = "adk_request_confirmation"

Response = dict[str, Any]


@dataclass
class _ModelCall:
    """One allowed model call, from its before-model callback to its settle."""

    admitted: AdmittedCall  # its call id, guard and start
    invocation_id: str
    forget: Any = None  # the weakref.finalize that drops the entry with its event
    usage: Any = None  # the last usage a partial (streamed) response reported

    async def settle(self, settle: SettleRequest) -> None:
        if self.forget is not None:
            self.forget.detach()  # settled: nothing left to drop
        await self.admitted.guard.settle(self.admitted.call_id, settle)


_NOTHING = object()  # a usage of no tokens: every count of it reads 0


class RatewardenPlugin(BasePlugin):  # type: ignore[misc,unused-ignore]
    """Allow, refuse or ask for each tool call by the daemon's rules for the session's user.

    `guard`: an `AsyncGuard` (default: one per event loop from RATEWARDEN_URL and
    RATEWARDEN_TOKEN); `user`: a callable from the `ToolContext` to the user id (default:
    `tool_context.user_id`, else RATEWARDEN_USER or the login name); `fail`: "open"
    (default) or "closed" when the daemon cannot be reached (only without `guard`: an
    `AsyncGuard` carries its own); `confirm`: ask a human through ADK's tool confirmation
    (default) or refuse an `ask`; `models`: check and settle model calls too (default).
    List it first among the runner's plugins: ADK stops at the first plugin whose
    after-tool or after-model callback returns a value, and the settles are there.
    """

    def __init__(
        self,
        guard: AsyncGuard | None = None,
        *,
        user: UserLookup | None = None,
        fail: str | None = None,
        confirm: bool = True,
        models: bool = True,
        name: str = "ratewarden",
    ) -> None:
        super().__init__(name=name)
        self._guards = LoopGuards(guard, fail)
        self._user = user
        self._confirm = confirm
        # Allowed calls by their ToolContext: ADK hands the same one to the before, after
        # and error callbacks of one call, and a call that never ends is forgotten with it.
        self._admitted: weakref.WeakKeyDictionary[Any, AdmittedCall] = weakref.WeakKeyDictionary()
        self._models = models
        # Allowed model calls by the id of their response event's `EventActions`: ADK
        # hands the before, after and error callbacks of one model call contexts over
        # that one object (a new one per model call, parallel agents included). It is
        # not hashable, hence its id; the entry goes when the object does (no id reuse).
        self._model_calls: dict[int, _ModelCall] = {}

    async def before_tool_callback(
        self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any
    ) -> Response | None:
        confirmation = tool_context.tool_confirmation  # the human's answer, on a re-run
        asked = None if confirmation is None else _our_question(tool_context, tool.name)
        if asked is not None and not confirmation.confirmed:
            return _refused(asked)
        guard = self._guards.get()
        call_id = vocabulary.call_id(HOST, tool_context.function_call_id)
        answer = await check_call(
            guard,
            user=resolve_user(tool_context, self._user),
            tool=tool.name,
            call_id=call_id,
            approved=asked is not None,
            args=tool_args,
        )
        if answer.decision == "ask" and asked is None:
            return self._ask(tool.name, tool_context, answer.message)
        if not answer.allowed:
            return _refused(answer.message)
        # A fail-open answer holds nothing, unless the daemon counted it locally (holds).
        if answer.holds or not answer.degraded:
            self._admitted[tool_context] = AdmittedCall(
                call_id, guard, send_result=answer.send_result
            )
        return None

    def _ask(self, tool: str, tool_context: Any, reason: str) -> Response:
        """Ask the app's human through ADK's confirmation, when we may and can."""
        if self._confirm and tool_context.function_call_id:
            tool_context.request_confirmation(hint=f"{_question(tool)}{reason}")
            # Pause the run, as ADK's own confirmation gate does: a model shown this
            # response at once would only call the tool again.
            tool_context.actions.skip_summarization = True
        return _refused(vocabulary.needs_approval(reason))

    async def after_tool_callback(
        self,
        *,
        tool: Any,
        tool_args: dict[str, Any],
        tool_context: Any,
        result: dict[str, Any],
    ) -> Response | None:
        # The tool (or its require_confirmation gate) asked for a confirmation: the call
        # will run again once answered, and is checked again then.
        paused = tool_context.function_call_id in tool_context.actions.requested_tool_confirmations
        await self._settle(tool_context, CallStatus.BLOCKED if paused else CallStatus.OK, result)
        return None

    async def on_tool_error_callback(
        self,
        *,
        tool: Any,
        tool_args: dict[str, Any],
        tool_context: Any,
        error: BaseException,
    ) -> Response | None:
        await self._settle(tool_context, CallStatus.ERROR)
        return None

    # -- model calls --------------------------------------------------------------------

    async def before_model_callback(self, *, callback_context: Any, llm_request: Any) -> Any:
        """Check the model call; refused, the model is skipped and the agent's answer is
        ratewarden's sentence (an `LlmResponse` with its text)."""
        if not self._models:
            return None
        guard = self._guards.get()
        model = str(getattr(llm_request, "model", None) or "model")
        config = getattr(llm_request, "config", None)
        request = model_check(
            resolve_user(callback_context, self._user),
            model,
            estimate_tokens(request_texts(llm_request)),
            getattr(config, "max_output_tokens", None),
            vocabulary.call_id(HOST),
        )
        answer = await _check_model(guard, request)
        if not answer.allowed:
            return model_refusal(answer, model)
        if must_settle(answer):
            actions = callback_context.actions
            key = id(actions)
            admitted = AdmittedCall(answer.call_id, guard)
            forget = weakref.finalize(actions, self._model_calls.pop, key, None)
            self._model_calls[key] = _ModelCall(admitted, callback_context.invocation_id, forget)
        return None

    async def after_model_callback(self, *, callback_context: Any, llm_response: Any) -> Any:
        """Settle the model call with the usage its (final) response reports."""
        key = id(callback_context.actions)
        call = self._model_calls.get(key)
        if call is None:  # refused, holding nothing, or not ours
            return None
        usage = getattr(llm_response, "usage_metadata", None)
        if getattr(llm_response, "partial", None):  # streamed: settled by the final one
            call.usage = usage or call.usage
            return None
        self._model_calls.pop(key, None)
        await call.settle(usage_settlement(usage or call.usage, call.admitted.elapsed_ms()))
        return None

    async def on_model_error_callback(
        self, *, callback_context: Any, llm_request: Any, error: Exception
    ) -> Any:
        """A model call that raised: settled with what its stream reported, else nothing
        used; the error goes on to ADK (and the app) unchanged."""
        call = self._model_calls.pop(id(callback_context.actions), None)
        if call is not None:
            # what a stream reported before it broke was used; else nothing was
            usage = call.usage if call.usage is not None else _NOTHING
            await call.settle(usage_settlement(usage, call.admitted.elapsed_ms(), CallStatus.ERROR))
        return None

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        """Release the model calls of this run that never reached the model: a later
        plugin or the agent's own before-model callback answered in its place."""
        invocation = getattr(invocation_context, "invocation_id", None)
        left = [k for k, call in self._model_calls.items() if call.invocation_id == invocation]
        for key in left:
            call = self._model_calls.pop(key, None)
            if call is not None:
                await call.settle(settlement(CallStatus.BLOCKED, None))

    async def _settle(self, tool_context: Any, status: CallStatus, result: Any = NO_RESULT) -> None:
        admitted = self._admitted.pop(tool_context, None)
        if admitted is None:  # refused, fail-open, or not ours
            return
        await admitted.guard.settle(admitted.call_id, admitted.settlement(status, result))


async def _check_model(guard: AsyncGuard, request: CheckRequest) -> CheckResponse:
    """The daemon's decision on a model call; a request it refuses: the fail mode."""
    try:
        return await guard.check(request)
    except (ClientError, ValueError) as exc:
        return unreachable_answer(request, guard.fail, exc)


def model_refusal(answer: CheckResponse, model: str) -> Any:
    """The `LlmResponse` the agent gets in place of the model's: ratewarden's sentence
    as the model's text, so the agent ends its turn with it."""
    from google.adk.models.llm_response import LlmResponse
    from google.genai import types

    rules = sorted({violation.rule for violation in answer.violations})
    return LlmResponse(
        content=types.Content(role="model", parts=[types.Part(text=refusal_text(answer, model))]),
        custom_metadata={"ratewarden": {"decision": answer.decision, "rules": rules}},
    )


def usage_settlement(
    usage: Any, duration_ms: float | None, status: CallStatus = CallStatus.OK
) -> SettleRequest:
    """The settle of a model call whose response reported `usage` (google-genai's
    `GenerateContentResponseUsageMetadata`): the prompt (cached part and tool-use prompt
    included) in, the candidates and thoughts out. Without usage, a plain settle, which
    charges the call its whole reservation."""
    if usage is None:
        return settlement(status, duration_ms)
    count = _counter(usage)
    return model_settlement(
        count("prompt_token_count") + count("tool_use_prompt_token_count"),
        count("candidates_token_count") + count("thoughts_token_count"),
        count("cached_content_token_count"),
        status=status,
        duration_ms=duration_ms,
    )


def _counter(usage: Any) -> Any:
    def count(name: str) -> int:
        value = getattr(usage, name, None)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    return count


def request_texts(llm_request: Any) -> Iterator[str]:
    """The text an `LlmRequest` sends: the system instruction, every part's text,
    function call and function response, and the tools' declarations."""
    config = getattr(llm_request, "config", None)
    yield from _texts(getattr(config, "system_instruction", None))
    for content in getattr(llm_request, "contents", None) or ():
        yield from _texts(content)
    for tool in getattr(config, "tools", None) or ():
        yield _dumped(tool)


def _texts(value: Any) -> Iterator[str]:
    """The text of a str, a Content, a Part, or a list of them."""
    if value is None:
        return
    if isinstance(value, str):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _texts(item)
    elif getattr(value, "parts", None) is not None:
        yield from _texts(value.parts)
    else:
        text = getattr(value, "text", None)
        if isinstance(text, str):
            yield text
        for name in ("function_call", "function_response"):
            found = getattr(value, name, None)
            if found is not None:
                yield _dumped(found)


def _dumped(value: Any) -> str:
    try:
        plain = (
            value.model_dump(exclude_none=True, mode="json")
            if hasattr(value, "model_dump")
            else value
        )
        return json.dumps(plain, default=str, ensure_ascii=False)
    except Exception:  # a value that cannot be written: it only sizes an estimate
        return ""


def _refused(message: str) -> Response:
    """What the model gets in place of the tool's result."""
    return {"error": message}


def _question(tool: str) -> str:
    """How our confirmation hints begin, which tells them from other confirmations."""
    return f"{vocabulary.ASK_REASON.format(tool=tool)}: "


def _our_question(tool_context: Any, tool: str) -> str | None:
    """The daemon's reason, if the confirmation this re-run answers is one we asked for.

    It is read from the session's history, where ADK keeps the request; the re-run's
    `tool_confirmation` holds only the human's answer. Another confirmation (the tool's
    own `require_confirmation`) is the tool's business, and approves nothing of ours.
    """
    wanted = tool_context.function_call_id
    for event in reversed(tool_context.session.events):
        for call in event.get_function_calls():
            args = call.args or {}
            original = args.get("originalFunctionCall") or {}
            if call.name == CONFIRMATION_CALL and original.get("id") == wanted:
                hint = str((args.get("toolConfirmation") or {}).get("hint") or "")
                ours = hint.startswith(_question(tool))
                return hint.removeprefix(_question(tool)) if ours else None
    return None
