"""The budget sweep (service/sweep.py): a reservation left unsettled in a scope no call
comes back to is charged at its estimate, to its budget and its day's spend record.

On the memory store, fakeredis and a real redis-server, one fake clock (and on Redis
Cluster and Sentinel, tests/helpers/redis_cluster.py `STORE_SUITES`): a sweep after the
expiry charges the estimate once, however often it runs; a late settle then corrects it by
the difference, once; a reservation not yet expired is left alone; a rule since removed
has its counter charged in the counter's own period; the counter outlives its latest
reservation long enough for a sweep to find it; and one process at a time holds the claim.
"""

from __future__ import annotations

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Engine
from ratewarden.limiter.algorithms.budget import MAX_SWEEP_INTERVAL_S, SWEEP_GRACE_MS
from ratewarden.limiter.ops import Kind
from ratewarden.limiter.script import SOURCE
from ratewarden.policy import parse_policy
from ratewarden.service.sweep import BudgetSweeper
from ratewarden.store import MemoryStore, Store
from ratewarden.store.keys import SWEEP_CLAIM_KEY, counter_key, counter_rule
from ratewarden.store.redis_store import RedisStore
from tests.conformance.test_spend_records import DAY_END_MS, records, today

POLICY = """\
version: 1
defaults: {timezone: UTC, reservation_ttl: 10m}
rules:
  - {name: daily-spend, per: [user], budget: 5.00/day}
"""
WITHOUT_IT = """\
version: 1
defaults: {timezone: UTC, reservation_ttl: 10m}
rules:
  - {name: other, per: [user], budget: 5.00/day}
"""
TTL_MS = 10 * 60_000
ALICE = (("user", "alice"),)


def engine_on(store: Store, clock: FakeClock, policy: str = POLICY) -> Engine:
    return Engine(parse_policy(policy.encode()), store, clock=clock)


def sweeper(store: Store, engine: Engine, member: str = "test") -> BudgetSweeper:
    return BudgetSweeper(store, engine, 60, member, timeout_s=10)


async def spent_and_reserved(engine: Engine, user: str = "alice") -> tuple[float, float | None]:
    (usage,) = await engine.usage(user)
    return usage.used, usage.reserved


