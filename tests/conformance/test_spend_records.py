"""Spend records: each budget counter's money charged per UTC day (store/keys.py).

On the memory store, fakeredis and a real redis-server, one fake clock (and on Redis
Cluster and Sentinel, tests/helpers/redis_cluster.py `STORE_SUITES`): a settle writes
its charge into today's record, an expired reservation its estimate, a late settle its
correction (negative too); a reservation, a refusal or a usage read writes none; the
record lives until the end of its day plus the retention; a reset leaves the history;
0 days of retention keeps none. Names that are glob characters, formulas, separators or
Unicode are read back exactly, and never match another user's pattern.
"""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Engine
from ratewarden.limiter.algorithms.budget import DAY_MS
from ratewarden.limiter.ops import Kind
from ratewarden.limiter.script import source
from ratewarden.policy import parse_policy
from ratewarden.store import MemoryStore, Store
from ratewarden.store.keys import counter_key, parse_spend_key, spend_patterns
from ratewarden.store.redis_store import RedisStore
from ratewarden.vocabulary import CallKind
from ratewarden.wire.bodies import ModelUsage
from tests.helpers.redis_server import RedisServer

POLICY = """\
version: 1
defaults: {timezone: UTC, reservation_ttl: 10m}
rules:
  - {name: daily-spend, per: [user], budget: 5.00/day, currency: USD}
  - {name: team-spend, per: [team], budget: 50.00/day, currency: EUR}
"""
DAY_END_MS = 1_700_006_400_000  # the conftest clock's UTC midnight (6382.655 s ahead)


def engine_on(store: Store, clock: FakeClock, policy: str = POLICY) -> Engine:
    return Engine(parse_policy(policy.encode()), store, clock=clock)


Found = dict[tuple[str, tuple[tuple[str, str], ...], int], int]


async def records(store: Store, user: str | None = None, team: str | None = None) -> Found:
    """{(rule, scope, day): micro-units} of the records the filters' patterns find."""
    found: Found = {}
    for pattern in spend_patterns(None, user, team):
        for key, micros in await store.spend_records(pattern, 1000):
            parsed = parse_spend_key(key)
            assert parsed is not None, key
            if not parsed.model:
                found[parsed.rule, parsed.scope, parsed.day] = micros
    return found


async def ttl_ms(store: Store, rule: str, scope: list[tuple[str, str]], day: int) -> int:
    key = "rw:spend:" + counter_key(rule, Kind.BUDGET, scope)[3:-3] + f":{day}"
    if isinstance(store, MemoryStore):
        return store._cells.ttl(key, store.clock.now_ms())
    client = store._client  # type: ignore[attr-defined]  # a Redis store, or a cluster's
    return int(await client.pttl(key))


def today(clock: FakeClock) -> int:
    return clock.now_ms() // DAY_MS


