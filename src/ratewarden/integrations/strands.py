"""Strands Agents: ask ratewarden before every tool call, settle the call after it ran.

    from strands import Agent
    from ratewarden.integrations.strands import RatewardenHook

    agent = Agent(model=..., tools=[...], hooks=[RatewardenHook()])
    agent("tidy my home directory", invocation_state={"user_id": "slack:U42"})

A refused call never runs: the hook sets `event.cancel_tool` to ratewarden's sentence,
which Strands hands to the model as the tool's error result. The user is
`invocation_state["user_id"]` (or the `user` callable's answer); `session_id` and
`team_id` there become the call's session and team; the tool use's `input` becomes its
`args` (sent whenever the daemon's policy reads them). The tool's metadata comes from its
spec's `annotations`, where Strands keeps an MCP tool's ToolAnnotations (`readOnlyHint`
and the rest), overridden by the `metadata` given to the hook. A call the daemon answered
with `send_result` (a loop rule keyed on results) is settled with the digest of the
tool's result: the `status` and `content` of Strands' ToolResult (not its toolUseId,
which differs on every call).

Model calls are asked too (issue 31; docs/budgets.md): before each model call
(`BeforeModelCallEvent`) the hook checks a model call (the model's `model_id`, Strands'
own `projected_input_tokens`, the `max_tokens` of the model's config), and a refusal sets
`event.cancel` to ratewarden's sentence, which Strands makes the model's answer: the
agent stops with that text as its reply (stop reason `end_turn`), nothing is sent to the
provider. After the call (`AfterModelCallEvent`) it settles with the usage Strands
attached to the message (`inputTokens`, `outputTokens`, `cacheReadInputTokens`,
`cacheWriteInputTokens`); a call that raised is settled as failed, using nothing.
`models=False` leaves model calls alone.

Strands runs a synchronous `agent(...)` on a fresh event loop each time, so the
callbacks are coroutines that run the thread-safe, blocking `Guard` in a worker thread:
parallel tool calls are checked in parallel and the loop never stalls on the daemon.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from ratewarden import vocabulary
from ratewarden.client import ClientError, Guard, unreachable_answer
from ratewarden.integrations._identity import resolve_user, user_from
from ratewarden.integrations._lifecycle import NO_RESULT, settlement
from ratewarden.integrations._model_calls import (
    FAILED,
    estimate_tokens,
    usage_settlement,
)
from ratewarden.vocabulary import CallStatus
from ratewarden.wire.bodies import CheckRequest, CheckResponse, SettleRequest, ToolMetadata
from ratewarden.wire.names import check_request, model_check_request

try:
    from strands.hooks import (
        AfterModelCallEvent,
        AfterToolCallEvent,
        BeforeModelCallEvent,
        BeforeToolCallEvent,
        HookProvider,
        HookRegistry,
    )
except ImportError:  # the module imports without strands; only Agent(hooks=...) needs it
    HookProvider = object  # type: ignore[misc,assignment,unused-ignore]

log = logging.getLogger("ratewarden.integrations.strands")

UserCallable = Callable[[dict[str, Any]], str | None]
ModelName = str | Callable[[Any], str | None]  # a name, or the agent's model -> its name

HOST = "strands"  # leads the call id when a tool use has no toolUseId


class RatewardenHook(HookProvider):  # type: ignore[misc,unused-ignore]
    """A Strands `HookProvider` that asks ratewarden before each tool call.

    `guard`: the `Guard` to ask (default: one reading RATEWARDEN_URL/RATEWARDEN_TOKEN,
    with `fail`, "open" unless told "closed", for when the daemon is unreachable).
    `user`: a callable taking the invocation state and returning the user id, in place
    of `invocation_state["user_id"]`. `metadata`: per tool name, metadata that wins over
    the tool's own annotations (ours or MCP's names, plus `tags`): annotations are hints
    from whoever serves the tool, and the operator may know better. `models`: whether
    model calls are checked and settled too (default True). `model`: the name the daemon
    prices a model call by, or a callable from the agent's model to it, in place of the
    model config's `model_id`.
    """

    def __init__(
        self,
        *,
        guard: Guard | None = None,
        user: UserCallable | None = None,
        fail: str | None = None,
        metadata: Mapping[str, Mapping[str, Any]] | None = None,
        models: bool = True,
        model: ModelName | None = None,
    ) -> None:
        if guard is not None and fail is not None:
            raise ValueError("pass fail= to the Guard you give, not to RatewardenHook")
        self.models = models
        self._model = model
        self.guard = guard if guard is not None else Guard(fail=fail or "open")
        self._user = user
        self._metadata = dict(metadata or {})
        # toolUseId -> (call_id, send_result) of allowed calls that hold a slot, a
        # reservation or a loop count; a list, because a model may repeat a toolUseId.
        # One hook may serve agents on several threads, hence the lock.
        self._held: dict[str, list[tuple[str, bool]]] = {}
        # id(agent) -> the call ids of its allowed model calls awaiting their after event
        # (an agent runs one model call at a time: more than one are leftovers).
        self._model_calls: dict[int, list[str]] = {}
        self._lock = threading.Lock()

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolCallEvent, self.before_tool_call)
        registry.add_callback(AfterToolCallEvent, self.after_tool_call)
        if self.models:
            registry.add_callback(BeforeModelCallEvent, self.before_model_call)
            registry.add_callback(AfterModelCallEvent, self.after_model_call)

    async def before_model_call(self, event: BeforeModelCallEvent) -> None:
        """Check the model call; refuse it through `cancel` unless ratewarden allows it."""
        with self._lock:  # an agent runs one model call at a time: any left never ran
            stale = self._model_calls.pop(id(event.agent), [])
        for call_id in stale:  # e.g. an interrupt raised by a later hook: no after event
            never_ran = usage_settlement(status=CallStatus.CANCELLED)
            await asyncio.to_thread(self.guard.settle, call_id, never_ran)
        if event.cancel:  # another hook already refused it: nothing to count
            return
        request = self.model_request_for(event)
        model = request.tool if request is not None else "model"
        answer = await asyncio.to_thread(self._decide, request, model)
        if answer.decision == "allow":
            if answer.holds:
                with self._lock:
                    self._model_calls.setdefault(id(event.agent), []).append(answer.call_id)
            return
        event.cancel = refusal_message(answer, model)

    async def after_model_call(self, event: AfterModelCallEvent) -> None:
        """Settle an allowed model call with the usage Strands attached to its message."""
        with self._lock:
            waiting = self._model_calls.get(id(event.agent))
            call_id = waiting.pop() if waiting else None
            if waiting == []:
                del self._model_calls[id(event.agent)]
        if call_id is None:  # refused by us, or it held nothing
            return
        await asyncio.to_thread(self.guard.settle, call_id, model_settlement(event))

    def model_request_for(self, event: Any) -> CheckRequest | None:
        """The check for a BeforeModelCallEvent; None if it cannot be expressed."""
        state = event.invocation_state
        agent = event.agent
        try:
            tokens = event.projected_input_tokens
            if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
                tokens = estimate_tokens(_texts(agent))
            limit = max_output_tokens(getattr(agent, "model", None))
            return model_check_request(  # clamps past the wire's cap: reserved at the cap
                user=resolve_user(state, self._user),
                model=self.model_name(getattr(agent, "model", None)),
                input_tokens=tokens,
                max_output_tokens=limit,
                session=user_from(state, "session_id"),
                team=user_from(state, "team_id"),
                call_id=vocabulary.call_id(HOST),
            )
        except (ValidationError, TypeError, ValueError) as exc:
            log.error("ratewarden cannot describe the model call: %s", exc)
            return None

    def model_name(self, model: Any) -> str:
        """`model=` (a name, or its answer), else the config's `model_id`, else the class."""
        if isinstance(self._model, str):
            return self._model
        found = self._model(model) if self._model is not None else _config(model).get("model_id")
        if isinstance(found, str) and found:
            return found
        return type(model).__name__

    async def before_tool_call(self, event: BeforeToolCallEvent) -> None:
        """Check the call; refuse it through `cancel_tool` unless ratewarden allows it."""
        if event.cancel_tool:  # another hook already refused it: nothing to count
            return
        tool_use = event.tool_use
        tool = str(tool_use.get("name", "tool"))
        answer = await asyncio.to_thread(self._decide, self.request_for(event), tool)
        if answer.decision == "allow":
            if answer.holds:
                with self._lock:
                    held = (answer.call_id, answer.send_result)
                    self._held.setdefault(_use_id(tool_use), []).append(held)
            return
        event.cancel_tool = refusal_message(answer, tool)

    async def after_tool_call(self, event: AfterToolCallEvent) -> None:
        """Settle an allowed call that holds something, with its duration and status."""
        held = self._take(_use_id(event.tool_use))
        if held is None:  # refused, or it held nothing: nothing to settle
            return
        call_id, send_result = held
        duration = event.duration  # Strands' own measure, in seconds
        status = _status(event)
        result = tool_result(event) if send_result and status != CallStatus.CANCELLED else NO_RESULT
        settle = settlement(status, None if duration is None else duration * 1000, result)
        await asyncio.to_thread(self.guard.settle, call_id, settle)

    def request_for(self, event: Any) -> CheckRequest | None:
        """The check for a BeforeToolCallEvent (a name the API would refuse is mapped);
        None if it cannot be expressed."""
        state = event.invocation_state
        tool_use = event.tool_use
        try:
            return check_request(
                user=resolve_user(state, self._user),
                tool=str(tool_use["name"]),
                session=user_from(state, "session_id"),
                team=user_from(state, "team_id"),
                # the toolUseId and a fresh suffix: Strands checks again when a hook
                # retries a tool, and some model servers reuse `call_0` on every turn
                call_id=vocabulary.call_id(HOST, tool_use.get("toolUseId")),
                metadata=self.metadata_for(event.selected_tool, tool_use["name"]),
                args=tool_use.get("input"),
            )
        except (ValidationError, KeyError) as exc:
            log.error("ratewarden cannot describe the %s call: %s", tool_use.get("name"), exc)
            return None

    def metadata_for(self, tool: Any, name: str) -> ToolMetadata | None:
        """The tool's annotations, then the operator's metadata for `name`, as ours."""
        found = _flags(_annotations(tool))
        found.update(_flags(self._metadata.get(name, {})))
        return ToolMetadata(**found) if found else None

    def _decide(self, request: CheckRequest | None, tool: str) -> CheckResponse:
        """The guard's answer; a call the daemon cannot judge is answered by the fail mode."""
        if request is None:  # e.g. a user id past the API's limits
            unjudged = CheckRequest.model_construct(user="", tool=tool)
            return unreachable_answer(unjudged, self.guard.fail, ValueError("invalid call"))
        try:
            return self.guard.check(request)
        except (ClientError, ValidationError) as exc:  # a bad token, a rejected request
            log.error("ratewarden refused the check of %s: %s", request.tool, exc)
            return unreachable_answer(request, self.guard.fail, exc)

    def _take(self, use_id: str) -> tuple[str, bool] | None:
        with self._lock:
            held = self._held.get(use_id)
            if not held:
                return None
            found = held.pop(0)
            if not held:
                del self._held[use_id]
            return found


