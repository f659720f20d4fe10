"""pydantic-ai-middleware: RatewardenMiddleware inside a real pydantic-ai Agent, offline.

`tests/hosts/drivers/pydantic_ai_agent.py` runs once, with the python of the pydantic_ai host
venv (pydantic-ai-middleware 0.2.4 on pydantic-ai-slim 1.107.10), against one real
`ratewarden serve`; each scenario is an agent run of its own user, with a scripted
`FunctionModel` and real tools wired through `MiddlewareToolset`. The tests read the
driver's report (what the model received, what the tools wrote) and ask the daemon what
it counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hosts.scenario import TERMINAL_POLICY, Run, host_scenario

DRIVER = Path(__file__).parent / "drivers" / "pydantic_ai_agent.py"
RATE_MESSAGE = "Rate limit: max 10 terminal calls per minute"
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
    with host_scenario("pydantic_ai", POLICY, tmp_path_factory.mktemp("pydantic_ai")) as host:
        yield host.run(DRIVER)


pytestmark = pytest.mark.timeout(600)  # the first run builds the host venv


def blocked(tool: str, message: str) -> str:
    """How MiddlewareToolset hands a refusal to the model."""
    return f"Tool '{tool}' blocked: {message}"


def test_eleventh_terminal_call_is_refused_and_ten_ran(run: Run) -> None:
    limit = run.report["limit"]
    results = limit["results"]
    assert results[:10] == [f"ran echo {i}" for i in range(1, 11)]
    assert results[10].startswith(blocked("terminal", RATE_MESSAGE)), results[10]
    assert len(results) == 11
    assert limit["ran"] == 10  # what the tool itself wrote
    assert limit["output"] == "done"  # the model read the refusal and answered
    usage = run.usage("discord:77")  # deps.user_id
    assert usage["terminal-per-minute"]["used"] == 10
    # All ten went through a cap of one call at a time: each was settled after it ran.
    assert usage["terminal-one-at-a-time"]["used"] == 0


def test_without_settle_the_cap_refuses_the_second_call(run: Run) -> None:
    """The control: a middleware whose after_tool_call does not settle keeps its slot."""
    no_settle = run.report["no_settle"]
    assert no_settle["results"][0] == "ran echo 1"
    assert no_settle["results"][1].startswith(
        blocked("terminal", "Concurrency limit: max 1 terminal calls at once")
    )
    assert no_settle["ran"] == 1


def test_parallel_calls_are_each_settled(run: Run) -> None:
    parallel = run.report["parallel"]
    assert parallel["results"] == ["ran build a", "ran build b", "ran build c", "ran build d"]
    assert run.usage("parallel-user")["build-two-at-a-time"]["used"] == 0


def test_a_failed_tool_is_settled_by_on_tool_error(run: Run) -> None:
    failed, after = run.report["tool_error"]["results"]
    assert "the command failed" in failed  # ModelRetry: the model is asked to retry
    assert after == "ran after"  # the failed call's slot was released
    usage = run.usage("errors-user")  # the user_id key of a dict deps
    assert usage["terminal-per-minute"]["used"] == 2
    assert usage["terminal-one-at-a-time"]["used"] == 0


def test_a_second_event_loop_gets_its_own_client(run: Run) -> None:
    """The same middleware in a second `asyncio.run`: httpx's pool is per loop."""
    assert run.report["second_loop"]["results"] == ["ran echo 1"]
    assert run.usage("discord:78")["terminal-per-minute"]["used"] == 1


def test_ask_returns_a_tool_permission_result(run: Run) -> None:
    direct = run.report["ask_direct"]
    assert direct["type"] == "ToolPermissionResult"
    assert direct["is_ask"]
    assert direct["reason"].startswith("Rate limit: max 1 deploy calls per minute")


def test_an_approved_ask_runs_and_is_recorded(run: Run) -> None:
    approved = run.report["ask_approved"]
    assert approved["results"] == ["ran deploy a", "ran deploy b"]
    assert approved["ran"] == 2
    [(tool, reason)] = approved["asked"]  # the handler saw the second call only
    assert tool == "deploy"
    assert reason.startswith("Rate limit: max 1 deploy calls per minute")
    # acct-9 came from the `user` callable; the daemon counted the approval.
    events = [entry["event"] for entry in run.denials("acct-9")]
    assert "approved" in events


def test_an_ask_without_a_handler_is_blocked(run: Run) -> None:
    no_handler = run.report["ask_no_handler"]
    assert no_handler["results"][0] == "ran deploy a"
    assert no_handler["results"][1].startswith(
        blocked("deploy", "Rate limit: max 1 deploy calls per minute")
    )
    assert no_handler["ran"] == 1


def test_a_tool_call_id_in_the_context_leads_the_call_id(run: Run) -> None:
    answer = run.report["tool_call_id"]
    assert answer["decision"] == "deny"
    assert answer["reason"].startswith("Rate limit: max 0 forbidden calls per minute")
    [entry] = run.denials("ids-user")
    assert entry["call_id"].startswith("call_xyz~")


def test_unreachable_daemon_fails_open(run: Run) -> None:
    fail_open = run.report["fail_open"]
    assert fail_open["results"] == ["ran echo 1", "ran echo 2", "ran echo 3"]
    assert fail_open["ran"] == 3


def test_unreachable_daemon_fails_closed_when_told(run: Run) -> None:
    fail_closed = run.report["fail_closed"]
    assert fail_closed["results"] == [blocked("terminal", UNAVAILABLE)] * 2
    assert fail_closed["ran"] == 0


def test_each_settle_carries_the_digest_of_the_tools_result(run: Run) -> None:
    """Issue #29 item 2: a call the daemon answered with `send_result` is settled with the
    digest of the result `after_tool_call` received."""
    from ratewarden.arguments import result_digest

    report = run.report["digest"]
    assert report["ran"] == 2
    assert report["results"] == ["ran gh run view 7"] * 2
    digests = [settle.get("result_digest") for settle in report["settles"]]
    assert digests == [result_digest("ran gh run view 7")] * 2
