"""CrewAI: ask ratewarden before every tool call, hand the model its refusal, settle after.

    from ratewarden.integrations.crewai import RatewardenHooks

    hooks = RatewardenHooks().register()  # every agent and crew of this process
    crew.kickoff(inputs={"user_id": "discord:77"})
    hooks.unregister()  # or: `with RatewardenHooks(): ...`

CrewAI's tool hooks are global (its `@before_tool_call` decorators and `@CrewBase` hook
methods land in the same process-wide lists), so `register()` adds a `before_tool_call`
and an `after_tool_call` hook there, once.

A refused call never runs. CrewAI drops the reason of a blocking hook: the model would
read only `Tool execution blocked by hook. Tool: terminal`. But CrewAI runs the
`after_tool_call` hooks on a blocked call too, and a string they return becomes the
tool's result, so the after hook hands the model ratewarden's sentence instead:
`Rate limit: max 10 terminal calls per minute (retry in 42s)`, as the tool message's
content. The before and after hooks of one call get two context objects but the same
`tool_input` dict (every CrewAI seam passes one object to both), which is how the after
hook finds its call, on any thread, sync or async.

The user is `user_id` of the crew's kickoff inputs (`crew.kickoff(inputs={...})`), else
RATEWARDEN_USER, else the login name; `user=` replaces it (a fixed id, or a callable
from the hook context to the id). `session_id` and `team_id` in the inputs become the
call's session and team; `tool_input` becomes its `args` (sent whenever the daemon's
policy reads them).

An `ask` rule goes to `approve(context, reason) -> bool` when one is given
(`console_approval` asks at the terminal through CrewAI's own
`ToolCallHookContext.request_human_input`); an approved call is checked again with
`approved: true`, so it is counted and audited as approved before it runs. Without
`approve`, or when the human declines, the call is refused and the model reads that a
human must approve it.

Model calls are asked too (issue 31; docs/budgets.md), unless `models=False`: a
`before_llm_call` hook checks each model call (the LLM's `model`, the input tokens
estimated from the messages, the LLM's `max_tokens`) and refuses it by raising CrewAI's
`HookAborted` with ratewarden's sentence: CrewAI has no way to answer a model call in its
place, so the deny ends the run and `crew.kickoff()` raises `HookAborted` whose `reason`
is the sentence (CrewAI's own contract for a hook's deny; a `False` return would lose the
reason). CrewAI's `after_llm_call` hook sees only the answer's text (not its usage, and
not at all for tool-call answers or failures), so the call is settled from CrewAI's
`LLMCallCompletedEvent` (its `usage`, read by CrewAI's own `UsageMetrics`) or
`LLMCallFailedEvent` (nothing used), which the LLM emits inside the call: a context
variable set by the before hook tells the handler which check it settles. The event bus
runs handlers in a thread pool, so the next before hook of the same run waits (up to
5 s) for the previous call's settle before it checks: a budget never sees a finished
call's reservation.

CrewAI's hooks are synchronous, also on its async paths (`akickoff`): the check is one
blocking request to the daemon (1 s timeout) on the calling thread. The module imports
without CrewAI (ratewarden never imports it); the hooks import it when CrewAI calls them.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ratewarden import vocabulary
from ratewarden.client import ClientError, Guard, unreachable_answer
from ratewarden.integrations._identity import default_user, user_from
from ratewarden.integrations._lifecycle import NO_RESULT, AdmittedCall, settlement
from ratewarden.integrations._model_calls import (
    FAILED,
    estimate_tokens,
    usage_settlement,
)
from ratewarden.vocabulary import CallStatus
from ratewarden.wire.bodies import CheckRequest, CheckResponse, SettleRequest
from ratewarden.wire.names import check_request, model_check_request

__all__ = ["RatewardenHooks", "console_approval", "kickoff_inputs"]

log = logging.getLogger("ratewarden.integrations.crewai")

HOST = "crewai"  # leads the call id: CrewAI's hook context carries no tool-call id
MAX_IN_FLIGHT = 10_000  # calls remembered for their after hook; older ones are dropped
# What CrewAI 1.x puts in place of a blocked call's result, and of a tool that raised
# (native tool calling): read from its raw result, which no after hook rewrites.
CREWAI_BLOCKED = "Tool execution blocked by hook."
CREWAI_ERROR = "Error executing tool: "
APPROVE_WORDS = frozenset({"approve", "approved", "yes", "y"})

UserSource = str | Callable[[Any], str | None]
Approver = Callable[[Any, str], bool]


SETTLE_WAIT_S = 5.0  # how long a model check waits for the previous call's settle


@dataclass(eq=False)
class _ModelCall:
    """An allowed model call holding a reservation, until CrewAI's event settles it."""

    call_id: str
    settled: threading.Event = field(default_factory=threading.Event)
    _claimed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def claim(self) -> bool:
        """True once: the first event for the call settles it, any other is ignored."""
        with self._lock:
            claimed, self._claimed = self._claimed, True
            return not claimed


