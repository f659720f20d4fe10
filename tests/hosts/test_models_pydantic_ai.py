"""pydantic-ai capabilities: RatewardenCapability guards a real Agent's model requests and
tool calls from one daily budget (issue 31, item 6; tests/hosts/model_budget.py).

`tests/hosts/drivers/pydantic_ai_models.py` runs in the pydantic_ai host venv
(pydantic-ai-slim 1.107.10) against one real `ratewarden serve`, with a `FunctionModel`
named gpt-4o that reports model_budget's USAGE for every answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.hosts.model_budget import BUDGET, MODEL, POLICY, SINGLE_CALL, USAGE, price_micros
from tests.hosts.scenario import Run, host_scenario, new_user
from tests.hosts.test_one_budget_across_surfaces import midday_timezone

DRIVER = Path(__file__).parent / "drivers" / "pydantic_ai_models.py"
TOOLS_DRIVER = Path(__file__).parent / "drivers" / "pydantic_ai_capability_tools.py"
# The capability's tool decisions alone (models=False), as the middleware's are proven:
# a call not settled would hold the user's one terminal slot.
TOOLS_POLICY = """\
version: 1
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 2/minute
  - name: terminal-one-at-a-time
    match: {tool: terminal}
    per: [user]
    concurrency: 1
  - name: deploy-needs-approval
    match: {tool: deploy}
    per: [user]
    rate: 1/minute
    on_exceed: ask
"""
RATE = "Rate limit: max 2 terminal calls per minute"
ASK = "Rate limit: max 1 deploy calls per minute"
DRAIN = 9  # answers that fit the day before the last run (checked below)
MAX_OUTPUT = 8000  # the policy's defaults.max_output_tokens
SMALL = {"input_tokens": 100, "output_tokens": 50}
pytestmark = pytest.mark.timeout(600)  # the first run builds the host venv


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    policy = POLICY.format(timezone=midday_timezone(datetime.now(UTC)))
    work = tmp_path_factory.mktemp("pydantic_ai_models")
    with host_scenario("pydantic_ai", policy, work) as host:
        config = host.config(
            model=MODEL, usage=USAGE, user=new_user("alice"), other=new_user("bob"), drain=DRAIN
        )
        yield host.run(DRIVER, config, timeout=300)


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    work = tmp_path_factory.mktemp("pydantic_ai_capability_tools")
    with host_scenario("pydantic_ai", TOOLS_POLICY, work) as host:
        yield host.run(TOOLS_DRIVER)


def test_the_capability_refuses_a_tool_call_with_the_message_as_its_result(tools: Run) -> None:
    limit = tools.report["limit"]
    assert limit["results"][:2] == ["ran t1", "ran t2"]  # each settled: one slot, reused
    assert limit["results"][2].startswith(RATE), limit["results"]
    assert limit["ran"] == 2
    assert limit["output"] == "done"  # the model read the refusal and answered
    usage = tools.usage("limit-user")
    assert usage["terminal-per-minute"]["used"] == 2
    assert usage["terminal-one-at-a-time"]["used"] == 0


def test_an_ask_is_a_refusal_unless_deferred(tools: Run) -> None:
    ask = tools.report["ask"]
    assert ask["results"][0] == "ran t1"
    assert ask["results"][1].startswith(ASK)
    assert ask["ran"] == 1


def test_a_deferred_ask_runs_once_approved_and_is_recorded(tools: Run) -> None:
    deferred = tools.report["deferred"]
    assert deferred["deferred"].startswith(ASK)  # ApprovalRequired's metadata
    assert deferred["results"] == ["ran t1", "ran t2"]
    assert deferred["ran"] == 2
    events = [entry["event"] for entry in tools.denials("deferred-user")]
    assert "approved" in events


def test_the_arithmetic_of_the_scenario() -> None:
    """Nine answers leave room for one more request at most 8000 output tokens long, the
    tenth leaves less than that request's maximum (10 USD per MTok of output)."""
    each = price_micros()
    assert 1_000_000 - DRAIN * each > MAX_OUTPUT * 10 + 1_000
    assert 1_000_000 - (DRAIN + 1) * each < MAX_OUTPUT * 10
    assert 1_000_000 - (DRAIN + 1) * each < 50_000  # the terminal's cost: it cannot fit


def test_model_calls_drain_the_day_by_their_real_usage(run: Run) -> None:
    report = run.report
    each = price_micros()
    assert [item["output"] for item in report["drain"]] == ["answer 1"] * DRAIN
    assert [item["requests"] for item in report["drain"]] == [1] * DRAIN
    # Each settle charged exactly genai-prices' price of the reported usage.
    assert report["spent"] == [each * k for k in range(1, DRAIN + 1)]
    assert report["spent_after_last"] == each * (DRAIN + 1)


def test_the_tool_call_is_refused_with_the_budget_message(run: Run) -> None:
    last = run.report["last"]
    assert last["requests"] == 1  # the request that asked for the tool was allowed
    [result] = last["tool_results"]
    assert BUDGET.match(result), result  # what the model read as the tool's result
    assert last["ran"] == 0


def test_a_request_that_could_cost_more_than_is_left_is_refused(run: Run) -> None:
    last = run.report["last"]
    # The request after the tool's refusal never reached the model: the run ended with
    # our message as its output, no exception; streamed alike.
    assert SINGLE_CALL.match(last["output"]), last["output"]
    assert last["requests"] == 1
    streamed = run.report["streamed"]  # agent.run_stream: the same answer, streamed
    assert SINGLE_CALL.match(streamed["output"]), streamed
    assert streamed["requests"] == 0


def test_max_tokens_sizes_the_reservation(run: Run) -> None:
    """With `max_tokens` 1000 the request's maximum fits what is left: asked and settled."""
    small = run.report["small"]
    assert small["requests"] == 1
    assert small["output"] == "answer 1"
    after = run.report["spent_after_last"] + price_micros(MODEL, SMALL)
    assert run.report["spent_after_small"] == after


def test_a_structured_run_gets_the_refusal_as_an_exception(run: Run) -> None:
    structured = run.report["structured"]
    assert SINGLE_CALL.match(structured["refused"]), structured
    assert structured["requests"] == 0


def test_a_second_user_is_untouched(run: Run) -> None:
    report = run.report
    assert report["other_before"] == 0
    other = report["other"]
    assert other["tool_results"] == ["ran echo hi"]
    assert other["ran"] == 1
    assert other["output"] == "answer 2"
    assert other["requests"] == 2
    assert report["other_spent"] == 2 * price_micros() + 50_000  # two answers, one terminal


def test_a_model_that_fails_is_settled_as_having_used_nothing(run: Run) -> None:
    """The provider raised: the run raised its error (pydantic-ai's own, not ours), and the
    call's reservation was released without a charge."""
    fails = run.report["fails"]
    assert fails["error"] == "the provider is down"
    assert fails["requests"] == 1
    assert run.report["after_fail"] == [run.report["spent_after_small"], 0]


def test_a_stream_given_up_half_read_is_charged_its_whole_reservation(run: Run) -> None:
    """The consumer gave up after the first chunk: pydantic-ai cancels the request's
    wrapper, and what the provider used is unknown, so all of the reservation is
    charged and nothing is left held."""
    given_up = run.report["abandoned"]
    assert given_up["chunks"] == ["answer 1"]
    assert given_up["reserved_while_streaming"] > 0
    assert given_up["charged"] == given_up["reserved_while_streaming"]
    assert given_up["reserved_after"] == 0
