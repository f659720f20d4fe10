"""Issue #29 item 2: the post-call hooks of the hosts that pass the tool's result send its
digest with the settle; the hosts that pass none (Gemini CLI's AfterTool names no call,
agent-code's post_tool_use carries no result) settle nothing and count identical calls
only.

`ratewarden hook HOST` runs in process (hooks.command.run) on payloads as each host
sends them; what it POSTs to the daemon is captured at its one HTTP exchange. The daemon
side is the real app in process, with Engine.settle recording the digest it is given.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ratewarden.arguments import result_digest
from ratewarden.engine.engine import Engine
from ratewarden.hooks import command
from ratewarden.hooks.command import HookOptions
from ratewarden.hooks.hosts import HOSTS
from ratewarden.http import exchange
from tests.helpers.app import build_app, serving

OPTIONS = HookOptions(user="u", url="http://daemon.test")
BASH = {"tool_name": "Bash", "tool_input": {"command": "gh run view 7"}}

CLAUDE_RESPONSE = {"stdout": "CI run 7: running\n", "stderr": "", "interrupted": False}
CLAUDE_POST = {
    **BASH,
    "hook_event_name": "PostToolUse",
    "session_id": "sess-1",
    "tool_use_id": "toolu_01",
    "tool_response": CLAUDE_RESPONSE,
    "duration_ms": 41,
}
CODEX_RESPONSE = "CI run 7: running\n"
CODEX_POST = {
    **BASH,
    "hook_event_name": "PostToolUse",
    "session_id": "sess-2",
    "turn_id": "turn-1",
    "tool_use_id": "call_0",
    "cwd": "/work",
    "tool_response": CODEX_RESPONSE,
}
CURSOR_OUTPUT = json.dumps({"exitCode": 0, "stdout": "CI run 7: running\n"})
CURSOR_POST = {
    "hook_event_name": "postToolUse",
    "conversation_id": "c0ffee00",
    "session_id": "c0ffee00",
    "tool_name": "Shell",
    "tool_input": {"command": "gh run view 7", "cwd": "/work"},
    "tool_use_id": "toolu_02",
    "tool_output": CURSOR_OUTPUT,
    "duration": 12.5,
}
HERMES_RESULT = json.dumps({"output": "CI run 7: running", "exit_code": 0})
HERMES_POST: dict[str, Any] = {
    "hook_event_name": "post_tool_call",
    "tool_name": "terminal",
    "tool_input": {"command": "gh run view 7"},
    "session_id": "sess-h",
    "cwd": "/tmp",
    "extra": {
        "tool_call_id": "call_0",
        "api_request_id": "turn-1:api:0",
        "status": "ok",
        "duration_ms": 30,
        "result": HERMES_RESULT,
    },
}
WITH_RESULT: dict[str, tuple[dict[str, Any], Any]] = {
    "claude-code": (CLAUDE_POST, CLAUDE_RESPONSE),
    "codex": (CODEX_POST, CODEX_RESPONSE),
    "cursor": (CURSOR_POST, CURSOR_OUTPUT),
    "hermes": (HERMES_POST, HERMES_RESULT),
}


def _without(payload: dict[str, Any], key: str, **changes: Any) -> dict[str, Any]:
    return {**{k: v for k, v in payload.items() if k != key}, **changes}


WITHOUT_RESULT: dict[str, dict[str, Any]] = {  # a post-call event whose payload shows no result
    "claude-code": _without(
        CLAUDE_POST, "tool_response", hook_event_name="PostToolUseFailure", error="exit 1"
    ),
    "cursor": _without(
        CURSOR_POST, "tool_output", hook_event_name="postToolUseFailure", failure_type="error"
    ),
    "hermes": {
        **HERMES_POST,
        "extra": {**HERMES_POST["extra"], "status": "blocked", "result": '{"error": "no"}'},
    },
}


@pytest.fixture
def posted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """What the hook POSTs to the daemon (path, body), answered allow."""
    sent: list[tuple[str, dict[str, Any]]] = []

    def post(url: str, path: str, body: bytes, token: Any, timeout: float) -> tuple[int, bytes]:
        sent.append((path, json.loads(body)))
        return 200, b'{"decision": "allow"}'

    monkeypatch.setattr(exchange, "post", post)
    return sent


def hook(host: str, payload: dict[str, Any], environ: dict[str, str] | None = None) -> None:
    output = command.run(HOSTS[host], OPTIONS, json.dumps(payload).encode(), environ or {})
    assert output.code == 0, output


@pytest.mark.parametrize("host", sorted(WITH_RESULT))
def test_a_post_call_hook_settles_with_the_results_digest(
    host: str, posted: list[tuple[str, dict[str, Any]]]
) -> None:
    payload, result = WITH_RESULT[host]
    hook(host, payload)
    [(path, body)] = posted
    assert path == f"/v1/hooks/{host}/decision"
    assert body["finished"] is True
    assert body["result_digest"] == result_digest(result)
    assert json.dumps(result) not in json.dumps(body)  # the digest travels, never the result


@pytest.mark.parametrize("host", sorted(WITHOUT_RESULT))
def test_a_post_call_without_a_result_settles_without_a_digest(
    host: str, posted: list[tuple[str, dict[str, Any]]]
) -> None:
    hook(host, WITHOUT_RESULT[host])
    [(_, body)] = posted
    assert body["finished"] is True
    assert "result_digest" not in body


def test_the_same_output_digests_alike_and_a_changed_one_apart(
    posted: list[tuple[str, dict[str, Any]]],
) -> None:
    changed = {**CLAUDE_RESPONSE, "stdout": "CI run 7: passed\n"}
    for response in (CLAUDE_RESPONSE, CLAUDE_RESPONSE, changed):
        hook("claude-code", {**CLAUDE_POST, "tool_response": response})
    first, again, other = (body["result_digest"] for _, body in posted)
    assert first == again != other


@pytest.mark.parametrize(
    ("tool", "response", "timing"),
    [
        ("WebFetch", {"bytes": 120, "code": 200, "codeText": "OK", "result": "run 7: running",
                      "url": "https://ci.test/runs/7"}, "durationMs"),
        ("WebSearch", {"query": "run 7", "results": ["run 7: running"], "searchCount": 1},
         "durationSeconds"),
        ("Glob", {"filenames": ["out/run-7.log"], "numFiles": 1, "truncated": False},
         "durationMs"),
        ("Task", {"content": [{"type": "text", "text": "running"}]}, "totalDurationMs"),
    ],
)  # fmt: skip
def test_claude_codes_own_timing_of_a_call_is_not_its_result(
    posted: list[tuple[str, dict[str, Any]]], tool: str, response: dict[str, Any], timing: str
) -> None:
    """Claude Code's tool_response says how long some tools took (WebFetch's and Glob's
    `durationMs`, WebSearch's `durationSeconds`, Task's `totalDurationMs`): a poll whose
    answer is the same and whose timing differs is the same result."""
    changed = {**response, "bytes" if tool == "WebFetch" else "changed": 121}
    for body, took in ((response, 830), (response, 412), (changed, 830)):
        payload = {**CLAUDE_POST, "tool_name": tool, "tool_response": {**body, timing: took}}
        hook("claude-code", payload)
    first, again, other = (body["result_digest"] for _, body in posted)
    assert first == again != other


@pytest.mark.parametrize(
    ("host", "payload", "environ"),
    [
        ("gemini", {**BASH, "hook_event_name": "AfterTool", "tool_response": {"llmContent": "x"}},
         {}),
        ("agent-code", {"tool": "Bash", "is_error": False},
         {"AGENT_CODE_HOOK_EVENT": "post_tool_use", "AGENT_CODE_HOOK_TOOL": "Bash"}),
    ],
)  # fmt: skip
def test_hosts_whose_post_call_names_no_call_settle_nothing(
    host: str,
    payload: dict[str, Any],
    environ: dict[str, str],
    posted: list[tuple[str, dict[str, Any]]],
) -> None:
    hook(host, payload, environ)
    assert posted == []  # their loop rules count identical calls only (docs/integrations.md)


# -- the daemon side: the digest reaches Engine.settle -----------------------------------------

POLICY = """\
version: 1
rules:
  - name: one-at-a-time
    match: {tool: Bash}
    concurrency: 1