# The model call the current context last checked: set by the before hook, read by the
# event handler CrewAI runs in a copy of the context the LLM emitted its event from.
_MODEL_CALL: contextvars.ContextVar[_ModelCall | None] = contextvars.ContextVar(
    "ratewarden_crewai_model_call", default=None
)


@dataclass(eq=False)
class _Pending:
    """A checked call waiting for its after hook."""

    args: object = field(repr=False)  # the call's tool_input: holding it keeps its id ours
    refusal: str | None = None  # what the model reads in place of CrewAI's own text
    call: AdmittedCall | None = None  # an allowed call holding a slot or a reservation


class RatewardenHooks:
    """CrewAI before/after tool-call hooks asking ratewarden.

    `guard`: the `Guard` to ask (default: one reading RATEWARDEN_URL and
    RATEWARDEN_TOKEN, failing by `fail`, else RATEWARDEN_FAIL, else "open").
    `user`: the user id, or a callable from the `ToolCallHookContext` to it (None or ""
    falls back to the kickoff inputs' `user_id`, then RATEWARDEN_USER). `approve`: a
    callable `(context, reason) -> bool` deciding a rule's `ask` (see `console_approval`);
    without one an ask is refused. Register it last among before hooks: a hook after it
    that blocks a call it allowed is seen in the after hook, and the call is settled as
    `blocked`, costing nothing. A call the daemon answered with `send_result` (a loop rule
    keyed on results) is settled with the digest of the tool's result, as the model reads
    it (the after hook context's `tool_result`).
    """

    def __init__(
        self,
        *,
        guard: Guard | None = None,
        user: UserSource | None = None,
        fail: str | None = None,
        approve: Approver | None = None,
        models: bool = True,
    ) -> None:
        if guard is not None and fail is not None:
            raise ValueError("pass fail= to the Guard you give, not to RatewardenHooks")
        self.models = models
        if guard is None:  # RATEWARDEN_FAIL read now, not at import
            guard = Guard(fail=fail or vocabulary.ClientSettings.read().fail)
        self.guard = guard
        self._user = user
        self._approve = approve
        self._lock = threading.Lock()
        # id(tool_input) -> the checks waiting for that call's after hook (a list: a hook
        # could see one dict twice).
        self._pending: OrderedDict[int, list[_Pending]] = OrderedDict()

    # -- registration -----------------------------------------------------------------

    def register(self) -> RatewardenHooks:
        """Add both hooks to CrewAI's global tool hooks; returns self."""
        from crewai.hooks import (
            get_before_tool_call_hooks,
            register_after_tool_call_hook,
            register_before_tool_call_hook,
        )

        registered = get_before_tool_call_hooks()
        if any(isinstance(getattr(hook, "__self__", None), RatewardenHooks) for hook in registered):
            # Two would check, and count, every call twice.
            raise RuntimeError("RatewardenHooks are already registered; unregister them first")
        register_before_tool_call_hook(self.before_tool_call)
        register_after_tool_call_hook(self.after_tool_call)
        if self.models:
            from crewai.events import crewai_event_bus
            from crewai.events.types.llm_events import LLMCallCompletedEvent, LLMCallFailedEvent
            from crewai.hooks import register_before_llm_call_hook

            register_before_llm_call_hook(self.before_llm_call)
            crewai_event_bus.register_handler(LLMCallCompletedEvent, self.llm_call_finished)
            crewai_event_bus.register_handler(LLMCallFailedEvent, self.llm_call_finished)
        return self

    def unregister(self) -> None:
        """Remove the hooks (a no-op for hooks not registered)."""
        from crewai.hooks import unregister_after_tool_call_hook, unregister_before_tool_call_hook

        unregister_before_tool_call_hook(self.before_tool_call)
        unregister_after_tool_call_hook(self.after_tool_call)
        if self.models:
            from crewai.events import crewai_event_bus
            from crewai.events.types.llm_events import LLMCallCompletedEvent, LLMCallFailedEvent
            from crewai.hooks import unregister_before_llm_call_hook

            unregister_before_llm_call_hook(self.before_llm_call)
            crewai_event_bus.off(LLMCallCompletedEvent, self.llm_call_finished)
            crewai_event_bus.off(LLMCallFailedEvent, self.llm_call_finished)

    def __enter__(self) -> RatewardenHooks:
        return self.register()

    def __exit__(self, *exc: object) -> None:
        self.unregister()

    # -- the hooks --------------------------------------------------------------------

    def before_tool_call(self, context: Any) -> bool | None:
        """None lets the call run; a refusal blocks it (its sentence comes in the after hook)."""
        tool = str(getattr(context, "tool_name", "") or "tool")
        try:
            answer = self._decide(context, tool)
        except Exception as exc:  # CrewAI would fail open on our exception: apply ours
            log.exception("ratewarden hook failed for %s", tool)
            answer = unreachable_answer(_unjudged(tool), self.guard.fail, exc)
        args = getattr(context, "tool_input", None)
        if answer.allowed:
            if answer.holds:
                admitted = AdmittedCall(answer.call_id, send_result=answer.send_result)
                self._remember(_Pending(args, call=admitted))
            return None
        self._remember(_Pending(args, refusal=refusal_message(answer, tool)))
        return _block(answer.message)

    def after_tool_call(self, context: Any) -> str | None:
        """Our refusal in place of CrewAI's text; else settle the call if it holds something."""
        pending = self._take(getattr(context, "tool_input", None))
        if pending is None:  # not checked by us, or it held nothing
            return None
        if pending.refusal is not None or pending.call is None:
            return pending.refusal
        # A blocked call (allowed by us, blocked by a later hook) never ran: it costs nothing.
        status = result_status(context)
        result = NO_RESULT if status == CallStatus.ERROR else tool_result(context)
        self.guard.settle(pending.call.call_id, pending.call.settlement(status, result))
        return None

    def before_llm_call(self, context: Any) -> None:
        """Check the model call; a refusal raises CrewAI's HookAborted with the sentence."""
        previous = _MODEL_CALL.get()
        if previous is not None and not previous.settled.wait(SETTLE_WAIT_S) and previous.claim():
            # No event came: a later hook blocked it, it never reached the provider.
            log.warning("ratewarden: no event for model call %s; released", previous.call_id)
            self.guard.settle(previous.call_id, usage_settlement(status=CallStatus.BLOCKED))
            previous.settled.set()
        _MODEL_CALL.set(None)
        model = llm_model(getattr(context, "llm", None))
        try:
            request = self.model_request_for(context, model)
            answer = self._check(request)
            if answer.decision == "ask":
                answer = self._ask(context, request, answer)
        except Exception as exc:  # CrewAI would fail open on our exception: apply ours
            log.exception("ratewarden hook failed for model %s", model)
            answer = unreachable_answer(_unjudged(model), self.guard.fail, exc)
        if answer.allowed:
            if answer.holds:
                _MODEL_CALL.set(_ModelCall(answer.call_id))
            return None
        _block(refusal_message(answer, model))
        return None  # a CrewAI without HookAborted: the call runs (cannot be refused)

    def llm_call_finished(self, source: Any, event: Any) -> None:
        """CrewAI's LLMCallCompletedEvent or LLMCallFailedEvent: settle the checked call."""
        call = _MODEL_CALL.get()
        if call is None or not call.claim():  # not ours, or settled by an earlier event
            return
        try:
            self.guard.settle(call.call_id, event_settlement(event))
        finally:
            call.settled.set()

    def model_request_for(self, context: Any, model: str) -> CheckRequest:
        """The check of one model call."""
        inputs = kickoff_inputs(context)
        messages = getattr(context, "messages", None) or []
        limit = llm_max_tokens(getattr(context, "llm", None))
        return model_check_request(  # clamps past the wire's cap: reserved at the cap
            user=self.user_for(context, inputs),
            model=model,
            input_tokens=estimate_tokens(message_texts(messages)),
            max_output_tokens=limit,
            session=user_from(inputs, "session_id"),
            team=user_from(inputs, "team_id"),
            call_id=vocabulary.call_id(HOST),
        )

    # -- the parts --------------------------------------------------------------------

    def request_for(self, context: Any, tool: str) -> CheckRequest:
        """The check for one call (a name the API would refuse is mapped)."""
        inputs = kickoff_inputs(context)
        return check_request(
            user=self.user_for(context, inputs),
            tool=tool,
            session=user_from(inputs, "session_id"),
            team=user_from(inputs, "team_id"),
            call_id=vocabulary.call_id(HOST),
            args=getattr(context, "tool_input", None),
        )

    def user_for(self, context: Any, inputs: Mapping[str, Any]) -> str:
        """`user=` (a str, or the callable's answer), else inputs' `user_id`, else the default."""
        if isinstance(self._user, str):
            found: str | None = self._user
        elif self._user is not None:
            found = self._user(context)
        else:
            found = user_from(dict(inputs))
        return found or default_user()

    def _decide(self, context: Any, tool: str) -> CheckResponse:
        request = self.request_for(context, tool)
        answer = self._check(request)
        return self._ask(context, request, answer) if answer.decision == "ask" else answer

    def _check(self, request: CheckRequest) -> CheckResponse:
        try:
            return self.guard.check(request)
        except (ClientError, ValidationError) as exc:  # a bad token, a rejected request
            log.error("ratewarden refused the check of %s: %s", request.tool, exc)
            return unreachable_answer(request, self.guard.fail, exc)

    def _ask(self, context: Any, request: CheckRequest, answer: CheckResponse) -> CheckResponse:
        """`approve` decides an ask; approved, the call is checked again as approved."""
        reason = answer.message or vocabulary.ASK_REASON.format(tool=request.tool)
        approved = False
        if self._approve is not None:
            try:
                approved = bool(self._approve(context, reason))
            except Exception as exc:  # no terminal (EOF), or the approver failed: refuse
                log.warning("ratewarden approval of %s failed: %s", request.tool, exc)
        if not approved:
            return answer.model_copy(update={"message": reason})
        return self._check(request.model_copy(update={"approved": True}))

    def _remember(self, pending: _Pending) -> None:
        with self._lock:
            key = id(pending.args)
            self._pending.setdefault(key, []).append(pending)
            self._pending.move_to_end(key)
            while len(self._pending) > MAX_IN_FLIGHT:  # after hooks that never came
                self._pending.popitem(last=False)

    def _take(self, args: object) -> _Pending | None:
        with self._lock:
            waiting = self._pending.get(id(args))
            # The same object, not another that took a freed id: ours are still held.
            found = next((p for p in waiting or [] if p.args is args), None)
            if waiting is None or found is None:
                return None
            waiting.remove(found)
            if not waiting:
                del self._pending[id(args)]
            return found


