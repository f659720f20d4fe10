"""Issue 15, items 1-4: money and idempotency hold against a caller who tries to cheat.

Each test is named after the hole it closes and ran red on bd4a06f. Every store-level
test runs on the memory store, fakeredis and a real redis-server, all on one fake clock
(the Redis store passes it to the script, so Redis runs on a clock the test controls).
"""

from __future__ import annotations

import pytest

from ratewarden.calls import Call, ToolFacts
from ratewarden.clock import FakeClock
from ratewarden.engine import CallIdConflict, Engine
from ratewarden.limiter import reference
from ratewarden.limiter.reference import MONEY_CEILING, Budget
from ratewarden.limiter.script import SOURCE
from ratewarden.policy import PolicyError, parse_policy
from ratewarden.policy.durations import MAX_AMOUNT, MICROS
from ratewarden.store import MemoryStore, Store
from ratewarden.store.redis_store import RedisStore
from tests.conformance.test_budgets import engine_on, money
from tests.helpers.app import build_app, serving

# The `clock` fixture starts 13 min 37.345 s into an hour.
MS_TO_HOUR_END = 2_782_655
MINUTE = 60_000
CEILING = MONEY_CEILING / MICROS  # in currency units: one billion

# An `ask` budget as large as a budget may be: an approved call goes past it, so spend
# can be driven up to (and past) the ceiling by a caller who keeps approving.
HUGE = """\
version: 1
defaults: {reservation_ttl: 10m, call_ttl: 2h}
rules:
  - {name: spend, budget: 1000000000/day, on_exceed: ask}
"""
HOURLY = """\
version: 1
defaults: {reservation_ttl: 10m, call_ttl: 3h}
rules:
  - {name: spend, budget: 1.00/hour}
"""


async def approved_round(engine: Engine, call_id: str, cost: float) -> None:
    """One approved call reserved at `cost` and settled at `cost`."""
    found = await engine.check(Call("alice", "t", call_id, cost=cost, approved=True))
    assert found.decision == "allow", found.message
    assert (await engine.settle(call_id, cost)).outcome == "settled"


# -- 1. spend never wraps or loses precision --------------------------------------------


def test_hole1_the_ceiling_is_one_figure_in_lua_and_python() -> None:
    assert f"local CEILING = {MONEY_CEILING} " in SOURCE
    assert MONEY_CEILING == MAX_AMOUNT * MICROS  # no budget is larger: a full one denies
    assert 3 * MONEY_CEILING < 2**53  # spent + reserved + cost stay exact in a double


