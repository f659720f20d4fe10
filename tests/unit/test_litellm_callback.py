"""The LiteLLM proxy callback (ratewarden.integrations.litellm) driven as the proxy calls
it, LiteLLM stood in (it is not installed in this venv; tests/hosts/test_models_litellm.py
runs the real proxy): who the user is, what the check says, that a refusal is the HTTP
error the proxy turns into the client's, and that each allowed call is settled once with
the usage the provider reported.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import HTTPException

from ratewarden.client import AsyncGuard
from ratewarden.integrations.litellm import (
    CALL_KEY,
    RatewardenCallback,
    max_output_tokens,
    usage_of,
)
from ratewarden.vocabulary import MAX_TOKENS
from ratewarden.wire.bodies import CheckResponse
from ratewarden.wire.names import MAX_SUBJECT

URL = "http://daemon.test"
BUDGET = {"rule": "daily-spend", "kind": "budget", "limit": 1.0, "remaining": 0.5,
          "reset_after": 3600.0}  # fmt: skip
REFUSAL = "Budget exceeded for model calls: 1.00 spent of 1.00 USD this day (retry in 6h12m)"


@dataclass
class FakeDaemon:
    allow: bool = True
    checks: list[dict[str, Any]] = field(default_factory=list)
    settles: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/check":
            body = json.loads(request.content)
            self.checks.append(body)
            answer = CheckResponse(
                decision="allow" if self.allow else "deny",
                allowed=self.allow,
                message="" if self.allow else REFUSAL,
                call_id=body["call_id"],
                retry_after=None if self.allow else 22320.0,
                limits=[BUDGET],
            )
            return httpx.Response(200, json=answer.model_dump(mode="json"))
        if path.startswith("/v1/calls/") and path.endswith("/settle"):
            call_id = path.removeprefix("/v1/calls/").removesuffix("/settle")
            self.settles.append((call_id, json.loads(request.content or b"{}")))
            return httpx.Response(200, json={"call_id": call_id, "outcome": "settled"})
        return httpx.Response(404, json={"error": "not_found", "message": path, "fields": []})

    def callback(self, **options: Any) -> RatewardenCallback:
        guard = AsyncGuard(URL, transport=httpx.MockTransport(self.handle))
        return RatewardenCallback(guard, **options)


def key(**fields: Any) -> SimpleNamespace:
    base = {"user_id": None, "key_alias": None, "team_id": None, "token": "hashed-1234",
            "end_user_id": None}  # fmt: skip
    return SimpleNamespace(**{**base, **fields})


def request(**fields: Any) -> dict[str, Any]:
    return {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "x" * 400}],
        "max_tokens": 300,
        "litellm_call_id": "1f0c-aa",
        "metadata": {},
        **fields,
    }


def pre_call(callback: RatewardenCallback, auth: Any, data: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = asyncio.run(
        callback.async_pre_call_hook(auth, None, data, "acompletion")
    )
    return answer


def openai_usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {"usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "prompt_tokens_details": {"cached_tokens": cached}}}  # fmt: skip


def event_kwargs(data: dict[str, Any]) -> dict[str, Any]:
    """The kwargs LiteLLM hands its events: the request's metadata under litellm_params."""
    return {
        "litellm_call_id": data.get("litellm_call_id"),
        "litellm_params": {"metadata": data["metadata"]},
    }


def test_the_check_names_the_model_its_tokens_and_the_key_user() -> None:
    daemon = FakeDaemon()
    data = pre_call(daemon.callback(), key(user_id="alice", team_id="red"), request())
    [check] = daemon.checks
    assert check["kind"] == "model"
    assert check["model"] == "gpt-4o"
    assert check["user"] == "alice"
    assert check["team"] == "red"
    assert check["input_tokens"] == 101  # "user" and 400 characters, estimated (no LiteLLM)
    assert check["max_output_tokens"] == 300
    # The call id is led by LiteLLM's own, with random digits: a client that repeats its
    # x-litellm-call-id cannot make the daemon replay an earlier allowed call.
    assert check["call_id"].startswith("1f0c-aa~")
    assert data["metadata"][CALL_KEY] == check["call_id"]


