"""Golden tests of every sentence a model can receive, word for word."""

from __future__ import annotations

import time

import pytest

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Decision, Engine
from ratewarden.policy import PolicyError, parse_policy
from ratewarden.policy.durations import humanize_seconds, parse_rate
from ratewarden.policy.messages import DEFAULT_TEMPLATES, default_template, retry_text
from ratewarden.store import MemoryStore, store_from_url
from ratewarden.store.redis_store import RedisStore
from tests.helpers.redis_server import free_port


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (12, "12s"),
        (200, "3m20s"),
        (7500, "2h5m"),
        (0.2, "1s"),
        (0, "1s"),  # never "0s": a retry hint always asks for some wait
        (0.001, "1s"),
        (12.4, "13s"),  # rounds up: retrying after 12 s would be too early
        (59.8, "1m"),
        (60, "1m"),
        (61, "1m1s"),
        (3599, "59m59s"),
        (3600, "1h"),
        (3660, "1h1m"),
        (3661, "1h1m"),  # seconds are dropped once hours show
        (86_400, "24h"),
    ],
)
def test_humanize_seconds(seconds: float, text: str) -> None:
    assert humanize_seconds(seconds) == text


@pytest.mark.parametrize(
    ("rate", "limit", "window_ms", "window"),
    [
        ("10/minute", 10, 60_000, "minute"),
        ("5/10 minutes", 5, 600_000, "10 minutes"),
        ("7/30s", 7, 30_000, "30 seconds"),
        ("1/hour", 1, 3_600_000, "hour"),
        ("3/day", 3, 86_400_000, "day"),
        ("100/5m", 100, 300_000, "5 minutes"),
        ("2/1h", 2, 3_600_000, "hour"),
        ("4/second", 4, 1_000, "second"),
        ("6/2 hours", 6, 7_200_000, "2 hours"),
    ],
)
def test_window_words(rate: str, limit: int, window_ms: int, window: str) -> None:
    parsed = parse_rate(rate)
    assert (parsed.limit, parsed.window_ms, parsed.window) == (limit, window_ms, window)


def test_default_templates_are_the_documented_ones() -> None:
    assert DEFAULT_TEMPLATES == {
        "rate": "Rate limit: max {limit} {label} calls per {window}",
        "concurrency": "Concurrency limit: max {limit} {label} calls at once",
        "budget": (
            "Budget exceeded for {label} tools: spent {spent} of {budget} {currency} this {period}"
        ),
        "budget_held": (
            "Budget exceeded for {label} tools: {spent} spent and {reserved} held by calls in "
            "flight of {budget} {currency} this {period}"
        ),
        "unavailable": "Tool guard unavailable; {label} calls are paused",
        "repeated": (
            "Repeated call: {label} was called with the same arguments {limit} times in the "
            "last {window}; change the arguments or the approach"
        ),
        "same_result": (
            "Repeated call: {label} returned the same result {limit} times in a row; change "
            "the arguments or the approach"
        ),
        "model_budget": (
            "Budget exceeded for model calls: {spent} spent of {budget} {currency} this {period}"
        ),
        "model_budget_held": (
            "Budget exceeded for model calls: {spent} spent and {reserved} held by calls in "
            "flight of {budget} {currency} this {period}"
        ),
        "model_call_too_costly": (
            "This model call could cost up to {cost} {currency}; {remaining} {currency} is "
            "left of {whose} {budget} {currency} budget: ask for a shorter answer or a "
            "smaller model"
        ),
        "token_rate": "Rate limit: max {limit} model tokens per {window}",
        "no_price": (
            "No price is known for model {tool}: ask the operator to add it to the policy's models"
        ),
    }
    fields = {"limit": 2, "label": "browser", "window": "minute"}
    money = {"spent": "4.98", "budget": "5.00", "currency": "USD", "period": "day"}
    assert default_template("rate").render(fields, 12) == (
        "Rate limit: max 2 browser calls per minute (retry in 12s)"
    )
    assert default_template("concurrency").render(fields, None) == (
        "Concurrency limit: max 2 browser calls at once"
    )
    assert default_template("budget").render(fields | money, None) == (
        "Budget exceeded for browser tools: spent 4.98 of 5.00 USD this day"
    )
    assert default_template("budget").render(fields | money, 3_600) == (
        "Budget exceeded for browser tools: spent 4.98 of 5.00 USD this day (retry in 1h)"
    )
    # A loop's advice is to change course, not to wait: no retry suffix.
    assert default_template("same_result").render({**fields, "label": "terminal"}, 30) == (
        "Repeated call: terminal returned the same result 2 times in a row; change the "
        "arguments or the approach"
    )
    assert default_template("unavailable").render(fields, None) == (
        "Tool guard unavailable; browser calls are paused"
    )
    # No suffix when waiting does not help (None) or is not needed (0).
    assert (
        default_template("rate").render(fields, 0) == "Rate limit: max 2 browser calls per minute"
    )
    assert retry_text(None) == "later"
    assert retry_text(12.4) == "13s"


