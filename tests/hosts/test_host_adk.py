"""Google ADK: RatewardenPlugin inside a real ADK runner loop, offline.

`tests/hosts/drivers/adk_agent.py` runs once, with the python of the adk host venv
(google-adk 2.13.0), against one real `ratewarden serve`; each scenario is a session of
its own user in an `InMemoryRunner`, whose agent's model is a scripted `BaseLlm` that
asks for function calls and records the function responses it receives. The tests read
the driver's report (what the model received, what the tools wrote, the confirmation
requests the runs paused on) and ask the daemon what it counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hosts.scenario import TERMINAL_POLICY, Run, clean_environment, host_scenario

DRIVER = Path(__file__).parent / "drivers" / "adk_agent.py"
RATE_MESSAGE = "Rate limit: max 10 terminal calls per minute"
DEPLOY_MESSAGE = "Rate limit: max 1 deploy calls per minute"
UNAVAILABLE = "Tool guard unavailable; terminal calls are paused"
APPROVAL_NEEDED = "A human must approve this call before it can run"
RM_REFUSED = "Refusing rm commands"

# terminal-one-at-a-time: a call not settled holds the user's only slot, so ten allowed
# sequential calls prove ten settles; builds run two at a time; no-rm reads the
# arguments; deploy asks past one a minute.
POLICY = (
    TERMINAL_POLICY
    + f"""\
  - name: terminal-one-at-a-time
    match: {{tool: terminal}}
    concurrency: 1
  - name: no-rm
    match:
      tool: terminal
      args: {{command: {{prefix: "rm "}}}}
    deny: "{RM_REFUSED}"
  - name: deploy-needs-approval
    match: {{tool: deploy}}
    rate: 1/minute
    on_exceed: ask
  - name: build-two-at-a-time
    match: {{tool: build}}
    concurrency: 2
  - name: publish-one-at-a-time
    match: {{tool: publish}}
    concurrency: 1
"""
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Every scenario, in one driver process; the daemon stays up for the tests' reads."""
    with host_scenario("adk", POLICY, tmp_path_factory.mktemp("adk")) as host:
        # Offline: no key for google-genai to look for, and no ADC lookup either.
        yield host.run(DRIVER, env=clean_environment(RATEWARDEN_URL=host.url, **OFFLINE))


OFFLINE = {
    "GOOGLE_GENAI_USE_VERTEXAI": "false",
    "GOOGLE_API_KEY": "",
    "GEMINI_API_KEY": "",
    "GOOGLE_APPLICATION_CREDENTIALS": "/nonexistent",
    "OTEL_SDK_DISABLED": "true",
}

pytestmark = pytest.mark.timeout(600)  # the first run builds the host venv


def error(message: str) -> dict[str, str]:
    """How RatewardenPlugin hands a refusal to the model: the function response."""
    return {"error": message}


def ran(*lines: str) -> list[dict[str, str]]:
    """How ADK hands a tool's string result to the model."""
    return [{"result": f"ran {line}"} for line in lines]


def test_eleventh_terminal_call_is_refused_and_ten_ran(run: Run) -> None:
    limit = run.report["limit"]
    results = limit["results"]  # every function response the model received, in order
    assert len(results) == 11
    assert results[:10] == ran(*(f"echo {i}" for i in range(1, 11)))
    assert list(results[10]) == ["error"], results[10]  # refused: the tool's result is ours
    assert RATE_MESSAGE in results[10]["error"]
    assert limit["ran"] == 10  # what the tool itself wrote
    assert limit["answered"]  # the model read the refusal and answered
    usage = run.usage("discord:77")  # the session's user_id
    assert usage["terminal-per-minute"]["used"] == 10
    # All ten went through a cap of one call at a time: each was settled after it ran.
    assert usage["terminal-one-at-a-time"]["used"] == 0


def test_a_second_user_still_gets_through(run: Run) -> None:
    """The same runner and plugin, a session of another user: a counter of its own."""
    second = run.report["second_user"]
    assert second["results"] == ran("echo 1", "echo 2")
    assert second["ran"] == 2
    assert run.usage("discord:78")["terminal-per-minute"]["used"] == 2


def test_the_function_call_id_leads_the_call_id(run: Run) -> None:
    [entry] = [e for e in run.denials("discord:77") if e["event"] == "deny"]
    assert entry["call_id"].startswith("fc-10-0~")  # the eleventh call's id


def test_the_arguments_reach_the_daemon(run: Run) -> None:
    """no-rm reads `command`: only the argument tells the two calls apart."""
    args = run.report["args"]
    assert args["results"] == [error(RM_REFUSED), *ran("echo ok")]
    assert args["ran"] == 1


def test_without_settle_the_cap_refuses_the_second_call(run: Run) -> None:
    """The control: a plugin whose after_tool_callback does not settle keeps its slot."""
    no_settle = run.report["no_settle"]
    assert no_settle["results"][0] == ran("echo 1")[0]
    assert "Concurrency limit: max 1 terminal calls at once" in no_settle["results"][1]["error"]
    assert no_settle["ran"] == 1


