"""One tool, one name, through a real daemon app: a host's own tool name (`Bash` from
Claude Code, `run_shell_command` from Gemini CLI) is checked as its canonical one
(`terminal`), so a policy that names only canonical tools covers every host and one
counter counts a user's shell calls from all of them; a policy written for a host's own
name keeps matching it (docs/policy.md, "Canonical tool names").

On a real Redis where a counter is shared; the mapping itself is wire/tools.py's
(rows used: claude-code Bash and Read, gemini run_shell_command).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from ratewarden.store import store_from_url
from tests.helpers.app import assert_error_shape, build_app, serving
from tests.helpers.redis_server import RedisServer

CANONICAL = """\
version: 1
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user, tool]
    rate: 3/minute
  - name: no-root-delete
    match: {tool: terminal, args: {command: {prefix: "rm -rf /"}}}
    deny: "Refusing to delete the root directory"
"""
RATE = "Rate limit: max 3 terminal calls per minute"


async def decide(client: httpx.AsyncClient, host: str, **event: Any) -> dict[str, Any]:
    """What `ratewarden hook HOST` gets for the event it read from its host's payload."""
    answer = await client.post(f"/v1/hooks/{host}/decision", json=event)
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def counter_keys(server: RedisServer, rule: str) -> list[str]:
    """The rule's counter keys in the real Redis."""
    found = server.client().keys(f"*{rule}*")
    return [key.decode() if isinstance(key, bytes) else str(key) for key in found]


async def test_claude_code_and_gemini_shell_calls_share_one_terminal_counter(
    redis_server: RedisServer, redis_url: str
) -> None:
    async with serving(build_app(CANONICAL, store=store_from_url(redis_url))) as client:
        calls = [
            ("claude-code", "Bash"),
            ("gemini", "run_shell_command"),
            ("claude-code", "Bash"),
        ]
        for host, tool in calls:
            allowed = await decide(client, host, user="u", tool=tool, args={"command": "ls"})
            assert allowed["decision"] == "allow", (host, allowed)
        # The fourth, from either host, is over the one counter's limit.
        for host, tool in [("gemini", "run_shell_command"), ("claude-code", "Bash")]:
            refused = await decide(client, host, user="u", tool=tool, args={"command": "ls"})
            assert refused["decision"] == "deny"
            assert refused["message"].startswith(RATE)
        # One counter, keyed by the canonical name, in the store itself.
        keys = counter_keys(redis_server, "terminal-per-minute")
        assert len(keys) == 1, keys
        assert "terminal" in keys[0]
        assert "Bash" not in keys[0]
        assert "run_shell_command" not in keys[0]
        # Another user's counter is their own.
        other = await decide(client, "gemini", user="v", tool="run_shell_command")
        assert other["decision"] == "allow"


async def test_a_terminal_args_rule_refuses_claude_codes_bash() -> None:
    async with serving(build_app(CANONICAL)) as client:
        for host, tool in [("claude-code", "Bash"), ("gemini", "run_shell_command")]:
            refused = await decide(client, host, user="u", tool=tool, args={"command": "rm -rf /"})
            assert (refused["decision"], refused["message"]) == (
                "deny",
                "Refusing to delete the root directory",
            )
            assert [v["rule"] for v in refused["violations"]] == ["no-root-delete"]
        # Claude Code's HTTP hook too, with its own payload.
        payload = {
            "hook_event_name": "PreToolUse",
            "tool_name": "Bash",
            "tool_input": {"command": "rm -rf / --no-preserve-root"},
            "tool_use_id": "t1",
            "session_id": "s1",
        }
        answer = await client.post("/v1/hooks/claude-code?user=u", content=json.dumps(payload))
        output = answer.json()["hookSpecificOutput"]
        assert output["permissionDecision"] == "deny"
        assert output["permissionDecisionReason"] == "Refusing to delete the root directory"
        # A tool no table knows keeps its name: the terminal rules do not see it.
        other = await decide(client, "claude-code", user="u", tool="TodoWrite", args={})
        assert other["decision"] == "allow"