async def refuse(policy: str, tool: str = "terminal", step_ms: int = 0, at_ms: int = 0) -> Decision:
    """Call until refused (`step_ms` apart), wait `at_ms`, and return the next refusal."""
    clock = FakeClock()
    engine = Engine(parse_policy(policy.encode()), MemoryStore(clock))
    for i in range(1000):
        decision = await engine.check(Call(user="alice", tool=tool, call_id=f"fill-{i}"))
        if not decision.allowed:
            break
        clock.advance(step_ms)
    clock.advance(at_ms)
    return await engine.check(Call(user="alice", tool=tool, call_id="refused"))


async def test_the_example_sentence() -> None:
    decision = await refuse(
        "version: 1\nrules:\n  - {name: terminal-per-minute, match: {tool: terminal},"
        " rate: 10/minute}\n",
        at_ms=48_000,
    )
    assert decision.decision == "deny"
    assert decision.retry_after == 12.0
    assert decision.message == "Rate limit: max 10 terminal calls per minute (retry in 12s)"
    [violation] = decision.violations
    assert (violation.rule, violation.kind, violation.limit, violation.window) == (
        "terminal-per-minute",
        "rate",
        10,
        "minute",
    )
    assert violation.message == decision.message


@pytest.mark.parametrize(
    ("rate", "message", "retry_after"),
    [
        ("10/minute", "Rate limit: max 10 terminal calls per minute (retry in 1m)", 60.0),
        ("5/10 minutes", "Rate limit: max 5 terminal calls per 10 minutes (retry in 10m)", 600.0),
        ("2/30s", "Rate limit: max 2 terminal calls per 30 seconds (retry in 30s)", 30.0),
        ("4/90s", "Rate limit: max 4 terminal calls per 90 seconds (retry in 1m30s)", 90.0),
        ("1/hour", "Rate limit: max 1 terminal calls per hour (retry in 1h)", 3600.0),
        ("3/day", "Rate limit: max 3 terminal calls per day (retry in 24h)", 86_400.0),
        ("0/minute", "Rate limit: max 0 terminal calls per minute", None),
    ],
)
async def test_rate_messages_per_window(rate: str, message: str, retry_after: float | None) -> None:
    decision = await refuse(f"version: 1\nrules:\n  - {{name: r, rate: {rate}}}\n")
    assert (decision.decision, decision.message, decision.retry_after) == (
        "deny",
        message,
        retry_after,
    )


async def test_retry_suffix_rounds_up() -> None:
    decision = await refuse("version: 1\nrules:\n  - {name: r, rate: 1/minute}\n", at_ms=47_500)
    assert decision.retry_after == 12.5
    assert decision.message == "Rate limit: max 1 terminal calls per minute (retry in 13s)"


async def test_ask_uses_the_same_sentence() -> None:
    decision = await refuse(
        "version: 1\nrules:\n  - {name: r, rate: 1/hour, on_exceed: ask}\n", at_ms=1_000
    )
    assert decision.decision == "ask"
    assert decision.message == "Rate limit: max 1 terminal calls per hour (retry in 59m59s)"


CATALOGUE = """
version: 1
tools:
  terminal: {}
  "browser_*": {label: browser}
  web_search: {label: web search}
  default: {cost: 0}
rules:
"""


@pytest.mark.parametrize(
    ("rule", "tool", "label"),
    [
        # The rule's label beats the catalogue's.
        ("{name: r, rate: 1/minute, label: web browsing}", "browser_open", "web browsing"),
        ("{name: r, rate: 1/minute, label: shell}", "terminal", "shell"),
        # A glob entry of the catalogue.
        ("{name: r, rate: 1/minute}", "browser_open", "browser"),
        ("{name: r, rate: 1/minute}", "browser_click", "browser"),
        # An exact entry with a label.
        ("{name: r, rate: 1/minute}", "web_search", "web search"),
        # An entry without a label, and a tool the catalogue does not name: the tool name.
        ("{name: r, rate: 1/minute}", "terminal", "terminal"),
        ("{name: r, rate: 1/minute}", "file_write", "file_write"),
        ("{name: r, rate: 1/minute}", "browser", "browser"),  # not matched by browser_*
    ],
)
async def test_label_precedence(rule: str, tool: str, label: str) -> None:
    decision = await refuse(CATALOGUE + f"  - {rule}\n", tool=tool)
    assert decision.message == f"Rate limit: max 1 {label} calls per minute (retry in 1m)"


