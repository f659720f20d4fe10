"""A refusal's structured detail (issue #29, item 4): beside the sentence, each violation
says which rule refused, its kind, the scope it counted, the limit and what was used,
`retry_after`, and for access and `args` rules the condition that matched. The same on
the memory store and real Redis, on the hot path and through FastAPI, and in
/v1/denials and the audit line (never an argument's value, nor its digest, unless the
operator audits arguments)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ratewarden.clock import FakeClock
from ratewarden.service.audit import HIDDEN
from ratewarden.store import MemoryStore, Store
from tests.helpers.app import build_app, serving
from tests.service.test_audit import (  # noqa: F401 - fixtures, by name
    audit_lines,
    audit_log,
    audit_to,
    daemon,
    redis_store,
)
from tests.service.test_hotpath import normalised

POLICY = """\
version: 1
rules:
  - {name: rate, match: {tool: rate-t}, per: [user, tool], rate: 1/minute}
  - {name: slots, match: {tool: conc-t}, per: [user], concurrency: 1}
  - {name: spend, match: {tool: budget-t}, per: [user], budget: 1.00/day}
  - name: no-deletes
    match: {tool: access-t, destructive: true}
    deny: "{tool} may not delete"
  - name: no-root-delete
    match: {tool: terminal, args: {command: {prefix: "rm -rf /"}}}
    deny: "Refusing to delete the root directory"
  - {name: loop, match: {tool: poll}, per: [user, tool, args], rate: 1/10 minutes}
"""
SECRET = "rm -rf /home/secret-value"
DESTRUCTIVE = {"destructiveHint": True}
# Each kind: the call, sent twice (the second is refused), and the detail it carries.
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "rate": (
        {"tool": "rate-t"},
        {"scope": {"user": "alice", "tool": "rate-t"}, "limit": 1, "used": 1, "window": "minute"},
    ),
    "concurrency": (
        {"tool": "conc-t"},
        {"scope": {"user": "alice"}, "limit": 1, "used": 1, "condition": None},
    ),
    "budget": (
        {"tool": "budget-t", "cost": 0.75},
        {"scope": {"user": "alice"}, "limit": 1.0, "used": 0.0, "reserved": 0.75},
    ),
    "access": (
        {"tool": "access-t", "metadata": DESTRUCTIVE},
        {
            "scope": {},
            "used": None,
            "condition": "tool in ['access-t'] and destructive is True",
            "retry_after": None,
        },
    ),
    "args": (
        {"tool": "terminal", "args": {"command": SECRET}},
        {"scope": {}, "condition": "tool in ['terminal'] and args.command starts with 'rm -rf /'"},
    ),
    "loop": (
        {"tool": "poll", "args": {"job": SECRET}},
        {"limit": 1, "used": 1, "condition": None},
    ),
}


async def refusal(client: Any, call: dict[str, Any]) -> dict[str, Any]:
    """The second of two identical calls (a new call_id each): refused."""
    body: dict[str, Any] = {}
    for n in range(2):
        response = await client.post(
            "/v1/check", json={"user": "alice", "call_id": f"{call['tool']}-{n}"} | call
        )
        assert response.status_code == 200, response.text
        body = response.json()
    assert body["allowed"] is False, body
    return body


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Store:
    clock = FakeClock(1_700_000_000_000 + 17_345)
    if request.param == "memory":
        return MemoryStore(clock)
    return redis_store(request.getfixturevalue("redis_url"), clock)


@pytest.mark.parametrize("kind", list(CASES))
async def test_each_kind_of_refusal_carries_its_detail(store: Store, kind: str) -> None:
    call, wanted = CASES[kind]
    async with serving(build_app(POLICY, store)) as client:
        body = await refusal(client, call)
    [found] = body["violations"]
    assert body["message"] == found["message"]  # the sentence comes first, as before
    assert list(body)[:4] == ["decision", "allowed", "message", "call_id"]
    assert found["kind"] == (
        "access" if kind in ("access", "args") else kind.replace("loop", "rate")
    )
    for name, value in wanted.items():
        assert found[name] == value, (name, found)
    assert SECRET not in json.dumps(body)  # a pattern of the policy's, never the value


async def test_a_loop_rule_scopes_by_the_args_digest_not_their_value() -> None:
    async with serving(build_app(POLICY)) as client:
        body = await refusal(client, CASES["loop"][0])
    scope = body["violations"][0]["scope"]
    assert scope["user"] == "alice"
    assert scope["tool"] == "poll"
    assert len(scope["args"]) == 32
    assert SECRET not in scope["args"]


async def test_nothing_of_the_detail_is_on_an_allowed_call() -> None:
    async with serving(build_app(POLICY)) as client:
        response = await client.post("/v1/check", json={"user": "a", "tool": "rate-t"})
    body = response.json()
    assert body["allowed"]
    assert body["violations"] == []
    assert all("scope" not in limit for limit in body["limits"])


@pytest.mark.parametrize("kind", list(CASES))
async def test_the_hot_path_and_fastapi_write_the_same_detail(kind: str) -> None:
    call = CASES[kind][0]
    answers = []
    for hot in (True, False):
        async with serving(
            build_app(POLICY, MemoryStore(FakeClock(1_700_000_017_345)), hot=hot)
        ) as c:
            for n in range(2):
                response = await c.post(
                    "/v1/check", json={"user": "alice", "call_id": f"{call['tool']}-{n}"} | call
                )
            answers.append(normalised(response))
    assert answers[0] == answers[1]


@pytest.mark.parametrize("audit_args", [False, True])
async def test_denials_and_the_audit_line_carry_the_same_detail(
    audit_log: Path,  # noqa: F811 - the fixture imported above
    audit_args: bool,
) -> None:
    async with daemon(POLICY, audit_args=audit_args) as d:
        answers = {call["tool"]: await refusal(d.http, call) for call, _ in CASES.values()}
        denials = (await d.denials())[::-1]
    lines = audit_lines(audit_log)
    assert lines == denials
    by_call = {line["call_id"]: line for line in lines}
    for tool, answer in answers.items():  # the refused second call of each
        [detail], [sent] = by_call[f"{tool}-1"]["violations"], answer["violations"]
        scope = sent["scope"]
        if not audit_args and "args" in scope:  # its digest, hidden with the args
            scope = scope | {"args": HIDDEN}
        assert detail == {name: sent[name] for name in detail} | {"scope": scope}
    assert (SECRET in audit_log.read_text()) is audit_args


async def test_a_remembered_refusal_carries_the_same_detail(store: Store) -> None:
    """A rate refusal answered from the daemon's memory (engine/refusals.py), not the store."""
    call = CASES["rate"][0]
    async with serving(build_app(POLICY, store)) as client:
        first = (await refusal(client, call))["violations"][0]
        again = await client.post("/v1/check", json={"user": "alice", "call_id": "c9"} | call)
    [found] = again.json()["violations"]
    assert (found["scope"], found["used"], found["limit"]) == (first["scope"], 1, 1)


