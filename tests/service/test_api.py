"""The v1 HTTP API, driven in-process on a fake clock: every endpoint, every refusal shape.

Decisions are always HTTP 200; bad input is a 422 naming the exact field; nothing a client
sends can produce a 5xx (a hypothesis test throws arbitrary JSON at the decide endpoints).
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from ratewarden.clock import FakeClock
from ratewarden.policy import parse_policy
from ratewarden.store import MemoryStore, Store, store_from_url
from ratewarden.store.keys import (
    FLEET_ALIVE_KEY,
    FLEET_REPORTS_KEY,
    all_keys_pattern,
    record_key,
)
from tests.helpers.app import assert_error_shape, build_app, serving
from tests.helpers.redis_server import RedisServer, free_port, start_redis

POLICY = """\
version: 1
tools:
  "browser_*": {label: browser}
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 10/minute
  - name: destructive-per-hour
    match: {destructive: true, tool: file_delete}
    per: [user]
    rate: 1/hour
    on_exceed: ask
  - name: browser-shadow
    match: {tool: "browser_*"}
    per: [user]
    rate: 1/minute
    mode: shadow
"""

# Fields only budget rules fill in; a rate or concurrency rule reports them as null.
NOT_A_BUDGET = {"spent": None, "reserved": None, "currency": None, "period": None}
TERMINAL_LIMIT_AFTER_FIRST = {
    "rule": "terminal-per-minute",
    "kind": "rate",
    "limit": 10,
    "window": "minute",
    "tokens": False,  # a rate of calls, not a token rate
    "remaining": 9,
    "reset_after": 60.0,
    **NOT_A_BUDGET,
}
GENERATED_CALL_ID = re.compile(r"^rw-[0-9a-f]{32}$")
JSON_HEADERS = {"content-type": "application/json"}


@pytest.fixture
async def client(clock: FakeClock) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(build_app(POLICY, clock=clock)) as http:
        yield http


async def check(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/check", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def only_field(response: httpx.Response) -> str:
    """The one field a 422 names (and check the error shape on the way)."""
    assert response.status_code == 422, response.text
    body = response.json()
    assert_error_shape(body)
    assert body["error"] == "invalid_request"
    fields: list[str] = [entry["field"] for entry in body["fields"]]
    assert len(fields) == 1, body
    assert body["message"].startswith(f"{fields[0]}: "), body
    return fields[0]


async def test_the_heap_built_at_start_up_is_frozen_while_serving(clock: FakeClock) -> None:
    """A full collection that walked FastAPI, pydantic and the policy stalled every request
    for 25-80 ms; the app freezes them for its lifetime and gives them back at shutdown."""
    gc.unfreeze()
    async with serving(build_app(POLICY, clock=clock)) as http:
        assert gc.get_freeze_count() > 10_000
        assert (await http.post("/v1/check", json={"user": "a", "tool": "t"})).status_code == 200
    assert gc.get_freeze_count() == 0


class ClosingStore(MemoryStore):
    closed = False

    async def close(self) -> None:
        self.closed = True
        await super().close()


async def test_shutdown_runs_when_the_server_stops_on_an_error(clock: FakeClock) -> None:
    """Its store closed and its heap given back even when the context serving it ends with
    an exception (a test's failed assertion left a Redis socket open for the next test)."""
    gc.unfreeze()
    store = ClosingStore(clock)
    with pytest.raises(RuntimeError, match="stopped mid-request"):
        async with serving(build_app(POLICY, store=store)):
            raise RuntimeError("stopped mid-request")
    assert store.closed
    assert gc.get_freeze_count() == 0


# -- POST /v1/check ---------------------------------------------------------------------


async def test_check_allows_and_echoes_the_call_id(client: httpx.AsyncClient) -> None:
    answer = await check(client, user="discord:1234", tool="terminal", call_id="call_abc")
    assert answer == {
        "decision": "allow",
        "allowed": True,
        "message": "",
        "call_id": "call_abc",
        "retry_after": None,
        "degraded": False,
        "approved": False,
        "violations": [],
        "shadow": [],
        "warnings": [],
        "limits": [TERMINAL_LIMIT_AFTER_FIRST],
        "replayed": False,
        "send_args": False,
        "send_result": False,
    }


async def test_check_generates_a_call_id_when_absent(client: httpx.AsyncClient) -> None:
    first = await check(client, user="u", tool="terminal")
    second = await check(client, user="u", tool="terminal")
    assert GENERATED_CALL_ID.match(first["call_id"]), first["call_id"]
    assert GENERATED_CALL_ID.match(second["call_id"]), second["call_id"]
    assert first["call_id"] != second["call_id"]


async def test_eleventh_terminal_call_in_a_minute_is_denied(
    client: httpx.AsyncClient, clock: FakeClock
) -> None:
    for i in range(10):
        answer = await check(client, user="u", tool="terminal", call_id=f"c{i}")
        assert (answer["decision"], answer["limits"][0]["remaining"]) == ("allow", 9 - i)
    clock.advance(12_600)
    denied = await check(client, user="u", tool="terminal", call_id="c10")
    message = "Rate limit: max 10 terminal calls per minute (retry in 48s)"
    assert denied == {
        "decision": "deny",
        "allowed": False,
        "message": message,
        "call_id": "c10",
        "retry_after": 47.4,
        "degraded": False,
        "approved": False,
        "violations": [
            {
                "rule": "terminal-per-minute",
                "kind": "rate",
                "limit": 10,
                "window": "minute",
                "remaining": 0,
                "retry_after": 47.4,
                "message": message,
                **NOT_A_BUDGET,
                "scope": {"user": "u"},  # the refusal's detail (docs/api.md)
                "used": 10,
                "condition": None,
            }
        ],
        "shadow": [],
        "warnings": [],
        "limits": [
            {
                "rule": "terminal-per-minute",
                "kind": "rate",
                "limit": 10,
                "window": "minute",
                "tokens": False,
                "remaining": 0,
                "reset_after": 47.4,
                **NOT_A_BUDGET,
            }
        ],
        "replayed": False,
        "send_args": False,
        "send_result": False,
    }
    # Another user has a counter of their own.
    assert (await check(client, user="v", tool="terminal"))["decision"] == "allow"
    # retry_after is truthful: one millisecond early is still refused, on time is allowed.
    clock.advance(47_399)
    assert (await check(client, user="u", tool="terminal"))["decision"] == "deny"
    clock.advance(1)
    assert (await check(client, user="u", tool="terminal"))["decision"] == "allow"


async def test_a_denied_call_consumes_nothing(client: httpx.AsyncClient) -> None:
    for _ in range(13):
        await check(client, user="u", tool="terminal")
    usage = (await client.get("/v1/usage", params={"user": "u", "tool": "terminal"})).json()
    assert [(item["used"], item["remaining"]) for item in usage["limits"]] == [(10, 0)]


@pytest.mark.parametrize(
    ("metadata", "applies"),
    [
        (None, True),  # unclassified: destructive by MCP default
        ({}, True),
        ({"destructive": True}, True),
        ({"destructiveHint": True}, True),
        ({"destructive": False}, False),
        ({"destructiveHint": False}, False),
        ({"read_only": True}, False),  # read-only and silent on destructive: not destructive
        ({"readOnlyHint": True}, False),
        ({"readOnlyHint": True, "destructiveHint": True}, True),
        ({"readOnlyHint": False, "idempotentHint": True, "openWorldHint": False}, True),
        ({"title": "Delete a file", "tags": ["fs"], "requires_confirmation": True}, True),
    ],
)
async def test_metadata_and_mcp_aliases_decide_whether_a_rule_applies(
    client: httpx.AsyncClient, metadata: dict[str, Any] | None, applies: bool
) -> None:
    body: dict[str, Any] = {"user": "u", "tool": "file_delete"}
    if metadata is not None:
        body["metadata"] = metadata
    answer = await check(client, **body)
    assert answer["decision"] == "allow"
    assert [item["rule"] for item in answer["limits"]] == (
        ["destructive-per-hour"] if applies else []
    )


async def test_ask_rule_asks_then_approval_lets_the_call_through(
    client: httpx.AsyncClient,
) -> None:
    assert (await check(client, user="u", tool="file_delete"))["decision"] == "allow"
    asked = await check(client, user="u", tool="file_delete", call_id="c2")
    message = "Rate limit: max 1 file_delete calls per hour (retry in 1h)"
    assert (asked["decision"], asked["allowed"], asked["message"]) == ("ask", False, message)
    assert asked["retry_after"] == 3600.0
    assert [v["rule"] for v in asked["violations"]] == ["destructive-per-hour"]
    approved = await check(client, user="u", tool="file_delete", approved=True)
    assert (approved["decision"], approved["approved"]) == ("allow", True)
    assert approved["warnings"] == [f"approved past destructive-per-hour: {message}"]
    assert approved["violations"] == []


async def test_shadow_rule_reports_but_allows(client: httpx.AsyncClient) -> None:
    first = await check(client, user="u", tool="browser_open")
    assert (first["decision"], first["shadow"]) == ("allow", [])
    second = await check(client, user="u", tool="browser_open")
    assert second["decision"] == "allow"
    assert second["violations"] == []
    assert second["shadow"] == [
        {
            "rule": "browser-shadow",
            "kind": "rate",
            "limit": 1,
            "window": "minute",
            "remaining": 0,
            "retry_after": 60.0,
            "message": "Rate limit: max 1 browser calls per minute (retry in 1m)",
            **NOT_A_BUDGET,
            "scope": {"user": "u"},
            "used": 1,
            "condition": None,
        }
    ]


async def test_a_call_no_rule_matches_is_allowed_with_no_limits(
    client: httpx.AsyncClient,
) -> None:
    answer = await check(client, user="u", tool="web_search", args={"q": "x" * 1000})
    assert (answer["decision"], answer["limits"], answer["message"]) == ("allow", [], "")


async def test_rate_zero_always_denies_and_unlimited_never_counts(clock: FakeClock) -> None:
    policy = """\
version: 1
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    rate: 2/minute
overrides:
  - users: ["banned-*"]
    rule: terminal-per-minute
    rate: 0/minute
  - users: [root]
    rule: terminal-per-minute
    unlimited: true
"""
    async with serving(build_app(policy, clock=clock)) as client:
        banned = await check(client, user="banned-1", tool="terminal")
        assert (banned["decision"], banned["retry_after"]) == ("deny", None)
        assert banned["message"] == "Rate limit: max 0 terminal calls per minute"
        for _ in range(5):
            root = await check(client, user="root", tool="terminal")
            assert (root["decision"], root["limits"]) == ("allow", [])
        usage = (await client.get("/v1/usage", params={"user": "root"})).json()
        assert [(i["rule"], i["limit"], i["used"], i["remaining"]) for i in usage["limits"]] == [
            ("terminal-per-minute", None, 0, None)
        ]


# -- POST /v1/check/batch ---------------------------------------------------------------


async def test_batch_is_decided_in_order_and_counts_every_call(
    client: httpx.AsyncClient,
) -> None:
    calls = [{"user": "u", "tool": "terminal", "call_id": f"b{i}"} for i in range(12)]
    calls.insert(5, {"user": "u", "tool": "web_search", "call_id": "other"})
    response = await client.post("/v1/check/batch", json={"calls": calls})
    assert response.status_code == 200
    results = response.json()["results"]
    assert [r["call_id"] for r in results] == [c["call_id"] for c in calls]
    assert [r["decision"] for r in results] == ["allow"] * 11 + ["deny"] * 2
    terminal = [r for r in results if r["call_id"] != "other"]
    assert [r["limits"][0]["remaining"] for r in terminal] == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0, 0]
    usage = (await client.get("/v1/usage", params={"user": "u", "tool": "terminal"})).json()
    assert usage["limits"][0]["used"] == 10
    # The next single check sees the batch's calls.
    assert (await check(client, user="u", tool="terminal"))["decision"] == "deny"