def test_a_refusal_is_an_http_429_carrying_our_sentence() -> None:
    daemon = FakeDaemon(allow=False)
    data = request()
    with pytest.raises(HTTPException) as raised:
        pre_call(daemon.callback(), key(user_id="alice"), data)
    assert raised.value.status_code == 429
    assert raised.value.detail == REFUSAL
    assert raised.value.headers == {"Retry-After": "22320"}
    assert CALL_KEY not in data["metadata"]  # nothing to settle
    failed = daemon.callback().async_post_call_failure_hook(data, RuntimeError("429"), None)
    asyncio.run(failed)
    assert daemon.settles == []


def test_the_success_event_settles_the_usage_once() -> None:
    daemon = FakeDaemon()
    callback = daemon.callback()
    data = pre_call(callback, key(user_id="alice"), request())
    response = openai_usage(12_345, 6_789, 2_345)
    for _ in range(2):  # a repeated event settles nothing more
        asyncio.run(callback.async_log_success_event(event_kwargs(data), response, 0, 0))
    [(call_id, body)] = daemon.settles
    assert call_id == data["metadata"][CALL_KEY]
    assert body["status"] == "ok"
    assert body["usage"] == {"input_tokens": 12_345, "output_tokens": 6_789,
                             "cache_read_tokens": 2_345, "cache_write_tokens": 0}  # fmt: skip


def test_a_streamed_answer_is_settled_from_the_complete_response() -> None:
    daemon = FakeDaemon()
    callback = daemon.callback()
    data = pre_call(callback, key(user_id="alice"), request(stream=True))
    kwargs = {**event_kwargs(data), "complete_streaming_response": openai_usage(10, 5, 0)}
    asyncio.run(callback.async_log_success_event(kwargs, None, 0, 0))
    [(_, body)] = daemon.settles
    assert body["usage"]["input_tokens"] == 10
    assert body["usage"]["output_tokens"] == 5


def test_a_failed_attempt_the_router_retries_settles_nothing() -> None:
    """LiteLLM sends a failure event per failed attempt, before the router retries."""
    daemon = FakeDaemon()
    callback = daemon.callback()
    data = pre_call(callback, key(user_id="alice"), request())
    # LiteLLM's own no-op: the callback does not settle on a failed attempt.
    assert "async_log_failure_event" not in vars(RatewardenCallback)
    response = openai_usage(10, 5, 0)
    asyncio.run(callback.async_log_success_event(event_kwargs(data), response, 0, 0))
    [(_, body)] = daemon.settles
    assert body["usage"]["input_tokens"] == 10


def test_a_client_gone_mid_stream_is_charged_its_reservation() -> None:
    daemon = FakeDaemon()
    callback = daemon.callback()
    data = pre_call(callback, key(user_id="alice"), request(stream=True))
    data["metadata"]["client_disconnected"] = True  # as LiteLLM marks it
    asyncio.run(callback.async_post_call_failure_hook(data, RuntimeError("499"), None))
    [(_, body)] = daemon.settles
    assert "usage" not in body  # no usage: the daemon charges the whole reservation


def test_a_failure_is_settled_with_zero_usage() -> None:
    daemon = FakeDaemon()
    callback = daemon.callback()
    data = pre_call(callback, key(user_id="alice"), request())
    asyncio.run(callback.async_post_call_failure_hook(data, RuntimeError("500"), None))
    asyncio.run(callback.async_post_call_failure_hook(data, RuntimeError("500"), None))
    [(_, body)] = daemon.settles
    assert body["status"] == "error"
    assert body["usage"] == {"input_tokens": 0, "output_tokens": 0,
                             "cache_read_tokens": 0, "cache_write_tokens": 0}  # fmt: skip