async def test_a_settle_writes_its_charge_into_todays_record(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    call = Call("alice", "t", "c1", team="red", cost=0.50)
    assert (await engine.check(call)).allowed
    assert await records(store) == {}  # a reservation alone writes none
    await engine.usage("alice", team="red")
    assert await records(store) == {}  # nor does a read
    await engine.settle("c1", 0.30)
    day = today(clock)
    assert await records(store, user="alice") == {
        ("daily-spend", (("user", "alice"),), day): 300_000
    }
    assert await records(store, team="red") == {("team-spend", (("team", "red"),), day): 300_000}
    assert await records(store, user="bob") == {}


async def test_a_record_lives_until_its_day_ends_plus_the_retention(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    await engine.check(Call("alice", "t", "c1", cost=0.10))
    await engine.settle("c1", 0.10)
    left = await ttl_ms(store, "daily-spend", [("user", "alice")], today(clock))
    assert abs(left - (DAY_END_MS + 90 * DAY_MS - clock.now_ms())) <= 5


async def test_an_expired_reservation_is_recorded_at_its_estimate_and_its_late_settle_nets_out(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    await engine.check(Call("alice", "t", "c1", cost=0.80))
    clock.advance(10 * 60_000)  # expired: charged at its estimate by the next load
    await engine.usage("alice")
    key = ("daily-spend", (("user", "alice"),), today(clock))
    assert await records(store, user="alice") == {key: 800_000}
    await engine.settle("c1", 0.10)  # late, same day and period: corrected by -0.70
    assert await records(store, user="alice") == {key: 100_000}
    clock.advance(DAY_END_MS - clock.now_ms() + 1000)  # tomorrow: a refund of 0.05 more
    await engine.check(Call("alice", "t", "c2", cost=0.20))
    clock.advance(10 * 60_000)
    await engine.usage("alice")
    await engine.settle("c2", 0.15)
    tomorrow = ("daily-spend", (("user", "alice"),), today(clock))
    assert await records(store, user="alice") == {key: 100_000, tomorrow: 150_000}


async def test_a_refused_call_writes_no_record(store: Store, clock: FakeClock) -> None:
    engine = engine_on(store, clock)
    refused = await engine.check(Call("alice", "t", "c1", cost=6.00))
    assert not refused.allowed
    assert await records(store) == {}


async def test_a_reset_leaves_the_spend_history(store: Store, clock: FakeClock) -> None:
    engine = engine_on(store, clock)
    await engine.check(Call("alice", "t", "c1", cost=0.40))
    await engine.settle("c1", 0.40)
    assert await engine.reset("alice") >= 1
    assert await engine.reset(None, "daily-spend") == 0
    assert list((await records(store, user="alice")).values()) == [400_000]
    [usage] = [u for u in await engine.usage("alice") if u.rule == "daily-spend"]
    assert usage.used == 0  # the budget itself starts afresh


HOSTILE = [
    "*",
    "a*",
    "[ab]",
    "a?b",
    "back\\slash",
    '=HYPERLINK("http://x","y")',
    "+1",
    "-1",
    "@SUM(1)",
    "a|user=b",
    "x}:bg",
    "{tag}",
    "ユーザー",
    "emoji 💸",
    "%2A",
]


async def test_names_are_read_back_exactly_and_never_match_another(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    for i, user in enumerate(HOSTILE):
        await engine.check(Call(user, "t", f"c{i}", team=user, cost=0.01 * (i + 1)))
        await engine.settle(f"c{i}", None)
    day = today(clock)
    for i, user in enumerate(HOSTILE):
        expected = {("daily-spend", (("user", user),), day): 10_000 * (i + 1)}
        assert await records(store, user=user) == expected, user
        team = {("team-spend", (("team", user),), day): 10_000 * (i + 1)}
        assert await records(store, team=user) == team, user
    assert len(await records(store)) == 2 * len(HOSTILE)


async def test_two_budgets_of_one_call_each_keep_their_own_record(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    await engine.check(Call("alice", "t", "c1", team="red", cost=0.25))
    await engine.check(Call("bob", "t", "c2", team="red", cost=0.50))
    await engine.settle("c1", None)
    await engine.settle("c2", 0.75)
    day = today(clock)
    assert await records(store, team="red") == {("team-spend", (("team", "red"),), day): 1_000_000}
    assert await records(store, user="bob") == {("daily-spend", (("user", "bob"),), day): 750_000}


@pytest.mark.redis
async def test_no_retention_keeps_no_record(redis_url: str, clock: FakeClock) -> None:
    stores: list[Store] = [
        MemoryStore(clock, spend_retention_days=0),
        RedisStore(aioredis.Redis.from_url(redis_url), redis_url, clock, 0),
    ]
    for store in stores:
        await store.start()
        engine = engine_on(store, clock)
        await engine.check(Call("alice", "t", "c1", cost=0.40))
        await engine.settle("c1", 0.40)
        [usage] = [u for u in await engine.usage("alice") if u.rule == "daily-spend"]
        assert usage.used == 0.40
        assert await records(store) == {}
        await store.close()


def test_the_retention_is_bounded() -> None:
    assert "SPEND_RETENTION_DAYS = 3660\n" in source(3660)
    for wrong in (-1, 3661, 10**9):
        with pytest.raises(ValueError, match="spend retention must be 0 to 3660 days"):
            source(wrong)


async def test_a_record_on_a_real_server_is_a_string_of_micro_units(
    redis_server: RedisServer, clock: FakeClock
) -> None:
    redis_server.client().flushall()
    store = RedisStore(aioredis.Redis.from_url(redis_server.url), redis_server.url, clock)
    await store.start()
    try:
        engine = engine_on(store, clock)
        await engine.check(Call("discord:1234", "t", "c1", cost=1.25))
        await engine.settle("c1", None)
        key = f"rw:spend:{{daily-spend|user=discord%3A1234}}:{today(clock)}"
        assert await store._client.get(key) == b"1250000"
    finally:
        await store.close()


MODEL_POLICY = """\
version: 1
defaults: {timezone: UTC, reservation_ttl: 10m}
models:
  "house-*": {input: 2, output: 8}
rules:
  - {name: daily-spend, match: {kind: any}, per: [user], budget: 5.00/day}
  - {name: team-spend, match: {kind: any}, per: [team], budget: 50.00/day}
"""


async def model_records(store: Store, user: str | None = None) -> Found:
    """{(rule, scope, day): micro-units} of the model records (`...:<day>:m`)."""
    found: Found = {}
    for pattern in spend_patterns(None, user, None):
        for key, micros in await store.spend_records(pattern, 1000):
            parsed = parse_spend_key(key)
            assert parsed is not None, key
            if parsed.model:
                found[parsed.rule, parsed.scope, parsed.day] = micros
    return found


async def test_a_model_calls_settle_writes_its_charge_as_model_spend_too(
    store: Store, clock: FakeClock
) -> None:
    """One model call and one tool call: the day's record holds both, its model record
    the model call's priced usage, for each budget that charged it (in the same step)."""
    engine = engine_on(store, clock, MODEL_POLICY)
    model = Call("alice", "house-7", "m1", team="red", kind=CallKind.MODEL,
                 input_tokens=1000, max_output_tokens=4000)  # fmt: skip
    assert (await engine.check(model)).allowed
    assert (await engine.check(Call("alice", "t", "t1", team="red", cost=0.25))).allowed
    usage = ModelUsage(input_tokens=1000, output_tokens=500)  # 2000 + 4000 micro-USD
    settled = await engine.settle("m1", usage=usage)
    assert settled.charged == {"daily-spend": 0.006, "team-spend": 0.006}
    await engine.settle("t1", 0.25)
    day = today(clock)
    alice = (("user", "alice"),)
    assert (await records(store, user="alice"))["daily-spend", alice, day] == 256_000
    assert await model_records(store) == {
        ("daily-spend", alice, day): 6_000,
        ("team-spend", (("team", "red"),), day): 6_000,
    }
    await engine.settle("m1", usage=usage)  # a second settle moves nothing
    assert (await model_records(store, user="alice"))["daily-spend", alice, day] == 6_000


async def test_a_model_call_without_usage_is_model_spend_at_its_reservation(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(store, clock, MODEL_POLICY)
    model = Call("bob", "house-7", "m2", kind=CallKind.MODEL, input_tokens=100,
                 max_output_tokens=100)  # fmt: skip
    assert (await engine.check(model)).allowed
    await engine.settle("m2")  # no usage: charged its whole reservation, 200 + 800
    bob = (("user", "bob"),)
    assert (await model_records(store, user="bob")) == {("daily-spend", bob, today(clock)): 1000}


async def test_tool_calls_write_no_model_record(store: Store, clock: FakeClock) -> None:
    engine = engine_on(store, clock, MODEL_POLICY)
    assert (await engine.check(Call("carol", "t", "t2", cost=0.25))).allowed
    await engine.settle("t2", 0.20)
    assert await records(store, user="carol") != {}
    assert await model_records(store) == {}


async def test_a_model_calls_late_settle_moves_its_whole_cost_into_model_spend(
    store: Store, clock: FakeClock
) -> None:
    """Its reservation expired (charged at its estimate, 0.01, as any call's: in the
    day's amount, not its model part); its late settle corrects the amount to the cost
    (0.006) and puts that whole cost in the model part."""
    engine = engine_on(store, clock, MODEL_POLICY)
    model = Call("dan", "house-7", "m3", kind=CallKind.MODEL, input_tokens=1000,
                 max_output_tokens=1000)  # fmt: skip
    assert (await engine.check(model)).allowed
    clock.advance(11 * 60_000)  # past the 10m reservation_ttl
    await engine.usage("dan")  # its scope loaded: the reservation charged at its estimate
    dan, day = (("user", "dan"),), today(clock)
    assert (await records(store, user="dan"))["daily-spend", dan, day] == 10_000
    assert await model_records(store, user="dan") == {}
    await engine.settle("m3", usage=ModelUsage(input_tokens=1000, output_tokens=500))
    assert (await records(store, user="dan"))["daily-spend", dan, day] == 6_000
    assert await model_records(store, user="dan") == {("daily-spend", dan, day): 6_000}
