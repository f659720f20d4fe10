"""Concurrency caps: a slot is leased at check, released at settle, and reclaimed after
the lease timeout when the caller vanished; and all or nothing across a rate rule, a
budget and a concurrency cap. Fake clock on all three stores, plus one real-time test on
a real redis-server whose `TIME` is the only clock.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Engine, Usage
from ratewarden.policy import parse_policy
from ratewarden.store import Store, store_from_url
from tests.conformance.test_budgets import engine_on, raw_state
from tests.helpers.redis_server import RedisServer

POLICY = """\
version: 1
defaults: {lease_timeout: 2m}
tools:
  "browser_*": {label: browser, cost: 0.05}
rules:
  - name: browser-concurrency
    match: {tool: "browser_*"}
    per: [user]
    concurrency: 2
  - name: deploy-slot
    match: {tool: deploy}
    per: []
    concurrency: 1
    lease_timeout: 30s
"""
MESSAGE = "Concurrency limit: max 2 browser calls at once"


async def slots(engine: Engine, user: str = "alice", tool: str = "browser_open") -> list[object]:
    """(rule, used, remaining, limit) of every concurrency rule, read without consuming."""
    return [
        (u.rule, u.used, u.remaining, u.limit)
        for u in await engine.usage(user, tool=tool)
        if u.kind == "concurrency"
    ]


async def test_slots_are_leased_at_check_and_released_at_settle(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(POLICY, store, clock)
    first = await engine.check(Call("alice", "browser_open", "c1"))
    second = await engine.check(Call("alice", "browser_click", "c2"))
    assert (first.decision, second.decision) == ("allow", "allow")
    assert [(v.rule, v.limit, v.remaining) for v in second.limits] == [
        ("browser-concurrency", 2, 0)
    ]
    assert await slots(engine) == [("browser-concurrency", 2, 0, 2)]

    third = await engine.check(Call("alice", "browser_open", "c3"))
    assert (third.decision, third.message) == ("deny", MESSAGE)
    assert third.retry_after is None  # only a settle frees a slot; no time to wait for
    [violation] = third.violations
    assert (violation.rule, violation.kind, violation.limit, violation.remaining) == (
        "browser-concurrency",
        "concurrency",
        2,
        0,
    )
    # Another user has their own slots.
    assert (await engine.check(Call("bob", "browser_open", "b1"))).allowed
    assert await slots(engine) == [("browser-concurrency", 2, 0, 2)]

    settled = await engine.settle("c1")
    assert (settled.outcome, settled.charged) == ("settled", {})
    assert await slots(engine) == [("browser-concurrency", 1, 1, 2)]
    retried = await engine.check(Call("alice", "browser_open", "c3"))  # refused: not recorded
    assert (retried.decision, retried.replayed) == ("allow", False)
    assert await slots(engine) == [("browser-concurrency", 2, 0, 2)]

    # Settling twice releases once: c2's and c3's slots stay held.
    assert (await engine.settle("c1")).outcome == "already_settled"
    assert await slots(engine) == [("browser-concurrency", 2, 0, 2)]
    await engine.settle("c2")
    await engine.settle("c3")
    assert await slots(engine) == [("browser-concurrency", 0, 2, 2)]


async def test_a_global_cap_counts_every_user(store: Store, clock: FakeClock) -> None:
    engine = engine_on(POLICY, store, clock)
    assert (await engine.check(Call("alice", "deploy", "d1"))).allowed
    denied = await engine.check(Call("bob", "deploy", "d2"))
    assert (denied.decision, denied.message) == (
        "deny",
        "Concurrency limit: max 1 deploy calls at once",
    )
    await engine.settle("d1")
    assert (await engine.check(Call("bob", "deploy", "d2"))).allowed


async def test_a_zero_cap_denies_every_call(store: Store, clock: FakeClock) -> None:
    engine = engine_on("version: 1\nrules:\n  - {name: none, concurrency: 0}\n", store, clock)
    denied = await engine.check(Call("alice", "x", "z"))
    assert (denied.decision, denied.message, denied.retry_after) == (
        "deny",
        "Concurrency limit: max 0 x calls at once",
        None,
    )
    assert await raw_state(store) == {}


@pytest.mark.parametrize(
    ("tool", "lease_ms", "rule"),
    [("browser_open", 120_000, "browser-concurrency"), ("deploy", 30_000, "deploy-slot")],
    ids=["default-lease", "rule-lease"],
)
async def test_a_crashed_callers_slot_returns_after_the_lease_timeout(
    store: Store, clock: FakeClock, tool: str, lease_ms: int, rule: str
) -> None:
    engine = engine_on(POLICY, store, clock)
    limit = 2 if rule == "browser-concurrency" else 1
    for i in range(limit):
        assert (await engine.check(Call("alice", tool, f"crashed-{i}"))).allowed
        clock.advance(10)
    clock.advance(lease_ms - 10 * limit - 1)  # the first lease has 1 ms left
    assert (await engine.check(Call("alice", tool, "waiting"))).decision == "deny"
    assert await slots(engine, tool=tool) == [(rule, limit, 0, limit)]

    clock.advance(1)  # the first lease expires now; the others 10 ms apart
    assert await slots(engine, tool=tool) == [(rule, limit - 1, 1, limit)]
    assert (await engine.check(Call("alice", tool, "waiting"))).allowed
    assert (await engine.check(Call("alice", tool, "next"))).decision == "deny"

    # The crashed caller's settle, when it finally comes, frees nobody else's slot.
    assert (await engine.settle("crashed-0")).outcome == "settled"
    assert await slots(engine, tool=tool) == [(rule, limit, 0, limit)]


@pytest.mark.parametrize(
    "position", [0, 1, 2], ids=["budget-first", "budget-second", "budget-last"]
)
async def test_when_only_the_budget_denies_no_rate_count_and_no_slot_is_taken(
    store: Store, clock: FakeClock, position: int
) -> None:
    rules = [
        "  - {name: calls, match: {tool: 'browser_*'}, rate: 10/minute}\n",
        "  - {name: slots, match: {tool: 'browser_*'}, concurrency: 2}\n",
    ]
    rules.insert(position, "  - {name: spend, budget: 1.00/day}\n")
    policy = "version: 1\ntools: {'browser_*': {label: browser, cost: 0.6}}\nrules:\n"
    engine = engine_on(policy + "".join(rules), store, clock)
    assert (await engine.check(Call("alice", "browser_open", "a1"))).allowed
    clock.advance(1_000)

    def view(usage: list[Usage]) -> dict[str, object]:
        return {u.rule: (u.used, u.remaining, u.reserved) for u in usage}

    usage_before = view(await engine.usage("alice", tool="browser_open"))
    assert usage_before == {"calls": (1, 9, None), "slots": (1, 1, None), "spend": (0.0, 0.4, 0.6)}
    state_before = await raw_state(store)
    assert sorted(state_before) == [
        "rw:call:{a1}",
        "rw:{calls|user=alice}:sw",
        "rw:{slots|user=alice}:cc",
        "rw:{spend|user=alice}:bg",
    ]

    for i in range(3):
        refused = await engine.check(Call("alice", "browser_open", f"refused-{i}"))
        assert refused.decision == "deny"
        assert [v.rule for v in refused.violations] == ["spend"]
        assert refused.message.startswith(
            "Budget exceeded for browser tools: 0.00 spent and 0.60 held by calls in flight of "
            "1.00 USD this day (retry in "
        )
        # The rate rule and the cap would have admitted it, and say so, unchanged.
        assert {v.rule: v.remaining for v in refused.limits} == {
            "calls": 9,
            "slots": 1,
            "spend": 0.4,
        }
    assert await raw_state(store) == state_before
    assert view(await engine.usage("alice", tool="browser_open")) == usage_before

    # A cheaper call fits and takes one of each.
    assert (await engine.check(Call("alice", "browser_open", "a2", cost=0.4))).allowed
    assert view(await engine.usage("alice", tool="browser_open")) == {
        "calls": (2, 8, None),
        "slots": (2, 0, None),
        "spend": (0.0, 0.0, 1.0),
    }


@pytest.mark.redis
async def test_lease_timeout_on_redis_time(redis_server: RedisServer, redis_url: str) -> None:
    """No injected clock: leases are scored by Redis TIME; a 1 s lease comes back by itself."""
    policy = (
        "version: 1\ndefaults: {lease_timeout: 1s, reservation_ttl: 1s, call_ttl: 1s}\n"
        "rules:\n  - {name: one, concurrency: 1}\n"
    )
    store = store_from_url(redis_url, timeout_ms=2_000)
    engine = Engine(parse_policy(policy.encode()), store)
    await store.start()
    try:
        started = time.monotonic()
        assert (await engine.check(Call("alice", "t", "vanished"))).allowed
        assert (await engine.check(Call("alice", "t", "second"))).decision == "deny"
        client = redis_server.client()
        pttl = client.pttl("rw:{one|user=alice}:cc")
        assert 0 < pttl <= 1_000
        deadline = started + 3.0
        while (await slots(engine, tool="t")) != [("one", 0, 1, 1)]:
            assert time.monotonic() < deadline, "the lease was never reclaimed"
            await asyncio.sleep(0.02)  # bounded polling on real time
        assert time.monotonic() - started >= 0.95  # not before the lease ran out
        assert (await engine.check(Call("alice", "t", "second"))).allowed
        client.close()
    finally:
        await store.close()