# -- what CrewAI knows about the call ---------------------------------------------------


def kickoff_inputs(context: Any) -> Mapping[str, Any]:
    """The inputs the crew was kicked off with (`crew.kickoff(inputs=...)`), or {}."""
    inputs = getattr(getattr(context, "crew", None), "_inputs", None)
    return inputs if isinstance(inputs, Mapping) else {}


def llm_model(llm: Any) -> str:
    """The model a CrewAI LLM calls (its `model`; the LLM itself when given as a name)."""
    found = llm if isinstance(llm, str) else getattr(llm, "model", None)
    return found if isinstance(found, str) and found else "model"


def llm_max_tokens(llm: Any) -> int | None:
    """The most output tokens the LLM asks for (`max_completion_tokens` or `max_tokens`,
    as CrewAI reports them); None: the policy's default."""
    for name in ("max_completion_tokens", "max_output_tokens", "max_tokens"):
        found = getattr(llm, name, None)
        if isinstance(found, int) and not isinstance(found, bool) and found > 0:
            return found
    return None


def message_texts(messages: Any) -> list[str]:
    """The texts of chat messages: string contents, and the text parts of lists."""
    texts: list[str] = []
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(
                part["text"]
                for part in content
                if isinstance(part, Mapping) and isinstance(part.get("text"), str)
            )
    return texts


