"""`ratewarden mcp` (stdio) between the official MCP SDK's client and a real SDK server.

`tests/hosts/drivers/mcp_client.py` runs with the python of the mcp host venv (`mcp`
2.3.0, ratewarden installed editable, so `<venv>/bin/ratewarden mcp` is the real
command), against one real `ratewarden serve`. Each scenario is a `ClientSession` over
`stdio_client` running `ratewarden mcp --user U --url URL -- python mcp_server.py`
(`drivers/mcp_server.py`, an `MCPServer` whose tools log each run to a file). The tests
read what the client received, what the tools wrote, and what the daemon counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.fake_anthropic import FakeMcpModel
from tests.hosts.scenario import (
    DRIVERS,
    TERMINAL_POLICY,
    Run,
    claude_with_mcp,
    host_python,
    host_scenario,
    running_daemon,
)

RATE_MESSAGE = "Rate limit: max 10 terminal calls per minute"
DEMO_MESSAGE = "Demo mode: destructive tools are off"
ASK_MESSAGE = "deploy needs a human's approval"
APPROVAL_NEEDED = "A human must approve this call before it can run"
UNAVAILABLE = "Tool guard unavailable; terminal calls are paused"
ROOT_DELETE = "Refusing destructive root delete"

# terminal-one-at-a-time and paid-one-at-a-time: a call not settled holds the user's only
# slot, so sequential calls that all run prove each was settled.
POLICY = (
    "version: 1\ntools:\n  slow_paid: {cost: 0.5}\n"
    + TERMINAL_POLICY.removeprefix("version: 1\n")
    + f"""\
  - name: terminal-one-at-a-time
    match: {{tool: terminal}}
    concurrency: 1
  - name: demo-mode
    match: {{user: mcp-demo, destructive: true}}
    deny: "{DEMO_MESSAGE}"
  - name: paid-budget
    match: {{tool: slow_paid}}
    per: [user]
    budget: 100/day
  - name: paid-one-at-a-time
    match: {{tool: [slow_paid, failing]}}
    concurrency: 1
  - name: hang-one-at-a-time
    match: {{tool: hang}}
    concurrency: 1
  - name: deploy-needs-approval
    match: {{tool: deploy}}
    ask: "{ASK_MESSAGE}"
  - name: no-root-delete
    match: {{user: mcp-padded, tool: terminal, args: {{command: {{regex: 'rm -rf /'}}}}}}
    deny: "{ROOT_DELETE}"
  - name: padded-loop
    match: {{user: mcp-padded-loop}}
    per: [user, tool, args]
    rate: 3/10 minutes
"""
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    with host_scenario("mcp", POLICY, tmp_path_factory.mktemp("mcp")) as host:
        config = host.config(
            ratewarden=str(host.python.parent / "ratewarden"),
            python=str(host.python),
            server=str(DRIVERS / "mcp_server.py"),
        )
        yield host.run(DRIVERS / "mcp_client.py", config, timeout=300)


pytestmark = pytest.mark.timeout(900)  # the first run builds the host venv


def test_eleventh_call_is_an_error_result_and_ten_ran(run: Run) -> None:
    limit = run.report["limit"]
    results = limit["results"]
    assert [r["text"] for r in results[:10]] == [f"ran echo {i}" for i in range(1, 11)]
    assert not any(r["is_error"] for r in results[:10])
    assert results[10]["is_error"] is True  # a CallToolResult, not a JSON-RPC error
    assert results[10]["text"].startswith(RATE_MESSAGE), results[10]
    assert limit["ran"] == [f"terminal echo {i}" for i in range(1, 11)]
    usage = run.usage("mcp-limit")
    assert usage["terminal-per-minute"]["used"] == 10
    # Ten sequential calls through a cap of one at a time: each was settled when it ended.
    assert usage["terminal-one-at-a-time"]["used"] == 0


def test_padded_arguments_still_meet_the_argument_rules(run: Run) -> None:
    """Issue 25 item 1: arguments past the wire's caps are sent bounded, never left out."""
    padded = run.report["padded"]
    for name, result in zip(padded["names"], padded["rm"], strict=True):
        assert result["is_error"], name
        assert result["text"].startswith(ROOT_DELETE), name
    # The same padding beside a harmless command: the command was read whole, and it ran.
    assert [r["is_error"] for r in padded["echo"]] == [False] * len(padded["names"])
    assert padded["ran"] == ["terminal echo fine"] * len(padded["names"])
    # Padded alike, counted alike: the fourth identical call is a repeated call.
    loop = padded["loop"]
    assert [r["is_error"] for r in loop] == [False, False, False, True]
    assert loop[3]["text"].startswith("Repeated call: terminal was called with the same")