HOST_NAMED = """\
version: 1
rules:
  - name: bash-only
    match: {tool: Bash}
    per: [user]
    rate: 1/minute
  - name: not-read
    match: {tool: terminal}
    unless: {tool: Read}
    per: [user]
    rate: 100/minute
"""


async def test_a_rule_naming_a_hosts_own_tool_matches_that_hosts_calls_only() -> None:
    async with serving(build_app(HOST_NAMED)) as client:
        first = await decide(client, "claude-code", user="u", tool="Bash")
        assert first["decision"] == "allow"
        second = await decide(client, "claude-code", user="u", tool="Bash")
        assert second["decision"] == "deny"
        # Rate limit: max 1 terminal calls: the rule names Bash, the message the tool.
        assert second["message"].startswith("Rate limit: max 1 terminal calls per minute")
        # Gemini's shell is `terminal` too, but not `Bash`: the rule does not cover it.
        gemini = await decide(client, "gemini", user="u", tool="run_shell_command")
        assert gemini["decision"] == "allow"
        # A plain check naming the canonical tool with the host's own name is matched too.
        plain = await client.post(
            "/v1/check", json={"user": "w", "tool": "terminal", "host_tool": "Bash"}
        )
        assert plain.json()["decision"] == "allow"
        again = await client.post(
            "/v1/check", json={"user": "w", "tool": "terminal", "host_tool": "Bash"}
        )
        assert again.json()["decision"] == "deny"


async def test_denials_show_both_names_and_find_either() -> None:
    async with serving(build_app(CANONICAL)) as client:
        await decide(client, "claude-code", user="u", tool="Bash", args={"command": "rm -rf /"})
        await client.post("/v1/check", json={"user": "u", "tool": "terminal", "args": {
            "command": "rm -rf /"}})  # fmt: skip
        found = (await client.get("/v1/denials")).json()["denials"]
        assert [(d["tool"], d["host_tool"]) for d in found] == [
            ("terminal", None),
            ("terminal", "Bash"),
        ]
        assert all("args" not in d for d in found)  # never logged
        by_host_name = (await client.get("/v1/denials", params={"tool": "Bash"})).json()
        assert [d["host_tool"] for d in by_host_name["denials"]] == ["Bash"]
        by_canonical = (await client.get("/v1/denials", params={"tool": "terminal"})).json()
        assert len(by_canonical["denials"]) == 2


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"host": 3}, "host"),
        ({"host": ["claude-code"]}, "host"),
        ({"host": "h" * 300}, "host"),
        ({"host": ""}, "host"),
        ({"host_tool": {"a": 1}}, "host_tool"),
        ({"host_tool": "t" * 300}, "host_tool"),
        ({"host_tool": ""}, "host_tool"),
    ],
)
async def test_wrong_host_fields_are_refused_naming_the_field(
    body: dict[str, Any], field: str
) -> None:
    for hot in (True, False):  # the hot path and FastAPI give the same answer
        async with serving(build_app(CANONICAL, hot=hot)) as client:
            answer = await client.post("/v1/check", json={"user": "u", "tool": "t", **body})
            assert answer.status_code == 422, (hot, answer.text)
            assert_error_shape(answer.json())
            assert any(field in e["field"] for e in answer.json()["fields"]), answer.json()


async def test_an_unknown_host_maps_nothing_and_odd_names_are_no_harm() -> None:
    async with serving(build_app(CANONICAL)) as client:
        # An unknown host (a newer client's, say): the tool keeps its name.
        unknown = await client.post(
            "/v1/check", json={"user": "u", "tool": "Bash", "host": "no-such-host"}
        )
        assert unknown.json()["decision"] == "allow"
        for _ in range(3):
            await client.post("/v1/check", json={"user": "u", "tool": "Bash", "host": "x\x01"})
        # Control characters in a host name are a name like any other: no mapping, no error.
        odd = await client.post("/v1/check", json={"user": "u", "tool": "Bash", "host": "x\x01"})
        assert odd.status_code == 200
        assert odd.json()["decision"] == "allow"  # not `terminal`: not counted there
        usage = (await client.get("/v1/usage", params={"user": "u", "tool": "terminal"})).json()
        [terminal] = [u for u in usage["limits"] if u["rule"] == "terminal-per-minute"]
        assert terminal["used"] == 0
        # Its hook route is still only for the hosts ratewarden knows.
        missing = await client.post("/v1/hooks/no-such-host/decision", json={"tool": "Bash"})
        assert missing.status_code == 404


