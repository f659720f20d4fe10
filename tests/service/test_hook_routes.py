"""The daemon's hook routes (service/hooks.py): a host's own HTTP hook answered in its own
terms, and the decisions the command hook asks for. In process, on the memory store;
tests/hosts/test_host_claude_code.py drives the real Claude Code CLI's HTTP hook."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from ratewarden.wire.tools import canonical
from tests.helpers.app import assert_error_shape, build_app, serving

POLICY = """\
version: 1
rules:
  - name: bash-per-minute
    match: {tool: Bash}
    per: [user]
    rate: 3/minute
  - name: bash-one-at-a-time
    match: {tool: Bash}
    per: [user]
    concurrency: 1
  - name: read-per-minute
    match: {tool: Read}
    per: [user]
    rate: 3/minute
  - name: deploy-asks
    match: {tool: deploy}
    ask: "Deploys need a human"
  - name: no-root-rm
    match: {tool: Bash, args: {command: {prefix: "rm -rf /"}}}
    deny: "Refusing to delete the root directory"
"""
# The policy names Claude Code's own tools (`Bash`, `Read`): its rules still match them,
# and the messages name the canonical tools the daemon maps them to (wire/tools.py).
RATE = "Rate limit: max 3 terminal calls per minute"
READ_RATE = "Rate limit: max 3 read_file calls per minute"  # a tool without a concurrency cap


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with serving(build_app(POLICY)) as client:
        yield client


def claude(event: str, tool: str, tool_use_id: str, **tool_input: Any) -> dict[str, Any]:
    return {
        "hook_event_name": event,
        "tool_name": tool,
        "tool_input": tool_input,
        "tool_use_id": tool_use_id,
        "session_id": "s1",
    }


async def claude_hook(client: httpx.AsyncClient, payload: object, query: str) -> httpx.Response:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return await client.post(f"/v1/hooks/claude-code?{query}", content=body)


def permission(answer: httpx.Response) -> tuple[str, str]:
    output = answer.json()["hookSpecificOutput"]
    assert output["hookEventName"] == "PreToolUse"
    return output["permissionDecision"], output["permissionDecisionReason"]


async def test_claude_code_http_hook_allows_with_an_empty_200_and_denies_in_its_json(
    client: httpx.AsyncClient,
) -> None:
    for n in range(3):
        pre = await claude_hook(
            client, claude("PreToolUse", "Bash", f"t{n}", command="ls"), "user=a"
        )
        # Allowed: an empty 2xx, never an explicit "allow" (it would skip the user's prompt).
        assert (pre.status_code, pre.content) == (200, b"")
        post = await claude_hook(client, claude("PostToolUse", "Bash", f"t{n}"), "user=a")
        assert (post.status_code, post.content) == (200, b"")  # settled: the slot is free
    refused = await claude_hook(client, claude("PreToolUse", "Bash", "t3", command="ls"), "user=a")
    assert refused.status_code == 200
    decision, reason = permission(refused)
    assert decision == "deny"
    assert reason.startswith(RATE)
    other = await claude_hook(client, claude("PreToolUse", "Bash", "u0", command="ls"), "user=b")
    assert other.content == b""  # another user's own counter


async def test_claude_code_http_hook_asks_and_reads_args_when_the_policy_does(
    client: httpx.AsyncClient,
) -> None:
    asked = await claude_hook(client, claude("PreToolUse", "deploy", "d1"), "user=a")
    assert permission(asked) == ("ask", "Deploys need a human")
    root = claude("PreToolUse", "Bash", "r1", command="rm -rf / --no-preserve-root")
    assert permission(await claude_hook(client, root, "user=a")) == (
        "deny",
        "Refusing to delete the root directory",
    )


async def test_an_unsettled_call_holds_its_slot_until_its_post_hook(
    client: httpx.AsyncClient,
) -> None:
    first = await claude_hook(client, claude("PreToolUse", "Bash", "c1", command="ls"), "user=c")
    assert first.content == b""
    held = await claude_hook(client, claude("PreToolUse", "Bash", "c2", command="ls"), "user=c")
    assert permission(held)[0] == "deny"  # one at a time: c1 still runs
    await claude_hook(client, claude("PostToolUseFailure", "Bash", "c1"), "user=c")
    freed = await claude_hook(client, claude("PreToolUse", "Bash", "c3", command="ls"), "user=c")
    assert freed.content == b""


async def test_a_reused_tool_use_id_is_checked_again_as_a_new_call(
    client: httpx.AsyncClient,
) -> None:
    """The daemon replays an allowed id without counting it: a host reusing ids (after
    settle, or before) must not get free calls."""
    for n in range(3):
        same = await claude_hook(client, claude("PreToolUse", "Read", "same"), "user=r")
        assert same.content == b"", n
        if n == 1:  # replayed before its settle (n=1) and after it (n=2): counted each time
            await claude_hook(client, claude("PostToolUse", "Read", "same"), "user=r")
    fourth = await claude_hook(client, claude("PreToolUse", "Read", "same"), "user=r")
    assert permission(fourth)[1].startswith(READ_RATE)


async def test_an_unreadable_payload_is_a_hook_error_open_and_a_deny_closed(
    client: httpx.AsyncClient,
) -> None:
    opened = await claude_hook(client, b"not json", "user=a")
    # Claude Code takes a non-2xx answer as a non-blocking error: the call runs.
    assert opened.status_code == 400
    assert "failing open" in opened.text
    closed = await claude_hook(client, b"not json", "user=a&fail=closed")
    decision, reason = permission(closed)
    assert decision == "deny"
    assert "cannot read the claude-code hook input" in reason
    no_tool = await claude_hook(client, {"hook_event_name": "PreToolUse"}, "user=a&fail=closed")
    assert "no tool name" in permission(no_tool)[1]


async def test_other_events_and_unknown_calls_answer_nothing(client: httpx.AsyncClient) -> None:
    session = {"hook_event_name": "SessionStart", "session_id": "s"}
    assert (await claude_hook(client, session, "user=a")).content == b""
    unknown = await claude_hook(client, claude("PostToolUse", "Bash", "never-checked"), "user=a")
    assert (unknown.status_code, unknown.content) == (200, b"")


async def test_agent_code_http_hook_vetoes_with_a_403_and_one_line(
    client: httpx.AsyncClient,
) -> None:
    body = json.dumps({"command": "ls"}).encode()
    # agent-code names no call, so its calls are never settled: a tool without a cap.
    url = "/v1/hooks/agent-code?user=ac&tool=Read&event=pre_tool_use"
    for n in range(3):
        allowed = await client.post(url, content=body)
        assert (allowed.status_code, allowed.content) == (200, b""), n
    vetoed = await client.post(url, content=body)
    assert vetoed.status_code == 403
    read = canonical("agent-code", "Read").tool  # as the host table names it
    assert vetoed.text.startswith(f"Rate limit: max 3 {read} calls per minute")
    assert "\n" not in vetoed.text  # agent-code reads the first line only
    # The URL must name what agent-code keeps out of its payload: a 422 (a veto to
    # agent-code) naming it, never a silent allow.
    for query, field in (
        ("user=ac&event=pre_tool_use", "query.tool"),
        ("user=ac&tool=Read", "query.event"),
    ):
        missing = await client.post(f"/v1/hooks/agent-code?{query}", content=body)
        assert missing.status_code == 422
        assert missing.json()["fields"][0]["field"] == field
    post_event = "/v1/hooks/agent-code?user=ac&tool=Read&event=post_tool_use"
    other_event = await client.post(post_event, content=body)
    assert (other_event.status_code, other_event.content) == (200, b"")


async def test_the_native_route_needs_a_user_a_known_host_and_a_valid_fail(
    client: httpx.AsyncClient,
) -> None:
    pre = json.dumps(claude("PreToolUse", "Bash", "x", command="ls")).encode()
    no_user = await client.post("/v1/hooks/claude-code", content=pre)
    assert no_user.status_code == 422
    assert_error_shape(no_user.json())
    assert no_user.json()["fields"][0]["field"] == "query.user"
    unknown = await client.post("/v1/hooks/vscode?user=a", content=pre)
    assert unknown.status_code == 404
    assert unknown.json()["fields"][0]["field"] == "host"
    no_http = await client.post("/v1/hooks/hermes?user=a", content=pre)  # command hooks only
    assert no_http.status_code == 404
    bad_fail = await client.post("/v1/hooks/claude-code?user=a&fail=maybe", content=pre)
    assert bad_fail.status_code == 422
    assert "fail" in bad_fail.text


async def test_the_decision_route_checks_and_settles_what_the_command_hook_read(
    client: httpx.AsyncClient,
) -> None:
    url = "/v1/hooks/claude-code/decision"
    for n in range(3):
        answer = await client.post(url, json={"user": "d", "tool": "Bash", "call_id": f"k{n}"})
        assert answer.json() == {
            "decision": "allow",
            "message": "",
            "notes": [],
            "retry_after": None,
            "violations": [],
            "detail": "",
        }
        done = await client.post(url, json={"user": "d", "call_id": f"k{n}", "finished": True})
        assert done.json()["notes"] == []
    refused = (await client.post(url, json={"user": "d", "tool": "Bash"})).json()
    assert refused["decision"] == "deny"
    assert refused["message"].startswith(RATE)
    # Names the API would refuse are mapped, not refused: a 300-character tool, a control
    # character in an id.
    odd = {"user": "d" * 300, "tool": "T" * 300, "call_id": "id\x07bell"}
    assert (await client.post(url, json=odd)).json()["decision"] == "allow"
    unknown = (
        await client.post(url, json={"user": "d", "call_id": "nope", "finished": True})
    ).json()
    assert unknown["notes"][0].startswith("could not settle nope")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"tool": "Bash"}, "user"),
        ({"user": "u"}, "tool"),
        ({"user": "u", "finished": True}, "call_id"),
        ({"user": "u", "tool": "Bash", "extra": 1}, "extra"),
        ({"user": "", "tool": "Bash"}, "user"),
        ({"user": "u", "tool": "Bash", "duration_ms": -1, "finished": True}, "duration_ms"),
        ({"user": "u" * 5000, "tool": "Bash"}, "user"),
    ],
)
async def test_the_decision_route_names_the_field_it_refuses(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    answer = await client.post("/v1/hooks/claude-code/decision", json=body)
    assert answer.status_code == 422
    assert_error_shape(answer.json())
    assert any(field in error["field"] for error in answer.json()["fields"]), answer.json()


async def test_hook_routes_need_the_check_role() -> None:
    app = build_app(POLICY, api_tokens=["check-token"])
    pre = json.dumps(claude("PreToolUse", "Bash", "x", command="ls")).encode()
    async with serving(app) as client:
        anonymous = await client.post("/v1/hooks/claude-code?user=a", content=pre)
        assert anonymous.status_code == 401
        decision = await client.post(
            "/v1/hooks/claude-code/decision", json={"user": "a", "tool": "Bash"}
        )
        assert decision.status_code == 401
        authorized = await client.post(
            "/v1/hooks/claude-code?user=a",
            content=pre,
            headers={"authorization": "Bearer check-token"},
        )
        assert (authorized.status_code, authorized.content) == (200, b"")


async def test_a_large_payload_is_read_up_to_the_hook_cap_and_refused_past_it() -> None:
    """A host posts the tool's whole input: a 1 MiB file to write is checked (past the
    API's 256 KiB), one past RATEWARDEN_MAX_HOOK_BODY_BYTES is refused in the host's own
    form naming it (a host runs the call on a 413: issue 25), and a payload of too many
    items is refused unread, whatever the fail mode."""
    app = build_app(POLICY, max_hook_body_bytes=2 * 1024 * 1024)
    async with serving(app) as client:
        big = claude("PreToolUse", "Write", "w1", file_path="/tmp/x", content="x" * 1024 * 1024)
        allowed = await claude_hook(client, big, "user=w")
        assert (allowed.status_code, allowed.content) == (200, b"")
        huge = claude("PreToolUse", "Write", "w2", content="x" * 3 * 1024 * 1024)
        refused = await claude_hook(client, huge, "user=w")
        assert refused.status_code == 200
        decision, reason = permission(refused)
        assert decision == "deny"
        assert reason.startswith("Tool call refused: its input is too large to check")
        assert "RATEWARDEN_MAX_HOOK_BODY_BYTES" in reason
        # The command hook's route keeps the API's cap: its args are capped by the hook.
        event = {"user": "w", "tool": "Write", "args": "x" * 300 * 1024}
        capped = await client.post("/v1/hooks/claude-code/decision", json=event)
        assert capped.status_code == 413
        assert "RATEWARDEN_MAX_BODY_BYTES" in capped.text
        many = claude("PreToolUse", "Write", "w3", items=[[]] * 5000)
        for fail in ("open", "closed"):
            unread = await claude_hook(client, many, f"user=w&fail={fail}")
            assert permission(unread)[0] == "deny"
            assert "more than 4000 items" in permission(unread)[1]


HOOK_REQUESTS: list[tuple[str, bytes]] = [
    ("claude-code?user=a", json.dumps(claude("PreToolUse", "Read", "r1")).encode()),
    (
        "claude-code?user=a",
        json.dumps(claude("PreToolUse", "Bash", "b1", command="rm -rf /")).encode(),
    ),
    ("claude-code?user=a", json.dumps(claude("PreToolUse", "deploy", "d1")).encode()),
    ("claude-code?user=a", json.dumps(claude("PostToolUse", "Read", "r1")).encode()),
    ("claude-code?user=a&fail=closed", b"not json"),
    ("claude-code?user=a", b"not json"),
    ("claude-code?user=a", json.dumps(claude("PreToolUse", "Read", "r2", k=[[]] * 5000)).encode()),
    ("claude-code?user=a&team=t", json.dumps(claude("Stop", "Read", "r3")).encode()),
    ("claude-code", json.dumps(claude("PreToolUse", "Read", "r4")).encode()),
    ("claude-code?user=", json.dumps(claude("PreToolUse", "Read", "r5")).encode()),
    ("claude-code?user=" + "u" * 4097, json.dumps(claude("PreToolUse", "Read", "r6")).encode()),
    ("claude-code?user=a&user=b", json.dumps(claude("PreToolUse", "Read", "r7")).encode()),
    ("claude-code?user=a&fail=sometimes", json.dumps(claude("PreToolUse", "Read", "r8")).encode()),
    ("nobody?user=a", b"{}"),
    ("codex?user=a", b"{}"),  # a command hook only
    ("agent-code?user=a&tool=Bash&event=pre_tool_use", b'{"command": "rm -rf /"}'),
    ("agent-code?user=a&event=pre_tool_use", b'{"command": "ls"}'),
]


async def test_the_hot_path_answers_a_hook_exactly_as_fastapi_does() -> None:
    """Issue 25 item 6: `POST /v1/hooks/{host}` is served in front of FastAPI (its routing
    cost a small payload several normal checks); every answer, refusals of the query
    included, is the one the FastAPI route gives."""
    answers: dict[bool, list[tuple[int, str, bytes]]] = {}
    for hot in (True, False):
        async with serving(build_app(POLICY, hot=hot)) as client:
            answers[hot] = []
            for query, body in HOOK_REQUESTS:
                answer = await client.post(f"/v1/hooks/{query}", content=body)
                kind = answer.headers.get("content-type", "")
                answers[hot].append((answer.status_code, kind, answer.content))
    for request, front, stack in zip(HOOK_REQUESTS, answers[True], answers[False], strict=True):
        assert front == stack, request[0]
