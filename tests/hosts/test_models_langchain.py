"""LangChain v1: model calls in one budget with tool calls, through RatewardenMiddleware's
`wrap_model_call` / `awrap_model_call` in a real `create_agent` loop, offline.

The scenario of tests/hosts/model_budget.py, driven by tests/hosts/drivers/
langchain_models.py in the langchain host venv against one real `ratewarden serve`: a
scripted chat model named gpt-4o reports `USAGE` on every answer; alice's model calls
drain her 1.00 USD day, each settle exact to the micro-unit against genai-prices; then
her tool call is refused with the budget's message and her model calls with the
single-call message (the agent ends its turn with it, no crash); bob is untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.daemon import clean_environment
from tests.hosts.model_budget import BUDGET, MODEL, POLICY, SINGLE_CALL, USAGE, price_micros
from tests.hosts.scenario import Run, host_scenario
from tests.hosts.test_one_budget_across_surfaces import midday_timezone

DRIVER = Path(__file__).parent / "drivers" / "langchain_models.py"
SRC = Path(__file__).resolve().parents[2] / "src"  # this checkout's ratewarden, not the venv's
TERMINAL = 50_000  # the policy's terminal cost, micro-USD
UNAVAILABLE = f"Tool guard unavailable; {MODEL} calls are paused"
SHORTER = {"input_tokens": 1_000, "output_tokens": 500, "cache_read_tokens": 0}

pytestmark = pytest.mark.timeout(900)


def driver_env(url: str) -> dict[str, str]:
    """The driver's environment: this checkout's src first."""
    return clean_environment(PYTHONPATH=str(SRC))


# the first run builds the host venv


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Every scenario, in one driver process; the daemon stays up for the tests' reads."""
    policy = POLICY.format(timezone=midday_timezone(datetime.now(UTC)))
    with host_scenario("langchain", policy, tmp_path_factory.mktemp("lc-models")) as host:
        config = host.config(model=MODEL, usage=USAGE)
        yield host.run(DRIVER, config, timeout=240, env=driver_env(host.url))


@pytest.fixture(scope="module")
def price() -> int:
    return price_micros()


def test_model_calls_drain_the_day_by_their_real_usage(run: Run, price: int) -> None:
    """Nine runs (invoke, then ainvoke), one model call each: every settle charges
    exactly genai-prices' price of the usage the model reported, and holds nothing."""
    drain = run.report["drain"]
    assert [step["model_calls"] for step in drain] == [1] * 9
    assert [step["output"] for step in drain] == ["done"] * 9
    assert [step["spent"] for step in drain] == [price * n for n in range(1, 10)]
    assert [step["reserved"] for step in drain] == [0] * 9


def test_the_tool_call_then_the_model_call_are_refused_in_one_turn(run: Run, price: int) -> None:
    """The tenth model call asks for terminal and spends; the tool call meets the
    budget's message; the model call after it could cost more than is left: the agent
    ends its turn with the single-call sentence, the model not asked."""
    turn = run.report["turn"]
    assert turn["model_calls"] == 1
    [refused_tool] = turn["tool_results"]
    assert BUDGET.match(refused_tool), refused_tool
    assert SINGLE_CALL.match(turn["output"]), turn["output"]
    assert turn["last_tool_calls"] == 0
    assert turn["last_metadata"]["ratewarden"] == {"decision": "deny", "rules": ["daily-spend"]}
    assert turn["raised"] is None
    assert (turn["spent"], turn["reserved"]) == (price * 10, 0)


def test_the_async_path_refuses_the_model_call_too(run: Run, price: int) -> None:
    refused = run.report["refused_async"]
    assert refused["model_calls"] == 0
    assert SINGLE_CALL.match(refused["output"]), refused["output"]
    assert (refused["spent"], refused["reserved"]) == (price * 10, 0)


def test_a_tools_only_service_meets_the_same_budget(run: Run, price: int) -> None:
    tools_only = run.report["tools_only"]
    [refused_tool] = tools_only["tool_results"]
    assert BUDGET.match(refused_tool), refused_tool
    assert "echo 2" not in run.report["ran"]
    assert tools_only["spent"] == price * 10  # its model calls are not checked


def test_a_shorter_answer_fits_in_what_is_left(run: Run, price: int) -> None:
    """The chat model's max_tokens sizes the reservation: 1000 tokens fit."""
    shorter = run.report["shorter"]
    assert (shorter["model_calls"], shorter["output"]) == (1, "done")
    assert shorter["spent"] == price * 10 + price_micros(MODEL, SHORTER)
    assert shorter["reserved"] == 0


def test_a_second_user_is_untouched(run: Run, price: int) -> None:
    assert run.report["bob_before"] == {"spent": 0, "reserved": 0}
    bob = run.report["bob"]
    assert bob["tool_results"] == ["ran echo 3"]
    assert run.report["ran"] == ["echo 3"]
    assert (bob["model_calls"], bob["output"]) == (2, "done")
    assert (bob["spent"], bob["reserved"]) == (price * 2 + TERMINAL, 0)


@pytest.mark.parametrize("scenario", ["failed", "failed_async"])
def test_a_model_that_raises_is_settled_with_nothing_used(run: Run, scenario: str) -> None:
    failed = run.report[scenario]
    assert failed["raised"] == "the provider is down"
    assert failed["model_calls"] == 1
    assert (failed["spent"], failed["reserved"]) == (0, 0)


def test_an_answer_without_usage_is_charged_its_reservation(run: Run) -> None:
    """No usage_metadata: the whole reservation (8000 output tokens, the policy's
    default, at 10 USD per million, and the estimated input) is charged."""
    no_usage = run.report["no_usage"]
    assert no_usage["output"] == "done"
    assert 80_000 < no_usage["spent"] < 81_000
    assert no_usage["reserved"] == 0


def test_the_daemon_records_both_refusals_under_one_rule(run: Run) -> None:
    denials: list[dict[str, Any]] = run.denials("alice")
    found = {(d["tool"], d["rule"]) for d in denials}
    assert found == {(MODEL, "daily-spend"), ("terminal", "daily-spend")}


def test_an_unreachable_daemon_fails_model_calls_by_the_fail_mode(run: Run) -> None:
    """Failing closed, the model is not asked and the agent reads why; failing open,
    it is asked, and nothing is counted."""
    closed, opened = run.report["fail_closed"], run.report["fail_open"]
    assert (closed["model_calls"], closed["output"]) == (0, UNAVAILABLE)
    assert (opened["model_calls"], opened["output"]) == (1, "done")
    assert (opened["spent"], opened["reserved"]) == (0, 0)


TOKEN_POLICY = """\
version: 1
rules:
  - name: gpt-tokens
    match: {model: "gpt-4o"}
    per: [user]
    rate: 20000 tokens/minute
"""
TOKEN_RATE = "Rate limit: max 20000 model tokens per minute"


def test_a_token_rate_counts_the_settled_tokens(tmp_path: Path) -> None:
    """A token rate alone holds nothing, yet each model call is settled with its usage
    (19 134 tokens): two fit under 20 000 a minute, the third is refused."""
    with host_scenario("langchain", TOKEN_POLICY, tmp_path) as host:
        config = host.config(model=MODEL, usage=USAGE, token_rate=True)
        found = host.run(DRIVER, config, timeout=240, env=driver_env(host.url)).report["token_rate"]
    assert [step["model_calls"] for step in found] == [1, 1, 0]
    assert [step["output"] for step in found][:2] == ["done", "done"]
    assert found[2]["output"].startswith(TOKEN_RATE), found[2]["output"]