# -- the policy's own same_as lines ------------------------------------------------------

SAME_AS = """\
version: 1
tools:
  my_shell: {same_as: terminal, args: {cmd: command}}
  Bash: {same_as: codex_shell, host: codex}
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user, tool]
    rate: 3/minute
  - name: no-root-delete
    match: {tool: terminal, args: {command: {prefix: "rm -rf /"}}}
    deny: "Refusing to delete the root directory"
"""


async def test_a_same_as_line_makes_a_plain_check_count_as_the_canonical_tool(
    redis_server: RedisServer, redis_url: str
) -> None:
    async with serving(build_app(SAME_AS, store=store_from_url(redis_url))) as client:
        plain = {"user": "u", "tool": "my_shell", "args": {"cmd": "ls"}}
        assert (await client.post("/v1/check", json=plain)).json()["decision"] == "allow"
        await decide(client, "claude-code", user="u", tool="Bash")
        await decide(client, "cursor", user="u", tool="my_shell")  # no host on the line
        refused = (await client.post("/v1/check", json=plain)).json()
        assert refused["decision"] == "deny"
        assert refused["message"].startswith(RATE)
        [key] = counter_keys(redis_server, "terminal-per-minute")
        assert "tool=terminal" in key
        # Its argument renamed: the args rule on `command` reads the host's `cmd`.
        root = {"user": "v", "tool": "my_shell", "args": {"cmd": "rm -rf /"}}
        denied = (await client.post("/v1/check", json=root)).json()
        assert denied["message"] == "Refusing to delete the root directory"
        found = (await client.get("/v1/denials", params={"user": "v"})).json()["denials"]
        assert [(d["tool"], d["host_tool"]) for d in found] == [("terminal", "my_shell")]


async def test_a_same_as_line_for_one_host_leaves_the_others_on_the_built_in_row() -> None:
    async with serving(build_app(SAME_AS)) as client:
        for _ in range(5):  # Codex's Bash is codex_shell here: no rule counts it
            codex = await decide(client, "codex", user="u", tool="Bash")
            assert codex["decision"] == "allow"
        root = await decide(client, "codex", user="u", tool="Bash", args={"command": "rm -rf /"})
        assert root["decision"] == "allow"  # not terminal: the operator's choice
        claude = await decide(client, "claude-code", user="u", tool="Bash", args={
            "command": "rm -rf /"})  # fmt: skip
        assert claude["message"] == "Refusing to delete the root directory"


# -- policy check and policy explain -----------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from ratewarden.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


HOST_RULES = """\
version: 1
rules:
  - name: no-root-delete
    match: {tool: terminal, args: {command: {prefix: "rm -rf /"}}}
    deny: "Refusing to delete the root directory"
  - name: bash-per-minute
    match: {tool: Bash}
    rate: 5/minute
"""


