"""Remembered refusals (engine/refusals.py): a refused call repeated is answered without
the store until its wait is over, and never when the answer could be different.

On the memory store and fakeredis, with a fake clock. The store is wrapped in a layer
that counts its `evaluate` calls, so "answered without the store" is counted, not
inferred. A twin engine with remembered refusals off, on the same store and clock, says
what the store itself answers at each instant: the remembered answer must be the same.
Real Redis (script runs counted by INFO commandstats, two daemons racing) is in
tests/stores/test_refusal_cache_redis.py.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

import fakeredis
import pytest
from prometheus_client import CollectorRegistry

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Decision, Engine
from ratewarden.engine.refusals import RefusalCache
from ratewarden.policy import Policy, parse_policy
from ratewarden.service.audit import AuditTrail
from ratewarden.service.metrics import Metrics
from ratewarden.service.observer import Observer
from ratewarden.store import MemoryStore, Store, StoreError
from ratewarden.store.base import Args, Layer
from ratewarden.store.redis_store import RedisStore
from tests.helpers.fakeredis_time import follow

T = TypeVar("T")
ALGORITHMS = ("sliding_window", "token_bucket", "fixed_window")
REMEMBERED = "ratewarden_remembered_refusals_total"


class Counted(Layer):
    """The store, with its `evaluate` calls counted; `down` makes every call fail."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.evaluations = 0
        self.down = False

    async def around(
        self, operation: str, function: Callable[[*Args], Awaitable[T]], *args: *Args
    ) -> T:
        if operation == "evaluate":
            self.evaluations += 1
        if self.down:
            raise StoreError("the test took the store down")
        return await function(*args)


@pytest.fixture(params=["memory", "fakeredis"])
async def store(
    request: pytest.FixtureRequest, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Counted]:
    inner: Store
    if request.param == "memory":
        inner = MemoryStore(clock)
    else:
        follow(monkeypatch, clock)  # its keys expire by the scripts' clock
        inner = RedisStore(fakeredis.FakeAsyncRedis(), "fakeredis", clock)
    counted = Counted(inner)
    await counted.start()
    yield counted
    await counted.close()


def policy(text: str) -> Policy:
    return parse_policy(f"version: 1\nrules:\n{text}".encode())


def one_rule(limit: int = 3, algorithm: str = "sliding_window", extra: str = "") -> Policy:
    return policy(
        f"  - {{name: per-user, per: [user], rate: {limit}/minute, algorithm: {algorithm}}}\n"
        + extra
    )


class Attempts:
    """Numbered calls of one engine, so every call_id is new (a refusal records nothing)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.count = 0

    async def __call__(self, user: str = "alice", tool: str = "terminal", **kw: object) -> Decision:
        self.count += 1
        call = Call(user=user, tool=tool, call_id=f"{user}-{self.count}", **kw)  # type: ignore[arg-type]
        return await self.engine.check(call)


def same_answer(a: Decision, b: Decision) -> bool:
    """Equal but for the call_id (each attempt has its own)."""
    return replace(a, call_id="") == replace(b, call_id="")


async def refused_alice(store: Counted, clock: FakeClock, rules: Policy) -> Attempts:
    """Alice's calls until the first refusal (from the store): her limit is used up."""
    attempt = Attempts(Engine(rules, store, clock=clock))
    while (await attempt()).allowed:
        assert attempt.count < 100
    return attempt


# -- answered without the store, until the wait is over --------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_refusal_repeated_is_answered_without_the_store_until_its_wait_ends(
    store: Counted, clock: FakeClock, algorithm: str
) -> None:
    rules = one_rule(3, algorithm)
    engine = Engine(rules, store, clock=clock)
    truth = Engine(rules, store, clock=clock, remember_refusals=False)  # the store's answer
    attempt = Attempts(engine)
    assert [(await attempt()).decision for _ in range(4)] == ["allow"] * 3 + ["deny"]
    first = await truth.check(Call("alice", "terminal", "truth-0"))
    assert first.decision == "deny"
    assert first.retry_after is not None
    asked = store.evaluations

    waits = []
    for step in range(5):  # a second apart: each answer is the store's at that instant
        answer = await attempt()
        expected = await truth.check(Call("alice", "terminal", f"truth-{step + 1}"))
        assert same_answer(answer, expected), (answer, expected)
        waits.append(answer.retry_after)
        clock.advance(1000)
    assert store.evaluations == asked + 5  # the twin's five; none of the engine's own
    assert engine.refusals.hits == 5
    assert waits == [first.retry_after - s for s in range(5)]  # shrinking with the clock

    assert first.retry_after > 5
    clock.advance(round(first.retry_after * 1000) - 5000)  # the wait is over
    admitted = await attempt()
    assert admitted.decision == "allow"
    assert store.evaluations == asked + 6  # the store was asked again
    assert engine.refusals.hits == 5