async def test_a_sweep_charges_an_expired_reservation_no_call_came_back_for(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    assert (await engine.check(Call("alice", "t", "c1", cost=0.80))).allowed
    clock.advance(TTL_MS)  # expired: nothing of alice's scope is called again
    assert await sweeper(store, engine).sweep() == 800_000
    assert await records(store, user="alice") == {("daily-spend", ALICE, today(clock)): 800_000}
    assert await sweeper(store, engine).sweep() == 0  # once, however often it runs
    assert await spent_and_reserved(engine) == (0.80, 0.0)
    assert await records(store, user="alice") == {("daily-spend", ALICE, today(clock)): 800_000}


async def test_a_late_settle_after_the_sweep_corrects_by_the_difference_once(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    await engine.check(Call("alice", "t", "c1", cost=0.80))
    clock.advance(TTL_MS + 1)
    assert await sweeper(store, engine).sweep() == 800_000
    settled = await engine.settle("c1", 0.30)
    assert settled.outcome == "settled"
    assert (await engine.settle("c1", 0.30)).outcome == "already_settled"
    assert await sweeper(store, engine).sweep() == 0
    assert await records(store, user="alice") == {("daily-spend", ALICE, today(clock)): 300_000}
    assert await spent_and_reserved(engine) == (0.30, 0.0)


async def test_a_reservation_not_yet_expired_is_left_alone(store: Store, clock: FakeClock) -> None:
    engine = engine_on(store, clock)
    await engine.check(Call("alice", "t", "c1", cost=0.80))
    await engine.check(Call("alice", "t", "c2", cost=0.10))
    clock.advance(TTL_MS - 1)
    assert await sweeper(store, engine).sweep() == 0
    assert await records(store) == {}
    clock.advance(1)  # both due now (reserved at the same instant)
    assert await sweeper(store, engine).sweep() == 900_000


async def test_only_the_expired_one_of_two_reservations_is_charged(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    await engine.check(Call("alice", "t", "c1", cost=0.80))
    clock.advance(5 * 60_000)
    await engine.check(Call("alice", "t", "c2", cost=0.10))
    clock.advance(5 * 60_000)  # c1 due, c2 five minutes from it
    assert await sweeper(store, engine).sweep() == 800_000
    assert await spent_and_reserved(engine) == (0.80, 0.10)
    await engine.settle("c2", 0.05)  # settled in time: its actual cost, not its estimate
    clock.advance(TTL_MS)
    assert await sweeper(store, engine).sweep() == 0
    assert await records(store, user="alice") == {("daily-spend", ALICE, today(clock)): 850_000}


async def test_a_removed_rules_counter_is_charged_in_its_own_period(
    store: Store, clock: FakeClock
) -> None:
    await engine_on(store, clock).check(Call("alice", "t", "c1", cost=0.40))
    clock.advance(TTL_MS)
    reloaded = engine_on(store, clock, WITHOUT_IT)  # the rule is gone from the policy
    assert reloaded.budget_period("daily-spend") == (0, 0, 0)
    assert await sweeper(store, reloaded).sweep() == 400_000
    assert await records(store, user="alice") == {("daily-spend", ALICE, today(clock)): 400_000}
    assert await sweeper(store, reloaded).sweep() == 0


async def test_a_reservation_expiring_just_before_the_period_ends_is_still_found(
    store: Store, clock: FakeClock
) -> None:
    """Its counter would have expired with the period; it lives 15 minutes past the
    reservation instead, so a sweep 10 minutes into the next day still charges it (into
    yesterday's period: the new day's budget starts at zero)."""
    engine = engine_on(store, clock)
    clock.advance(DAY_END_MS - clock.now_ms() - TTL_MS - 60_000)  # 11 min before midnight
    await engine.check(Call("alice", "t", "c1", cost=0.70))
    key = counter_key("daily-spend", Kind.BUDGET, ALICE)
    left = await _ttl_ms(store, key)
    assert left >= TTL_MS + SWEEP_GRACE_MS - 1000, left
    yesterday = today(clock)
    clock.advance(TTL_MS + 60_000 + 10 * 60_000)  # 10 min into the next day
    assert await sweeper(store, engine).sweep() == 700_000
    assert await records(store, user="alice") == {("daily-spend", ALICE, yesterday + 1): 700_000}
    assert await spent_and_reserved(engine) == (0.0, 0.0)  # charged to the day it expired in


async def test_one_claimant_at_a_time(store: Store, clock: FakeClock) -> None:
    engine = engine_on(store, clock)
    first, second = sweeper(store, engine, "one"), sweeper(store, engine, "two")
    await engine.check(Call("alice", "t", "c1", cost=0.20))
    clock.advance(TTL_MS)
    if isinstance(store, MemoryStore):  # one process: always its own
        assert await store.claim_sweep("two", 1000)
        return
    assert await store.claim_sweep("one", 30_000)
    assert await second.tick() == 0  # held by the first: no walk
    assert await records(store) == {}
    assert await store.claim_sweep("one", 30_000)  # renewed by its holder
    assert not await store.claim_sweep("two", 30_000)
    assert await first.tick() == 200_000
    if isinstance(store, RedisStore):  # the holder's tick renewed it for two intervals
        assert await store._client.pttl(SWEEP_CLAIM_KEY) > 100_000


def test_a_counter_key_names_its_rule() -> None:
    for rule in ["daily-spend", "a|b", "}:bg", "ünï {x}", "%41", "*?[]"]:
        key = counter_key(rule, Kind.BUDGET, [("user", "a|b}c")])
        assert counter_rule(key) == rule
        assert counter_rule(counter_key(rule, Kind.BUDGET, [])) == rule
    assert counter_rule("rw:spend:{x}:1") is None
    assert counter_rule("other") is None


async def _ttl_ms(store: Store, key: str) -> int:
    if isinstance(store, MemoryStore):
        return store._cells.ttl(key, store.clock.now_ms())
    client = store._client  # type: ignore[attr-defined]  # a Redis store, or a cluster's
    return int(await client.pttl(key))


def test_the_script_and_its_twin_keep_counters_the_same_grace() -> None:
    assert f"local SWEEP_GRACE_MS = {SWEEP_GRACE_MS}\n" in SOURCE
    assert SWEEP_GRACE_MS >= 3 * MAX_SWEEP_INTERVAL_S * 1000  # three sweeps at the longest


async def test_a_counter_whose_reservation_was_settled_is_not_swept_again(
    store: Store, clock: FakeClock
) -> None:
    """A settle leaves the counter's `n` naming its reservation; the first sweep past it
    charges nothing and sets `n` right, so the walk no longer finds the counter due."""
    engine = engine_on(store, clock)
    await engine.check(Call("alice", "t", "c1", cost=0.80))
    await engine.settle("c1", 0.25)
    clock.advance(TTL_MS)
    key = counter_key("daily-spend", Kind.BUDGET, ALICE)
    assert await sweeper(store, engine).sweep() == 0
    assert await _walk(store) == {key: None}
    assert await records(store, user="alice") == {("daily-spend", ALICE, today(clock)): 250_000}


async def test_keys_of_the_pattern_that_are_not_budget_counters_are_passed_by(
    store: Store, clock: FakeClock
) -> None:
    """Another program's keys under `rw:{...}:bg`: a string, a hash with a `n` that is
    no number, a key that is not ASCII. The walk passes them by and sweeps the rest."""
    if isinstance(store, MemoryStore):
        return  # no other program writes into it
    client = store._client  # type: ignore[attr-defined]  # a Redis store, or a cluster's
    await client.set("rw:{stray}:bg", "text")
    await client.hset("rw:{odd}:bg", mapping={"n": "soon", "h:x": "1:1"})
    await client.hset("rw:{ün}:bg".encode(), mapping={"n": "1"})
    engine = engine_on(store, clock)
    await engine.check(Call("alice", "t", "c1", cost=0.80))
    clock.advance(TTL_MS)
    assert await sweeper(store, engine).sweep() == 800_000
    assert await client.get("rw:{stray}:bg") == b"text"


async def _walk(store: Store) -> dict[str, int | None]:
    found: dict[str, int | None] = {}
    for _ in range(100):
        counters, ended = await store.budget_counters(1000)
        found.update(counters)
        if ended:
            return found
    raise AssertionError("the walk never ended")


async def test_a_walk_in_small_steps_reaches_every_counter(store: Store, clock: FakeClock) -> None:
    """Twenty users' counters (on every primary of a cluster: twenty hash tags), walked
    three at a time: seven steps charge every one, once."""
    engine = engine_on(store, clock)
    users = [f"user-{n}" for n in range(20)]
    for n, user in enumerate(users):
        assert (await engine.check(Call(user, "t", f"c{n}", cost=0.10))).allowed
    clock.advance(TTL_MS)
    small = BudgetSweeper(store, engine, 60, "test", timeout_s=10, batch=3)
    charged = [await small.sweep() for _ in range(7)]
    assert sum(charged) == 20 * 100_000, charged
    assert max(charged) <= 3 * 100_000  # no step went past its batch
    assert sum([await small.sweep() for _ in range(8)]) == 0  # a second walk: nothing
    found = await records(store)
    assert sorted(found.values()) == [100_000] * 20


async def test_a_step_that_meets_the_walks_end_begins_the_next_walk(
    store: Store, clock: FakeClock
) -> None:
    """Three counters walked three at a time: every step finds the three, none is idle
    (a SCAN's end is only known at the step after its last key)."""
    engine = engine_on(store, clock)
    for n in range(3):
        await engine.check(Call(f"user-{n}", "t", f"c{n}", cost=0.10))
    for _ in range(3):
        counters, _ = await store.budget_counters(3)
        assert len(counters) == 3, counters