def event_settlement(event: Any) -> SettleRequest:
    """The settle of a finished model call: a failed one used nothing; a completed one
    its usage as CrewAI reads it (`UsageMetrics.from_provider_dict`: prompt tokens with
    the cached ones, whatever the provider's names); none reported: the reservation."""
    usage = getattr(event, "usage", None)
    if type(event).__name__ == "LLMCallFailedEvent":
        return FAILED
    if not isinstance(usage, Mapping) or not usage:
        return settlement(CallStatus.OK, None)
    from crewai.types.usage_metrics import UsageMetrics

    metrics = UsageMetrics.from_provider_dict(dict(usage))
    if metrics is None:
        return settlement(CallStatus.OK, None)
    counts = (
        metrics.prompt_tokens,
        metrics.completion_tokens,
        metrics.cached_prompt_tokens,
        metrics.cache_creation_tokens,
    )
    return usage_settlement(*(int(n) for n in counts))


def result_status(context: Any) -> CallStatus:
    """`blocked`, `error` or `ok`, from the after hook context's raw result."""
    raw = getattr(context, "raw_tool_result", None)
    if isinstance(raw, str) and raw.startswith(CREWAI_BLOCKED):
        return CallStatus.BLOCKED
    failed = isinstance(raw, BaseException) or type(raw).__name__ == "ToolFailure"
    failed = failed or (isinstance(raw, str) and raw.startswith(CREWAI_ERROR))
    return CallStatus.ERROR if failed else CallStatus.OK


