"""hermes-agent: ask ratewarden before every tool call, settle the call after it ran.

Installed into hermes' environment (`pip install './ratewarden[hermes]'` from a clone:
docs/install.md), this module is the plugin `ratewarden` of the entry-point group
`hermes_agent.plugins`; hermes loads it once it is enabled in `$HERMES_HOME/config.yaml`:

    plugins:
      enabled: [ratewarden]

`register(ctx)` adds a `pre_tool_call` and a `post_tool_call` hook. A refused call
never runs: the hook returns `{"action": "block", "message": <ratewarden's sentence>}`
and hermes hands the model the tool result `{"error": "<that sentence>"}`.

The user is the gateway session's platform-qualified user id (`discord:1234`, from
`gateway.session_context`), else RATEWARDEN_USER, else the OS login name; the session is
hermes' session id; the call's `args` go along whenever the daemon's policy reads them.
RATEWARDEN_URL and RATEWARDEN_TOKEN say where the daemon is, and RATEWARDEN_FAIL
(`open`, the default, or `closed`) what to do when it cannot be asked.

An `ask` decision goes to hermes' own human-approval gate (the one its dangerous-command
prompt and plugin `approve` directives use: the CLI prompt, the gateway's approval
buttons; refused when no human can answer). An approved call is checked again with
`approved: true`, so it is counted and audited as approved before it runs.

hermes may run hooks on worker threads, for parallel tool calls: one plugin instance
holds one thread-safe `Guard`, and its table of calls in flight is behind a lock.

A call the daemon answered with `send_result` (a loop rule keyed on results) is settled
with the digest of `post_tool_call`'s `result`, the text the model reads.

Model calls (issue 31; docs/budgets.md): hermes 0.19's `pre_llm_call` and
`post_llm_call` hooks run once per turn and cannot veto, so the plugin registers an
`llm_execution` middleware (`hermes_cli/middleware.py`), which wraps each provider
request of the agent loop: it checks the model call (the request's `model`, its
messages' estimated tokens, its `max_tokens`), calls the provider only when allowed,
and settles with the response's `usage` (chat completions', Anthropic's or the Responses
API's names). A refused call never reaches the provider: the middleware returns a
response whose text is ratewarden's sentence (in the chat completions shape, or
Anthropic's for `api_mode: anthropic_messages`), which hermes takes as the model's
final answer of the turn. A hermes without middleware (older than 0.19) is left alone.
"""

from __future__ import annotations

import importlib
import logging
import os
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ratewarden import vocabulary
from ratewarden.client import ClientError, Guard, unreachable_answer
from ratewarden.integrations._identity import default_user
from ratewarden.integrations._lifecycle import NO_RESULT, settlement
from ratewarden.integrations._model_calls import (
    FAILED,
    estimate_tokens,
    usage_settlement,
)
from ratewarden.vocabulary import CallStatus
from ratewarden.wire.bodies import CheckRequest, CheckResponse, SettleRequest, ToolMetadata
from ratewarden.wire.names import check_request, model_check_request

log = logging.getLogger("ratewarden.integrations.hermes")

PLUGIN_NAME = "ratewarden"
HOST = "hermes"  # whose names its tools are; leads the call id when hermes gives none
MAX_IN_FLIGHT = 10_000  # calls remembered for settling; older ones expire in the daemon
Directive = dict[str, str]
_Held = tuple[str, bool]  # an allowed call's id, and whether to settle it with a digest
UserCallable = Callable[[Mapping[str, Any]], str | None]