async def test_a_remembered_refusal_still_refuses_with_the_store_down(
    store: Counted, clock: FakeClock
) -> None:
    rules = policy(
        "  - {name: per-user, per: [user], rate: 2/minute, fail: open}\n"  # down: allow
    )
    attempt = await refused_alice(store, clock, rules)
    store.down = True
    remembered = await attempt()
    assert (remembered.decision, remembered.degraded) == ("deny", False)
    assert attempt.engine.refusals.hits == 1
    other = await attempt(user="bob")  # nothing remembered: the fail mode decides
    assert (other.decision, other.degraded) == ("allow", True)


# -- cleared by a reload, a reset and a changed limit ----------------------------------


async def test_a_reload_clears_it(store: Counted, clock: FakeClock) -> None:
    attempt = await refused_alice(store, clock, one_rule(2))
    assert (await attempt()).decision == "deny"
    asked = store.evaluations
    attempt.engine.policy = one_rule(2)  # what a reload does (service/reload.py)
    again = await attempt()
    assert again.decision == "deny"  # the same limits: refused, but by the store
    assert store.evaluations == asked + 1
    assert attempt.engine.refusals.hits == 1
    assert (await attempt()).decision == "deny"  # and remembered again
    assert store.evaluations == asked + 1


async def test_a_reset_clears_it(store: Counted, clock: FakeClock) -> None:
    attempt = await refused_alice(store, clock, one_rule(2))
    assert (await attempt()).decision == "deny"
    assert await attempt.engine.reset(user="alice") == 1
    asked = store.evaluations
    assert (await attempt()).decision == "allow"  # no wait: the counter is gone
    assert store.evaluations == asked + 1


class ClearedMidway(Layer):
    """The store, with `engine`'s refusals cleared while each evaluate is in flight: what a
    reset through another process, followed at this one's poll, can do."""

    engine: Engine | None = None
    ticker: FakeClock

    async def around(
        self, operation: str, function: Callable[[*Args], Awaitable[T]], *args: *Args
    ) -> T:
        found = await function(*args)
        if operation == "evaluate" and self.engine is not None:
            self.ticker.advance(1)  # the clear comes a moment after the question
            self.engine.refusals.clear()
        return found


async def test_a_refusal_asked_before_a_clear_is_not_remembered_after_it(
    store: Counted, clock: FakeClock
) -> None:
    await refused_alice(store, clock, one_rule(2))  # her limit is used up
    midway = ClearedMidway(store)
    midway.ticker = clock
    engine = midway.engine = Engine(one_rule(2), midway, clock=clock)
    assert (await engine.check(Call("alice", "terminal", "late"))).decision == "deny"
    assert len(engine.refusals) == 0  # the clear came after the question: not kept


async def test_an_override_that_raises_the_limit_clears_it(
    store: Counted, clock: FakeClock
) -> None:
    attempt = await refused_alice(store, clock, one_rule(2))
    assert (await attempt()).decision == "deny"
    asked = store.evaluations
    raised = "overrides:\n  - {users: [alice], rule: per-user, rate: 3/minute}\n"
    attempt.engine.policy = parse_policy(
        b"version: 1\nrules:\n  - {name: per-user, per: [user], rate: 2/minute}\n" + raised.encode()
    )
    assert (await attempt()).decision == "allow"  # the third call fits the new limit
    assert (await attempt()).decision == "deny"
    assert store.evaluations == asked + 2


# -- never remembered: what something besides waiting can lift --------------------------


