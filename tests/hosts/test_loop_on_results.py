"""Loops keyed on the result (issue #29, item 5), proven with real hosts, offline.

One rule, "3 identical calls with the same result per 10 minutes". A scripted model polls
`ci_status` for the same run again and again: for the first ten polls the answer changes
every second call (drivers/ci_status.py), and no poll is refused; then the answer stops
changing, and the 4th identical call with the same result is refused with the loop
message. The same through a real LangChain agent (RatewardenMiddleware), the official MCP
SDK's client through `ratewarden mcp`, and the real Claude Code CLI whose PostToolUse hook
settles each call with the digest of what Bash printed.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.fake_anthropic import fake_messages_api
from tests.hosts.drivers.ci_status import CHANGING, answer
from tests.hosts.scenario import DRIVERS, Run, host_python, host_scenario, running_daemon
from tests.hosts.test_host_claude_code import ClaudeCode, claude_code, run_claude  # noqa: F401

pytestmark = pytest.mark.timeout(900)  # the first run builds the host venvs

POLICY = """\
version: 1
rules:
  - name: polls-getting-nowhere
    match: {tool: [ci_status, terminal]}
    per: [user, tool, args]
    rate: 3/10 minutes
    same_result: true
"""
POLLS = CHANGING + 4  # ten changing answers, three the same, and the refused fourth


def loop_message(tool: str) -> str:
    return (
        f"Repeated call: {tool} returned the same result 3 times in a row; "
        "change the arguments or the approach"
    )


def assert_polled_until_the_loop(results: list[dict[str, Any]], tool: str) -> None:
    assert len(results) == POLLS
    ran = results[: POLLS - 1]
    assert [r["text"] for r in ran] == [answer(n) for n in range(1, POLLS)]  # no refusal
    assert not any(r["is_error"] for r in ran)
    assert results[-1]["is_error"], results[-1]
    assert loop_message(tool) in results[-1]["text"], results[-1]


@pytest.fixture(scope="module")
def langchain_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    with host_scenario("langchain", POLICY, tmp_path_factory.mktemp("langchain")) as host:
        yield host.run(DRIVERS / "langchain_loops.py", host.config(user="lc", polls=POLLS))


def test_a_langchain_agent_polls_a_changing_run_until_it_stops_changing(
    langchain_run: Run,
) -> None:
    assert_polled_until_the_loop(langchain_run.report["results"], "ci_status")
    [denial] = langchain_run.denials("lc")  # the daemon refused one call, by the loop rule
    assert denial["rules"] == ["polls-getting-nowhere"]


def test_the_mcp_proxy_polls_a_changing_run_until_it_stops_changing(
    tmp_path: Path,
) -> None:
    with host_scenario("mcp", POLICY, tmp_path) as host:
        config = host.config(
            ratewarden=str(host.python.parent / "ratewarden"),
            python=str(host.python),
            server=str(DRIVERS / "ci_server.py"),
            user="mcp-poller",
            polls=POLLS,
        )
        report = host.run(DRIVERS / "mcp_loops.py", config, timeout=300).report
    assert_polled_until_the_loop(report["results"], "ci_status")


def test_claude_code_polls_a_changing_run_until_it_stops_changing(
    claude_code: ClaudeCode,  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    """Each Bash call runs the same command; PostToolUse settles it with the digest of
    what Bash returned, so only the same output again counts towards the loop."""
    counter = tmp_path / "claude.count"
    script = Path(__file__).parent / "drivers" / "ci_status.py"
    command = f"{shlex.quote(str(host_python('claude_code')))} {script} {counter}"
    with (
        running_daemon(POLICY, tmp_path / "daemon") as daemon,
        fake_messages_api(command, calls=POLLS) as (url, model),
    ):
        result = run_claude(claude_code, tmp_path, url, f"--url {daemon.url} --user cc-poller")
    assert result["is_error"] is False, result
    assert counter.read_text() == str(POLLS - 1)  # the refused 14th never ran
    texts = [model.tool_results[call] for call in model.tool_use_ids]
    assert len(texts) == POLLS
    for n, text in enumerate(texts[: POLLS - 1], start=1):
        assert answer(n) in text
        assert "Repeated call" not in text
    assert loop_message("terminal") in texts[-1], texts[-1]