class RatewardenPlugin:
    """The two hooks, around one `Guard`.

    `guard`: the `Guard` to ask (default: one reading RATEWARDEN_URL and
    RATEWARDEN_TOKEN, failing by `fail`, else RATEWARDEN_FAIL, else "open").
    `user`: a callable taking the hook's keyword arguments and returning the user id,
    in place of the gateway session's; None or "" falls back to the default user.
    """

    def __init__(
        self,
        *,
        guard: Guard | None = None,
        user: UserCallable | None = None,
        fail: str | None = None,
        models: bool = True,
    ) -> None:
        if guard is not None and fail is not None:
            raise ValueError("pass fail= to the Guard you give, not to RatewardenPlugin")
        self.models = models
        self.guard = guard if guard is not None else Guard(fail=fail or fail_from_environment())
        self._user = user
        self._lock = threading.Lock()
        # (session, tool, tool_call_id or thread) -> (call_id, send_result) of allowed
        # calls, until settled; a list, because a model may repeat a tool_call_id within
        # one batch.
        self._in_flight: OrderedDict[tuple[str, str, str], list[_Held]] = OrderedDict()

    def register(self, ctx: Any) -> None:
        """Add both hooks to hermes' plugin context (once per plugin manager)."""
        if _already_registered(ctx):
            log.warning("ratewarden is already registered with hermes; not adding it twice")
            return
        ctx.register_hook("pre_tool_call", self.pre_tool_call)
        ctx.register_hook("post_tool_call", self.post_tool_call)
        if self.models and hasattr(ctx, "register_middleware"):  # hermes >= 0.19
            ctx.register_middleware("llm_execution", self.llm_execution)

    def llm_execution(self, *, request: Any, next_call: Callable[..., Any], **context: Any) -> Any:
        """hermes' `llm_execution` middleware: check the model call, call the provider if
        allowed, settle with its usage; refused, answer with ratewarden's sentence."""
        model = str(context.get("model") or _get(request, "model") or "model")
        try:
            check = self.model_request_for(model, request, context)
            answer = self._check(check)
        except Exception as exc:  # hermes would run the call on our exception: apply ours
            log.exception("ratewarden middleware failed for model %s", model)
            answer = self._fail_answer(CheckRequest.model_construct(user="", tool=model), exc)
        if not answer.allowed:
            message = answer.message or vocabulary.REFUSED.format(tool=model)
            if answer.decision == "ask":
                message = vocabulary.needs_approval(message)
            return refused_response(message, model, str(context.get("api_mode") or ""))
        if not answer.holds:
            return next_call(request)
        try:
            response = next_call(request)
        except BaseException:  # the provider failed: nothing used (hermes re-raises)
            self.guard.settle(answer.call_id, FAILED)
            raise
        self.guard.settle(answer.call_id, response_settlement(response))
        return response

    def model_request_for(
        self, model: str, request: Any, context: Mapping[str, Any]
    ) -> CheckRequest:
        """The check of one provider request (hermes' api_kwargs)."""
        user = (self._user(dict(context)) if self._user is not None else None) or session_user()
        limit = next(
            (
                _tokens(_get(request, key))
                for key in ("max_tokens", "max_completion_tokens", "max_output_tokens")
                if _tokens(_get(request, key))
            ),
            None,
        )
        texts = _texts(_get(request, "messages") or _get(request, "input"))
        system = _get(request, "system")
        texts.extend(_texts(system) if isinstance(system, list) else [str(system or "")])
        return model_check_request(
            user=user,
            model=model,
            input_tokens=estimate_tokens(texts),
            max_output_tokens=limit,
            session=str(context.get("session_id") or "") or None,
            call_id=vocabulary.call_id(HOST, context.get("api_request_id")),
        )

    # -- the hooks --------------------------------------------------------------------

    def pre_tool_call(self, **kwargs: Any) -> Directive | None:
        """None lets the call run; a block directive refuses it with ratewarden's reason."""
        tool = str(kwargs.get("tool_name") or "tool")
        try:
            return self._pre_tool_call(tool, kwargs)
        except Exception as exc:  # hermes would fail open on our exception: apply ours
            log.exception("ratewarden hook failed for %s", tool)
            answer = self._fail_answer(CheckRequest.model_construct(user="", tool=tool), exc)
            return None if answer.allowed else _block(answer.message)

    def post_tool_call(self, **kwargs: Any) -> None:
        """Settle an allowed call with its status and duration (a refused one holds nothing)."""
        held = self._take(_call_key(kwargs))
        if held is None:  # refused by us, unjudged, or answered by the fail mode
            return
        call_id, send_result = held
        # `blocked`: allowed by us, then refused by another plugin or hermes' guardrails;
        # it never ran, so `settlement` releases what it holds and charges nothing.
        status = str(kwargs.get("status") or CallStatus.OK)[:32]
        # hermes' `result` is the text the model reads; its digest goes when asked for.
        result = kwargs.get("result", NO_RESULT) if send_result else NO_RESULT
        self.guard.settle(call_id, settlement(status, _duration(kwargs), result))

    # -- the parts --------------------------------------------------------------------

    def _pre_tool_call(self, tool: str, kwargs: Mapping[str, Any]) -> Directive | None:
        request = self.request_for(tool, kwargs)
        answer = self._check(request)
        if answer.decision == "ask":
            answer = self._ask_human(request, answer)
        if not answer.allowed:
            return _block(answer.message or vocabulary.REFUSED.format(tool=tool))
        if answer.holds or not answer.degraded:  # a fail-open one holds only what it lists
            call_id = answer.call_id or request.call_id or ""
            self._remember(_call_key(kwargs), (call_id, answer.send_result))
        return None

    def request_for(self, tool: str, kwargs: Mapping[str, Any]) -> CheckRequest:
        """The check for one hook invocation (a name the API would refuse is mapped)."""
        user = (self._user(kwargs) if self._user is not None else None) or session_user()
        return check_request(
            user=user,
            tool=tool,
            session=str(kwargs.get("session_id") or "") or None,
            # hermes' tool_call_id and a fresh suffix: some model servers reuse `call_0`
            call_id=vocabulary.call_id(HOST, kwargs.get("tool_call_id")),
            metadata=tool_metadata(tool),
            args=kwargs.get("args"),  # the model's arguments, as hermes parsed them
            host=HOST,  # the daemon maps hermes' own names (`patch` is edit_file)
        )

    def _check(self, request: CheckRequest) -> CheckResponse:
        try:
            return self.guard.check(request)
        except (ClientError, ValidationError) as exc:  # a bad token, a rejected request
            log.error("ratewarden refused the check of %s: %s", request.tool, exc)
            return self._fail_answer(request, exc)

    def _fail_answer(self, request: CheckRequest, error: Exception) -> CheckResponse:
        return unreachable_answer(request, self.guard.fail, error)

    def _ask_human(self, request: CheckRequest, answer: CheckResponse) -> CheckResponse:
        """hermes' approval gate for an `ask`; approved, the call is checked as approved."""
        reason = answer.message or vocabulary.ASK_REASON.format(tool=request.tool)
        rules = sorted({violation.rule for violation in answer.violations})
        try:
            # hermes' top-level `tools` package (imported by name: not a typed dependency)
            request_tool_approval = importlib.import_module("tools.approval").request_tool_approval
            verdict = request_tool_approval(
                request.tool, reason, rule_key=f"{PLUGIN_NAME}:{','.join(rules)}"
            )
        except Exception as exc:  # no gate (another hermes), or the gate failed: refuse
            log.warning("hermes approval gate unavailable for %s: %s", request.tool, exc)
            return answer
        if not isinstance(verdict, Mapping) or not verdict.get("approved"):
            message = verdict.get("message") if isinstance(verdict, Mapping) else None
            return answer.model_copy(update={"message": str(message or reason)})
        return self._check(request.model_copy(update={"approved": True}))

    def _remember(self, key: tuple[str, str, str], held: _Held) -> None:
        with self._lock:
            self._in_flight.setdefault(key, []).append(held)
            self._in_flight.move_to_end(key)
            while len(self._in_flight) > MAX_IN_FLIGHT:  # posts that never came
                self._in_flight.popitem(last=False)

    def _take(self, key: tuple[str, str, str]) -> _Held | None:
        with self._lock:
            held = self._in_flight.get(key)
            if not held:
                return None
            found = held.pop(0)
            if not held:
                del self._in_flight[key]
            return found