async def test_batch_of_exactly_100_calls_is_accepted(client: httpx.AsyncClient) -> None:
    calls = [{"user": f"u{i}", "tool": "terminal"} for i in range(100)]
    response = await client.post("/v1/check/batch", json={"calls": calls})
    assert response.status_code == 200
    assert len(response.json()["results"]) == 100


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"calls": [{"user": "u", "tool": "t"}] * 101}, "calls"),
        ({"calls": []}, "calls"),
        ({}, "calls"),
        ({"calls": {"user": "u", "tool": "t"}}, "calls"),
        ({"calls": [{"user": "u", "tool": "t"}, {"user": "u"}]}, "calls[1].tool"),
        ({"calls": [{"user": "u", "tool": "t", "cost": -1}]}, "calls[0].cost"),
        ({"calls": [{"user": "u", "tool": "t"}], "extra": 1}, "extra"),
        ([{"user": "u", "tool": "t"}], "body"),
    ],
)
async def test_batch_refusals_name_the_field(
    client: httpx.AsyncClient, body: Any, field: str
) -> None:
    response = await client.post("/v1/check/batch", json=body)
    assert only_field(response) == field


async def test_a_refused_batch_counts_nothing(client: httpx.AsyncClient) -> None:
    calls = [{"user": "u", "tool": "terminal"}] * 5 + [{"user": "u"}]
    assert (await client.post("/v1/check/batch", json={"calls": calls})).status_code == 422
    usage = (await client.get("/v1/usage", params={"user": "u", "tool": "terminal"})).json()
    assert usage["limits"][0]["used"] == 0


