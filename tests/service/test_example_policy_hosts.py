"""The packaged example policy protects every coding agent out of the box: each host's
hook payload, in the host's own shape (its tool name, its arguments: Codex's argv
command too), read by that host's hook as `ratewarden hook HOST` reads it, is refused
`rm -rf /` by the example's `no-root-delete`, and the shell calls of one user from all
hosts share the example's one `terminal-per-minute` counter (docs/integrations.md, "One
name per tool"). The real hosts run the same in tests/hosts/test_one_name_across_hosts.py.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import httpx
import pytest

from ratewarden.hooks.contract import PreCall
from ratewarden.hooks.hosts import HOSTS
from tests.helpers.app import build_app, serving

EXAMPLE = (resources.files("ratewarden.policy") / "example.yaml").read_text()
ROOT_DELETE = "Refusing to delete the root directory"
RATE = "Rate limit: max 10 terminal calls per minute"


def payload(host: str, command: Any, n: int = 0) -> tuple[bytes, dict[str, str]]:
    """A shell call's hook payload as `host` sends it (tests/hosts/ and docs), and the
    hook's environment."""
    if host == "agent-code":  # stdin is the tool's input; the tool is in the environment
        context = {"AGENT_CODE_HOOK_EVENT": "pre_tool_use", "AGENT_CODE_HOOK_TOOL": "Bash"}
        return json.dumps({"command": command, "timeout": 120000}).encode(), context
    shapes: dict[str, dict[str, Any]] = {
        "claude-code": {
            "hook_event_name": "PreToolUse",
            "tool_name": "Bash",
            "tool_input": {"command": command, "description": "run it"},
            "tool_use_id": f"toolu_{n}",
            "session_id": "s",
        },
        "codex": {
            "hook_event_name": "PreToolUse",
            "tool_name": "Bash",
            "tool_input": {"command": command},
            "tool_use_id": f"call_{n}",
            "session_id": "s",
            "turn_id": "t",
        },
        "gemini": {
            "hook_event_name": "BeforeTool",
            "tool_name": "run_shell_command",
            "tool_input": {"command": command, "description": "run it"},
            "session_id": "s",
        },
        "cursor": {
            "hook_event_name": "preToolUse",
            "tool_name": "Shell",
            "tool_input": {"command": command, "cwd": "/w"},
            "tool_use_id": f"tool_{n}",
            "conversation_id": "c",
            "user_email": None,
        },
        "hermes": {
            "hook_event_name": "pre_tool_call",
            "tool_name": "terminal",
            "tool_input": {"command": command},
            "session_id": "s",
            "extra": {"tool_call_id": f"call_{n}", "api_request_id": f"r:api:{n}"},
        },
    }
    return json.dumps(shapes[host]).encode(), {}


async def decide(client: httpx.AsyncClient, host: str, command: Any, n: int = 0) -> Any:
    """What the daemon answers `ratewarden hook HOST` for the call it read."""
    body, context = payload(host, command, n)
    event = HOSTS[host].read(body, context)
    assert isinstance(event, PreCall)
    sent = {"user": "alice", "tool": event.tool, "args": event.args, "session": event.session}
    if isinstance(event.args, bytes):  # agent-code's stdin, sent as JSON text
        sent["args"] = json.loads(event.args)
    answer = await client.post(f"/v1/hooks/{host}/decision", json=sent)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.parametrize("host", sorted(HOSTS))
@pytest.mark.parametrize(
    "command",
    ["rm -rf /", "sudo rm -rf /*", "cd /tmp && /bin/rm -fr '/'", ["bash", "-lc", "rm -rf /"]],
)
async def test_the_example_refuses_a_root_delete_from_every_host(host: str, command: Any) -> None:
    async with serving(build_app(EXAMPLE)) as client:
        refused = await decide(client, host, command)
    assert (refused["decision"], refused["message"]) == ("deny", ROOT_DELETE)


async def test_the_example_counts_every_hosts_shell_calls_on_one_counter() -> None:
    hosts = sorted(HOSTS)
    async with serving(build_app(EXAMPLE)) as client:
        for n in range(10):
            host = hosts[n % len(hosts)]
            allowed = await decide(client, host, f"echo {n}", n)
            assert allowed["decision"] == "allow", (host, allowed)
        for host in hosts:  # the eleventh, from whichever host
            refused = await decide(client, host, "echo eleven", 99)
            assert refused["decision"] == "deny"
            assert refused["message"].startswith(RATE)
        still = await decide(client, "claude-code", "ls /tmp/build")
        assert still["decision"] == "deny"  # the same counter, whoever asks