# -- what hermes knows about the call ---------------------------------------------------


def session_user() -> str:
    """The gateway session's user as `platform:user_id`, else the default user."""
    try:
        from gateway.session_context import get_session_env
    except ImportError:
        return default_user()
    user_id = str(get_session_env("HERMES_SESSION_USER_ID", "") or "")
    if not user_id:
        return default_user()
    platform = str(get_session_env("HERMES_SESSION_PLATFORM", "") or "")
    return f"{platform}:{user_id}" if platform else user_id


def tool_metadata(tool: str) -> ToolMetadata | None:
    """hermes' registry says nothing about read-only or destructive; only the toolset.

    The toolset becomes the tag `toolset:<name>` (rules can match `tags:
    ["toolset:mcp-github"]`); the booleans stay unset, so the tool is unclassified.
    """
    try:
        entry = importlib.import_module("tools.registry").registry.get_entry(tool)
    except Exception:
        return None
    toolset = getattr(entry, "toolset", None)
    if not isinstance(toolset, str) or not toolset:
        return None
    tag = f"toolset:{toolset}"
    return ToolMetadata(tags=[tag]) if len(tag) <= 64 else None


def _call_key(kwargs: Mapping[str, Any]) -> tuple[str, str, str]:
    """Pairs a post_tool_call with its pre_tool_call.

    hermes passes the model's tool_call_id to both; without one, both hooks of a call
    run on the same thread (hermes' dispatch calls them in one function).
    """
    call = str(kwargs.get("tool_call_id") or "") or f"thread-{threading.get_ident()}"
    return (str(kwargs.get("session_id") or ""), str(kwargs.get("tool_name") or ""), call)


def _duration(kwargs: Mapping[str, Any]) -> float | None:
    value = kwargs.get("duration_ms")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value < float("inf") else None


def _block(message: str) -> Directive:
    return {"action": "block", "message": message}


def fail_from_environment() -> str:
    """RATEWARDEN_FAIL: `open` (default) or `closed`; anything else is taken as closed."""
    return vocabulary.ClientSettings.read().fail


def _already_registered(ctx: Any) -> bool:
    """True if a RatewardenPlugin's hook is already in this plugin manager.

    hermes keeps one plugin per name (the pip entry point wins over a directory plugin
    also called `ratewarden`), but a copy under another name would check every call
    twice, counting it twice. A forced rediscovery clears the hooks first, so this
    never stops a legitimate reload.
    """
    hooks = getattr(getattr(ctx, "_manager", None), "_hooks", None)
    if not isinstance(hooks, dict):
        return False
    registered = hooks.get("pre_tool_call") or []
    return any(isinstance(getattr(cb, "__self__", None), RatewardenPlugin) for cb in registered)


