"""OpenAI Agents SDK: ratewarden's tool guardrails inside real openai-agents 0.24.0 runs.

`tests/hosts/drivers/openai_agents_run.py` runs once, with the python of the openai_agents host
venv, against one real `ratewarden serve`; each scenario is a `Runner.run` for a user of
its own, with the SDK's `ScriptedModel` and real function tools. The tests read the
driver's report (what the model received, what the tools wrote, the guardrail results)
and ask the daemon what it counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hosts.scenario import TERMINAL_POLICY, Run, host_scenario

DRIVER = Path(__file__).parent / "drivers" / "openai_agents_run.py"
RATE_MESSAGE = "Rate limit: max 10 terminal calls per minute"
UNAVAILABLE = "Tool guard unavailable; terminal calls are paused"

# terminal-one-at-a-time: a call not settled holds the user's only slot, so allowed
# sequential calls prove the settles in between; builds run two at a time. deploy asks
# past one a minute.
POLICY = (
    TERMINAL_POLICY
    + """\
  - name: terminal-one-at-a-time
    match: {tool: terminal}
    concurrency: 1
  - name: build-two-at-a-time
    match: {tool: build}
    concurrency: 2
  - name: deploy-needs-approval
    match: {tool: deploy}
    rate: 1/minute
    on_exceed: ask
"""
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Every scenario, in one driver process; the daemon stays up for the tests' reads."""
    with host_scenario("openai_agents", POLICY, tmp_path_factory.mktemp("openai_agents")) as host:
        yield host.run(DRIVER)


pytestmark = pytest.mark.timeout(600)  # the first run builds the host venv


def test_eleventh_terminal_call_is_refused_and_ten_ran(run: Run) -> None:
    limit = run.report["limit"]
    results = limit["results"]
    assert results[:10] == [f"ran echo {i}" for i in range(1, 11)]
    assert results[10].startswith(RATE_MESSAGE), results[10]  # reject_content: unchanged
    assert len(results) == 11
    assert limit["ran"] == 10  # what the tool itself wrote
    assert limit["output"] == "done"  # the model read the refusal and answered
    decisions = [g["decision"] for g in limit["guardrails"]]
    assert decisions == ["allow"] * 10 + ["deny"]
    # The call id leads with the SDK's tool_call_id.
    assert [g["call_id"].split("~")[0] for g in limit["guardrails"]] == [
        f"call_{i}" for i in range(1, 12)
    ]
    usage = run.usage("discord:77")  # the run context's user_id
    assert usage["terminal-per-minute"]["used"] == 10
    # Ten calls through a cap of one at a time: the output guardrail settled each.
    assert usage["terminal-one-at-a-time"]["used"] == 0


def test_tool_call_ids_reused_across_runs_are_still_counted(run: Run) -> None:
    """Eleven runs whose model names its one call `call_1` each time."""
    repeat = run.report["repeat_ids"]
    assert repeat["results"][:10] == [f"ran echo {i}" for i in range(1, 11)]
    assert repeat["results"][10].startswith(RATE_MESSAGE)
    assert repeat["ran"] == 10
    assert run.usage("repeat-user")["terminal-per-minute"]["used"] == 10


def test_parallel_calls_are_each_settled(run: Run) -> None:
    parallel = run.report["parallel"]
    assert parallel["results"] == ["ran a", "ran b", "ran c", "ran d"]
    assert run.usage("parallel-user")["build-two-at-a-time"]["used"] == 0


def test_run_hooks_settle_instead_of_the_output_guardrail(run: Run) -> None:
    hooks = run.report["hooks"]
    assert hooks["results"] == ["ran echo 1", "ran echo 2", "ran echo 3"]
    assert run.usage("hooks-user")["terminal-one-at-a-time"]["used"] == 0


def test_without_settle_the_cap_refuses_the_second_call(run: Run) -> None:
    """The control: the input guardrail alone, nothing settles, the slot stays held."""
    no_settle = run.report["no_settle"]
    assert no_settle["results"] == [
        "ran echo 1",
        "Concurrency limit: max 1 terminal calls at once",
    ]
    assert no_settle["ran"] == 1


def test_a_failed_tool_is_settled(run: Run) -> None:
    """The SDK turns the tool's exception into a result; the output guardrail still runs."""
    failed, after = run.report["tool_error"]["results"]
    assert "error occurred while running the tool" in failed
    assert after == "ran after"  # the failed call's slot was released
    assert run.usage("errors-user")["terminal-one-at-a-time"]["used"] == 0


def test_the_factory_takes_a_guard_and_a_user_lookup(run: Run) -> None:
    factory = run.report["factory"]
    assert factory["results"] == ["ran echo 1", "ran echo 2"]
    usage = run.usage("acct-9")  # from the `user` callable, not a user_id
    assert usage["terminal-per-minute"]["used"] == 2
    assert usage["terminal-one-at-a-time"]["used"] == 0


def test_an_ask_is_a_refusal_here(run: Run) -> None:
    """The SDK's guardrails cannot ask a person: the model gets the message."""
    ask = run.report["ask"]
    assert ask["results"][0] == "ran a"
    assert ask["results"][1].startswith("Rate limit: max 1 deploy calls per minute")
    assert [g["decision"] for g in ask["guardrails"]] == ["allow", "ask"]
    assert ask["ran"] == 1


def test_unreachable_daemon_fails_open(run: Run) -> None:
    fail_open = run.report["fail_open"]
    assert fail_open["results"] == ["ran echo 1", "ran echo 2", "ran echo 3"]
    assert fail_open["ran"] == 3
    assert all(g["degraded"] for g in fail_open["guardrails"])


def test_unreachable_daemon_fails_closed_when_told(run: Run) -> None:
    fail_closed = run.report["fail_closed"]
    assert fail_closed["results"] == [UNAVAILABLE] * 2
    assert fail_closed["ran"] == 0


@pytest.mark.parametrize("scenario", ["digest_guardrail", "digest_hooks"])
def test_each_settle_carries_the_digest_of_the_tools_output(run: Run, scenario: str) -> None:
    """Issue #29 item 2: a call the daemon answered with `send_result` is settled, by the
    output guardrail or the run hooks, with the digest of the tool's output."""
    from ratewarden.arguments import result_digest

    report = run.report[scenario]
    assert report["ran"] == 2
    assert report["results"] == ["ran gh run view 7"] * 2
    digests = [settle.get("result_digest") for settle in report["settles"]]
    assert digests == [result_digest("ran gh run view 7")] * 2