"""


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> list[str | None]:
    """The result digest of every Engine.settle, in order."""
    digests: list[str | None] = []
    original = Engine.settle

    async def settle(self: Engine, *args: Any, **kwargs: Any) -> Any:
        digests.append(kwargs.get("result_digest", args[3] if len(args) > 3 else None))
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "settle", settle)
    return digests


@pytest.fixture
async def daemon() -> AsyncIterator[Any]:
    async with serving(build_app(POLICY)) as http:
        yield http


async def test_the_hooks_settle_reaches_the_engine_with_its_digest(
    posted: list[tuple[str, dict[str, Any]]], settled: list[str | None], daemon: Any
) -> None:
    hook("claude-code", CLAUDE_POST)
    [(path, body)] = posted
    answer = await daemon.post(path, json=body)
    assert answer.status_code == 200, answer.text
    assert settled == [result_digest(CLAUDE_RESPONSE)]


async def test_claude_codes_http_hook_settles_with_its_digest(
    settled: list[str | None], daemon: Any
) -> None:
    """Claude Code's `http` hook posts its own payload to the daemon, which reads it."""
    answer = await daemon.post("/v1/hooks/claude-code", params={"user": "u"}, json=CLAUDE_POST)
    assert answer.status_code == 200, answer.text
    assert settled == [result_digest(CLAUDE_RESPONSE)]