def test_a_client_cannot_name_the_call_an_event_settles() -> None:
    daemon = FakeDaemon()
    callback = daemon.callback()
    victim = pre_call(callback, key(user_id="alice"), request())
    # Another request's metadata names alice's call id: the pre-call hook drops it...
    forged = request(metadata={CALL_KEY: victim["metadata"][CALL_KEY]})
    forged["litellm_call_id"] = victim["litellm_call_id"]  # the same x-litellm-call-id
    mallory = pre_call(callback, key(user_id="mallory"), forged)
    assert mallory["metadata"][CALL_KEY] != victim["metadata"][CALL_KEY]
    # A refused request naming alice's call: its failure event must not settle hers.
    daemon.allow = False
    refused = request(metadata={CALL_KEY: victim["metadata"][CALL_KEY]})
    with pytest.raises(HTTPException):
        pre_call(callback, key(user_id="mallory"), refused)
    asyncio.run(callback.async_post_call_failure_hook(refused, RuntimeError("429"), None))
    assert daemon.settles == []
    # Nor an unguarded call's (an image): its pre-call hook drops the client's value too.
    image = {"model": "dall-e-3", "metadata": {CALL_KEY: victim["metadata"][CALL_KEY]}}
    asyncio.run(callback.async_pre_call_hook(key(user_id="m"), None, image, "aimage_generation"))
    asyncio.run(callback.async_log_success_event(event_kwargs(image), None, 0, 0))
    assert daemon.settles == []
    # A call id nobody was given settles nothing either.
    unknown = {"metadata": {CALL_KEY: "litellm~0000000000000000"}}
    asyncio.run(callback.async_log_success_event(unknown, openai_usage(0, 0, 0), 0, 0))
    assert daemon.settles == []
    # alice's own event still settles hers.
    asyncio.run(callback.async_log_success_event(event_kwargs(victim), openai_usage(1, 1, 0), 0, 0))
    assert [call_id for call_id, _ in daemon.settles] == [victim["metadata"][CALL_KEY]]


@pytest.mark.parametrize(
    ("auth", "claimed", "user"),
    [
        (key(user_id="alice"), None, "alice"),
        (key(user_id="alice"), "bob", "alice"),  # a claim from a key not trusted for it
        (key(key_alias="ops-dashboard"), "bob", "ops-dashboard"),
        (key(), None, "key:hashed-1234"),
        (key(user_id="support-bot"), "carol", "carol"),  # a service vouching for its user
        (key(key_alias="support-bot"), "carol", "carol"),
        (key(user_id="support-bot"), None, "support-bot"),
        (key(user_id="support-bot", end_user_id="dan"), None, "dan"),
    ],
)
def test_the_user_is_the_authenticated_key_unless_it_vouches(
    auth: Any, claimed: str | None, user: str
) -> None:
    daemon = FakeDaemon()
    data = request(user=claimed) if claimed else request()
    pre_call(daemon.callback(end_user_keys=["support-bot"]), auth, data)
    assert daemon.checks[0]["user"] == user


def test_hostile_names_are_made_acceptable() -> None:
    daemon = FakeDaemon()
    callback = daemon.callback(end_user_keys=["svc"])
    pre_call(callback, key(user_id="svc"), request(user="\x00evil\n" + "u" * 5000))
    pre_call(callback, key(user_id="a\tb", team_id="t" * 900), request(model="m\x01" * 300))
    first, second = daemon.checks
    assert len(first["user"]) <= MAX_SUBJECT
    assert "\x00" not in first["user"]
    assert "\t" not in second["user"]
    assert len(second["team"]) <= MAX_SUBJECT
    assert len(second["model"]) <= MAX_SUBJECT


def test_calls_that_are_not_priced_by_tokens_go_unchecked() -> None:
    daemon = FakeDaemon()
    data = {"model": "dall-e-3", "prompt": "a cat", "metadata": {}}
    answer = asyncio.run(
        daemon.callback().async_pre_call_hook(key(user_id="a"), None, data, "aimage_generation")
    )
    assert answer is data
    assert daemon.checks == []