def test_annotations_drive_an_access_rule(run: Run) -> None:
    access = run.report["access"]
    # The client saw the server's annotations unchanged.
    assert access["annotations"]["read_file"] == {"readOnlyHint": True}
    assert access["annotations"]["drop_table"]["destructiveHint"] is True
    [drop] = access["drop"]
    assert drop["is_error"] is True
    assert drop["text"].startswith(DEMO_MESSAGE)
    assert access["read"] == [{"text": "contents of README", "is_error": False}]
    assert access["ran"] == ["read_file README"]  # drop_table never ran
    [entry] = run.denials("mcp-demo")
    assert entry["tool"] == "drop_table"


def test_budget_is_reserved_and_settled(run: Run) -> None:
    budget = run.report["budget"]
    texts = [r["text"] for r in budget["results"]]
    assert texts[:3] == ["bought thing 0", "bought thing 1", "bought thing 2"]
    assert budget["results"][3]["is_error"] is True  # the tool's own failure passes through
    assert texts[3] == "Error executing tool failing"  # the SDK hides the exception
    assert budget["ran"] == [*(f"slow_paid thing {i}" for i in range(3)), "failing boom"]
    usage = run.usage("mcp-budget")
    assert usage["paid-budget"]["used"] == pytest.approx(1.5)  # three settled at 0.5
    assert not usage["paid-budget"]["reserved"]  # nothing held by an unsettled call
    assert usage["paid-one-at-a-time"]["used"] == 0  # the error result was settled too


def test_a_cancelled_call_is_settled(run: Run) -> None:
    cancelled = run.report["cancelled"]
    assert cancelled["first"] != "answered"  # the client gave up on it
    assert cancelled["second"] == [{"text": "bought next", "is_error": False}]
    usage = run.usage("mcp-cancel")
    assert usage["paid-one-at-a-time"]["used"] == 0
    assert not usage["paid-budget"]["reserved"]


def test_a_call_left_running_when_the_client_goes_is_settled(run: Run) -> None:
    abandoned = run.report["abandoned"]
    assert abandoned["ran"] == ["hang left started"]  # it was running when the client left
    assert abandoned["exit"] == 0
    # Its slot was released when the session ended, not left to the lease's timeout.
    assert run.usage("mcp-abandon")["hang-one-at-a-time"]["used"] == 0


def test_everything_else_passes_through(run: Run) -> None:
    passed = run.report["passthrough"]
    assert passed["resources"] == ["notes://today"]
    assert passed["read"] == ["today's notes"]
    assert passed["prompts"] == ["greet"]
    assert passed["prompt"] == ["Say hello to Ada"]
    # The server's progress, its elicitation and its sampling request reached the client,
    # and the client's answers reached the server.
    assert passed["progress"] == [[0.5, 1.0, "half way"]]
    assert passed["seen"] == {"elicit": "Go on with cats?", "sample": "about cats"}
    assert passed["interactive"] == "elicited accept ok=True; sampled fine"
    assert passed["ran"] == ["interactive cats"]


def test_an_ask_is_put_to_the_user_by_elicitation(run: Run) -> None:
    accepted = run.report["ask_accepted"]
    [asked] = accepted["asked"]
    assert ASK_MESSAGE in asked
    assert accepted["results"] == [{"text": "deployed prod", "is_error": False}]
    assert accepted["ran"] == ["deploy prod"]
    events = [entry["event"] for entry in run.denials("mcp-ask-yes")]
    assert "approved" in events


def test_a_declined_ask_is_refused(run: Run) -> None:
    declined = run.report["ask_declined"]
    [result] = declined["results"]
    assert result["is_error"] is True
    assert result["text"].startswith(ASK_MESSAGE)
    assert declined["ran"] == []


