"""CrewAI model calls: RatewardenHooks' `before_llm_call` hook and CrewAI's LLM call
events inside a real crewai 1.15.30 Crew, against a real `ratewarden serve` (issue 31,
item 4).

The driver (tests/hosts/drivers/crewai_models.py) kicks off a Crew whose LLM is CrewAI's
own OpenAI provider (gpt-4o, max_tokens 8000) talking to a fake chat-completions server
that answers every request with one `terminal` call and reports the shared scenario's
usage (tests/hosts/model_budget.py) in OpenAI's names. The user's one daily budget pays
for both: every model call is charged by its usage, every terminal call its 0.05; once
what is left is less than a model call could cost, the next model call is refused:
`crew.kickoff()` raises CrewAI's HookAborted whose reason is the single-call message.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ratewarden.vocabulary import MAX_TOKENS
from tests.hosts.model_budget import POLICY, SINGLE_CALL, USAGE, price_micros, spent_micros
from tests.hosts.scenario import (
    clean_environment,
    host_python,
    nowhere,
    run_driver,
    running_daemon,
)
from tests.hosts.test_one_budget_across_surfaces import midday_timezone

DRIVER = Path(__file__).parent / "drivers" / "crewai_models.py"
TOOL_MICROS = 50_000  # the policy's terminal cost, 0.05 USD
OPENAI_USAGE = {  # USAGE as OpenAI's chat completions report it
    "prompt_tokens": USAGE["input_tokens"],
    "completion_tokens": USAGE["output_tokens"],
    "total_tokens": USAGE["input_tokens"] + USAGE["output_tokens"],
    "prompt_tokens_details": {"cached_tokens": USAGE["cache_read_tokens"]},
}


@pytest.fixture(scope="module")
def crewai_python() -> Path:
    return host_python("crewai")


def policy() -> str:
    return POLICY.format(timezone=midday_timezone(datetime.now(UTC)))


def drive(python: Path, url: str, work: Path, **config: Any) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = run_driver(
        python,
        DRIVER,
        {"usage": OPENAI_USAGE, **config, "work": str(work)},
        timeout=180,
        env=clean_environment(RATEWARDEN_URL=url),
    )
    return report


@pytest.mark.timeout(600)  # the first run builds the host venv
@pytest.mark.parametrize("use_async", [False, True], ids=["kickoff", "akickoff"])
def test_model_calls_are_charged_by_usage_until_one_is_refused(
    crewai_python: Path, tmp_path: Path, use_async: bool
) -> None:
    with running_daemon(policy(), tmp_path / "daemon") as daemon:
        report = drive(crewai_python, daemon.url, tmp_path, user="discord:77", use_async=use_async)
        spent = spent_micros(daemon, "discord:77")
        other = spent_micros(daemon, "discord:78")

    calls = report["requests"]  # model calls that reached the model
    assert report["error"] is None, report["error"]
    assert SINGLE_CALL.match(report["refusal"] or ""), report  # HookAborted's reason
    assert calls >= 5  # the budget paid for several calls before the refusal
    # Each answer asked for one terminal call, which ran; the last may have been refused
    # by the same budget (0.05 USD when less is left: the scenario's BUDGET message).
    ran = report["ran"]
    assert calls - 1 <= ran <= calls
    # Each model call charged exactly genai-prices' price of its usage, each tool its cost.
    assert spent == calls * price_micros() + ran * TOOL_MICROS
    assert other == 0


def test_a_failed_model_call_costs_nothing(crewai_python: Path, tmp_path: Path) -> None:
    """The provider answers the third request with a 500: that call is settled from
    CrewAI's LLMCallFailedEvent (nothing charged, its reservation released)."""
    with running_daemon(policy(), tmp_path / "daemon") as daemon:
        report = drive(crewai_python, daemon.url, tmp_path, user="discord:77", fail_at=2)
        spent = spent_micros(daemon, "discord:77")
    assert report["refusal"] is None
    assert report["error"] is not None  # CrewAI raises the provider's error to the caller
    assert "the provider is down" in report["error"]
    assert report["requests"] == 2  # answered; the third call failed
    assert report["ran"] == 2
    assert spent == 2 * price_micros() + 2 * TOOL_MICROS


def test_fail_closed_refuses_a_model_call_when_the_daemon_is_away(
    crewai_python: Path, tmp_path: Path
) -> None:
    report = drive(crewai_python, nowhere(), tmp_path, user="u", fail="closed")
    assert report["requests"] == 0  # the provider was never asked
    assert report["refusal"] == "Tool guard unavailable; gpt-4o calls are paused"
    assert report["error"] is None


# -- the adapter, without crewai -----------------------------------------------------------


def test_a_model_call_no_event_settled_is_released_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A later before_llm_call hook blocks the call ours allowed: CrewAI emits no LLM
    event for it. The run's next check releases it (after the wait), so it holds nothing."""
    import contextvars
    from types import SimpleNamespace

    from ratewarden.client import Guard
    from ratewarden.integrations import crewai

    monkeypatch.setattr(crewai, "SETTLE_WAIT_S", 0.05)
    one_at_a_time = (
        "version: 1\nrules:\n  - name: one\n    match: {model: gpt-4o}\n    concurrency: 1\n"
    )
    with running_daemon(one_at_a_time, tmp_path / "daemon") as daemon:
        hooks = crewai.RatewardenHooks(guard=Guard(daemon.url), user="u")
        llm = SimpleNamespace(model="gpt-4o", max_tokens=100)
        context = SimpleNamespace(llm=llm, messages=[{"role": "user", "content": "hi"}])

        def two_calls() -> tuple[object, object]:
            hooks.before_llm_call(context)
            first = crewai._MODEL_CALL.get()
            hooks.before_llm_call(context)  # no event came for the first
            return first, crewai._MODEL_CALL.get()

        first, second = contextvars.copy_context().run(two_calls)
        assert first is not None  # allowed, holding the rule's slot
        assert second is not None  # allowed too: the first was released
        assert second is not first
        hooks.guard.close()


def test_hostile_usage_counts_are_settled_within_the_wire(crewai_python: Path) -> None:
    """A provider's usage past the wire's cap, or below zero, read by CrewAI's own
    UsageMetrics: the settle takes the cap and zero, never a request the daemon refuses."""
    script = (
        "import json, types\n"
        "from ratewarden.integrations.crewai import event_settlement\n"
        "usage = {'prompt_tokens': 10**15, 'completion_tokens': -7,\n"
        "         'prompt_tokens_details': {'cached_tokens': 10**15}}\n"
        "event = types.SimpleNamespace(usage=usage)\n"
        "print(json.dumps(event_settlement(event).usage.model_dump()))\n"
    )
    done = subprocess.run(
        [str(crewai_python), "-c", script],
        capture_output=True, text=True, timeout=120, check=False,
        env=clean_environment(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "input_tokens": MAX_TOKENS,
        "output_tokens": 0,
        "cache_read_tokens": MAX_TOKENS,
        "cache_write_tokens": 0,
    }