async def test_hole1_spend_saturates_at_the_ceiling_and_still_denies(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(HUGE, store, clock)
    await approved_round(engine, "r0", 1e9)
    assert await money(engine) == {"spend": (CEILING, 0.0, 0.0)}  # exactly at the ceiling
    # Twelve more billions: the true sum (1.3e16 micro-units) is past 2^53, where a double
    # stops counting exactly. The figure stays an exact integer: the ceiling.
    for i in range(1, 13):
        await approved_round(engine, f"r{i}", 1e9)
        assert await money(engine) == {"spend": (CEILING, 0.0, 0.0)}
    denied = await engine.check(Call("alice", "t", "next", cost=0.01))
    assert denied.decision == "ask"
    assert denied.message.startswith(
        "Budget exceeded for t tools: spent 1000000000.00 of 1000000000.00 USD this day"
    )


async def test_hole1_a_settle_with_a_positive_cost_never_lowers_spend(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(HUGE, store, clock)
    await approved_round(engine, "r0", 7e8)
    before = (await money(engine))["spend"][0]
    for i, cost in enumerate((1e9, 1e9, 0.000001, 5e8)):
        await approved_round(engine, f"r{i + 1}", cost)
        after = (await money(engine))["spend"][0]
        assert after >= before
        before = after
    assert before == CEILING
    # A call reserved at the ceiling and then left to expire is charged; spend stays put.
    approved = await engine.check(Call("alice", "t", "late", cost=1e9, approved=True))
    assert approved.allowed
    clock.advance(11 * MINUTE)
    assert await money(engine) == {"spend": (CEILING, 0.0, 0.0)}
    assert (await engine.settle("late", 0.5)).outcome == "settled"
    assert await money(engine) == {"spend": (CEILING, 0.0, 0.0)}  # saturated spend stays


async def test_hole1_reservations_past_the_ceiling_never_drift(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(HUGE, store, clock)
    ids = [f"h{i}" for i in range(12)]
    for call_id in ids:  # twelve billions held at once: more than the ceiling
        found = await engine.check(Call("alice", "t", call_id, cost=1e9, approved=True))
        assert found.allowed
        assert await money(engine) == {"spend": (0.0, CEILING, 0.0)}
    for call_id in ids:
        assert (await engine.settle(call_id, 0.0)).outcome == "settled"
    # Every reservation released: nothing held, nothing spent, not a micro-unit off.
    assert await money(engine) == {"spend": (0.0, 0.0, CEILING)}
    assert (await engine.check(Call("alice", "t", "fits", cost=1e9))).allowed


async def seed_spent(store: Store, clock: FakeClock, key: str, micros: int) -> None:
    """A counter whose spent total an older daemon let grow to `micros` this period."""
    engine = engine_on(HUGE, store, clock)
    assert (await engine.check(Call("alice", "t", "seed", cost=0.000001, approved=True))).allowed
    assert (await engine.settle("seed", 0.0)).outcome == "settled"
    if isinstance(store, MemoryStore):
        cell, expires = store._cells.values[key]
        assert isinstance(cell, Budget)
        cell.spent = micros
        store._cells.values[key] = (cell, expires)
    else:
        assert isinstance(store, RedisStore)
        await store._client.hset(key, "s", str(micros))


async def test_hole1_a_spent_total_past_2_63_does_not_wrap_into_allowing(
    store: Store, clock: FakeClock
) -> None:
    key = "rw:{spend|user=alice}:bg"
    await seed_spent(store, clock, key, 2**63 - 1_000_000_000)
    engine = engine_on(HUGE, store, clock)
    await approved_round(engine, "over", 1e9)  # would pass 2^63 micro-units
    [usage] = await engine.usage("alice")
    assert usage.used == CEILING
    denied = await engine.check(Call("alice", "t", "after", cost=0.01))
    assert denied.decision == "ask"  # refused; a wrapped (negative) total allowed it


def test_hole1_a_catalogue_cost_above_the_largest_budget_is_refused() -> None:
    text = "version: 1\ntools:\n  x: {cost: 1000000000.5}\nrules:\n  - {name: b, budget: 1/day}\n"
    with pytest.raises(PolicyError, match=r"tools\.x\.cost: .*less than or equal to 1000000000"):
        parse_policy(text.encode())


# -- 2. a late settle never refunds a later period --------------------------------------


async def test_hole2_a_late_settle_never_refunds_a_later_period(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(HOURLY, store, clock)
    assert (await engine.check(Call("alice", "t", "early", cost=0.8))).allowed
    clock.advance(11 * MINUTE)  # its reservation expired: charged at 0.80, in this hour
    assert await money(engine) == {"spend": (0.8, 0.0, 0.2)}

    clock.advance(MS_TO_HOUR_END - 11 * MINUTE + MINUTE)  # a minute into the next hour
    assert (await engine.check(Call("alice", "t", "now", cost=0.8))).allowed
    assert (await engine.settle("now", 0.8)).outcome == "settled"
    assert await money(engine) == {"spend": (0.8, 0.0, 0.2)}

    # The early call settles at last, far below its estimate: last hour's charge is not
    # taken off this hour's spend.
    assert (await engine.settle("early", 0.1)).outcome == "settled"
    assert await money(engine) == {"spend": (0.8, 0.0, 0.2)}
    refused = await engine.check(Call("alice", "t", "too-much", cost=0.9))
    assert refused.decision == "deny"


async def test_hole2_an_extra_charge_above_the_estimate_lands_in_the_current_period(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(HOURLY, store, clock)
    assert (await engine.check(Call("alice", "t", "early", cost=0.3))).allowed
    clock.advance(11 * MINUTE)  # charged at 0.30 in this hour
    clock.advance(MS_TO_HOUR_END)  # the next hour
    assert await money(engine) == {"spend": (0.0, 0.0, 1.0)}
    assert (await engine.settle("early", 0.55)).outcome == "settled"
    assert await money(engine) == {"spend": (0.25, 0.0, 0.75)}  # only the excess is new


async def test_hole2_a_correction_within_the_period_of_the_charge_still_applies(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(HOURLY, store, clock)
    assert (await engine.check(Call("alice", "t", "a", cost=0.8))).allowed
    clock.advance(11 * MINUTE)  # charged at 0.80 in this hour
    assert (await engine.settle("a", 0.1)).outcome == "settled"
    assert await money(engine) == {"spend": (0.1, 0.0, 0.9)}  # refunded where it was charged


async def test_hole2_a_reservation_carried_over_is_corrected_where_it_was_charged(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(HOURLY, store, clock)
    clock.advance(MS_TO_HOUR_END - 5 * MINUTE)  # five minutes before the hour ends
    assert (await engine.check(Call("alice", "t", "a", cost=0.8))).allowed
    clock.advance(6 * MINUTE)  # the next hour; still reserved there (carried over)
    clock.advance(10 * MINUTE)  # expired in this hour: charged here
    assert await money(engine) == {"spend": (0.8, 0.0, 0.2)}
    assert (await engine.settle("a", 0.2)).outcome == "settled"
    assert await money(engine) == {"spend": (0.2, 0.0, 0.8)}  # this hour's own charge


# -- 3. a finished call cannot be replayed ----------------------------------------------

ONE_DOLLAR = """\
version: 1
tools: {"browser_*": {label: browser}}
rules:
  - {name: spend, budget: 1.00/day}
  - {name: slots, match: {tool: "browser_*"}, concurrency: 1}
"""


async def test_hole3_a_settled_call_id_is_refused_not_replayed(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(ONE_DOLLAR, store, clock)
    call = Call("alice", "browser_open", "same", cost=0.6)
    assert (await engine.check(call)).allowed
    assert (await engine.settle("same", 0.6)).outcome == "settled"
    for _ in range(19):  # 20 check+settle rounds with one id: one allow, one charge
        with pytest.raises(CallIdConflict, match="already settled"):
            await engine.check(call)
        assert (await engine.settle("same", 0.6)).outcome == "already_settled"
    assert await money(engine) == {"spend": (0.6, 0.0, 0.4)}
    # The concurrency cap saw one call: the slot is free, and a new call takes it.
    assert (await engine.check(Call("alice", "browser_open", "fresh", cost=0.1))).allowed


async def test_hole3_a_replay_before_settle_is_the_original_answer(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(ONE_DOLLAR, store, clock)
    first = await engine.check(Call("alice", "browser_open", "c1", cost=0.6))
    again = await engine.check(Call("alice", "browser_open", "c1", cost=0.6))
    assert (again.decision, again.replayed, again.limits) == ("allow", True, first.limits)
    assert await money(engine) == {"spend": (0.0, 0.6, 0.4)}


@pytest.mark.parametrize(
    "changed",
    [
        {"user": "bob"},
        {"tool": "browser_click"},
        {"session": "s2"},
        {"team": "red"},
        {"cost": 0.01},
        {"facts": ToolFacts(read_only=True)},
        {"facts": ToolFacts(tags=frozenset({"net"}))},
        {"approved": True},
    ],
    ids=lambda changed: next(iter(changed)),
)
async def test_hole3_the_same_call_id_with_any_field_changed_is_a_conflict(
    store: Store, clock: FakeClock, changed: dict[str, object]
) -> None:
    engine = engine_on(ONE_DOLLAR, store, clock)
    base: dict[str, object] = {"user": "alice", "tool": "browser_open", "call_id": "c1"}
    base |= {"session": "s1", "cost": 0.6}
    assert (await engine.check(Call(**base))).allowed  # type: ignore[arg-type]
    with pytest.raises(CallIdConflict, match="already used for another call"):
        await engine.check(Call(**(base | changed)))  # type: ignore[arg-type]
    # Metadata is compared as what it says: the same tags in another order replay.
    same = await engine.check(Call(**base))  # type: ignore[arg-type]
    assert same.replayed


def test_hole3_the_identity_does_not_depend_on_tag_order_or_process() -> None:
    from ratewarden.engine.engine import fingerprint

    one = Call("a", "t", "c", facts=ToolFacts(tags=frozenset(["x", "y", "z"])))
    other = Call("a", "t", "c", facts=ToolFacts(tags=frozenset(["z", "y", "x"])))
    assert fingerprint(one) == fingerprint(other)
    assert fingerprint(Call("a", "t", "c")) == fingerprint(Call("a", "t", "c", facts=ToolFacts()))


async def test_hole3_a_settled_call_id_is_a_409_naming_call_id_over_http(
    clock: FakeClock,
) -> None:
    app = build_app(ONE_DOLLAR, clock=clock)
    async with serving(app) as http:
        body = {"user": "alice", "tool": "browser_open", "call_id": "x1", "cost": 0.5}
        assert (await http.post("/v1/check", json=body)).json()["decision"] == "allow"
        assert (await http.post("/v1/calls/x1/settle", json={"cost": 0.5})).status_code == 200
        replay = await http.post("/v1/check", json=body)
        assert replay.status_code == 409
        assert [f["field"] for f in replay.json()["fields"]] == ["call_id"]
        assert "already settled" in replay.json()["message"]
        batch = await http.post("/v1/check/batch", json={"calls": [body]})
        assert batch.status_code == 409
        assert [f["field"] for f in batch.json()["fields"]] == ["calls[0].call_id"]


# -- 4. budget messages tell the truth --------------------------------------------------


async def test_hole4_a_budget_filled_by_calls_in_flight_says_so(
    store: Store, clock: FakeClock
) -> None:
    policy = "version: 1\ntools: {browser_open: {label: browser}}\n" + (
        "rules:\n  - {name: spend, budget: 1.00/day}\n"
    )
    engine = engine_on(policy, store, clock)
    assert (await engine.check(Call("alice", "browser_open", "a", cost=1.0))).allowed
    refused = await engine.check(Call("alice", "browser_open", "b", cost=0.01))
    assert refused.message.startswith(
        "Budget exceeded for browser tools: 0.00 spent and 1.00 held by calls in flight of "
        "1.00 USD this day (retry in "
    )
    await engine.settle("a", 0.25)
    await engine.check(Call("alice", "browser_open", "c", cost=0.75))
    await engine.settle("c", 0.75)
    spent_only = await engine.check(Call("alice", "browser_open", "d", cost=0.01))
    assert spent_only.message.startswith(
        "Budget exceeded for browser tools: spent 1.00 of 1.00 USD this day (retry in "
    )


def test_hole1_the_saturating_sum_sticks_at_the_ceiling() -> None:
    assert reference.spend(MONEY_CEILING - 1, 10) == MONEY_CEILING
    assert reference.spend(MONEY_CEILING, -10) == MONEY_CEILING
    assert reference.spend(5, -10) == 0