def refusal_message(answer: CheckResponse, tool: str) -> str:
    """What the model reads instead of the tool's result."""
    message = answer.message or vocabulary.REFUSED.format(tool=tool)
    return vocabulary.needs_approval(message) if answer.decision == "ask" else message


def model_settlement(event: Any) -> SettleRequest:
    """What an AfterModelCallEvent used, from the usage Strands attached to its message:
    `inputTokens` holds the cached tokens too unless the totals say otherwise (Strands'
    own reading, `telemetry.metrics._total_prompt_tokens`: Bedrock reports them apart)."""
    if event.exception is not None:  # the provider raised: nothing used
        return FAILED
    response = event.stop_response
    message = getattr(response, "message", None)
    metadata = message.get("metadata") if isinstance(message, Mapping) else None
    usage = metadata.get("usage") if isinstance(metadata, Mapping) else None
    if not isinstance(usage, Mapping):  # cancelled by a later hook: never sent
        return usage_settlement(status=CallStatus.CANCELLED)
    read, write = _count(usage, "cacheReadInputTokens"), _count(usage, "cacheWriteInputTokens")
    given, output = _count(usage, "inputTokens"), _count(usage, "outputTokens")
    total = usage.get("totalTokens")
    folded = not isinstance(total, int) or given + output == total
    return usage_settlement(given if folded else given + read + write, output, read, write)