# -- GET /v1/usage ----------------------------------------------------------------------


async def test_usage_reports_used_and_remaining_without_consuming(
    client: httpx.AsyncClient, clock: FakeClock
) -> None:
    for _ in range(3):
        await check(client, user="discord:1234", tool="terminal")
    clock.advance(5_000)
    for _ in range(4):  # reading usage consumes nothing, however often
        response = await client.get(
            "/v1/usage", params={"user": "discord:1234", "tool": "terminal"}
        )
    assert response.status_code == 200
    assert response.json() == {
        "user": "discord:1234",
        "tool": "terminal",
        "session": None,
        "team": None,
        "limits": [
            {
                "rule": "terminal-per-minute",
                "kind": "rate",
                "algorithm": "sliding_window",
                "mode": "enforce",
                "limit": 10,
                "window": "minute",
                "used": 3,
                "remaining": 7,
                "reset_after": 55.0,
                "scope": {"user": "discord:1234"},
                "reserved": None,
                "currency": None,
                "period": None,
            }
        ],
        "unshown": [],  # rules whose counter needs a part not given (none here)
    }
    assert (await check(client, user="discord:1234", tool="terminal"))["limits"][0][
        "remaining"
    ] == 6


async def test_usage_without_a_tool_lists_every_rule_of_the_user(
    client: httpx.AsyncClient,
) -> None:
    await check(client, user="u", tool="browser_open")
    usage = (await client.get("/v1/usage", params={"user": "u"})).json()
    assert [(i["rule"], i["mode"], i["used"]) for i in usage["limits"]] == [
        ("terminal-per-minute", "enforce", 0),
        ("destructive-per-hour", "enforce", 0),
        ("browser-shadow", "shadow", 1),
    ]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "user"),
        ({"tool": "terminal"}, "user"),
        ({"user": ""}, "user"),
        ({"user": "x" * 257}, "user"),
        ({"user": "u", "tool": ""}, "tool"),
        ({"user": "u", "session": "s" * 257}, "session"),
        ({"user": "u", "team": ""}, "team"),
    ],
)
async def test_usage_refusals_name_the_parameter(
    client: httpx.AsyncClient, params: dict[str, str], field: str
) -> None:
    response = await client.get("/v1/usage", params=params)
    assert only_field(response) == field


