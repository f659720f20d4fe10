"""CrewAI: RatewardenHooks inside a real Crew, offline.

`tests/hosts/drivers/crewai_agent.py` runs once, with the python of the crewai host venv
(crewai 1.15.30), against one real `ratewarden serve`; each scenario is a crew kickoff of
its own user, whose LLM is CrewAI's OpenAI provider talking to a fake chat-completions
server (or, for the text tool path, a scripted `BaseLLM`). The tests read the driver's
report (the tool messages the model was sent, what the tools wrote) and ask the daemon
what it counted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.hosts.scenario import TERMINAL_POLICY, Run, clean_environment, host_scenario

DRIVER = Path(__file__).parent / "drivers" / "crewai_agent.py"
RATE_MESSAGE = "Rate limit: max 10 terminal calls per minute"
UNAVAILABLE = "Tool guard unavailable; terminal calls are paused"
DEPLOY_ASK = "Rate limit: max 1 deploy calls per minute"
APPROVAL_NEEDED = "A human must approve this call before it can run"
CREWAI_BLOCKED = "Tool execution blocked by hook"  # what CrewAI alone would have said
ENV_USER = "crewai-env-user"

# terminal-one-at-a-time: a call not settled holds the user's only slot, so ten allowed
# sequential calls prove ten settles; builds run two at a time. deploy asks past one a
# minute.
POLICY = (
    TERMINAL_POLICY
    + """\
  - name: terminal-one-at-a-time
    match: {tool: terminal}
    concurrency: 1
  - name: deploy-needs-approval
    match: {tool: deploy}
    rate: 1/minute
    on_exceed: ask
  - name: build-two-at-a-time
    match: {tool: build}
    concurrency: 2
"""
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Every scenario, in one driver process; the daemon stays up for the tests' reads."""
    work = tmp_path_factory.mktemp("crewai")
    home = work / "home"
    home.mkdir()
    with host_scenario("crewai", POLICY, work) as host:
        environment = clean_environment(
            HOME=str(home),  # CrewAI writes its storage and settings under it
            CREWAI_STORAGE_DIR=str(work / "storage"),
            RATEWARDEN_USER=ENV_USER,
            OPENAI_API_KEY="sk-fake",
        )
        # CrewAI's console prompt: the two console scenarios
        yield host.run(DRIVER, timeout=300, env=environment, stdin="approve\nno\n")


pytestmark = pytest.mark.timeout(900)  # the first run builds the host venv (about 1 GB)


def assert_eleventh_refused(outcome: dict[str, Any]) -> None:
    results = outcome["results"]
    assert len(results) == 11
    assert results[:10] == [f"ran echo {i}" for i in range(1, 11)]
    # The whole tool result: ratewarden's sentence, not CrewAI's "blocked by hook".
    assert re.fullmatch(re.escape(RATE_MESSAGE) + r" \(retry in \w+\)", results[10]), results[10]
    assert CREWAI_BLOCKED not in results[10]
    assert outcome["ran"] == 10  # what the tool itself wrote
    assert outcome["output"] == "done"  # the model read the refusal and answered


def test_eleventh_terminal_call_is_refused_and_ten_ran(run: Run) -> None:
    assert_eleventh_refused(run.report["limit"])
    usage = run.usage("discord:77")  # user_id of the kickoff inputs
    assert usage["terminal-per-minute"]["used"] == 10
    # All ten went through a cap of one call at a time: each was settled after it ran.
    assert usage["terminal-one-at-a-time"]["used"] == 0


def test_a_second_user_still_gets_through(run: Run) -> None:
    second = run.report["second_user"]
    assert second["results"] == ["ran echo 1"]
    assert second["ran"] == 1
    assert run.usage("discord:78")["terminal-per-minute"]["used"] == 1


def test_without_settle_the_cap_refuses_the_second_call(run: Run) -> None:
    """The control: hooks whose after hook does not settle keep the call's slot."""
    no_settle = run.report["no_settle"]
    assert no_settle["results"][0] == "ran echo 1"
    assert no_settle["results"][1].startswith("Concurrency limit: max 1 terminal calls at once")
    assert no_settle["ran"] == 1


def test_parallel_calls_are_each_settled(run: Run) -> None:
    """CrewAI runs a turn's calls in threads; each after hook finds its own call."""
    parallel = run.report["parallel"]
    assert parallel["results"] == ["ran build a", "ran build b", "ran build c", "ran build d"]
    assert run.usage("parallel-user")["build-two-at-a-time"]["used"] == 0


def test_a_failed_tool_is_settled(run: Run) -> None:
    failed, after = run.report["tool_error"]["results"]
    assert failed == "Error executing tool: the command failed"
    assert after == "ran after"  # the failed call's slot was released
    assert run.report["tool_error"]["ran"] == 1
    usage = run.usage("errors-user")
    assert usage["terminal-per-minute"]["used"] == 2
    assert usage["terminal-one-at-a-time"]["used"] == 0