async def test_an_ask_rules_refusal_is_not_remembered(store: Counted, clock: FakeClock) -> None:
    rules = policy("  - {name: confirm, per: [user], rate: 1/minute, on_exceed: ask}\n")
    attempt = Attempts(Engine(rules, store, clock=clock))
    assert (await attempt()).decision == "allow"
    for _ in range(3):
        assert (await attempt()).decision == "ask"
    asked = store.evaluations
    assert (await attempt(approved=True)).decision == "allow"  # the approval lets it past
    assert store.evaluations == asked + 1
    assert len(attempt.engine.refusals) == 0
    assert attempt.engine.refusals.hits == 0


async def test_a_budget_refusal_is_not_remembered(store: Counted, clock: FakeClock) -> None:
    rules = parse_policy(
        b"version: 1\ntools: {default: {cost: 0.02}}\n"
        b"rules:\n  - {name: spend, per: [user], budget: 0.05/day}\n"
    )
    engine = Engine(rules, store, clock=clock)
    assert [(await engine.check(Call("alice", "t", f"c{i}"))).decision for i in range(3)] == [
        "allow",
        "allow",
        "deny",
    ]
    for i in range(3):  # each asks the store: a settle may free money any moment
        assert (await engine.check(Call("alice", "t", f"again{i}"))).decision == "deny"
    assert store.evaluations == 6
    await engine.settle("c0", 0.0)  # charged nothing after all: 0.02 back
    assert (await engine.check(Call("alice", "t", "after-settle"))).decision == "allow"
    assert len(engine.refusals) == 0


async def test_a_concurrency_refusal_is_not_remembered(store: Counted, clock: FakeClock) -> None:
    rules = policy("  - {name: one-at-a-time, per: [user], concurrency: 1}\n")
    engine = Engine(rules, store, clock=clock)
    assert (await engine.check(Call("alice", "t", "running"))).decision == "allow"
    for i in range(3):
        assert (await engine.check(Call("alice", "t", f"c{i}"))).decision == "deny"
    assert store.evaluations == 4
    await engine.settle("running")  # the slot is free: the next call must get it
    assert (await engine.check(Call("alice", "t", "next"))).decision == "allow"
    assert len(engine.refusals) == 0


async def test_a_shadow_rule_is_not_remembered(store: Counted, clock: FakeClock) -> None:
    rules = policy(
        "  - {name: watched, per: [user], rate: 1/minute, mode: shadow}\n"
        "  - {name: enforced, per: [user, tool], rate: 2/minute}\n"
    )
    attempt = Attempts(Engine(rules, store, clock=clock))
    assert (await attempt(tool="a")).decision == "allow"
    shadowed = await attempt(tool="a")  # the shadow rule alone refuses, and it is asked
    assert (shadowed.decision, [v.rule for v in shadowed.shadow]) == ("allow", ["watched"])
    assert len(attempt.engine.refusals) == 0
    refused = await attempt(tool="a")  # both refuse: the shadow one would, the other does
    assert refused.decision == "deny"
    assert [v.rule for v in refused.violations] == ["enforced"]
    assert len(attempt.engine.refusals) == 1  # the enforcing rule's counter only
    for _ in range(2):  # another tool: again the shadow rule alone, asked each time
        shadowed = await attempt(tool="b")
        assert (shadowed.decision, [v.rule for v in shadowed.shadow]) == ("allow", ["watched"])
    assert store.evaluations == 5
    remembered = await attempt(tool="a")
    assert [v.rule for v in remembered.violations] == ["enforced"]
    assert remembered.shadow == ()  # only the remembered refusals are listed
    assert store.evaluations == 5


# -- one counter, several limits --------------------------------------------------------


async def test_a_shared_counter_is_not_answered_from_another_users_limit(
    store: Counted, clock: FakeClock
) -> None:
    rules = parse_policy(
        b"version: 1\nrules:\n  - {name: per-tool, per: [tool], rate: 2/minute}\n"
        b"overrides:\n  - {users: [vip], rule: per-tool, rate: 4/minute}\n"
    )
    attempt = await refused_alice(store, clock, rules)  # the shared counter at 2: refused
    assert (await attempt()).decision == "deny"
    assert attempt.engine.refusals.hits == 1
    assert [(await attempt(user="vip")).decision for _ in range(3)] == ["allow", "allow", "deny"]
    assert attempt.engine.refusals.hits == 1  # vip's limit is 4: never alice's entry
    assert (await attempt(user="vip")).decision == "deny"
    assert attempt.engine.refusals.hits == 2  # vip's own refusal, remembered
    assert (await attempt()).decision == "deny"  # and alice's limit is still 2