def test_parallel_calls_are_each_settled(run: Run) -> None:
    """Two turns of two parallel builds under a cap of two: the second turn runs only
    if each call of the first was settled under its own call id."""
    parallel = run.report["parallel"]
    assert parallel["results"] == ran("build a", "build b", "build c", "build d")
    assert run.usage("parallel-user")["build-two-at-a-time"]["used"] == 0


def test_a_failed_tool_is_released_by_on_tool_error(run: Run) -> None:
    failed = run.report["tool_error"]
    assert failed["error"] == "RuntimeError: the command failed"  # ADK ends the run
    assert failed["ran"] == 0
    # The user's only terminal slot was released: the next call runs.
    assert run.report["after_error"]["results"] == ran("after")
    usage = run.usage("errors-user")
    assert usage["terminal-per-minute"]["used"] == 2
    assert usage["terminal-one-at-a-time"]["used"] == 0


def test_a_cancelled_call_is_released(run: Run) -> None:
    """A parallel call fails while a build runs: ADK cancels the build, and tells the
    plugin through on_tool_error_callback."""
    cancelled = run.report["cancelled"]
    assert cancelled["error"] == "RuntimeError: the command failed"
    assert cancelled["ran"] == 0
    assert run.usage("cancel-user")["build-two-at-a-time"]["used"] == 0


def test_an_ask_pauses_the_run_for_a_confirmation(run: Run) -> None:
    paused = run.report["ask_approved"]["paused"]
    [request] = paused["confirmations"]
    assert request["hint"].startswith(
        f"ratewarden asks a human to approve this deploy call: {DEPLOY_MESSAGE}"
    )
    # The paused call's response (what the model reads if the run goes on unanswered).
    refusal = paused["responses"][-1]["error"]
    assert refusal.startswith(DEPLOY_MESSAGE)
    assert APPROVAL_NEEDED in refusal
    assert not paused["answered"]  # the model was not asked again: the run paused
    assert paused["ran"] == 1


def test_a_confirmed_ask_runs_and_is_recorded_as_approved(run: Run) -> None:
    answered = run.report["ask_approved"]["answered"]
    assert answered["results"] == ran("deploy a", "deploy b")  # the model's view after
    assert answered["ran"] == 2
    assert answered["answered"]
    # acct-approved came from the `user` callable (the session state); the daemon
    # counted the confirmation as an approval.
    events = [entry["event"] for entry in run.denials("acct-approved")]
    assert "approved" in events


def test_a_rejected_ask_is_refused_with_the_reason(run: Run) -> None:
    answered = run.report["ask_rejected"]["answered"]
    assert answered["results"][0] == ran("deploy a")[0]
    assert answered["results"][1]["error"].startswith(DEPLOY_MESSAGE)
    assert answered["ran"] == 1
    assert "approved" not in [entry["event"] for entry in run.denials("acct-rejected")]


def test_an_ask_without_confirmation_is_refused(run: Run) -> None:
    no_confirm = run.report["ask_no_confirm"]  # RatewardenPlugin(confirm=False)
    assert no_confirm["confirmations"] == []
    assert no_confirm["results"][0] == ran("deploy a")[0]
    refusal = no_confirm["results"][1]["error"]
    assert refusal.startswith(DEPLOY_MESSAGE)
    assert APPROVAL_NEEDED in refusal
    assert no_confirm["ran"] == 1


def test_the_tools_own_confirmation_approves_nothing_of_ours(run: Run) -> None:
    """`publish` has ADK's require_confirmation: its hint is ADK's, a yes runs it (checked
    again, not as approved), a no is the gate's refusal; its slot is released each time."""
    approved, rejected = run.report["own_approved"], run.report["own_rejected"]
    [request] = approved["paused"]["confirmations"]
    assert not request["hint"].startswith("ratewarden")
    assert approved["answered"]["results"] == ran("publish site")
    assert rejected["answered"]["results"] == [error("This tool call is rejected.")]
    assert rejected["answered"]["ran"] == 0
    for user in ("publisher-approved", "publisher-rejected"):
        assert run.usage(user)["publish-one-at-a-time"]["used"] == 0
        assert "approved" not in [entry["event"] for entry in run.denials(user)]


def test_unreachable_daemon_fails_open(run: Run) -> None:
    fail_open = run.report["fail_open"]
    assert fail_open["results"] == ran("echo 1", "echo 2", "echo 3")
    assert fail_open["ran"] == 3


def test_unreachable_daemon_fails_closed_when_told(run: Run) -> None:
    fail_closed = run.report["fail_closed"]
    assert fail_closed["results"] == [error(UNAVAILABLE)] * 2
    assert fail_closed["ran"] == 0


def test_each_settle_carries_the_digest_of_the_tools_response(run: Run) -> None:
    """Issue #29 item 2: a call the daemon answered with `send_result` is settled with the
    digest of the response after_tool_callback received (the tool's return value; the
    model reads it wrapped as {"result": ...})."""
    from ratewarden.arguments import result_digest

    report = run.report["digest"]
    assert report["ran"] == 2
    assert report["results"] == [{"result": "ran gh run view 7"}] * 2
    digests = [settle.get("result_digest") for settle in report["settles"]]
    assert digests == [result_digest("ran gh run view 7")] * 2
