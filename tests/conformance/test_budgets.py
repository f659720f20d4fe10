"""Budget rules: what a call costs, reserve-then-settle, soft limits, shadow and ask.

Every test runs on the memory store, fakeredis and a real redis-server, all on one fake
clock that the store and the engine share (the engine's clock picks the budget period,
the store's clock is the script's "now"). Amounts are asserted exactly: money is counted
in integer micro-units, so 0.1 + 0.2 is 0.3 here.

`raw_state` and `engine_on` are shared with the other issue-3 test files.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import datetime

import pytest

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Decision, Engine
from ratewarden.limiter.reference import Budget
from ratewarden.policy import parse_policy
from ratewarden.store import MemoryStore, Store
from ratewarden.store.keys import DENIALS_KEY
from ratewarden.store.redis_store import RedisStore

# The `clock` fixture starts at 2023-11-14T22:13:37.345Z: 6382.655 s before UTC midnight.
DAY_END_MS = 1_700_006_400_000
SECONDS_TO_DAY_END = 6382.655

POLICY = """\
version: 1
defaults: {timezone: UTC, reservation_ttl: 10m}
tools:
  "web_*": {cost: 0.03}
  web_search: {cost: 0.01}
  "browser_*": {label: browser, cost: 0.05}
  default: {cost: 0.02}
rules:
  - name: daily-spend
    per: [user]
    budget: 5.00/day
    currency: USD
    soft_limit: 80%
"""


def engine_on(policy_text: str, store: Store, clock: FakeClock) -> Engine:
    """An engine whose budget periods follow the same fake clock as the store."""
    return Engine(parse_policy(policy_text.encode()), store, clock=clock)


def ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


async def raw_state(store: Store) -> dict[str, object]:
    """Every live key the store holds (counters and call records), value by value.

    Not the recent-denials list: it is the audit trail's, pushed on a timer of its own
    (so present or not by how fast the machine runs the test), and the memory store keeps
    it apart from its counters. Nor the daemon's own bookkeeping (`rw:admin:`: runtime
    overrides, the fleet's reports, written by a served daemon's once-a-second poll)."""
    if isinstance(store, MemoryStore):
        now = store.clock.now_ms()
        return {
            key: _stored(value)
            for key, (value, expires_at) in store._cells.values.items()
            if expires_at > now
        }
    assert isinstance(store, RedisStore)
    client = store._client
    state: dict[str, object] = {}
    async for key in client.scan_iter(match="rw:*"):
        name = key.decode() if isinstance(key, bytes) else key
        if name == DENIALS_KEY or name.startswith("rw:admin:"):
            continue
        kind = await client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "string":
            state[name] = await client.get(key)
        elif kind == "hash":
            state[name] = await client.hgetall(key)
        else:
            assert kind == "zset", (key, kind)
            state[name] = await client.zrange(key, 0, -1, withscores=True)
    return state


def _stored(value: object) -> object:
    """A memory cell's value as Redis would hold it (a budget's scratch fields dropped)."""
    if isinstance(value, Budget):
        return replace(copy.deepcopy(value), finish=0, dirty=False)
    return copy.deepcopy(value)


async def money(engine: Engine, user: str = "alice") -> dict[str, tuple[float, float, float]]:
    """(used, reserved, remaining) of every budget rule of `user`, read without consuming."""
    return {
        u.rule: (u.used, u.reserved, u.remaining)  # type: ignore[misc]
        for u in await engine.usage(user)
        if u.kind == "budget"
    }


def budget_state(decision: Decision) -> tuple[float | None, float | None, object]:
    [limit] = decision.limits
    return limit.spent, limit.reserved, limit.remaining


async def test_cost_is_the_callers_else_the_catalogues_else_zero(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(POLICY, store, clock)
    steps = [
        ("browser_open", None, 0.05),  # glob entry
        ("web_search", None, 0.01),  # exact entry beats the earlier `web_*` glob
        ("web_fetch", None, 0.03),  # glob entry
        ("terminal", None, 0.02),  # `default` entry
        ("browser_open", 1.5, 1.5),  # the caller's cost beats the catalogue
        ("web_search", 0.0, 0.0),  # an explicit 0 is the caller's cost too
    ]
    reserved = 0.0
    for i, (tool, cost, expected) in enumerate(steps):
        decision = await engine.check(Call("alice", tool, f"c{i}", cost=cost))
        assert decision.decision == "allow"
        reserved = round(reserved + expected, 6)
        assert budget_state(decision) == (0.0, reserved, round(5.0 - reserved, 6)), tool
    assert await money(engine) == {"daily-spend": (0.0, 1.61, 3.39)}

    # Settling without a cost charges each call's own estimate.
    for i, (_, _, expected) in enumerate(steps):
        settled = await engine.settle(f"c{i}")
        assert (settled.outcome, settled.charged) == ("settled", {"daily-spend": expected})
    assert await money(engine) == {"daily-spend": (1.61, 0.0, 3.39)}


async def test_without_a_default_entry_an_uncatalogued_tool_costs_nothing(
    store: Store, clock: FakeClock
) -> None:
    policy = (
        "version: 1\ntools: {browser_open: {cost: 0.25}}\n"
        "rules:\n  - {name: spend, budget: 1.00/day}\n"
    )
    engine = engine_on(policy, store, clock)
    free = await engine.check(Call("alice", "terminal", "free"))
    assert (free.decision, budget_state(free)) == ("allow", (0.0, 0.0, 1.0))
    paid = await engine.check(Call("alice", "browser_open", "paid"))
    assert (paid.decision, budget_state(paid)) == ("allow", (0.0, 0.25, 0.75))
    assert (await engine.settle("free")).charged == {"spend": 0.0}
    assert await money(engine) == {"spend": (0.0, 0.25, 0.75)}


async def test_a_call_estimated_at_zero_is_charged_its_actual_cost_at_settle(
    store: Store, clock: FakeClock
) -> None:
    """Once the user's budget counter exists (here: an earlier priced call)."""
    engine = engine_on(POLICY.replace("default: {cost: 0.02}", "default: {cost: 0}"), store, clock)
    assert (await engine.check(Call("alice", "web_search", "priced"))).allowed
    assert (await engine.check(Call("alice", "llm", "unknown-cost"))).allowed
    settled = await engine.settle("unknown-cost", 4.0)
    assert (settled.outcome, settled.charged) == ("settled", {"daily-spend": 4.0})
    assert await money(engine) == {"daily-spend": (4.0, 0.01, 0.99)}