def tool_result(context: Any) -> Any:
    """What the tool returned, as the model reads it (the after hook context's
    `tool_result`, else its raw result); what a settle digests for `send_result`."""
    found = getattr(context, "tool_result", None)
    return getattr(context, "raw_tool_result", None) if found is None else found


def refusal_message(answer: CheckResponse, tool: str) -> str:
    """What the model reads instead of the tool's result."""
    message = answer.message or vocabulary.REFUSED.format(tool=tool)
    return vocabulary.needs_approval(message) if answer.decision == "ask" else message


def console_approval(context: Any, reason: str) -> bool:
    """An `approve` for a crew run at a terminal: CrewAI's own prompt; `approve` runs it."""
    response = context.request_human_input(
        prompt=f"ratewarden: {reason}",
        default_message="Type 'approve' to run this tool call, anything else to refuse it:",
    )
    return str(response).strip().lower() in APPROVE_WORDS


def _unjudged(tool: str) -> CheckRequest:  # a model's name stands in for its tool
    return CheckRequest.model_construct(user="", tool=tool)


def _block(reason: str) -> bool:
    """Block the call: CrewAI's HookAborted (its reason reaches CrewAI's event listeners),
    or False for a CrewAI without it."""
    try:
        from crewai.hooks import HookAborted
    except ImportError:
        return False
    raise HookAborted(reason or vocabulary.BLOCKED, source="ratewarden")