async def test_custom_template_with_every_placeholder() -> None:
    policy = (
        CATALOGUE + "  - name: slow-down\n"
        "    match: {tool: terminal}\n"
        "    rate: 2/minute\n"
        "    label: shell\n"
        '    message: "{rule}: {user} ran {tool} ({label}) past {limit}/{window};'
        ' {remaining} left, retry in {retry_after}"\n'
    )
    decision = await refuse(policy, step_ms=10_000, at_ms=28_000)
    # Two calls at 0 and 10 s; refused at 10 + 10 + 28 = 48 s: the call at 0 frees at 60 s.
    assert decision.retry_after == 12.0
    assert decision.message == (
        "slow-down: alice ran terminal (shell) past 2/minute; 0 left, retry in 12s"
    )  # and no automatic " (retry in ...)" suffix


async def test_custom_template_when_waiting_never_helps() -> None:
    decision = await refuse(
        "version: 1\nrules:\n"
        '  - {name: r, rate: 0/day, message: "No {tool} today; try {retry_after}"}\n'
    )
    assert decision.retry_after is None
    assert decision.message == "No terminal today; try later"


def test_unknown_placeholder_is_a_policy_error() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(
            b'version: 1\nrules:\n  - name: r\n    rate: 1/minute\n    message: "wait {eta}"\n',
            source="p.yaml",
        )
    [issue] = caught.value.issues
    assert issue.field == "rules[0].message"
    assert issue.line == 5
    assert "unknown placeholder {eta}" in issue.message


# ---------------------------------------------------------------------------- store down


async def decide_with_store_down(policy: str, tool: str = "terminal") -> tuple[Decision, float]:
    store = store_from_url(f"redis://127.0.0.1:{free_port()}/0", timeout_ms=100)
    assert isinstance(store, RedisStore)
    try:
        engine = Engine(parse_policy(policy.encode()), store)
        started = time.perf_counter()
        decision = await engine.check(Call(user="alice", tool=tool, call_id="c1"))
        return decision, time.perf_counter() - started
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("policy", "tool", "message"),
    [
        (
            "rules:\n  - {name: t, match: {tool: terminal}, rate: 10/minute, fail: closed}\n",
            "terminal",
            "Tool guard unavailable; terminal calls are paused",
        ),
        (  # a global default, and the catalogue's label
            "defaults: {fail: closed}\ntools: {'browser_*': {label: browser}}\n"
            "rules:\n  - {name: b, rate: 10/minute}\n",
            "browser_open",
            "Tool guard unavailable; browser calls are paused",
        ),
        (  # the rule's label; and one closed rule is enough
            "rules:\n  - {name: open, rate: 10/minute}\n"
            "  - {name: shut, rate: 5/minute, fail: closed, label: shell}\n",
            "terminal",
            "Tool guard unavailable; shell calls are paused",
        ),
    ],
    ids=["rule-fail-closed", "default-fail-closed", "one-of-two-closed"],
)
async def test_fail_closed_message(
    caplog: pytest.LogCaptureFixture, policy: str, tool: str, message: str
) -> None:
    decision, elapsed = await decide_with_store_down("version: 1\n" + policy, tool)
    assert decision.decision == "deny"
    assert decision.message == message
    assert decision.degraded is True
    assert decision.retry_after is None
    assert [(v.kind, v.message) for v in decision.violations] == [("unavailable", message)]
    assert elapsed < 1.0  # refused connection: answered at once, no retry loop
    assert "store unavailable" in caplog.text


@pytest.mark.parametrize(
    "policy",
    [
        "rules:\n  - {name: t, rate: 10/minute}\n",  # fail: open is the default
        "defaults: {fail: closed}\nrules:\n  - {name: t, rate: 10/minute, fail: open}\n",
        "rules:\n  - {name: t, rate: 10/minute, fail: closed, mode: shadow}\n",  # never blocks
    ],
    ids=["default-open", "rule-overrides-default", "shadow-rule"],
)
async def test_fail_open_allows_degraded(policy: str) -> None:
    decision, elapsed = await decide_with_store_down("version: 1\n" + policy)
    assert (decision.decision, decision.degraded, decision.message) == ("allow", True, "")
    assert decision.violations == ()
    assert elapsed < 1.0
