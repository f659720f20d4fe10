"""OpenAI Agents SDK: RatewardenModel checks a real run's model calls, the tool guardrail
its tool calls, from one daily budget (issue 31, item 6; tests/hosts/model_budget.py).

`tests/hosts/drivers/openai_agents_models.py` runs in the openai_agents host venv
(openai-agents 0.24.0) against one real `ratewarden serve`, with the SDK's
`ScriptedModel` reporting model_budget's USAGE for every answer, wrapped in
`RatewardenModel` priced as gpt-4o, the user in the run's context.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.hosts.model_budget import BUDGET, MODEL, POLICY, SINGLE_CALL, USAGE, price_micros
from tests.hosts.scenario import Run, host_scenario, new_user
from tests.hosts.test_models_pydantic_ai import DRAIN, SMALL
from tests.hosts.test_one_budget_across_surfaces import midday_timezone

DRIVER = Path(__file__).parent / "drivers" / "openai_agents_models.py"
pytestmark = pytest.mark.timeout(600)  # the first run builds the host venv


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    policy = POLICY.format(timezone=midday_timezone(datetime.now(UTC)))
    work = tmp_path_factory.mktemp("openai_agents_models")
    with host_scenario("openai_agents", policy, work) as host:
        config = host.config(
            model=MODEL, usage=USAGE, user=new_user("alice"), other=new_user("bob"), drain=DRAIN
        )
        yield host.run(DRIVER, config, timeout=300)


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
    assert last["requests"] == 1  # the call that asked for the tool was allowed
    [result] = last["tool_results"]
    assert BUDGET.match(result), result  # the tool's output, our message
    assert last["ran"] == 0


def test_a_call_that_could_cost_more_than_is_left_is_refused(run: Run) -> None:
    """The call after the tool's refusal never reached the model; the run ended with our
    message as its final output, no exception; streamed alike."""
    last = run.report["last"]
    assert SINGLE_CALL.match(last["output"]), last["output"]
    streamed = run.report["streamed"]
    assert SINGLE_CALL.match(streamed["output"]), streamed
    assert streamed["requests"] == 0


def test_max_tokens_sizes_the_reservation(run: Run) -> None:
    small = run.report["small"]
    assert small["requests"] == 1
    assert small["output"] == "answer 1"
    after = run.report["spent_after_last"] + price_micros(MODEL, SMALL)
    assert run.report["spent_after_small"] == after


def test_a_structured_run_gets_the_refusal_as_the_models(run: Run) -> None:
    """ModelRefusalError, or what `error_handlers["model_refusal"]` makes of it."""
    structured = run.report["structured"]
    assert SINGLE_CALL.match(structured["refused"]), structured
    assert structured["requests"] == 0
    assert run.report["handled"]["output"] == "Verdict(ok=False)"
    assert run.report["spent_at_end"] == run.report["spent_after_small"]  # refusals are free


def test_a_second_user_is_untouched(run: Run) -> None:
    report = run.report
    assert report["other_before"] == 0
    # Streamed (settled from the stream's response.completed), the model resolved by name
    # through the run config's provider: bob's spend is his calls' alone.
    other = report["other"]
    assert other["tool_results"] == ["ran echo hi"]
    assert other["ran"] == 1
    assert other["output"] == "answer 2"
    assert other["requests"] == 2
    assert report["other_spent"] == 2 * price_micros() + 50_000  # two answers, one terminal


def test_a_model_that_fails_is_settled_as_having_used_nothing(run: Run) -> None:
    """The provider raised: the run raised its error (the SDK's own, not ours), and the
    call's reservation was released without a charge."""
    fails = run.report["fails"]
    assert fails["error"] == "the provider is down"
    assert fails["requests"] == 1
    assert run.report["after_fail"] == [run.report["spent_after_small"], 0]


def test_a_stream_closed_half_read_is_charged_its_whole_reservation(run: Run) -> None:
    """The consumer closed the stream after its first event: the provider may have
    charged anything up to the reservation, so all of it is charged, nothing held."""
    half = run.report["half_read"]
    assert half["seen"][0] != "response.completed"  # closed before the usage was known
    assert half["reserved_while_streaming"] > 0
    assert half["charged"] == half["reserved_while_streaming"]
    assert half["reserved_after"] == 0


def test_a_stream_closed_after_its_usage_is_charged_that_usage(run: Run) -> None:
    done = run.report["closed_after_completion"]
    assert done["seen"][-1] == "response.completed"
    assert done["reserved_while_streaming"] > 0
    assert done["charged"] == price_micros(usage={"input_tokens": 100, "output_tokens": 50})
    assert done["reserved_after"] == 0