async def test_usage_of_a_missing_user_says_required(client: httpx.AsyncClient) -> None:
    body = (await client.get("/v1/usage")).json()
    assert body == {
        "error": "invalid_request",
        "message": "user: required field is missing",
        "fields": [{"field": "user", "message": "required field is missing"}],
    }


# -- GET /v1/policy, health, docs -------------------------------------------------------


async def test_policy_endpoint_serves_the_policy_and_its_version(
    client: httpx.AsyncClient,
) -> None:
    expected = parse_policy(POLICY.encode())
    body = (await client.get("/v1/policy")).json()
    assert body["version"] == expected.version
    assert re.fullmatch(r"[0-9a-f]{16}", body["version"])
    assert body["source"] == "<policy>"
    assert body["policy"] == expected.document
    assert [r["name"] for r in body["policy"]["rules"]] == [
        "terminal-per-minute",
        "destructive-per-hour",
        "browser-shadow",
    ]
    assert body["policy"]["rules"][0]["rate"] == "10/minute"


async def test_a_different_policy_has_a_different_version(clock: FakeClock) -> None:
    other = POLICY.replace("10/minute", "11/minute")
    async with serving(build_app(other, clock=clock)) as client:
        body = (await client.get("/v1/policy")).json()
    assert body["version"] == parse_policy(other.encode()).version
    assert body["version"] != parse_policy(POLICY.encode()).version


async def test_healthz_and_readyz(client: httpx.AsyncClient) -> None:
    health = await client.get("/healthz")
    assert (health.status_code, health.json()) == (200, {"status": "ok", "store": "ok"})
    ready = await client.get("/readyz")
    version = parse_policy(POLICY.encode()).version
    expected = {"status": "ready", "policy": version, "store": "ok", "answering": "store"}
    assert (ready.status_code, ready.json()) == (200, expected)


@pytest.mark.redis
async def test_readyz_stays_ready_and_says_the_store_went_away(tmp_path: Path) -> None:
    """Ready means "can answer": by the fail mode too. Were it 503, every pod would leave
    its Service at once and the hosts would follow their own fail mode (open by default)."""
    redis_server = start_redis(tmp_path / "redis")
    try:
        app = build_app(POLICY, store=store_from_url(redis_server.url))
        async with serving(app) as client:
            assert (await client.get("/readyz")).status_code == 200
            redis_server.stop()
            ready = await client.get("/readyz")
            assert ready.status_code == 200
            assert ready.json()["answering"] == "fail mode"
            assert ready.json()["store"].startswith("unavailable: ")
            health = await client.get("/healthz")
            assert health.status_code == 200
            assert health.json()["store"].startswith("unavailable: ")
            # Decisions still answer (fail open by default), flagged as degraded.
            answer = await check(client, user="u", tool="terminal")
            assert (answer["decision"], answer["degraded"]) == ("allow", True)
            usage = await client.get("/v1/usage", params={"user": "u"})
            assert usage.status_code == 503
            assert_error_shape(usage.json())
            assert usage.json()["error"] == "store_unavailable"
    finally:
        redis_server.stop()


async def test_readyz_is_ready_by_the_fail_mode_when_the_store_is_down_from_the_start() -> None:
    store = store_from_url(f"redis://127.0.0.1:{free_port()}/0")
    try:
        async with serving(build_app(POLICY, store=store)) as client:
            ready = await client.get("/readyz")
            assert ready.status_code == 200
            assert (ready.json()["status"], ready.json()["answering"]) == ("ready", "fail mode")
            assert (await client.get("/healthz")).status_code == 200
            answer = await check(client, user="u", tool="terminal")
            assert (answer["decision"], answer["degraded"]) == ("allow", True)
    finally:
        await store.close()


