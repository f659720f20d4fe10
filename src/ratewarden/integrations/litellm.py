"""LiteLLM proxy: a custom callback that asks ratewarden before every model call the
proxy forwards and settles it with the provider's usage, so every application behind the
proxy spends the same budgets as the agents' tools.

    # config.yaml of `litellm --config config.yaml`
    litellm_settings:
      callbacks: ratewarden.integrations.litellm.proxy_handler

The daemon is RATEWARDEN_URL (and RATEWARDEN_TOKEN) of the proxy's environment. For other
settings, build a `RatewardenCallback(...)` in a module of your own beside config.yaml
and name it there (`callbacks: ratewarden_hook.handler`).

Who calls: the key the proxy authenticated (`user_api_key_dict`, LiteLLM's own check of
the `Authorization` header): its `user_id` (a virtual key's user, or what a
`custom_auth` function returned), else its `key_alias`, else the key itself (its hash,
as `key:<hash>`); its `team_id` is the call's team. The request body's `user` field is
the application's claim about its end user: it is honoured only for the keys named in
`end_user_keys` (by user id or alias), services that authenticated their users
themselves; any other key's `user` field is ignored.

Before the call (`async_pre_call_hook`) the check names the deployment's underlying model
(`gpt-4o` for `openai/gpt-4o`, or the deployment's `model_info.base_model`), the input
tokens (LiteLLM's `token_counter`, else estimated) and the request's `max_tokens` /
`max_completion_tokens` / `max_output_tokens`. A refused call never reaches the provider:
the hook raises `HTTPException(429, detail=<our message>)`, which the proxy answers as an
OpenAI error (`{"error": {"message": <our message>, "type": "rate_limit_error", "code":
"429"}}`, with `Retry-After` when the daemon gives one): an OpenAI client raises
`RateLimitError` whose `.message` holds the sentence. An allowed call is settled once,
with the usage the provider reported (`async_log_success_event`: `prompt_tokens`,
`completion_tokens`, `prompt_tokens_details.cached_tokens`, a stream's usage included),
or with zero usage when the proxy answers the client with the provider's error
(`async_post_call_failure_hook`, once the router gave up retrying; a client that went
away mid-stream is charged the whole reservation). The module imports without LiteLLM
(ratewarden never imports it); the callback needs it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from collections.abc import Collection, Mapping
from typing import Any

from ratewarden import vocabulary
from ratewarden.client import AsyncGuard
from ratewarden.integrations._async import LoopGuards
from ratewarden.integrations._model_calls import (
    FAILED,
    estimate_tokens,
    usage_settlement,
)
from ratewarden.vocabulary import MAX_TOKENS
from ratewarden.wire.bodies import CheckResponse
from ratewarden.wire.names import model_check_request, subject

try:
    from litellm.integrations.custom_logger import (  # type: ignore[import-not-found,unused-ignore]
        CustomLogger,
    )
except ImportError:  # the module imports without LiteLLM; the proxy loads it with it
    CustomLogger = object

log = logging.getLogger("ratewarden.integrations")

__all__ = ["RatewardenCallback", "proxy_handler"]
HOST = "litellm"  # leads the call id, before LiteLLM's own litellm_call_id
# Where the callback keeps its call id in the request's metadata: the proxy hands the same
# metadata to the success and failure events. Set by the pre-call hook on every guarded
# request (a client's own value is overwritten), so a client cannot name another call.
CALL_KEY = "ratewarden_call_id"
# The proxy's call types that ask a model for tokens (litellm.types.utils.CallTypes).
# Others (images, audio, files, MCP...) are not priced by tokens and go through unchecked.
GUARDED = frozenset(
    {
        "completion", "acompletion", "text_completion", "atext_completion",
        "responses", "aresponses", "anthropic_messages", "aanthropic_messages",
        "agenerate_content", "agenerate_content_stream",
        "embedding", "aembedding",
    }
)  # fmt: skip
NO_OUTPUT = frozenset({"embedding", "aembedding"})
# Allowed calls waiting for their settle, oldest first: a call whose event never comes
# (a proxy restarted mid-stream) is forgotten past this many, its reservation charged
# by the daemon's sweep at `reservation_ttl`.
MAX_PENDING = 10_000
# Prompts longer than this are estimated, not tokenized: counting a huge prompt would
# hold a thread for long, and the settle charges what the provider counted anyway.
MAX_COUNTED_CHARS = 2_000_000


class RatewardenCallback(CustomLogger):  # type: ignore[misc,valid-type,unused-ignore]
    """A LiteLLM proxy callback: a ratewarden check before each model call, a settle after.

    `guard`: an `AsyncGuard` (default: one per event loop from RATEWARDEN_URL and
    RATEWARDEN_TOKEN); `fail`: "open" (default) or "closed" when the daemon cannot be
    reached (only without `guard`); `end_user_keys`: the user ids or aliases of the keys
    whose requests' `user` field names the user (services that authenticate their own
    users); `count_tokens`: count input tokens with LiteLLM's `token_counter` (default)
    rather than estimate them.
    """

    def __init__(
        self,
        guard: AsyncGuard | None = None,
        *,
        fail: str | None = None,
        end_user_keys: Collection[str] = (),
        count_tokens: bool = True,
    ) -> None:
        if CustomLogger is not object:
            super().__init__()
        if isinstance(end_user_keys, str):
            raise TypeError("end_user_keys is a collection of key user ids or aliases")
        self._guards = LoopGuards(guard, fail)
        self._end_user_keys = frozenset(end_user_keys)
        self._count_tokens = count_tokens
        self._pending: OrderedDict[str, AsyncGuard] = OrderedDict()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The proxy calls a callback's pre-call hook only when its own class defines one
        # (`"async_pre_call_hook" in vars(cls)`, litellm.proxy.utils): a subclass that
        # overrides only other methods would be let through unchecked without this.
        super().__init_subclass__(**kwargs)
        if "async_pre_call_hook" not in vars(cls):
            cls.async_pre_call_hook = RatewardenCallback.async_pre_call_hook  # type: ignore[method-assign]

    # -- who and what -------------------------------------------------------------------

    def user_of(self, key: Any, data: Mapping[str, Any]) -> str:
        """The ratewarden user of a request made with the authenticated `key`."""
        user_id = _text(getattr(key, "user_id", None))
        alias = _text(getattr(key, "key_alias", None))
        if self._end_user_keys and ({user_id, alias} & self._end_user_keys):
            claimed = _text(data.get("user")) or _text(getattr(key, "end_user_id", None))
            if claimed:
                return subject(claimed)
        if user_id:
            return subject(user_id)
        if alias:
            return subject(alias)
        token = _text(getattr(key, "token", None)) or _text(getattr(key, "api_key", None))
        return subject(f"key:{token}" if token else "key:unknown")

    # -- LiteLLM's hooks (litellm.integrations.custom_logger.CustomLogger) ----------------

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: Any
    ) -> dict[str, Any]:
        if not isinstance(data, dict):
            return data
        metadata = _metadata(data)
        metadata.pop(CALL_KEY, None)  # never the client's, on any call
        kind = str(getattr(call_type, "value", call_type))
        if kind not in GUARDED:
            return data
        guard = self._guards.get()
        model = underlying_model(data.get("model"))
        call_id = vocabulary.call_id(HOST, data.get("litellm_call_id"))
        request = model_check_request(
            user=self.user_of(user_api_key_dict, data),
            model=model,
            input_tokens=await self._input_tokens(model, data),
            max_output_tokens=0 if kind in NO_OUTPUT else max_output_tokens(data),
            team=_subject_or_none(getattr(user_api_key_dict, "team_id", None)),
            call_id=call_id,
        )
        answer = await guard.check(request)
        if not answer.allowed:
            raise refusal(answer)
        if answer.holds or not answer.degraded:
            metadata[CALL_KEY] = call_id
            self._pending[call_id] = guard
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)
        return data

    async def async_log_success_event(
        self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        found = self._admitted(kwargs)
        if found is None:
            return
        call_id, guard = found
        usage = usage_of(response_obj) or usage_of(_get(kwargs, "complete_streaming_response"))
        if usage is None:  # no usage reported: charged its whole reservation
            await guard.settle(call_id)
            return
        await guard.settle(call_id, usage_settlement(*usage))

    async def async_post_call_failure_hook(
        self,
        request_data: dict[str, Any],
        original_exception: Exception,
        user_api_key_dict: Any,
        traceback_str: str | None = None,
    ) -> None:
        """The proxy answers the client with an error: the provider failed (after the
        router's retries), or the client went away mid-stream. Not `async_log_failure_event`:
        LiteLLM sends that for each failed attempt, before the router retries, and a call
        settled there would go uncharged when the retry succeeds."""
        found = self._admitted(request_data)
        if found is None:
            return
        call_id, guard = found
        if _get(_get(request_data, "metadata"), "client_disconnected"):
            # The provider may have billed what it streamed, which LiteLLM does not
            # report here: the call is charged its whole reservation.
            await guard.settle(call_id)
            return
        await guard.settle(call_id, FAILED)

    # -- helpers ----------------------------------------------------------------------------

    def _admitted(self, kwargs: Any) -> tuple[str, AsyncGuard] | None:
        """The call these event `kwargs` end, once: None when it was not ours or is settled."""
        params = _get(kwargs, "litellm_params")
        for where in ("metadata", "litellm_metadata"):
            metadata = _get(params, where) or _get(kwargs, where)
            call_id = _get(metadata, CALL_KEY)
            if isinstance(call_id, str):
                guard = self._pending.pop(call_id, None)
                if guard is not None:
                    return call_id, guard
        return None

    async def _input_tokens(self, model: str, data: Mapping[str, Any]) -> int:
        """Counted by LiteLLM's tokenizer when the text is short enough, else estimated;
        `model_check_request` bounds it to the wire."""
        texts = list(_texts(data))
        chars = sum(len(text) for text in texts)
        if self._count_tokens and chars <= MAX_COUNTED_CHARS:
            counted = await asyncio.to_thread(_token_count, model, data)
            if counted is not None:
                return counted
        return estimate_tokens(texts)


def refusal(answer: CheckResponse) -> Exception:
    """What the pre-call hook raises for a refused call: the proxy answers it as an OpenAI
    error with this status and our message (`proxy_exception_from_http_exception`)."""
    from fastapi import HTTPException  # type: ignore[import-not-found,unused-ignore]

    headers = {}
    if answer.retry_after is not None and answer.retry_after > 0:
        headers["Retry-After"] = str(max(1, round(answer.retry_after)))
    # A guard that failed closed (no daemon) is unavailable, not a limit the caller hit.
    status = 503 if answer.degraded else 429
    exception: Exception = HTTPException(
        status_code=status, detail=answer.message, headers=headers or None
    )
    return exception


def underlying_model(public: Any) -> str:
    """The model a proxy's model name routes to, as prices know it: the deployments'
    `model_info.base_model` or their `litellm_params.model` without its provider
    (`openai/gpt-4o` -> `gpt-4o`); the name itself when its deployments disagree or the
    proxy has no router."""
    name = _text(public) or "unknown"
    try:
        from litellm.proxy.proxy_server import (  # type: ignore[import-not-found,unused-ignore]
            llm_router,
        )
    except ImportError:
        return subject(name)
    found: set[str] = set()
    try:
        deployments = llm_router.get_model_list(model_name=name) if llm_router else None
    except Exception:  # a router that cannot list: the name itself
        deployments = None
    for deployment in deployments or []:
        info = _get(deployment, "model_info") or {}
        params = _get(deployment, "litellm_params") or {}
        model = _text(_get(info, "base_model")) or _without_provider(_get(params, "model"))
        if model:
            found.add(model)
    return subject(found.pop() if len(found) == 1 else name)


def max_output_tokens(data: Mapping[str, Any]) -> int | None:
    """The most output tokens the request allows (None: the policy's default), at most
    what the wire takes (a larger maximum is reserved at that, and so refused)."""
    config = data.get("config") or data.get("generationConfig")
    google = config if isinstance(config, Mapping) else {}
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens", "maxOutputTokens"):
        value = data.get(key, google.get(key))
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return min(value, MAX_TOKENS)
    return None


def usage_of(response: Any) -> tuple[int, int, int, int] | None:
    """(input, output, cache read, cache write) tokens of a response's usage, input
    counting the cached ones; None when it reports none."""
    usage = _get(response, "usage")
    if usage is None:  # Google's generateContent
        google = _get(response, "usageMetadata") or _get(response, "usage_metadata")
        return None if google is None else _google_usage(google)
    prompt = _input_tokens_of(usage)
    output = _first(usage, "completion_tokens", "output_tokens")
    if prompt is None and output is None:
        return None
    details = _get(usage, "prompt_tokens_details") or _get(usage, "input_tokens_details")
    cached = _first(details, "cached_tokens")
    if cached is None:
        cached = _first(usage, "cache_read_input_tokens")
    written = _first(usage, "cache_creation_input_tokens")
    if written is None:
        written = _first(details, "cache_write_tokens")
    return prompt or 0, output or 0, cached or 0, written or 0


def _input_tokens_of(usage: Any) -> int | None:
    """Every input token, cached ones included: OpenAI's `prompt_tokens`, the Responses
    API's `input_tokens`, or Anthropic's `input_tokens`, which leave out the cache reads
    and writes (Anthropic's usage has `cache_read_input_tokens` and no details)."""
    prompt = _first(usage, "prompt_tokens")
    if prompt is not None:
        return prompt
    prompt = _first(usage, "input_tokens")
    anthropic = _get(usage, "cache_read_input_tokens") is not None
    if prompt is None or not anthropic or _get(usage, "input_tokens_details") is not None:
        return prompt
    cache = (_first(usage, "cache_read_input_tokens") or 0) + (
        _first(usage, "cache_creation_input_tokens") or 0
    )
    return min(prompt + cache, MAX_TOKENS)


def _google_usage(google: Any) -> tuple[int, int, int, int]:
    output = (_first(google, "candidatesTokenCount") or 0) + (
        _first(google, "thoughtsTokenCount") or 0
    )
    return (
        _first(google, "promptTokenCount") or 0,
        min(output, MAX_TOKENS),
        _first(google, "cachedContentTokenCount") or 0,
        0,
    )


def _first(obj: Any, *keys: str) -> int | None:
    """The first of `keys` that `obj` holds as a count."""
    for key in keys:
        found = _count(_get(obj, key))
        if found is not None:
            return found
    return None


# The callback a config names: `callbacks: ratewarden.integrations.litellm.proxy_handler`.
proxy_handler = RatewardenCallback()


def _token_count(model: str, data: Mapping[str, Any]) -> int | None:
    try:
        import litellm  # type: ignore[import-not-found,unused-ignore]

        messages = data.get("messages")
        if isinstance(messages, list):
            counted = litellm.token_counter(model=model, messages=messages)
        else:
            counted = litellm.token_counter(model=model, text="\n".join(_texts(data)))
    except Exception:  # an odd message, an unknown tokenizer: the estimate
        log.debug("litellm token_counter failed for %s; estimating", model, exc_info=True)
        return None
    return counted if isinstance(counted, int) and counted >= 0 else None


def _texts(data: Mapping[str, Any]) -> list[str]:
    """The text a request sends: its messages' contents, prompt, input, instructions."""
    found: list[str] = []
    for key in ("messages", "prompt", "input", "instructions", "system", "tools", "contents"):
        _collect(data.get(key), found, depth=0)
    return found


def _collect(value: Any, found: list[str], depth: int) -> None:
    if depth > 8 or value is None:
        return
    if isinstance(value, str):
        found.append(value)
    elif isinstance(value, Mapping):
        for item in value.values():
            _collect(item, found, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            _collect(item, found, depth + 1)


def _metadata(data: dict[str, Any]) -> dict[str, Any]:
    """The request's metadata the proxy hands on to the events (`litellm_metadata` for
    the routes that use it, else `metadata`), made a dict when it is not one."""
    key = "litellm_metadata" if isinstance(data.get("litellm_metadata"), dict) else "metadata"
    metadata = data.get(key)
    if not isinstance(metadata, dict):
        metadata = data[key] = {}
    return metadata


def _without_provider(model: Any) -> str | None:
    name = _text(model)
    if name is None:
        return None
    provider, _, rest = name.partition("/")
    if not rest:
        return name
    try:
        import litellm

        known = provider in litellm.provider_list
    except Exception:  # pragma: no cover - LiteLLM always has its provider list
        known = True
    return rest if known else name


def _get(obj: Any, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return min(max(int(min(value, MAX_TOKENS)), 0), MAX_TOKENS)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    text = str(value).strip()
    return text or None


def _subject_or_none(value: Any) -> str | None:
    text = _text(value)
    return subject(text) if text else None