@pytest.mark.parametrize("kind", ["rate", "concurrency", "args", "loop"])
async def test_a_hook_refusal_carries_the_detail_and_its_line(store: Store, kind: str) -> None:
    """`/v1/hooks/HOST/decision` answers a refusal as a check does (`retry_after`,
    `violations`) and words it in one line for the host's user (`detail`)."""
    call, wanted = CASES[kind]
    event = {name: value for name, value in call.items() if name != "metadata"}
    async with serving(build_app(POLICY, store)) as client:
        for n in range(2):
            answer = await client.post(
                "/v1/hooks/claude-code/decision",
                json={"user": "alice", "call_id": f"{kind}-{n}"} | event,
            )
            assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["decision"] == "deny"
    [found] = body["violations"]
    assert found["message"] == body["message"]
    for name, value in wanted.items():
        assert found[name] == value, (name, found)
    assert body["retry_after"] == found["retry_after"]
    line = body["detail"]
    assert line.startswith(f"ratewarden: rule {found['rule']} ({found['kind']}) refused the call")
    assert ("user=alice" in line) is ("user" in found["scope"])
    assert (f"{found['used']} of {found['limit']} used" in line) is (found["used"] is not None)
    assert (found["condition"] or "") in line
    assert "\n" not in line
    assert SECRET not in json.dumps(body)


async def test_an_allowed_hook_call_carries_no_detail() -> None:
    async with serving(build_app(POLICY)) as client:
        answer = await client.post(
            "/v1/hooks/claude-code/decision", json={"user": "alice", "tool": "rate-t"}
        )
    assert answer.json() == {
        "decision": "allow",
        "message": "",
        "notes": [],
        "retry_after": None,
        "violations": [],
        "detail": "",
    }


async def test_claude_codes_http_hook_shows_the_detail_to_the_user_only() -> None:
    """Claude Code's own answer: the sentence is the model's reason, the detail its
    `systemMessage` (shown to the user)."""
    payload = {
        "session_id": "s-1",
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": SECRET},
        "tool_use_id": "toolu_1",
    }
    async with serving(build_app(POLICY)) as client:
        answer = await client.post("/v1/hooks/claude-code?user=alice", content=json.dumps(payload))
    body = answer.json()
    reason = body["hookSpecificOutput"]["permissionDecisionReason"]
    assert reason == "Refusing to delete the root directory"
    assert body["systemMessage"] == (
        "ratewarden: rule no-root-delete (access) refused the call; it applies when "
        "tool in ['terminal'] and args.command starts with 'rm -rf /'"
    )
    assert SECRET not in answer.text