async def test_openapi_and_docs(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    assert spec["info"]["title"] == "ratewarden"
    assert {
        "/v1/check",
        "/v1/check/batch",
        "/v1/usage",
        "/v1/policy",
        "/healthz",
        "/readyz",
    } <= set(spec["paths"])
    assert set(spec["paths"]["/v1/check"]) == {"post"}
    schemas = spec["components"]["schemas"]
    assert {"user", "tool", "session", "team", "call_id", "cost", "metadata", "approved"} <= set(
        schemas["CheckRequest"]["properties"]
    )
    # `user` may be left out with a user token (service/vouch.py), and is required otherwise.
    assert schemas["CheckRequest"]["required"] == ["tool"]
    docs = await client.get("/docs")
    assert docs.status_code == 200
    assert docs.headers["content-type"].startswith("text/html")
    assert "/openapi.json" in docs.text
    assert "swagger" in docs.text.lower()


async def test_unknown_paths_and_methods_get_the_error_shape(client: httpx.AsyncClient) -> None:
    missing = await client.get("/v1/nope")
    assert (missing.status_code, missing.json()["error"]) == (404, "not_found")
    assert_error_shape(missing.json())
    wrong = await client.get("/v1/check")
    assert (wrong.status_code, wrong.json()["error"]) == (405, "method_not_allowed")
    assert_error_shape(wrong.json())


# -- bad input: one field at a time ------------------------------------------------------

LONG = "x" * 257
BAD_FIELDS = [
    # (what to merge into a valid body, the field the 422 must name)
    ({"user": None}, "user"),
    ({"user": 5}, "user"),
    ({"user": ["u"]}, "user"),
    ({"user": ""}, "user"),
    ({"user": LONG}, "user"),
    ({"tool": None}, "tool"),
    ({"tool": True}, "tool"),
    ({"tool": ""}, "tool"),
    ({"tool": LONG}, "tool"),
    ({"session": 5}, "session"),
    ({"session": ""}, "session"),
    ({"session": LONG}, "session"),
    ({"team": {"a": 1}}, "team"),
    ({"team": ""}, "team"),
    ({"team": LONG}, "team"),
    ({"call_id": 5}, "call_id"),
    ({"call_id": ""}, "call_id"),
    ({"call_id": "c" * 129}, "call_id"),
    ({"cost": -0.01}, "cost"),
    ({"cost": float("nan")}, "cost"),
    ({"cost": float("inf")}, "cost"),
    ({"cost": float("-inf")}, "cost"),
    ({"cost": "ten"}, "cost"),
    ({"cost": [1]}, "cost"),
    ({"cost": 1e10}, "cost"),
    ({"metadata": []}, "metadata"),
    ({"metadata": "destructive"}, "metadata"),
    ({"metadata": {"destructive": "yes"}}, "metadata.destructive"),
    ({"metadata": {"destructive": 1}}, "metadata.destructive"),
    ({"metadata": {"read_only": "true"}}, "metadata.read_only"),
    ({"metadata": {"idempotent": None, "open_world": 0}}, "metadata.open_world"),
    ({"metadata": {"requires_confirmation": "no"}}, "metadata.requires_confirmation"),
    ({"metadata": {"readOnlyHint": "x"}}, "metadata.readOnlyHint"),
    ({"metadata": {"destructiveHint": 0}}, "metadata.destructiveHint"),
    ({"metadata": {"idempotentHint": []}}, "metadata.idempotentHint"),
    ({"metadata": {"openWorldHint": "false"}}, "metadata.openWorldHint"),
    ({"metadata": {"tags": "fs"}}, "metadata.tags"),
    ({"metadata": {"tags": ["fs", ""]}}, "metadata.tags[1]"),
    ({"metadata": {"tags": ["t" * 65]}}, "metadata.tags[0]"),
    ({"metadata": {"tags": [1]}}, "metadata.tags[0]"),
    ({"metadata": {"tags": [f"t{i}" for i in range(33)]}}, "metadata.tags"),
    ({"metadata": {"title": LONG}}, "metadata.title"),
    ({"metadata": {"dangerous": True}}, "metadata.dangerous"),
    ({"args": [1]}, "args"),
    ({"args": "ls"}, "args"),
    ({"approved": "true"}, "approved"),
    ({"approved": 1}, "approved"),
    ({"approved": None}, "approved"),
    ({"tags": ["fs"]}, "tags"),
    ({"colour": "red"}, "colour"),
]


@pytest.mark.parametrize(("patch", "field"), BAD_FIELDS, ids=[f for _, f in BAD_FIELDS])
async def test_a_bad_field_is_a_422_naming_exactly_that_field(
    client: httpx.AsyncClient, patch: dict[str, Any], field: str
) -> None:
    body = {"user": "u", "tool": "terminal", **patch}
    response = await client.post("/v1/check", content=json.dumps(body), headers=JSON_HEADERS)
    assert only_field(response) == field
    # A refused check consumes nothing.
    usage = (await client.get("/v1/usage", params={"user": "u", "tool": "terminal"})).json()
    assert usage["limits"][0]["used"] == 0


@pytest.mark.parametrize("missing", ["user", "tool"])
async def test_a_missing_required_field_says_so(client: httpx.AsyncClient, missing: str) -> None:
    body = {"user": "u", "tool": "terminal"}
    del body[missing]
    response = await client.post("/v1/check", json=body)
    assert response.json() == {
        "error": "invalid_request",
        "message": f"{missing}: required field is missing",
        "fields": [{"field": missing, "message": "required field is missing"}],
    }


async def test_every_bad_field_is_named_at_once(client: httpx.AsyncClient) -> None:
    body = {"tool": "", "cost": -1, "metadata": {"destructive": "yes"}, "x": 1}
    response = await client.post("/v1/check", json=body)
    assert response.status_code == 422
    fields = sorted(entry["field"] for entry in response.json()["fields"])
    # A missing `user` is named once the body is otherwise valid: only then is it known
    # whether the token says who calls (service/vouch.py).
    assert fields == ["cost", "metadata.destructive", "tool", "x"]


@pytest.mark.parametrize(
    "raw",
    [
        b"{bad",
        b'{"user": "u", "tool": "t"',
        b"{'user': 'u'}",
        b"[1,]",
        b"\xff\xfe",
        b"\xff\xfe\x00",
    ],
)
async def test_invalid_json_is_a_422_naming_the_body(client: httpx.AsyncClient, raw: bytes) -> None:
    response = await client.post("/v1/check", content=raw, headers=JSON_HEADERS)
    assert only_field(response) == "body"
    assert response.json()["message"].startswith("body: invalid JSON: ")


@pytest.mark.parametrize("value", [[1], ["user", "u"], "u", 5, 1.5, True, None])
async def test_a_body_that_is_not_an_object_is_a_422_naming_the_body(
    client: httpx.AsyncClient, value: Any
) -> None:
    response = await client.post("/v1/check", content=json.dumps(value), headers=JSON_HEADERS)
    assert only_field(response) == "body"


async def test_an_empty_body_is_a_422_naming_the_body(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/check", content=b"", headers=JSON_HEADERS)
    assert only_field(response) == "body"
    assert response.json()["message"] == "body: required field is missing"


@pytest.mark.parametrize("cost", [True, False, "1", "0.5"])
async def test_a_cost_that_is_not_a_json_number_is_refused(
    client: httpx.AsyncClient, cost: Any
) -> None:
    response = await client.post("/v1/check", json={"user": "u", "tool": "t", "cost": cost})
    assert only_field(response) == "cost"


async def test_a_json_body_with_a_form_content_type_is_accepted_or_explained(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/check",
        content=b'{"user": "discord:1234", "tool": "terminal"}',
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    if response.status_code != 200:
        assert 400 <= response.status_code < 500
        assert "content-type" in response.json()["message"].lower()


# -- key encoding: no user can reach another user's counter -------------------------------

KEY_POLICY = """\
version: 1
rules:
  - name: per-user
    match: {tool: t}
    per: [user]
    rate: 1/minute
  - name: per-user-session
    match: {tool: s}
    per: [user, session]
    rate: 1/minute
  - name: per-team-tool
    match: {tool: "m*"}
    per: [team, tool]
    rate: 1/minute
"""
NEIGHBOURS = [
    # Names that a normalising or lossy encoding would merge.
    ({"user": "a|user=b"}, {"user": "a"}),
    ({"user": "a|user=b"}, {"user": "b"}),
    ({"user": "x}y"}, {"user": "x"}),
    ({"user": "x{y}"}, {"user": "y"}),
    ({"user": "u:1"}, {"user": "u%3A1"}),
    ({"user": "u:1"}, {"user": "u"}),
    ({"user": "a\x00"}, {"user": "a"}),
    ({"user": "a\n"}, {"user": "a"}),
    ({"user": "a "}, {"user": "a"}),
    ({"user": "a+b"}, {"user": "a b"}),
    ({"user": "\u202ea"}, {"user": "a"}),
    ({"user": "\u00e9"}, {"user": "e\u0301"}),
    ({"user": "A"}, {"user": "a"}),
    ({"user": "rw:{per-user|user=a}:sw"}, {"user": "a"}),
    ({"user": "*"}, {"user": "a"}),
    # Pairs whose parts, joined unencoded, spell the same key.
    (
        {"user": "a|session=b", "session": "c", "tool": "s"},
        {"user": "a", "session": "b|session=c", "tool": "s"},
    ),
    (
        {"user": "u", "team": "x|tool=m1", "tool": "m2"},
        {"user": "u", "team": "x", "tool": "m1|tool=m2"},
    ),
    ({"user": "a|session=b", "tool": "s"}, {"user": "a", "session": "b", "tool": "s"}),
    ({"user": "a", "session": "b|x", "tool": "s"}, {"user": "a", "session": "b", "tool": "s"}),
    ({"user": "a", "session": "b}", "tool": "s"}, {"user": "a", "session": "b", "tool": "s"}),
    ({"user": "a", "team": "x|tool=m1", "tool": "m2"}, {"user": "b", "team": "x", "tool": "m1"}),
    ({"user": "a", "team": "x", "tool": "m1|tool=m2"}, {"user": "b", "team": "x", "tool": "m1"}),
]


@pytest.mark.parametrize(
    ("first", "second"), NEIGHBOURS, ids=[f"{a!r}-vs-{b!r}" for a, b in NEIGHBOURS]
)
async def test_lookalike_subjects_never_share_a_counter(
    store: Store, first: dict[str, str], second: dict[str, str]
) -> None:
    one, other = {"tool": "t", **first}, {"tool": "t", **second}
    async with serving(build_app(KEY_POLICY, store=store)) as client:
        assert (await check(client, **one))["decision"] == "allow"
        assert (await check(client, **other))["decision"] == "allow"
        assert (await check(client, **one))["decision"] == "deny"
        assert (await check(client, **other))["decision"] == "deny"


# -- a real redis-server ----------------------------------------------------------------


@pytest.mark.redis
async def test_the_app_runs_on_a_real_redis(redis_server: RedisServer, redis_url: str) -> None:
    app = build_app(POLICY, store=store_from_url(redis_url))
    async with serving(app) as client:
        first = await check(client, user="discord:1234", tool="terminal", call_id="c1")
        assert (first["decision"], first["limits"]) == ("allow", [TERMINAL_LIMIT_AFTER_FIRST])
        await check(client, user="discord:1234", tool="terminal")
        usage = (await client.get("/v1/usage", params={"user": "discord:1234"})).json()
        assert [(i["rule"], i["used"], i["remaining"]) for i in usage["limits"]] == [
            ("terminal-per-minute", 2, 8),
            ("destructive-per-hour", 0, 1),
            ("browser-shadow", 0, 1),
        ]
        assert (await client.get("/readyz")).status_code == 200
    sync = redis_server.client()
    keys = sync.keys(all_keys_pattern())
    assert keys == [b"rw:{terminal-per-minute|user=discord%3A1234}:sw"]
    assert 0 < sync.pttl(keys[0]) <= 60_000
    # The call the caller named is recorded (for 1 h); the one with a generated id is not.
    # Beside them, only the fleet's report of this process (service/fleet.py), and who
    # was decided in this minute and hour (service/activity.py: every sketch has a TTL).
    found = cast("list[bytes]", sync.keys("*"))  # redis-py types both decodings
    fleet = sorted(k for k in found if k.startswith(b"rw:admin:"))
    assert fleet == sorted([FLEET_ALIVE_KEY.encode(), FLEET_REPORTS_KEY.encode()])
    sketches = [k for k in found if k.startswith(b"rw:activity:")]
    assert all(0 < sync.pttl(k) <= 26 * 3_600_000 for k in sketches)
    rest = set(found) - set(fleet) - set(sketches)
    assert sorted(rest) == sorted([*keys, record_key("c1").encode()])
    assert 3_590_000 < sync.pttl(record_key("c1")) <= 3_600_000
    sync.close()


# -- fuzz: nothing a client sends produces a 5xx -----------------------------------------

HOSTILE = st.sampled_from(
    [
        "",
        "{",
        "}",
        "{user}",
        "{0}",
        "a:b",
        "a|user=b",
        "rw:{x}:sw",
        "\n",
        "\r\n",
        "\x00",
        "\u202e",
        "\u200f",
        "\ufeff",
        "%00",
        "%",
        "\\",
        '"',
        "*",
        "[a-",
        "NaN",
        "__proto__",
        "\U0001f600",
        "terminal",
        "u",
    ]
)
LONG_STRINGS = st.builds(
    lambda ch, n: ch * n,
    st.sampled_from(["a", "{", "\u202e", "\x00", "\u00e9", ":"]),
    st.sampled_from([64, 65, 128, 129, 256, 257, 10_000]),
)
STRINGS = st.one_of(st.text(max_size=30), HOSTILE, LONG_STRINGS)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(),
    STRINGS,
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(STRINGS, children, max_size=4)
    ),
    max_leaves=12,
)
REQUEST_KEYS = [
    "user",
    "tool",
    "session",
    "team",
    "call_id",
    "cost",
    "metadata",
    "args",
    "approved",
    "tags",
]
METADATA_KEYS = [
    "read_only",
    "destructive",
    "idempotent",
    "open_world",
    "requires_confirmation",
    "readOnlyHint",
    "destructiveHint",
    "idempotentHint",
    "openWorldHint",
    "tags",
    "title",
]
ARBITRARY_DICTS = st.dictionaries(
    st.one_of(st.sampled_from(REQUEST_KEYS), STRINGS), JSON_VALUES, max_size=8
)
METADATA = st.dictionaries(
    st.sampled_from(METADATA_KEYS),
    st.one_of(st.booleans(), st.lists(STRINGS, max_size=3), JSON_VALUES),
    max_size=5,
)
NEAR_VALID = st.fixed_dictionaries(
    {"user": STRINGS, "tool": st.one_of(HOSTILE, STRINGS, st.sampled_from(["terminal"]))},
    optional={
        "session": STRINGS,
        "team": STRINGS,
        "call_id": STRINGS,
        "cost": st.one_of(st.floats(), st.integers(), STRINGS),
        "metadata": st.one_of(METADATA, JSON_VALUES),
        "approved": st.one_of(st.booleans(), JSON_VALUES),
        "args": JSON_VALUES,
    },
)
# Requests that are mostly valid, so that hostile names reach the engine and the store.
SUBJECTS = st.one_of(
    st.text(min_size=1, max_size=30),
    HOSTILE.filter(bool),
    st.builds(
        lambda ch, n: ch * n,
        st.sampled_from(["a", "{", "\u202e", "\x00", "|", "="]),
        st.sampled_from([1, 64, 255, 256]),
    ),
)
VALIDISH = st.fixed_dictionaries(
    {"user": SUBJECTS, "tool": st.one_of(SUBJECTS, st.sampled_from(["terminal", "browser_x"]))},
    optional={
        "session": SUBJECTS,
        "team": SUBJECTS,
        "call_id": st.text(min_size=1, max_size=128),
        "cost": st.floats(min_value=0, max_value=1e9),
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                **dict.fromkeys(
                    ["readOnlyHint", "destructive", "idempotentHint", "open_world"], st.booleans()
                ),
                "tags": st.lists(st.text(min_size=1, max_size=64), max_size=32),
            },
        ),
        "approved": st.booleans(),
        "args": st.dictionaries(STRINGS, JSON_VALUES, max_size=3),
    },
)
CHECK_BODIES = st.one_of(JSON_VALUES, ARBITRARY_DICTS, NEAR_VALID, VALIDISH, VALIDISH)
BATCH_BODIES = st.one_of(
    JSON_VALUES,
    st.fixed_dictionaries({"calls": st.lists(VALIDISH, min_size=1, max_size=6)}),
    st.fixed_dictionaries({"calls": st.lists(VALIDISH, min_size=1, max_size=6)}),
    st.fixed_dictionaries(
        {"calls": st.lists(st.one_of(NEAR_VALID, ARBITRARY_DICTS, VALIDISH), max_size=6)}
    ),
    st.fixed_dictionaries({"calls": JSON_VALUES}),
    ARBITRARY_DICTS,
)