def test_an_embedding_reserves_no_output() -> None:
    daemon = FakeDaemon()
    data = {"model": "text-embedding-3-small", "input": ["abcd"] * 3, "metadata": {}}
    asyncio.run(daemon.callback().async_pre_call_hook(key(user_id="a"), None, data, "aembedding"))
    assert daemon.checks[0]["max_output_tokens"] == 0
    assert daemon.checks[0]["input_tokens"] == 3


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"max_tokens": 50}, 50),
        ({"max_completion_tokens": 70, "max_tokens": 50}, 70),
        ({"max_output_tokens": 90}, 90),  # the Responses API's name
        ({"config": {"max_output_tokens": 40}}, 40),  # Google's generateContent
        ({"generationConfig": {"maxOutputTokens": 30}}, 30),
        ({"max_tokens": True}, None),
        ({"max_tokens": -1}, None),
        ({"max_tokens": "9999"}, None),
        ({"max_tokens": 10**15}, MAX_TOKENS),  # reserved at the wire's most, so refused
        ({}, None),
    ],
)
def test_max_output_tokens(fields: dict[str, Any], expected: int | None) -> None:
    assert max_output_tokens(fields) == expected


def test_usage_in_each_api_s_names() -> None:
    assert usage_of(openai_usage(100, 20, 30)) == (100, 20, 30, 0)
    responses = {"usage": {"input_tokens": 100, "output_tokens": 20,
                           "input_tokens_details": {"cached_tokens": 30}}}  # fmt: skip
    assert usage_of(responses) == (100, 20, 30, 0)
    # Anthropic's input_tokens leave out what was read from or written to the cache.
    anthropic = {
        "usage": {
            "input_tokens": 10,
            "output_tokens": 20,
            "cache_read_input_tokens": 30,
            "cache_creation_input_tokens": 40,
        }
    }
    assert usage_of(anthropic) == (80, 20, 30, 40)
    google = {"usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 20,
                                "thoughtsTokenCount": 5,
                                "cachedContentTokenCount": 30}}  # fmt: skip
    assert usage_of(google) == (100, 25, 30, 0)
    assert usage_of({"usage": None}) is None
    huge = {"usage": {"prompt_tokens": 10**15, "completion_tokens": float("inf")}}
    assert usage_of(huge) == (MAX_TOKENS, MAX_TOKENS, 0, 0)
    assert usage_of({"usage": {"prompt_tokens": float("nan"), "completion_tokens": 1}}) == (
        0,
        1,
        0,
        0,
    )
    assert usage_of(None) is None
    assert usage_of({"usage": {"prompt_tokens": "many", "completion_tokens": -3}}) == (0, 0, 0, 0)


def test_a_subclass_keeps_a_pre_call_hook_of_its_own() -> None:
    """The proxy skips a callback whose class does not itself define the hook."""

    class Mine(RatewardenCallback):
        async def async_log_success_event(
            self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any
        ) -> None:
            await super().async_log_success_event(kwargs, response_obj, start_time, end_time)

    assert "async_pre_call_hook" in vars(Mine)
    daemon = FakeDaemon()
    guard = AsyncGuard(URL, transport=httpx.MockTransport(daemon.handle))
    pre_call(Mine(guard), key(user_id="alice"), request())
    assert len(daemon.checks) == 1


def test_an_unreachable_daemon_failing_closed_is_a_503() -> None:
    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    guard = AsyncGuard(URL, fail="closed", transport=httpx.MockTransport(unreachable))
    with pytest.raises(HTTPException) as raised:
        pre_call(RatewardenCallback(guard), key(user_id="alice"), request())
    assert raised.value.status_code == 503
    assert raised.value.detail


def test_a_huge_prompt_is_estimated_within_the_wire() -> None:
    daemon = FakeDaemon()
    data = request(messages=[{"role": "user", "content": "x" * 3_000_000}], max_tokens=10**15)
    pre_call(daemon.callback(), key(user_id="alice"), data)
    [check] = daemon.checks
    assert check["input_tokens"] == 750_001  # estimated: past what is worth counting
    assert check["max_output_tokens"] == MAX_TOKENS
