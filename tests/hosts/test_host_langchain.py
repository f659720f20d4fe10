"""LangChain v1: RatewardenMiddleware inside a real `create_agent` loop, offline.

`tests/hosts/drivers/langchain_agent.py` runs once, with the python of the langchain host
venv (langchain 1.5.2 on langgraph 1.2.24, pins in requirements/langchain.txt), against
one real `ratewarden serve`; each scenario is an agent run of its own user, with a
scripted `GenericFakeChatModel` and real `@tool` tools, through `invoke`
(`wrap_tool_call`) or `ainvoke` (`awrap_tool_call`). The tests read the driver's report
(what the model received, what the tools wrote) and ask the daemon what it counted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratewarden.vocabulary import APPROVAL_NEEDED
from tests.hosts.scenario import TERMINAL_POLICY, Run, host_scenario

DRIVER = Path(__file__).parent / "drivers" / "langchain_agent.py"
RATE_MESSAGE = "Rate limit: max 10 terminal calls per minute"
DEPLOY_MESSAGE = "Rate limit: max 1 deploy calls per minute"
UNAVAILABLE = "Tool guard unavailable; terminal calls are paused"

# terminal-one-at-a-time: a call not settled holds the user's only slot, so ten allowed
# sequential calls prove ten settles; builds run two at a time. deploy asks past one a
# minute; forbidden is off.
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
  - name: forbidden
    match: {tool: forbidden}
    rate: 0/minute
"""
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Every scenario, in one driver process; the daemon stays up for the tests' reads."""
    with host_scenario("langchain", POLICY, tmp_path_factory.mktemp("langchain")) as host:
        yield host.run(DRIVER, timeout=180)


pytestmark = pytest.mark.timeout(900)  # the first run builds the host venv


@pytest.mark.parametrize(
    ("scenario", "user"), [("limit", "discord:77"), ("limit_async", "discord:88")]
)
def test_eleventh_terminal_call_is_refused_and_ten_ran(run: Run, scenario: str, user: str) -> None:
    limit = run.report[scenario]
    results = limit["results"]
    assert results[:10] == [f"ran echo {i}" for i in range(1, 11)]
    assert len(results) == 11
    assert RATE_MESSAGE in results[10], results[10]
    assert limit["errors"] == [results[10]]  # the refusal is an error ToolMessage
    assert limit["ran"] == 10  # what the tool itself wrote
    assert limit["output"] == "done"  # the model read the refusal and answered
    usage = run.usage(user)  # the context's user_id (invoke), the config's (ainvoke)
    assert usage["terminal-per-minute"]["used"] == 10
    # All ten went through a cap of one call at a time: each was settled after it ran.
    assert usage["terminal-one-at-a-time"]["used"] == 0


def test_a_second_user_still_gets_through(run: Run) -> None:
    second = run.report["second_user"]
    assert second["results"] == ["ran echo 1"]
    assert second["ran"] == 1
    assert run.usage("discord:78")["terminal-per-minute"]["used"] == 1


@pytest.mark.parametrize("scenario", ["no_settle", "no_settle_async"])
def test_without_settle_the_cap_refuses_the_second_call(run: Run, scenario: str) -> None:
    """The control: a middleware that does not settle keeps its slot."""
    no_settle = run.report[scenario]
    assert no_settle["results"][0] == "ran echo 1"
    assert "Concurrency limit: max 1 terminal calls at once" in no_settle["results"][1]
    assert no_settle["ran"] == 1


@pytest.mark.parametrize(
    ("scenario", "user"), [("parallel", "par"), ("parallel_async", "par-async")]
)
def test_parallel_calls_are_each_settled(run: Run, scenario: str, user: str) -> None:
    parallel = run.report[scenario]
    assert sorted(parallel["results"]) == [f"ran build {t}" for t in "abcd"]
    assert parallel["ran"] == 4
    assert run.usage(user)["build-two-at-a-time"]["used"] == 0


@pytest.mark.parametrize(
    ("scenario", "user"), [("tool_error", "err"), ("tool_error_async", "err-async")]
)
def test_a_tool_error_result_is_settled(run: Run, scenario: str, user: str) -> None:
    failed, after = run.report[scenario]["results"]
    assert "the command failed" in failed  # the tool's own error ToolMessage
    assert after == "ran after"  # the failed call's slot was released
    usage = run.usage(user)
    assert usage["terminal-per-minute"]["used"] == 2
    assert usage["terminal-one-at-a-time"]["used"] == 0