def test_an_ask_without_elicitation_says_a_human_must_approve(run: Run) -> None:
    none = run.report["ask_none"]
    [result] = none["results"]
    assert result["is_error"] is True
    assert result["text"].startswith(ASK_MESSAGE)
    assert APPROVAL_NEEDED in result["text"]
    assert none["ran"] == []


def test_unreachable_daemon_fails_open(run: Run) -> None:
    fail_open = run.report["fail"]["open"]
    assert [r["text"] for r in fail_open["results"]] == ["ran echo 1", "ran echo 2"]
    assert len(fail_open["ran"]) == 2


def test_unreachable_daemon_fails_closed_when_told(run: Run) -> None:
    fail_closed = run.report["fail"]["closed"]
    assert fail_closed["results"] == [{"text": UNAVAILABLE, "is_error": True}] * 2
    assert fail_closed["ran"] == []


# -- (b) the real Claude Code CLI, the proxy as its MCP server ------------------------------

MCP_TOOL = "mcp__guarded__terminal"  # Claude Code's name for server `guarded`'s `terminal`


def run_claude(
    tmp_path: Path, model: FakeMcpModel, user: str, start_delay_s: float = 0
) -> dict[str, dict[str, Any]]:
    """`claude -p` with `ratewarden mcp` as its MCP server `guarded`, started `start_delay_s`
    late (as on a loaded machine); the user's usage."""
    python = host_python("mcp")
    with running_daemon(POLICY, tmp_path / "daemon") as daemon:
        proxy = [
            "mcp", "--user", user, "--url", daemon.url,
            "--", str(python), str(DRIVERS / "mcp_server.py"),
        ]  # fmt: skip
        command = [str(python.parent / "ratewarden"), *proxy]
        if start_delay_s:
            command = ["/bin/sh", "-c", f'sleep {start_delay_s}; exec "$0" "$@"', *command]
        config = {
            "mcpServers": {
                "guarded": {
                    "command": command[0],
                    "args": command[1:],
                    "env": {"MCP_RAN": str(tmp_path / "ran.txt")},
                }
            }
        }
        claude_with_mcp(config, model, tmp_path, timeout=180)
        return Run(daemon.url, {}).usage(user)


def ran(tmp_path: Path) -> list[str]:
    path = tmp_path / "ran.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_real_claude_code_gets_the_message_as_the_11th_tool_result(tmp_path: Path) -> None:
    model = FakeMcpModel("mcp__guarded__terminal", {"command": "echo hi"}, calls=11)
    usage = run_claude(tmp_path, model, "claude-user")
    assert len(model.tool_use_ids) == 11
    results = [model.tool_results.get(call, "") for call in model.tool_use_ids]
    # Claude Code hands the model the structured result: `{"result":"ran echo hi"}`.
    assert all("ran echo hi" in text for text in results[:10]), results
    assert all(RATE_MESSAGE not in text for text in results[:10])
    assert RATE_MESSAGE in results[10], results[10]
    assert ran(tmp_path) == ["terminal echo hi"] * 10
    assert usage["terminal-per-minute"]["used"] == 10
    assert usage["terminal-one-at-a-time"]["used"] == 0  # each call settled


def test_real_claude_code_is_told_a_human_must_approve(tmp_path: Path) -> None:
    """Claude Code speaks the 2026-07-28 protocol, which takes no elicitation outside a
    request: the ask is refused with the approval-needed message, not put to anyone."""
    model = FakeMcpModel("mcp__guarded__deploy", {"target": "prod"}, calls=1)
    run_claude(tmp_path, model, "claude-asker")
    [result] = model.tool_results.values()
    assert ASK_MESSAGE in result
    assert APPROVAL_NEEDED in result
    assert ran(tmp_path) == []


def test_real_claude_code_that_fell_back_to_initialize_is_not_asked(tmp_path: Path) -> None:
    """A proxy slow to start (a loaded machine): Claude Code, its 2026-07-28 probe not yet
    answered, also sends the old `initialize` declaring elicitation, which the server
    refuses. The session is in the new era, so the ask is still refused, never put to a
    client that drops it (the call then waited for ever: CI's 300 s timeout)."""
    model = FakeMcpModel("mcp__guarded__deploy", {"target": "prod"}, calls=1)
    run_claude(tmp_path, model, "claude-slow-asker", start_delay_s=12)
    [result] = model.tool_results.values()
    assert APPROVAL_NEEDED in result
    assert ran(tmp_path) == []
