"""Issue 25 item 1 through the paths real agents use: a `rm -rf /` padded past the wire's
caps is refused by every command hook (each host's payload, a real `ratewarden hook`
process), both HTTP hooks and the in-process adapters, against a real `ratewarden serve`.

On cfe3e0b each path left the arguments out and the daemon decided the call as one with
none, so the rule on `command` did not match: allowed, even with `--fail closed`. The MCP
proxy and gateway are driven by the `mcp` SDK's client in tests/hosts/test_mcp_*.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from ratewarden.arguments import read_json
from ratewarden.client import AsyncGuard, Guard
from ratewarden.service.settings import Settings
from ratewarden.vocabulary import TOO_LARGE
from ratewarden.wire.bounded import TooManyItems
from tests.helpers.hostenv import Daemon, clean_environment, running_daemon
from tests.helpers.sdk_stand_ins import (
    ToolDecision,
    ToolGuardrail,
    ToolGuardrailFunctionOutput,
    ToolPermissionResult,
    stand_in,
)

RATEWARDEN = Path(sys.executable).with_name("ratewarden")  # the installed console script
ROOT_DELETE = "Refusing destructive root delete"
HOOK_CAP = int(Settings.model_fields["max_hook_body_bytes"].default)
SHELLS = ["Bash", "terminal", "run_shell_command", "Shell"]  # each host's own name
POLICY = f"""\
version: 1
rules:
  - name: no-root-delete
    match:
      tool: {json.dumps(SHELLS)}
      args: {{command: {{regex: '\\brm\\s+-rf\\s+/'}}}}
    deny: "{ROOT_DELETE}"