def max_output_tokens(model: Any) -> int | None:
    """The most output tokens the model's config allows (`max_tokens`, or in `params`
    `max_tokens`, `max_completion_tokens` or `max_output_tokens`); None: the policy's."""
    config = _config(model)
    params = config.get("params")
    sources = [config, params if isinstance(params, Mapping) else {}]
    for source in sources:
        for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            found = source.get(key)
            if isinstance(found, int) and not isinstance(found, bool) and found > 0:
                return found
    return None


def _config(model: Any) -> Mapping[str, Any]:
    try:
        config = model.get_config() if model is not None else None
    except Exception:  # a model without a readable config: named by its class
        return {}
    return config if isinstance(config, Mapping) else {}


def _count(usage: Mapping[str, Any], key: str) -> int:
    """A token count of Strands' usage: a positive int, else 0 (`usage_settlement` bounds
    it to the wire)."""
    found = usage.get(key)
    if isinstance(found, int) and not isinstance(found, bool) and found > 0:
        return found
    return 0


def _texts(agent: Any) -> list[str]:
    """The text the model would be sent: the system prompt and every message's text."""
    texts = [getattr(agent, "system_prompt", None) or ""]
    for message in getattr(agent, "messages", None) or []:
        for block in message.get("content", []) if isinstance(message, Mapping) else []:
            text = block.get("text") if isinstance(block, Mapping) else None
            texts.append(text if isinstance(text, str) else json.dumps(block, default=str))
    return [t if isinstance(t, str) else "" for t in texts]