def test_policy_check_warns_of_a_rule_naming_a_hosts_tool(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(HOST_RULES)
    code, out, err = run(capsys, "policy", "check", str(path))
    assert code == 0
    assert out.startswith(f"{path}: ok ")
    assert err == (
        f"{path}: warning: rule 'bash-per-minute' (line 7) names 'Bash', Claude Code's, "
        "Codex's and agent-code's name for 'terminal': it matches only those hosts' calls; "
        "name 'terminal' to cover every host\n"
    )
    path.write_text(CANONICAL)
    assert run(capsys, "policy", "check", str(path)) == (
        0, f"{path}: ok (version {_version(CANONICAL)}, 2 rules)\n", "")  # fmt: skip


def _version(text: str) -> str:
    from ratewarden.policy.compile import policy_version

    return policy_version(text.encode())


def test_explain_shows_the_mapping_and_the_refusing_rule_and_exits_as_check_would(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(HOST_RULES)
    code, out, err = run(
        capsys, "policy", "explain", str(path), "--user", "alice", "--host", "codex",
        "--tool", "Bash", "--args", '{"command": "rm -rf /home/s3cr3t"}',
    )  # fmt: skip
    assert (code, err) == (1, "")
    lines = out.splitlines()
    assert lines[1] == "call: user='alice' tool='terminal' host_tool='Bash' session=None team=None"
    assert lines[2] == (
        "tool 'Bash' on codex is 'terminal' (the built-in table); rules naming either match, "
        "counters and messages say 'terminal'"
    )
    assert (
        "  APPLIES  no-root-delete: access: deny 'Refusing to delete the root directory' "
        "(rule default); enforce"
    ) in lines
    assert "           held   tool in ['Bash']" in lines  # bash-per-minute, by the host's name
    assert lines[-1] == (
        "decision: deny: Refusing to delete the root directory (a first call: fresh "
        "counters, nothing kept)"
    )
    assert "s3cr3t" not in out  # args are never printed
    # Gemini's shell: the same rule refuses; a harmless command is allowed (exit 0).
    code, out, _ = run(
        capsys, "policy", "explain", str(path), "--user", "alice", "--host", "gemini",
        "--tool", "run_shell_command", "--args", '{"command": "ls"}',
    )  # fmt: skip
    assert code == 0
    assert "tool 'run_shell_command' on gemini is 'terminal'" in out
    assert "  skip     bash-per-minute: tool 'terminal' (the host's 'run_shell_command') is " \
        "not in ['Bash']" in out  # fmt: skip
    # A tool the host table does not know keeps its name, and says so.
    code, out, _ = run(
        capsys, "policy", "explain", str(path), "--user", "a", "--host", "gemini", "--tool", "x"
    )
    assert code == 0
    assert "tool 'x' on gemini keeps its name (no other name for it)" in out


def test_explain_asks_and_same_as_lines_and_an_unknown_host(
    capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "version: 1\ntools: {my_shell: {same_as: terminal}}\n"
        "rules: [{name: a, match: {tool: terminal}, ask: 'A human must approve {tool}'}]\n"
    )
    code, out, _ = run(capsys, "policy", "explain", str(path), "--user", "u", "--tool", "my_shell")
    assert code == 3
    assert "tool 'my_shell' is 'terminal' (this policy's tools: same_as)" in out
    assert out.splitlines()[-1].startswith("decision: ask: A human must approve terminal")
    with pytest.raises(SystemExit) as exited:
        run(capsys, "policy", "explain", str(path), "--user", "u", "--host", "vim", "--tool", "t")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --host: invalid choice: 'vim'" in err
    assert "'claude-code'" in err
    assert "'hermes'" in err


DECOY = """\
version: 1
rules:
  - name: no-secrets
    match: {tool: read_file, args: {path: {prefix: "/etc/"}}}
    deny: "Reading /etc is not allowed"
"""


@pytest.mark.parametrize(
    ("host", "tool", "key"),
    [("claude-code", "Read", "file_path"), ("claude-code", "Edit", "file_path")],
)
async def test_a_decoy_canonical_key_cannot_hide_the_path_the_host_opens(
    host: str, tool: str, key: str
) -> None:
    """A hostile model adds `path` beside the host's own key: the rule on `path` must read
    the file the host will open, not the decoy."""
    policy = DECOY.replace("tool: read_file", "tool: [read_file, edit_file]")
    async with serving(build_app(policy)) as client:
        args = {key: "/etc/shadow", "path": "/tmp/harmless"}
        refused = await decide(client, host, user="u", tool=tool, args=args)
        assert refused["decision"] == "deny", refused
        assert refused["message"].startswith("Reading /etc is not allowed")