"""


def nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


# Each padding as the JSON text of the tool input a host hands over.
PADDINGS = {
    "over 64 KiB": '{"command": "rm -rf /", "pad": "%s"}' % ("x" * 70_000),
    "deeper than 32 levels": f'{{"command": "rm -rf /", "deep": {nested(40)}}}',
    # Deeper than Python's own JSON reader goes (a host's, such as Node's, reads it).
    "deeper than Python reads": f'{{"command": "rm -rf /", "deep": {nested(1_100)}}}',
    "more items than a body holds": f'{{"command": "rm -rf /", "many": {list(range(5_000))}}}',
    "1e400": '{"command": "rm -rf /", "n": 1e400}',
    "an integer past 4300 digits": '{"command": "rm -rf /", "n": %s}' % ("9" * 5_000),
    "strings of escapes": '{{"command": "rm -rf /", "e": {}}}'.format(
        json.dumps(["\x01" * 100] * 3_900)
    ),
}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(POLICY, tmp_path_factory.mktemp("hole-args")) as served:
        yield served


def payload(host: str, tool_input: str) -> str:
    """A pre-tool event of `host` whose tool input is `tool_input` (JSON text, inlined)."""
    call = uuid.uuid4().hex
    fields: object = {
        "claude-code": {"hook_event_name": "PreToolUse", "tool_name": "Bash",
                        "session_id": "s", "tool_use_id": f"toolu_{call}"},
        "codex": {"hook_event_name": "PreToolUse", "tool_name": "Bash", "session_id": "s",
                  "turn_id": "t", "tool_use_id": f"call_{call}"},
        "gemini": {"hook_event_name": "BeforeTool", "tool_name": "run_shell_command",
                   "session_id": "s"},
        "cursor": {"hook_event_name": "preToolUse", "tool_name": "Shell",
                   "conversation_id": "s", "tool_use_id": call},
        "hermes": {"hook_event_name": "pre_tool_call", "tool_name": "terminal",
                   "session_id": "s", "extra": {"tool_call_id": call}},
    }[host]  # fmt: skip
    return json.dumps(fields)[:-1] + f', "tool_input": {tool_input}}}'


def run_hook(host: str, tool_input: str, daemon: Daemon, *flags: str) -> str:
    """The hook's whole output, as its host would read it (stdout, stderr, exit code)."""
    if host == "agent-code":  # stdin is the tool's input; the tool name is in the environment
        stdin = tool_input
        env = clean_environment(AGENT_CODE_HOOK_EVENT="pre_tool_use", AGENT_CODE_HOOK_TOOL="Bash")
    else:
        stdin, env = payload(host, tool_input), clean_environment()
    done = subprocess.run(
        [str(RATEWARDEN), "hook", host, "--url", daemon.url, "--user", "u", *flags],
        input=stdin, capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    return f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"


HOSTS = ["claude-code", "codex", "gemini", "cursor", "hermes", "agent-code"]


@pytest.mark.parametrize("name", sorted(PADDINGS))
@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.slow
def test_every_command_hook_refuses_a_padded_root_delete(
    daemon: Daemon, host: str, name: str
) -> None:
    for flags in ((), ("--fail", "closed")):
        said = run_hook(host, PADDINGS[name], daemon, *flags)
        assert ROOT_DELETE in said, (flags, said[:500])


@pytest.mark.parametrize("host", HOSTS)
def test_a_harmless_command_padded_alike_runs(daemon: Daemon, host: str) -> None:
    said = run_hook(host, PADDINGS["over 64 KiB"].replace("rm -rf /", "ls -la"), daemon)
    assert ROOT_DELETE not in said, said[:500]
    assert said.startswith("exit 0"), said[:500]


@pytest.mark.parametrize("name", sorted(PADDINGS))
def test_the_http_hooks_refuse_a_padded_root_delete(daemon: Daemon, name: str) -> None:
    """With the rule's message; a body past the hook cap or of more items than any body may
    hold is refused unread (reading it would cost the daemon more than a check), as too
    large to check."""
    tool_input = PADDINGS[name]
    refused = ROOT_DELETE
    if name == "more items than a body holds":
        refused = TOO_LARGE.format(reason=TooManyItems().args[0])
    elif len(payload("claude-code", tool_input)) > HOOK_CAP:
        refused = TOO_LARGE.format(
            reason=f"body larger than the {HOOK_CAP}-byte limit (RATEWARDEN_MAX_HOOK_BODY_BYTES)"
        )
    claude = httpx.post(
        f"{daemon.url}/v1/hooks/claude-code?user=u",
        content=payload("claude-code", tool_input),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert claude.status_code == 200
    answer = claude.json()["hookSpecificOutput"]
    assert (answer["permissionDecision"], answer["permissionDecisionReason"]) == (
        "deny",
        refused,
    )
    agent_code = httpx.post(
        f"{daemon.url}/v1/hooks/agent-code?user=u&tool=Bash&event=pre_tool_use",
        content=tool_input,
        timeout=30,
    )
    assert (agent_code.status_code, agent_code.text.strip()) == (403, refused)


# -- the in-process adapters, their frameworks stood in where not installed here ---------


def padded_args(name: str) -> Any:
    """The padding as the Python object a framework would hand over (1e400: infinity)."""
    return read_json(PADDINGS[name])


@pytest.mark.parametrize("name", sorted(PADDINGS))
def test_the_hermes_plugin_refuses_a_padded_root_delete(daemon: Daemon, name: str) -> None:
    from ratewarden.integrations.hermes import RatewardenPlugin

    plugin = RatewardenPlugin(guard=Guard(daemon.url), user=lambda hook: "u")
    try:
        blocked = plugin.pre_tool_call(
            tool_name="terminal", args=padded_args(name), tool_call_id="c", session_id="s"
        )
    finally:
        plugin.guard.close()
    assert blocked is not None
    assert blocked["message"] == ROOT_DELETE


@pytest.mark.parametrize("name", sorted(PADDINGS))
async def test_the_strands_hook_refuses_a_padded_root_delete(daemon: Daemon, name: str) -> None:
    from ratewarden.integrations.strands import RatewardenHook

    hook = RatewardenHook(guard=Guard(daemon.url))
    event = SimpleNamespace(
        cancel_tool=False,
        tool_use={"name": "terminal", "toolUseId": "t1", "input": padded_args(name)},
        invocation_state={"user_id": "u"},
        selected_tool=None,
    )
    try:
        await hook.before_tool_call(event)
    finally:
        hook.guard.close()
    assert event.cancel_tool == ROOT_DELETE


@pytest.mark.parametrize("name", sorted(PADDINGS))
async def test_the_pydantic_ai_middleware_refuses_a_padded_root_delete(
    daemon: Daemon, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in(
        monkeypatch,
        "pydantic_ai_middleware",
        ToolDecision=ToolDecision,
        ToolPermissionResult=ToolPermissionResult,
    )
    from ratewarden.integrations.pydantic_ai import RatewardenMiddleware

    guard = AsyncGuard(daemon.url)
    try:
        decided = await RatewardenMiddleware(guard).before_tool_call(
            "terminal", padded_args(name), {"user_id": "u"}, SimpleNamespace(tool_call_id="c")
        )
    finally:
        await guard.aclose()
    assert (decided.decision, decided.reason) == (ToolDecision.DENY, ROOT_DELETE)


@pytest.mark.parametrize("name", sorted(PADDINGS))
async def test_the_openai_agents_guardrail_refuses_a_padded_root_delete(
    daemon: Daemon, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK hands over the model's arguments as JSON text: `1e400` as written."""
    stand_in(
        monkeypatch,
        "agents",
        ToolGuardrailFunctionOutput=ToolGuardrailFunctionOutput,
        ToolInputGuardrail=ToolGuardrail,
    )
    from ratewarden.integrations.openai_agents import make_ratewarden_guardrail

    guard = AsyncGuard(daemon.url)
    context = SimpleNamespace(
        tool_name="terminal",
        tool_call_id="call_0",
        tool_arguments=PADDINGS[name],
        context={"user_id": "u"},
    )
    try:
        output = await make_ratewarden_guardrail(guard).guardrail_function(
            SimpleNamespace(context=context)
        )
    finally:
        await guard.aclose()
    assert not output.allowed
    assert output.message == ROOT_DELETE


def test_every_adapter_builds_its_check_with_names_check_request() -> None:
    """The guarantee the adapter tests above stand for: no integration builds a check of its
    own, so every one sends bounded arguments (`names.call_args`)."""
    integrations = Path(__file__).parents[2] / "src" / "ratewarden" / "integrations"
    for module in sorted(integrations.glob("*.py")):
        if module.name == "names.py":
            continue
        text = module.read_text()
        assert "CheckRequest(" not in text, module.name
        assert "args=" not in text or "check_request" in text or "check_call" in text, module.name


def test_a_hook_body_past_its_cap_is_refused_in_the_hosts_form(daemon: Daemon) -> None:
    """On cfe3e0b a body past RATEWARDEN_MAX_HOOK_BODY_BYTES was a 413, and a host runs the
    call on any answer but its refusal: padding past the cap ran `rm -rf /` unchecked."""
    huge = '{"command": "rm -rf /", "pad": "%s"}' % ("x" * 5 * 1024 * 1024)
    claude = httpx.post(
        f"{daemon.url}/v1/hooks/claude-code?user=u",
        content=payload("claude-code", huge),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert claude.status_code == 200
    answer = claude.json()["hookSpecificOutput"]
    assert answer["permissionDecision"] == "deny"
    assert "RATEWARDEN_MAX_HOOK_BODY_BYTES" in answer["permissionDecisionReason"]
    agent_code = httpx.post(
        f"{daemon.url}/v1/hooks/agent-code?user=u&tool=Bash&event=pre_tool_use",
        content=huge,
        timeout=30,
    )
    assert agent_code.status_code == 403
    assert agent_code.text.startswith("Tool call refused: its input is too large to check")


def test_the_api_takes_args_cut_and_it_can_only_make_a_decision_stricter(daemon: Daemon) -> None:
    def check(**body: Any) -> httpx.Response:
        return httpx.post(f"{daemon.url}/v1/check", json={"user": "u", "tool": "Bash", **body})

    assert check(args={"command": "ls"}).json()["decision"] == "allow"
    cut = check(args={"command": "ls\u2026~0123456789abcdef"}, args_cut=["command"])
    assert (cut.json()["decision"], cut.json()["message"]) == ("deny", ROOT_DELETE)
    assert check(args={"command": "ls", "pad": "x"}, args_cut=["pad"]).json()["decision"] == (
        "allow"  # a cut elsewhere leaves `command` read as sent
    )
    for bad, field in (
        (["a b"], "args_cut[0]"),
        (["x" * 600], "args_cut[0]"),
        ([f"p{i}" for i in range(17)], "args_cut"),
        ("command", "args_cut"),
    ):
        refused = check(args={"command": "ls"}, args_cut=bad)
        assert refused.status_code == 422, bad
        assert field in [f["field"] for f in refused.json()["fields"]], refused.json()