def encode(body: Any) -> bytes | None:
    """JSON text for `body` (NaN and Infinity as Python writes them), or None if unencodable."""
    try:
        return json.dumps(body).encode()
    except (ValueError, OverflowError):
        return None


def assert_sane(path: str, body: Any, response: httpx.Response) -> None:
    assert response.status_code < 500, (path, body, response.status_code, response.text)
    answer = response.json()
    if response.status_code == 200:
        if path == "/v1/check":
            assert answer["decision"] in ("allow", "deny", "ask")
        else:
            assert len(answer["results"]) == len(body["calls"])
    else:
        assert 400 <= response.status_code < 500
        assert_error_shape(answer)


@pytest.mark.slow
def test_no_input_makes_the_decide_endpoints_fail(clock: FakeClock) -> None:
    fuzz = hsettings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    with asyncio.Runner() as runner:
        app = build_app(POLICY, clock=clock)
        lifespan = app.router.lifespan_context(app)
        runner.run(lifespan.__aenter__())
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")

        def post(path: str, body: Any, raw: bytes) -> None:
            response = runner.run(client.post(path, content=raw, headers=JSON_HEADERS))
            assert_sane(path, body, response)

        @fuzz
        @given(body=CHECK_BODIES)
        def check_anything(body: Any) -> None:
            raw = encode(body)
            if raw is not None:
                post("/v1/check", body, raw)

        @fuzz
        @given(body=BATCH_BODIES)
        def batch_anything(body: Any) -> None:
            raw = encode(body)
            if raw is not None:
                post("/v1/check/batch", body, raw)

        @fuzz
        @given(raw=st.binary(max_size=64))
        def bytes_anything(raw: bytes) -> None:
            # Hypothesis mixes literals from the code into its bytes, so a draw may be a
            # valid body (b'{"user":" ","tool":" "}' was): then it must be answered sanely.
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            for path in ("/v1/check", "/v1/check/batch"):
                response = runner.run(client.post(path, content=raw, headers=JSON_HEADERS))
                if isinstance(body, dict) and response.status_code == 200:
                    assert_sane(path, body, response)
                    continue
                assert 400 <= response.status_code < 500, (raw, response.text)
                assert_error_shape(response.json())

        try:
            check_anything()
            batch_anything()
            bytes_anything()
        finally:
            runner.run(client.aclose())
            runner.run(lifespan.__aexit__(None, None, None))