# -- model calls ------------------------------------------------------------------------


def _get(found: Any, key: str) -> Any:
    """`found[key]` or `found.key`: hermes' requests are dicts, SDK responses objects."""
    if isinstance(found, Mapping):
        return found.get(key)
    return getattr(found, key, None)


def _tokens(value: Any) -> int:
    """A token count: a positive int, else 0 (`usage_settlement` bounds it to the wire)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return 0


def _texts(messages: Any) -> list[str]:
    """The texts of chat messages (string contents, and the text of content parts)."""
    texts: list[str] = []
    for message in messages if isinstance(messages, list) else []:
        content = _get(message, "content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(t for t in (_get(p, "text") for p in content) if isinstance(t, str))
        elif isinstance(_get(message, "text"), str):
            texts.append(_get(message, "text"))
    return texts


def response_settlement(response: Any) -> SettleRequest:
    """The settle of a provider response by its `usage`: chat completions'
    (`prompt_tokens` with the cached ones, `prompt_tokens_details.cached_tokens`),
    Anthropic's (`input_tokens` without the cache reads and writes, which are added) or
    the Responses API's (`input_tokens`, `input_tokens_details.cached_tokens`). No usage:
    charged its reservation."""
    usage = _get(response, "usage")
    if usage is None:
        return settlement(CallStatus.OK, None)
    if _get(usage, "prompt_tokens") is not None:  # chat completions
        details = _get(usage, "prompt_tokens_details")
        return usage_settlement(
            _tokens(_get(usage, "prompt_tokens")),
            _tokens(_get(usage, "completion_tokens")),
            _tokens(_get(details, "cached_tokens")),
            _tokens(_get(details, "cache_write_tokens")),
        )
    read = _tokens(_get(usage, "cache_read_input_tokens"))
    write = _tokens(_get(usage, "cache_creation_input_tokens"))
    if read or write or _get(usage, "cache_read_input_tokens") is not None:  # Anthropic
        given = _tokens(_get(usage, "input_tokens")) + read + write
        output = _tokens(_get(usage, "output_tokens"))
        return usage_settlement(given, output, read, write)
    details = _get(usage, "input_tokens_details")  # the Responses API
    return usage_settlement(
        _tokens(_get(usage, "input_tokens")),
        _tokens(_get(usage, "output_tokens")),
        _tokens(_get(details, "cached_tokens")),
    )


def refused_response(message: str, model: str, api_mode: str) -> Any:
    """A provider response whose answer is `message`, in the shape hermes' loop reads for
    `api_mode` (its chat completions stream result, or an Anthropic message)."""
    from types import SimpleNamespace

    if api_mode == "anthropic_messages":
        text = SimpleNamespace(type="text", text=message)
        return SimpleNamespace(
            id=f"ratewarden-{vocabulary.call_id(HOST)}",
            type="message",
            role="assistant",
            model=model,
            content=[text],
            stop_reason="end_turn",
            stop_sequence=None,
            usage=None,
        )
    reply = SimpleNamespace(
        role="assistant", content=message, tool_calls=None, reasoning_content=None
    )
    choice = SimpleNamespace(index=0, message=reply, finish_reason="stop")
    return SimpleNamespace(
        id=f"ratewarden-{vocabulary.call_id(HOST)}", model=model, choices=[choice], usage=None
    )


# -- the entry point and the directory plugin -------------------------------------------


def register(ctx: Any) -> None:
    """hermes' entry point: one plugin, configured from the environment."""
    RatewardenPlugin().register(ctx)


PLUGIN_FILES = ("plugin.yaml", "__init__.py")


def plugin_directory() -> Path:
    """The packaged directory plugin (plugin.yaml and __init__.py)."""
    return Path(__file__).resolve().parent / "hermes_plugin"


def install_directory_plugin(hermes_home: Path | str | None = None) -> Path:
    """Copy the directory plugin to `<hermes_home>/plugins/ratewarden/`; return that path.

    `hermes_home` defaults to $HERMES_HOME, else ~/.hermes. The plugin still imports
    ratewarden, which must be installed in hermes' environment; it is still loaded only
    once `ratewarden` is listed under `plugins: enabled:` in config.yaml.
    """
    home = Path(hermes_home or os.environ.get("HERMES_HOME") or Path.home() / ".hermes")
    target = home.expanduser() / "plugins" / PLUGIN_NAME
    target.mkdir(parents=True, exist_ok=True)
    for name in PLUGIN_FILES:
        shutil.copyfile(plugin_directory() / name, target / name)
    return target
