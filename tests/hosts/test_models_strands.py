"""Strands model calls: RatewardenHook's BeforeModelCallEvent / AfterModelCallEvent inside
a real strands-agents 1.62.0 Agent, against a real `ratewarden serve` (issue 31, item 4).

The driver (tests/hosts/drivers/strands_agent.py, scenario `models`) runs an Agent whose
scripted model asks for one `terminal` call per turn and reports the shared scenario's
usage (tests/hosts/model_budget.py) for every answer, in Strands' names. The user's one
daily budget (`kind: any`) pays for both: every model call is charged by its usage,
every terminal call its 0.05; once what is left is less than a model call could cost,
the next model call is refused and the agent's reply is the single-call message.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.model_budget import MODEL, POLICY, SINGLE_CALL, USAGE, price_micros, spent_micros
from tests.hosts.scenario import clean_environment, host_python, run_driver, running_daemon
from tests.hosts.test_one_budget_across_surfaces import midday_timezone

DRIVER = Path(__file__).parent / "drivers" / "strands_agent.py"
TOOL_MICROS = 50_000  # the policy's terminal cost, 0.05 USD
MODEL_CONFIG = {"model_id": MODEL, "max_tokens": 8000}
# USAGE in Strands' names, as OpenAI-style providers report it: `inputTokens` holds the
# cached tokens (input + output == total)...
FOLDED = {
    "inputTokens": USAGE["input_tokens"],
    "outputTokens": USAGE["output_tokens"],
    "totalTokens": USAGE["input_tokens"] + USAGE["output_tokens"],
    "cacheReadInputTokens": USAGE["cache_read_tokens"],
}
# ...and as Bedrock reports it: the cached tokens apart from `inputTokens`.
APART = {**FOLDED, "inputTokens": USAGE["input_tokens"] - USAGE["cache_read_tokens"]}


@pytest.fixture(scope="module")
def strands_python() -> Path:
    return host_python("strands")


def policy() -> str:
    return POLICY.format(timezone=midday_timezone(datetime.now(UTC)))


def drive(python: Path, url: str, work: Path, **config: Any) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = run_driver(
        python,
        DRIVER,
        {"scenario": "models", "model_config": MODEL_CONFIG, **config, "work": str(work)},
        timeout=120,
        env=clean_environment(RATEWARDEN_URL=url),
    )
    return report


@pytest.mark.timeout(600)  # the first run builds the host venv
@pytest.mark.parametrize("usage", [FOLDED, APART], ids=["folded", "apart"])
def test_model_calls_are_charged_by_usage_until_one_is_refused(
    strands_python: Path, tmp_path: Path, usage: dict[str, int]
) -> None:
    with running_daemon(policy(), tmp_path / "daemon") as daemon:
        report = drive(strands_python, daemon.url, tmp_path, user="slack:U42", usage=usage)
        spent = spent_micros(daemon, "slack:U42")
        other = spent_micros(daemon, "slack:U43")

    turns = report["model_turns"]  # model calls that reached the model
    assert report["error"] is None  # the refusal is the agent's reply, not a crash
    assert SINGLE_CALL.match(report["reply"]), report["reply"]
    assert report["stop_reason"] == "end_turn"
    assert turns >= 5  # the budget paid for several calls before the refusal
    # Each answered turn asked for one terminal call, which ran; the last may have been
    # refused by the same budget (0.05 USD when less is left: the scenario's BUDGET).
    ran = len(report["ran"])
    assert turns - 1 <= ran <= turns
    # Each model call charged exactly genai-prices' price of its usage, each tool its cost.
    assert spent == turns * price_micros() + ran * TOOL_MICROS
    assert other == 0


def test_a_failed_model_call_costs_nothing(strands_python: Path, tmp_path: Path) -> None:
    """The provider fails in the middle of the third answer: that call is settled as
    failed (its reservation released, nothing charged) and Strands raises to the caller."""
    with running_daemon(policy(), tmp_path / "daemon") as daemon:
        report = drive(
            strands_python, daemon.url, tmp_path, user="slack:U42", usage=FOLDED, fail_at=2
        )
        spent = spent_micros(daemon, "slack:U42")
    # Strands wraps the provider's error in its EventLoopException, raised to the caller.
    assert report["error"].endswith("the provider dropped the connection")
    assert report["model_turns"] == 3
    assert spent == 2 * price_micros() + 2 * TOOL_MICROS


def test_fail_closed_refuses_a_model_call_when_the_daemon_is_away(
    strands_python: Path, tmp_path: Path
) -> None:
    from tests.hosts.scenario import nowhere

    report = drive(strands_python, nowhere(), tmp_path, user="u", usage=FOLDED, fail="closed")
    assert report["model_turns"] == 0  # the provider was never asked
    assert report["reply"] == f"Tool guard unavailable; {MODEL} calls are paused"


# -- the adapter's reading of Strands' events, without strands -----------------------------


def after(usage: Any = None, exception: Exception | None = None, metadata: bool = True) -> Any:
    from types import SimpleNamespace

    message: dict[str, Any] = {"role": "assistant", "content": [{"text": "hi"}]}
    if metadata:
        message["metadata"] = {"usage": usage, "metrics": {"latencyMs": 1}}
    response = None if exception else SimpleNamespace(message=message, stop_reason="end_turn")
    return SimpleNamespace(stop_response=response, exception=exception)


@pytest.mark.parametrize("usage", [FOLDED, APART], ids=["folded", "apart"])
def test_usage_is_read_with_the_cached_tokens_in_the_input(usage: dict[str, int]) -> None:
    from ratewarden.integrations.strands import model_settlement

    settle = model_settlement(after(usage))
    assert settle.usage is not None
    assert settle.usage.model_dump() == {
        "input_tokens": USAGE["input_tokens"],
        "output_tokens": USAGE["output_tokens"],
        "cache_read_tokens": USAGE["cache_read_tokens"],
        "cache_write_tokens": 0,
    }


def test_a_failed_a_cancelled_and_a_hostile_usage() -> None:
    from ratewarden.integrations.strands import model_settlement

    failed = model_settlement(after(exception=RuntimeError("down")))
    assert (failed.status, failed.usage.input_tokens if failed.usage else None) == ("error", 0)
    cancelled = model_settlement(after(metadata=False))  # cancelled by a later hook
    assert cancelled.status == "cancelled"
    assert cancelled.usage is not None
    assert cancelled.usage.output_tokens == 0
    hostile = {
        "inputTokens": -5,
        "outputTokens": True,
        "totalTokens": "x",
        "cacheReadInputTokens": 9,
    }
    settle = model_settlement(after(hostile))
    assert settle.usage is not None
    assert (settle.usage.input_tokens, settle.usage.output_tokens) == (0, 0)
    assert settle.usage.cache_read_tokens == 0  # never more than the input


def test_the_model_and_its_output_limit_come_from_the_model_config() -> None:
    from types import SimpleNamespace

    from ratewarden.integrations.strands import RatewardenHook, max_output_tokens
    from tests.hosts.test_host_strands import RefusingGuard

    class Model:
        def __init__(self, config: Any) -> None:
            self.config = config

        def get_config(self) -> Any:
            return self.config

    assert max_output_tokens(Model({"max_tokens": 8000})) == 8000
    assert max_output_tokens(Model({"params": {"max_completion_tokens": 300}})) == 300
    assert max_output_tokens(Model({"max_tokens": True})) is None
    assert max_output_tokens(Model(None)) is None
    hook = RatewardenHook(guard=RefusingGuard())
    agent = SimpleNamespace(
        model=Model({"model_id": "gpt-4o"}),
        system_prompt="x" * 40,
        messages=[{"role": "user", "content": [{"text": "y" * 40}]}],
    )
    event = SimpleNamespace(
        agent=agent, invocation_state={"user_id": "u"}, projected_input_tokens=None
    )
    request = hook.model_request_for(event)
    assert request is not None
    assert (request.model, request.input_tokens, request.max_output_tokens) == ("gpt-4o", 20, None)
    event.projected_input_tokens = 1234  # Strands' own count wins
    assert hook.model_request_for(event).input_tokens == 1234  # type: ignore[union-attr]
    assert RatewardenHook(guard=RefusingGuard(), model="my-model").model_name(agent.model) == (
        "my-model"
    )
    assert hook.model_name(Model({})) == "Model"  # nothing names it: its class
    hook.guard.close()


def test_counts_past_the_wires_cap_are_the_cap() -> None:
    from types import SimpleNamespace

    from ratewarden import vocabulary
    from ratewarden.integrations.strands import RatewardenHook, model_settlement
    from tests.hosts.test_host_strands import RefusingGuard

    huge = vocabulary.MAX_TOKENS * 10

    class Model:
        def get_config(self) -> Any:
            return {"model_id": "gpt-4o", "max_tokens": huge}

    hook = RatewardenHook(guard=RefusingGuard())
    agent = SimpleNamespace(model=Model(), system_prompt="", messages=[])
    event = SimpleNamespace(agent=agent, invocation_state={}, projected_input_tokens=huge)
    request = hook.model_request_for(event)
    assert request is not None  # checked at the cap, not unjudged
    assert request.input_tokens == request.max_output_tokens == vocabulary.MAX_TOKENS
    usage = {"inputTokens": huge, "outputTokens": huge, "totalTokens": 1}  # not folded
    settle = model_settlement(after({**usage, "cacheReadInputTokens": huge}))
    assert settle.usage is not None
    assert settle.usage.input_tokens == settle.usage.output_tokens == vocabulary.MAX_TOKENS
    hook.guard.close()


async def test_a_model_call_that_never_ran_is_released_by_the_next(tmp_path: Path) -> None:
    """A later hook's interrupt stops the call after ours allowed it, and Strands sends no
    AfterModelCallEvent: the agent's next model call releases it (one at a time)."""
    from types import SimpleNamespace

    from ratewarden.client import Guard
    from ratewarden.integrations.strands import RatewardenHook

    one_at_a_time = (
        "version: 1\nrules:\n  - name: one\n    match: {model: gpt-4o}\n    concurrency: 1\n"
    )
    with running_daemon(one_at_a_time, tmp_path / "daemon") as daemon:
        hook = RatewardenHook(guard=Guard(daemon.url))

        class Model:
            def get_config(self) -> Any:
                return MODEL_CONFIG

        agent = SimpleNamespace(model=Model(), system_prompt="", messages=[])

        def before() -> Any:
            state = {"user_id": "u"}
            return SimpleNamespace(
                agent=agent, invocation_state=state, projected_input_tokens=10, cancel=False
            )

        first = before()
        await hook.before_model_call(first)  # allowed, then interrupted: no after event
        assert hook._model_calls  # it holds the rule's slot (else this proves nothing)
        second = before()
        await hook.before_model_call(second)
        assert first.cancel is False
        assert second.cancel is False  # the first's slot was released, not held
        hook.guard.close()
