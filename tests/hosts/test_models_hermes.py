"""hermes-agent model calls: ratewarden's plugin's `llm_execution` middleware inside a
real hermes-agent 0.19.0 agent loop, against a real `ratewarden serve` (issue 31, item 4).

The driver (tests/hosts/drivers/hermes_models.py) runs `run_agent.AIAgent` (gpt-4o)
against the fake chat-completions server of hermes_loop.py, which answers every request
with one `terminal` call and reports the shared scenario's usage
(tests/hosts/model_budget.py) in OpenAI's names. The user's one daily budget pays for
both: every model call is charged by its usage, every terminal call its 0.05; once what
is left is less than a model call could cost, the middleware refuses the next model
call and the turn's final response is the single-call message.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ratewarden.vocabulary import MAX_TOKENS
from tests.hosts.model_budget import MODEL, POLICY, SINGLE_CALL, USAGE, price_micros, spent_micros
from tests.hosts.scenario import host_python, running_daemon
from tests.hosts.test_host_hermes import drive, hermes_home
from tests.hosts.test_one_budget_across_surfaces import midday_timezone

DRIVER = Path(__file__).parent / "drivers" / "hermes_models.py"
TOOL_MICROS = 50_000  # the policy's terminal cost, 0.05 USD
OPENAI_USAGE = {  # USAGE as OpenAI's chat completions report it
    "prompt_tokens": USAGE["input_tokens"],
    "completion_tokens": USAGE["output_tokens"],
    "total_tokens": USAGE["input_tokens"] + USAGE["output_tokens"],
    "prompt_tokens_details": {"cached_tokens": USAGE["cache_read_tokens"]},
}


@pytest.fixture(scope="module")
def hermes_python() -> Path:
    return host_python("hermes")


@pytest.mark.timeout(900)  # the first run builds the host venv
def test_model_calls_are_charged_by_usage_until_one_is_refused(
    hermes_python: Path, tmp_path: Path
) -> None:
    counter = tmp_path / "ran.txt"
    policy = POLICY.format(timezone=midday_timezone(datetime.now(UTC)))
    with running_daemon(policy, tmp_path / "daemon") as daemon:
        report = drive(
            hermes_python,
            tmp_path,
            [str(DRIVER)],
            {"counter": str(counter), "usage": OPENAI_USAGE, "model": MODEL},
            HERMES_HOME=str(hermes_home(tmp_path, "ratewarden")),
            RATEWARDEN_URL=daemon.url,
        )
        spent = spent_micros(daemon, "discord:1234")
    calls = report["requests"]  # model calls that reached the model
    ran = len(counter.read_text().splitlines()) if counter.exists() else 0
    assert SINGLE_CALL.match(report["final_response"] or ""), report["final_response"]
    # hermes' requests reserve more than the policy's 8000 output tokens would
    assert calls >= 3  # the budget paid for several calls before the refusal
    assert calls - 1 <= ran <= calls  # the last terminal call may meet the budget
    # Each model call charged exactly genai-prices' price of its usage, each tool its cost.
    assert spent == calls * price_micros() + ran * TOOL_MICROS


# -- the middleware, without hermes -------------------------------------------------------


def test_usage_is_read_in_each_api_shape() -> None:
    from ratewarden.integrations.hermes import response_settlement

    def usage_of(**fields: Any) -> Any:
        return response_settlement(SimpleNamespace(usage=SimpleNamespace(**fields))).usage

    chat = usage_of(
        prompt_tokens=100, completion_tokens=20, prompt_tokens_details={"cached_tokens": 40}
    )
    anthropic = usage_of(
        input_tokens=60, output_tokens=20, cache_read_input_tokens=40, cache_creation_input_tokens=0
    )
    responses = usage_of(
        input_tokens=100, output_tokens=20, input_tokens_details={"cached_tokens": 40}
    )
    for usage in (chat, anthropic, responses):
        assert (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens) == (100, 20, 40)
    assert response_settlement(SimpleNamespace(usage=None)).usage is None  # its reservation
    # Anthropic's input plus its cache counts past the wire's cap: the settle takes the cap.
    huge = usage_of(
        input_tokens=MAX_TOKENS, output_tokens=10**15,
        cache_read_input_tokens=MAX_TOKENS, cache_creation_input_tokens=MAX_TOKENS,
    )  # fmt: skip
    assert (huge.input_tokens, huge.output_tokens) == (MAX_TOKENS, MAX_TOKENS)
    assert (huge.cache_read_tokens, huge.cache_write_tokens) == (MAX_TOKENS, 0)


def test_a_refusal_is_an_answer_in_the_loops_shape() -> None:
    from ratewarden.integrations.hermes import refused_response

    chat = refused_response("No more today", "gpt-4o", "chat_completions")
    assert chat.choices[0].message.content == "No more today"
    assert chat.choices[0].message.tool_calls is None
    assert chat.choices[0].finish_reason == "stop"
    anthropic = refused_response("No more today", "claude", "anthropic_messages")
    assert anthropic.content[0].text == "No more today"
    assert anthropic.stop_reason == "end_turn"