async def test_the_first_call_estimated_at_zero_is_charged_its_actual_cost_at_settle(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(POLICY.replace("default: {cost: 0.02}", "default: {cost: 0}"), store, clock)
    for i in range(3):  # every call is priced only when it settles
        assert (await engine.check(Call("alice", "llm", f"call-{i}"))).allowed
        settled = await engine.settle(f"call-{i}", 2.0)
        assert settled.outcome == "settled"
        spent = 2.0 * (i + 1)
        assert await money(engine) == {"daily-spend": (spent, 0.0, max(0.0, 5.0 - spent))}
    # Past the budget: refused (today: allowed, nothing was ever charged).
    assert (await engine.check(Call("alice", "llm", "call-3"))).decision == "deny"


async def test_settling_below_the_estimate_refunds_the_difference(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(POLICY, store, clock)
    assert (await engine.check(Call("alice", "terminal", "big", cost=2.0))).allowed
    assert await money(engine) == {"daily-spend": (0.0, 2.0, 3.0)}
    settled = await engine.settle("big", 0.5)
    assert (settled.outcome, settled.charged) == ("settled", {"daily-spend": 0.5})
    assert await money(engine) == {"daily-spend": (0.5, 0.0, 4.5)}

    # The refunded 1.50 is spendable again, to the last micro-unit and not beyond.
    assert (await engine.check(Call("alice", "terminal", "rest", cost=4.5))).allowed
    over = await engine.check(Call("alice", "terminal", "over", cost=0.000001))
    assert over.decision == "deny"
    assert await money(engine) == {"daily-spend": (0.5, 4.5, 0.0)}


async def test_an_extra_charge_may_pass_the_limit_and_then_calls_are_denied(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(POLICY, store, clock)
    assert (await engine.check(Call("alice", "browser_open", "b1", cost=1.0))).allowed
    settled = await engine.settle("b1", 6.0)
    assert (settled.outcome, settled.charged) == ("settled", {"daily-spend": 6.0})
    assert await money(engine) == {"daily-spend": (6.0, 0.0, 0.0)}

    for call_id, tool, cost in (("b2", "browser_open", None), ("b3", "browser_click", 0.0)):
        denied = await engine.check(Call("alice", tool, call_id, cost=cost))
        assert denied.decision == "deny"
        assert denied.message == (
            "Budget exceeded for browser tools: spent 6.00 of 5.00 USD this day (retry in 1h46m)"
        )
        assert denied.retry_after == SECONDS_TO_DAY_END
        [violation] = denied.violations
        assert (violation.rule, violation.kind, violation.limit) == ("daily-spend", "budget", 5.0)
        assert (violation.spent, violation.reserved, violation.remaining) == (6.0, 0.0, 0.0)
        assert (violation.currency, violation.period) == ("USD", "day")
        assert denied.warnings == ()  # a refused call is not "flagged", it is refused
    assert await money(engine) == {"daily-spend": (6.0, 0.0, 0.0)}

    # Another user's budget is their own.
    assert (await engine.check(Call("bob", "browser_open", "bob1"))).allowed

    # The period ends at UTC midnight (timezone: UTC): a new day, a new budget.
    clock.set(DAY_END_MS - 1)
    assert (await engine.check(Call("alice", "browser_open", "b4"))).decision == "deny"
    clock.set(DAY_END_MS)
    fresh = await engine.check(Call("alice", "browser_open", "b5"))
    assert (fresh.decision, budget_state(fresh)) == ("allow", (0.0, 0.05, 4.95))


async def test_soft_limit_flags_an_allowed_call_from_the_threshold_on(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(POLICY, store, clock)
    below = await engine.check(Call("alice", "browser_open", "s1", cost=3.99))
    assert (below.decision, below.warnings) == ("allow", ())
    assert below.limits[0].soft_limited is False

    at = await engine.check(Call("alice", "browser_open", "s2", cost=0.01))  # 4.00 = 80%
    assert at.decision == "allow"
    assert at.warnings == (
        "Budget soft limit: browser tools at 80% of 5.00 USD this day (daily-spend)",
    )
    # Settled spend counts towards the soft limit as much as reservations do.
    await engine.settle("s1")
    await engine.settle("s2")
    above = await engine.check(Call("alice", "terminal", "s3", cost=0.5))
    assert above.warnings == (
        "Budget soft limit: terminal tools at 90% of 5.00 USD this day (daily-spend)",
    )
    assert await money(engine) == {"daily-spend": (4.0, 0.5, 0.5)}


@pytest.mark.parametrize("written", ["25%", "25", "'25 %'"])
async def test_a_soft_limit_is_a_percentage(store: Store, clock: FakeClock, written: str) -> None:
    engine = engine_on(POLICY.replace("80%", written), store, clock)
    below = await engine.check(Call("alice", "web_search", "a", cost=1.249999))
    assert below.warnings == ()
    at = await engine.check(Call("alice", "web_search", "b", cost=0.000001))
    assert at.warnings == (
        "Budget soft limit: web_search tools at 25% of 5.00 USD this day (daily-spend)",
    )


async def test_no_soft_limit_means_no_warning(store: Store, clock: FakeClock) -> None:
    engine = engine_on(POLICY.replace("    soft_limit: 80%\n", ""), store, clock)
    decision = await engine.check(Call("alice", "browser_open", "x", cost=4.99))
    assert (decision.decision, decision.warnings) == ("allow", ())


async def test_a_cost_larger_than_the_whole_budget_is_denied_for_good(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(POLICY, store, clock)
    denied = await engine.check(Call("alice", "terminal", "huge", cost=5.000001))
    assert denied.decision == "deny"
    assert denied.retry_after is None  # waiting for the next period would not help
    assert denied.violations[0].retry_after is None
    assert denied.message == "Budget exceeded for terminal tools: spent 0.00 of 5.00 USD this day"
    assert await money(engine) == {"daily-spend": (0.0, 0.0, 5.0)}
    exact = await engine.check(Call("alice", "terminal", "exact", cost=5.0))
    assert (exact.decision, budget_state(exact)) == ("allow", (0.0, 5.0, 0.0))


async def test_a_zero_budget_denies_every_call(store: Store, clock: FakeClock) -> None:
    policy = "version: 1\nrules:\n  - {name: none, budget: 0/day, label: paid}\n"
    engine = engine_on(policy, store, clock)
    priced = await engine.check(Call("alice", "terminal", "p", cost=0.01))
    assert (priced.decision, priced.retry_after) == ("deny", None)
    assert priced.message == "Budget exceeded for paid tools: spent 0.00 of 0.00 USD this day"
    free = await engine.check(Call("alice", "terminal", "f"))  # even a free call
    assert free.decision == "deny"
    assert await money(engine) == {"none": (0.0, 0.0, 0.0)}
    assert await raw_state(store) == {}


async def test_a_shadow_budget_reports_and_allows(store: Store, clock: FakeClock) -> None:
    policy = (
        "version: 1\nrules:\n  - {name: watch, budget: 1.00/week, mode: shadow, currency: EUR}\n"
    )
    engine = engine_on(policy, store, clock)
    within = await engine.check(Call("alice", "terminal", "w1", cost=0.75))
    assert (within.decision, within.shadow, within.violations) == ("allow", (), ())
    assert await money(engine) == {"watch": (0.0, 0.75, 0.25)}  # shadow rules still count

    over = await engine.check(Call("alice", "terminal", "w2", cost=0.5))
    assert (over.decision, over.allowed, over.violations) == ("allow", True, ())
    [shadow] = over.shadow
    assert (shadow.rule, shadow.kind, shadow.spent, shadow.reserved) == ("watch", "budget", 0, 0.75)
    assert shadow.message.startswith(
        "Budget exceeded for terminal tools: 0.00 spent and 0.75 held by calls in flight of 1.00 "
        "EUR this week (retry in "
    )
    # What it would have refused is not reserved (it would not have run).
    assert await money(engine) == {"watch": (0.0, 0.75, 0.25)}


async def test_an_approved_ask_on_a_budget_reserves_past_the_limit(
    store: Store, clock: FakeClock
) -> None:
    policy = "version: 1\nrules:\n  - {name: spend, budget: 1.00/day, on_exceed: ask}\n"
    engine = engine_on(policy, store, clock)
    assert (await engine.check(Call("alice", "terminal", "a1", cost=0.8))).allowed

    asked = await engine.check(Call("alice", "terminal", "a2", cost=0.5))
    assert (asked.decision, asked.allowed, asked.approved) == ("ask", False, False)
    assert asked.message == (
        "Budget exceeded for terminal tools: 0.00 spent and 0.80 held by calls in flight of "
        "1.00 USD this day (retry in 1h46m)"
    )
    assert await money(engine) == {"spend": (0.0, 0.8, 0.2)}  # asking consumed nothing

    approved = await engine.check(Call("alice", "terminal", "a2", cost=0.5, approved=True))
    assert (approved.decision, approved.approved, approved.violations) == ("allow", True, ())
    assert approved.warnings == (
        "approved past spend: Budget exceeded for terminal tools: 0.00 spent and 1.30 held "
        "by calls in flight of 1.00 USD this day (retry in 1h46m)",
    )
    assert await money(engine) == {"spend": (0.0, 1.3, 0.0)}

    # Past the limit, the next unapproved call is asked about again; settling charges it.
    assert (await engine.check(Call("alice", "terminal", "a3", cost=0.01))).decision == "ask"
    assert (await engine.settle("a2")).charged == {"spend": 0.5}
    assert await money(engine) == {"spend": (0.5, 0.8, 0.0)}


async def test_an_unsettled_reservation_is_charged_at_its_estimate_after_its_ttl(
    store: Store, clock: FakeClock
) -> None:
    """reservation_ttl is 10 minutes: one ms before, still reserved; at the TTL, spent."""
    engine = engine_on(POLICY, store, clock)
    assert (await engine.check(Call("alice", "terminal", "lost", cost=0.3))).allowed
    clock.advance(600_000 - 1)
    assert await money(engine) == {"daily-spend": (0.0, 0.3, 4.7)}
    clock.advance(1)
    assert await money(engine) == {"daily-spend": (0.3, 0.0, 4.7)}
    # A check sees the same thing: the expired reservation is spend now.
    later = await engine.check(Call("alice", "terminal", "later", cost=4.7))
    assert (later.decision, budget_state(later)) == ("allow", (0.3, 4.7, 0.0))

    # A late settle (the record outlives the reservation) corrects by the difference...
    late = await engine.settle("lost", 0.1)
    assert (late.outcome, late.charged) == ("settled", {"daily-spend": 0.1})
    assert await money(engine) == {"daily-spend": (0.1, 4.7, 0.2)}
    # ...once.
    assert (await engine.settle("lost", 0.0)).outcome == "already_settled"
    assert await money(engine) == {"daily-spend": (0.1, 4.7, 0.2)}


async def test_refused_calls_and_usage_reads_create_no_keys(store: Store, clock: FakeClock) -> None:
    policy = (
        "version: 1\nrules:\n"
        "  - {name: calls, rate: 5/minute}\n"
        "  - {name: slots, concurrency: 1}\n"
        "  - {name: spend, budget: 1.00/day}\n"
    )
    engine = engine_on(policy, store, clock)
    assert await engine.usage("alice") != []
    assert await engine.usage("alice", tool="terminal", session="s") != []
    refused = await engine.check(Call("alice", "terminal", "too-dear", cost=2.0))
    assert refused.decision == "deny"
    assert await raw_state(store) == {}

    assert (await engine.check(Call("alice", "terminal", "ok", cost=0.4))).allowed
    after_one = await raw_state(store)
    assert sorted(after_one) == [
        "rw:call:{ok}",
        "rw:{calls|user=alice}:sw",
        "rw:{slots|user=alice}:cc",
        "rw:{spend|user=alice}:bg",
    ]
    for call_id, user, cost in (("busy", "alice", 0.1), ("b-dear", "bob", 1.5)):
        assert (await engine.check(Call(user, "terminal", call_id, cost=cost))).decision == "deny"
    await engine.usage("bob")
    await engine.usage("carol", tool="terminal")
    assert await raw_state(store) == after_one


@pytest.mark.parametrize("period", ["hour", "day", "week", "month"])
async def test_every_period_reports_its_name_and_resets_at_its_end(
    store: Store, clock: FakeClock, period: str
) -> None:
    # 2026-01-31 (a Saturday) 23:59:59 UTC: the hour, day and month end a second later,
    # the week two days later.
    clock.set(ms("2026-01-31T23:59:59+00:00"))
    ends = {
        "hour": ms("2026-02-01T00:00:00+00:00"),
        "day": ms("2026-02-01T00:00:00+00:00"),
        "week": ms("2026-02-02T00:00:00+00:00"),
        "month": ms("2026-02-01T00:00:00+00:00"),
    }
    engine = engine_on(f"version: 1\nrules:\n  - {{name: b, budget: 1/{period}}}\n", store, clock)
    assert (await engine.check(Call("alice", "t", "one", cost=1))).allowed
    await engine.settle("one")
    denied = await engine.check(Call("alice", "t", "two", cost=1))
    assert denied.decision == "deny"
    assert denied.message.startswith(
        f"Budget exceeded for t tools: spent 1.00 of 1.00 USD this {period}"
    )
    assert denied.retry_after == (ends[period] - clock.now_ms()) / 1000
    [usage] = await engine.usage("alice")
    assert (usage.period, usage.currency, usage.limit, usage.used) == (period, "USD", 1.0, 1.0)
    clock.set(ends[period] - 1)
    assert (await engine.check(Call("alice", "t", "three", cost=1))).decision == "deny"
    clock.set(ends[period])
    assert (await engine.check(Call("alice", "t", "four", cost=1))).allowed