def test_the_async_kickoff_is_guarded_the_same(run: Run) -> None:
    assert_eleventh_refused(run.report["async"])
    assert run.usage("async-user")["terminal-one-at-a-time"]["used"] == 0


def test_the_text_tool_path_gets_the_message_too(run: Run) -> None:
    """An LLM without function calling: CrewAI's ReAct path, the refusal as Observation."""
    assert_eleventh_refused(run.report["react"])
    assert run.usage("react-user")["terminal-per-minute"]["used"] == 10  # user= wins
    assert run.usage("not-this-one")["terminal-per-minute"]["used"] == 0


def test_without_inputs_the_user_is_ratewarden_user(run: Run) -> None:
    assert run.report["no_inputs"]["ran"] == 1
    assert run.usage(ENV_USER)["terminal-per-minute"]["used"] == 1


def test_an_approved_ask_runs_and_is_recorded(run: Run) -> None:
    approved = run.report["ask_approved"]
    assert approved["results"] == ["ran deploy a", "ran deploy b"]
    assert approved["ran"] == 2
    [(tool, reason)] = approved["asked"]  # the approver saw the second call only
    assert tool == "deploy"
    assert reason.startswith(DEPLOY_ASK)
    # acct-9 came from the `user` callable; the daemon counted the approval.
    events = [entry["event"] for entry in run.denials("acct-9")]
    assert "approved" in events


def test_an_ask_without_an_approver_is_refused(run: Run) -> None:
    no_approver = run.report["ask_no_approver"]
    assert no_approver["results"][0] == "ran deploy a"
    assert no_approver["results"][1].startswith(DEPLOY_ASK)
    assert APPROVAL_NEEDED in no_approver["results"][1]
    assert no_approver["ran"] == 1


def test_the_console_approval_uses_crewais_prompt(run: Run) -> None:
    approved = run.report["ask_console"]  # "approve" typed at CrewAI's prompt
    assert approved["results"] == ["ran deploy a", "ran deploy b"]
    declined = run.report["ask_console_declined"]  # "no"
    assert declined["results"][1].startswith(DEPLOY_ASK)
    assert APPROVAL_NEEDED in declined["results"][1]
    assert declined["ran"] == 1
    assert "approved" in [entry["event"] for entry in run.denials("acct-11")]


def test_a_call_blocked_by_a_later_hook_is_released(run: Run) -> None:
    """Another hook's block: CrewAI's own text, and ratewarden frees the slot it held."""
    blocked = run.report["blocked_later"]
    assert blocked["results"] == ["Tool execution blocked by hook. Tool: terminal", "ran echo 2"]
    assert blocked["ran"] == 1
    usage = run.usage("blocked-later")
    assert usage["terminal-per-minute"]["used"] == 2  # checked and allowed by ratewarden
    assert usage["terminal-one-at-a-time"]["used"] == 0


def test_only_calls_that_hold_something_are_settled(run: Run) -> None:
    """Every settle found its call: none of a refused, unjudged or slotless call."""
    with httpx.Client(trust_env=False) as http:
        metrics = http.get(f"{run.url}/metrics").raise_for_status().text
    settles = dict(
        re.findall(r'^ratewarden_settles_total\{outcome="(\w+)"\} (\S+)$', metrics, re.M)
    )
    # terminal (one at a time) and build (two at a time) calls that ran or were allowed:
    # limit 10, second_user 1, parallel 4, tool_error 2, async 10, react 10, no_inputs 1,
    # blocked_later 2, digest 2. deploy holds nothing; fail_open's calls were never judged.
    assert settles == {"settled": "42.0"}


def test_registering_twice_is_refused(run: Run) -> None:
    assert "already registered" in run.report["register_twice"]


def test_unreachable_daemon_fails_open(run: Run) -> None:
    fail_open = run.report["fail_open"]
    assert fail_open["results"] == ["ran echo 1", "ran echo 2", "ran echo 3"]
    assert fail_open["ran"] == 3


def test_unreachable_daemon_fails_closed_when_told(run: Run) -> None:
    fail_closed = run.report["fail_closed"]
    assert fail_closed["results"] == [UNAVAILABLE] * 2
    assert fail_closed["ran"] == 0


def test_each_settle_carries_the_digest_of_the_tool_result(run: Run) -> None:
    """Issue #29 item 2: a call the daemon answered with `send_result` is settled with the
    digest of the after hook context's `tool_result`."""
    from ratewarden.arguments import result_digest

    report = run.report["digest"]
    assert report["ran"] == 2
    digests = [settle.get("result_digest") for settle in report["settles"]]
    assert digests == [result_digest("ran echo 1"), result_digest("ran echo 2")]