@pytest.mark.parametrize(
    ("scenario", "user"), [("crash", "crash-user"), ("crash_async", "crash_async-user")]
)
def test_a_raising_tool_is_settled_and_the_error_raised(run: Run, scenario: str, user: str) -> None:
    crash = run.report[scenario]
    assert crash["raised"] == "the tool crashed"  # re-raised to the caller of invoke
    assert crash["results"] == ["ran echo 1"]  # the next run got the released slot
    usage = run.usage(user)
    assert usage["terminal-per-minute"]["used"] == 2
    assert usage["terminal-one-at-a-time"]["used"] == 0


def test_an_approved_interrupt_runs_the_tool(run: Run) -> None:
    approved = run.report["ask_approved"]
    assert approved["ran_before_resume"] == 1  # paused before deploy b ran
    [request] = approved["interrupts"]
    assert request["type"] == "tool_approval"  # HumanInTheLoopMiddleware's per-call shape
    assert request["name"] == "deploy"
    assert request["tool_call_id"] == "call_1_0"
    assert request["args"] == {"target": "b"}
    assert request["description"].startswith(DEPLOY_MESSAGE)
    assert request["ratewarden"]["rules"] == ["deploy-needs-approval"]
    assert approved["results"] == ["ran deploy a", "ran deploy b"]
    assert approved["ran"] == 2
    # acct-9 came from the `user` callable; the daemon counted the approval.
    events = [entry["event"] for entry in run.denials("acct-9")]
    assert "approved" in events


def test_a_rejected_interrupt_refuses_with_the_message(run: Run) -> None:
    rejected = run.report["ask_rejected"]
    [request] = rejected["interrupts"]
    assert request["name"] == "deploy"
    first, second = rejected["results"]
    assert first == "ran deploy a"
    assert DEPLOY_MESSAGE in second
    assert "not during the freeze" in second  # the human's reason reaches the model
    assert rejected["ran"] == 1
    events = [entry["event"] for entry in run.denials("acct-12")]
    assert "approved" not in events


@pytest.mark.parametrize("scenario", ["ask_no_path", "ask_no_path_async"])
def test_an_ask_without_an_approval_path_is_refused(run: Run, scenario: str) -> None:
    no_path = run.report[scenario]
    assert no_path["results"][0] == "ran deploy a"
    assert DEPLOY_MESSAGE in no_path["results"][1]
    assert APPROVAL_NEEDED in no_path["results"][1]
    assert no_path["ran"] == 1


def test_the_tool_call_id_leads_the_call_id(run: Run) -> None:
    [result] = run.report["call_id"]["results"]
    assert result.startswith("Rate limit: max 0 forbidden calls per minute")
    [entry] = run.denials("ids-user")
    assert entry["call_id"].startswith("call_0_0~")


@pytest.mark.parametrize("scenario", ["fail_open", "fail_open_async"])
def test_unreachable_daemon_fails_open(run: Run, scenario: str) -> None:
    fail_open = run.report[scenario]
    count = len(fail_open["results"])
    assert fail_open["results"] == [f"ran echo {i}" for i in range(1, count + 1)]
    assert fail_open["ran"] == count >= 2


@pytest.mark.parametrize("scenario", ["fail_closed", "fail_closed_async"])
def test_unreachable_daemon_fails_closed_when_told(run: Run, scenario: str) -> None:
    fail_closed = run.report[scenario]
    assert fail_closed["results"] == [UNAVAILABLE] * 2
    assert fail_closed["ran"] == 0


def test_the_module_imports_without_langchain() -> None:
    """In this (the main) environment, where LangChain is not installed."""
    code = (
        "import sys, ratewarden.integrations.langchain as m; m.RatewardenMiddleware();"
        "assert 'langchain' not in sys.modules and 'langgraph' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("scenario", ["result_digest", "result_digest_async"])
def test_each_settle_carries_the_digest_of_the_tool_messages_content(
    run: Run, scenario: str
) -> None:
    """Issue #29 item 2: a call the daemon answered with `send_result` is settled with the
    digest of what the model read (the ToolMessage's content), never the content."""
    from ratewarden.arguments import result_digest

    report = run.report[scenario]
    assert report["ran"] == 2
    assert report["results"] == ["ran gh run view 7"] * 2
    digests = [settle["result_digest"] for settle in report["settles"]]
    assert digests == [result_digest("ran gh run view 7")] * 2
    assert all("ran gh run view 7" not in json.dumps(s) for s in report["settles"])