# -- bounded, and never admitting -------------------------------------------------------

THREE_RULES = """\
  - {name: a, per: [user], rate: 1/minute}
  - {name: b, per: [user], rate: 1/minute, algorithm: token_bucket}
  - {name: c, per: [user], rate: 1/minute, algorithm: fixed_window}
"""


async def test_the_cache_never_grows_past_its_bound(store: Counted, clock: FakeClock) -> None:
    engine = Engine(policy(THREE_RULES), store, clock=clock)
    engine.refusals = RefusalCache(clock, max_entries=4)
    for i in range(20):  # each user's second call is refused by three counters at once
        for attempt in range(3):
            await engine.check(Call(f"user-{i}", "t", f"{i}-{attempt}"))
            assert len(engine.refusals) <= 4
            clock.advance(10)
    assert engine.refusals.hits > 0  # it was used all along


SHARED = """\
version: 1
rules:
  - {name: per-user, per: [user], rate: 3/10s}
  - {name: per-tool, per: [tool], rate: 5/10s, algorithm: token_bucket}
  - {name: per-pair, per: [user, tool], rate: 2/10s, algorithm: fixed_window}
  - {name: confirm, match: {tool: deploy}, per: [user], rate: 1/10s, on_exceed: ask}
overrides:
  - {users: [vip], rule: per-tool, rate: 8/10s}
  - {users: [u1], rule: per-user, rate: 1/10s}
"""


@pytest.mark.parametrize("seed", range(4))
async def test_it_never_answers_otherwise_than_the_store(
    store: Counted, clock: FakeClock, seed: int
) -> None:
    """Two engines make the same random calls, each on its own store: one remembers
    refusals in a small cache, one does not. Every decision is the same."""
    twin_clock = FakeClock(clock.now_ms())
    twin_store = MemoryStore(twin_clock)
    rules = parse_policy(SHARED.encode())
    engine = Engine(rules, store, clock=clock)
    engine.refusals = RefusalCache(clock, max_entries=3)
    twin = Engine(rules, twin_store, clock=twin_clock, remember_refusals=False)
    pick = random.Random(seed)
    for i in range(300):
        user = pick.choice(["u1", "u2", "vip"])
        tool = pick.choice(["terminal", "web", "deploy"])
        approved = pick.random() < 0.1
        call = Call(user, tool, f"c{i}", approved=approved)
        got, expected = await engine.check(call), await twin.check(call)
        assert got.decision == expected.decision, (i, got, expected)
        assert len(engine.refusals) <= 3
        step = pick.choice([0, 0, 0, 50, 400, 2000])
        clock.advance(step)
        twin_clock.advance(step)
    assert engine.refusals.hits > 0


# -- the metric -------------------------------------------------------------------------


async def test_the_metric_counts_each_check_answered_from_memory(
    store: Counted, clock: FakeClock
) -> None:
    registry = CollectorRegistry()
    engine = Engine(one_rule(1), store, clock=clock)
    observer = Observer(Metrics(registry), AuditTrail(store), engine.refusals)
    rules = engine.policy

    async def check(i: int, user: str = "alice") -> Decision:
        call = Call(user, "terminal", f"c{i}")
        decision = await engine.check(call)
        observer.checked(decision, call, None, rules, 0.001)
        return decision

    assert registry.get_sample_value(REMEMBERED) == 0
    assert [(await check(i)).decision for i in range(2)] == ["allow", "deny"]  # the store's
    assert registry.get_sample_value(REMEMBERED) == 0
    for i in range(2, 7):
        await check(i)
    await check(7, user="bob")  # allowed by the store
    assert registry.get_sample_value(REMEMBERED) == 5
    assert engine.refusals.hits == 5