def _use_id(tool_use: Mapping[str, Any]) -> str:
    return str(tool_use.get("toolUseId") or "")


def _annotations(tool: Any) -> Mapping[str, Any]:
    """`tool_spec["annotations"]`: MCP ToolAnnotations for an MCPAgentTool, else the spec's."""
    spec = getattr(tool, "tool_spec", None) if tool is not None else None
    found = spec.get("annotations") if isinstance(spec, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _flags(source: Mapping[str, Any]) -> dict[str, Any]:
    """Boolean hints under our names or MCP's, and valid tags; anything else is ignored."""
    found: dict[str, Any] = vocabulary.hint_flags(source)
    tags = source.get("tags")
    if isinstance(tags, list | tuple):
        found["tags"] = [t for t in tags if _valid_tag(t)][: vocabulary.MAX_TAGS]
    return found


def _valid_tag(tag: object) -> bool:
    return isinstance(tag, str) and 0 < len(tag) <= vocabulary.MAX_TAG


def tool_result(event: Any) -> Any:
    """What a settle digests of an AfterToolCallEvent's result: a ToolResult's `status`
    and `content` (its toolUseId names the call, not what it returned); else the result
    itself; no result when the tool raised."""
    result = event.result
    if event.exception is not None or result is None:
        return NO_RESULT
    if isinstance(result, Mapping):
        return {"status": result.get("status"), "content": result.get("content")}
    return result


def _status(event: Any) -> CallStatus:
    if event.cancel_message is not None:  # allowed by us, cancelled by a later hook
        return CallStatus.CANCELLED
    result = event.result if isinstance(event.result, Mapping) else {}
    failed = event.exception is not None or result.get("status") == "error"  # Strands' own
    return CallStatus.ERROR if failed else CallStatus.OK
