"""Budget periods are calendar periods in the policy's timezone, DST changes included.

Berlin is UTC+1 in winter and UTC+2 in summer, so its midnights are never UTC's: each
test spends the whole budget, is still refused one millisecond before local midnight
(the end of the day, the Monday that starts a week, the first of a month) and allowed
at it, while UTC is still in the old day. The days of the DST changes are 23 and 25
hours long. All on the memory store, fakeredis and a real redis-server, with one fake
clock shared by the store and the engine (which picks the period).

A reservation in flight when its period ends is carried into the new period: it counts
against the new period's budget while it is open, and it is charged in the period in
which it settles (or in which it expires unsettled). The old period is over and keeps
only what was settled in it.
"""

from __future__ import annotations

import pytest

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.store import MemoryStore, Store
from ratewarden.store.redis_store import RedisStore
from tests.conformance.test_budgets import engine_on, money, ms

BERLIN = """\
version: 1
defaults: {timezone: Europe/Berlin}
rules:
  - {name: spend, budget: 1.00/PERIOD}
"""

BOUNDARIES = {
    # The fall-back day, 25 hours: spent right after its start, still refused 24.5 hours
    # later, and at UTC midnight (02:00 summer time, mid-day in Berlin).
    "day-25h-spent-early": (
        "day",
        "2026-10-25T00:30:00+02:00",
        "2026-10-26T00:00:00+01:00",
        ["2026-10-25T00:00:00+00:00", "2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00+01:00"],
    ),
    # The same day, spent just before its local midnight (23:00 UTC).
    "day-25h-spent-late": (
        "day",
        "2026-10-25T23:59:00+01:00",
        "2026-10-26T00:00:00+01:00",
        [],
    ),
    # The spring-forward day, 23 hours.
    "day-23h": (
        "day",
        "2026-03-29T00:30:00+01:00",
        "2026-03-30T00:00:00+02:00",
        ["2026-03-29T00:00:00+00:00", "2026-03-29T03:00:00+02:00"],
    ),
    # The week of the fall-back change (Monday to Monday, 169 hours); Monday 00:00 in
    # Berlin is still Sunday in UTC.
    "week-169h": (
        "week",
        "2026-10-19T00:00:00+02:00",
        "2026-10-26T00:00:00+01:00",
        ["2026-10-25T02:30:00+01:00", "2026-10-25T22:59:59.999+00:00"],
    ),
    # October in Berlin has 745 hours; 1 November starts while UTC is in 31 October.
    "month-october": (
        "month",
        "2026-10-31T23:30:00+01:00",
        "2026-11-01T00:00:00+01:00",
        [],
    ),
    # March has 743 hours; 1 April starts at 22:00 UTC on 31 March.
    "month-march": (
        "month",
        "2026-03-01T00:00:00+01:00",
        "2026-04-01T00:00:00+02:00",
        ["2026-03-31T21:59:59.999+00:00"],
    ),
}


@pytest.mark.parametrize(
    ("period", "spent_at", "boundary", "still_refused_at"),
    list(BOUNDARIES.values()),
    ids=list(BOUNDARIES),
)
async def test_a_budget_resets_exactly_at_local_midnight(
    store: Store,
    clock: FakeClock,
    period: str,
    spent_at: str,
    boundary: str,
    still_refused_at: list[str],
) -> None:
    engine = engine_on(BERLIN.replace("PERIOD", period), store, clock)
    clock.set(ms(spent_at))
    assert (await engine.check(Call("alice", "t", "all", cost=1.0))).allowed
    await engine.settle("all")
    end = ms(boundary)

    refused = await engine.check(Call("alice", "t", "one-more", cost=0.01))
    assert refused.decision == "deny"
    assert refused.retry_after == (end - ms(spent_at)) / 1000
    assert refused.message.startswith(
        f"Budget exceeded for t tools: spent 1.00 of 1.00 USD this {period} (retry in "
    )
    for moment in still_refused_at:
        clock.set(ms(moment))
        assert (await engine.check(Call("alice", "t", "one-more", cost=0.01))).retry_after == (
            end - ms(moment)
        ) / 1000

    clock.set(end - 1)
    last_ms = await engine.check(Call("alice", "t", "one-more", cost=0.01))
    assert (last_ms.decision, last_ms.retry_after) == ("deny", 0.001)
    assert await money(engine) == {"spend": (1.0, 0.0, 0.0)}

    clock.set(end)
    assert await money(engine) == {"spend": (0.0, 0.0, 1.0)}
    fresh = await engine.check(Call("alice", "t", "one-more", cost=0.01))
    assert fresh.decision == "allow"
    [limit] = fresh.limits
    assert (limit.spent, limit.reserved, limit.remaining) == (0.0, 0.01, 0.99)


async def test_an_hour_budget_follows_a_half_hour_zone(store: Store, clock: FakeClock) -> None:
    policy = (
        "version: 1\ndefaults: {timezone: Asia/Kolkata}\nrules:\n  - {name: h, budget: 1/hour}\n"
    )
    engine = engine_on(policy, store, clock)
    clock.set(ms("2026-03-15T00:45:00+05:30"))
    assert (await engine.check(Call("alice", "t", "a", cost=1))).allowed
    await engine.settle("a")
    clock.set(ms("2026-03-14T19:30:00+00:00") - 1)
    assert (await engine.check(Call("alice", "t", "b", cost=1))).decision == "deny"
    clock.set(ms("2026-03-14T19:30:00+00:00"))  # 01:00 in Kolkata, a UTC half-hour
    assert (await engine.check(Call("alice", "t", "b", cost=1))).allowed
    assert (await engine.check(Call("alice", "t", "c", cost=1))).decision == "deny"


async def test_a_reservation_in_flight_across_midnight_is_charged_where_it_settles(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(BERLIN.replace("PERIOD", "day"), store, clock)
    clock.set(ms("2026-10-25T23:00:00+01:00"))
    assert (await engine.check(Call("alice", "t", "done", cost=0.3))).allowed
    await engine.settle("done")
    clock.set(ms("2026-10-25T23:50:00+01:00"))
    assert (await engine.check(Call("alice", "t", "in-flight", cost=0.6))).allowed
    assert await money(engine) == {"spend": (0.3, 0.6, 0.1)}

    # Local midnight: the 0.30 settled yesterday is gone, the open 0.60 is carried over.
    clock.set(ms("2026-10-26T00:00:00+01:00"))
    assert await money(engine) == {"spend": (0.0, 0.6, 0.4)}
    too_much = await engine.check(Call("alice", "t", "x", cost=0.41))
    assert too_much.decision == "deny"
    assert too_much.message.startswith(
        "Budget exceeded for t tools: 0.00 spent and 0.60 held by calls in flight of 1.00 USD "
        "this day (retry in "
    )
    assert (await engine.check(Call("alice", "t", "fits", cost=0.4))).allowed

    # Settled after midnight: the actual cost is charged to the new day.
    clock.set(ms("2026-10-26T00:10:00+01:00"))
    settled = await engine.settle("in-flight", 0.7)
    assert (settled.outcome, settled.charged) == ("settled", {"spend": 0.7})
    assert await money(engine) == {"spend": (0.7, 0.4, 0.0)}


async def test_a_reservation_carried_over_and_never_settled_is_charged_in_the_new_period(
    store: Store, clock: FakeClock
) -> None:
    """reservation_ttl is 1 h: reserved at 23:30, charged at its estimate at 00:30."""
    engine = engine_on(BERLIN.replace("PERIOD", "day"), store, clock)
    clock.set(ms("2026-10-25T23:30:00+01:00"))
    assert (await engine.check(Call("alice", "t", "vanished", cost=0.6))).allowed
    clock.set(ms("2026-10-26T00:05:00+01:00"))
    assert await money(engine) == {"spend": (0.0, 0.6, 0.4)}
    clock.set(ms("2026-10-26T00:30:00+01:00") - 1)
    assert await money(engine) == {"spend": (0.0, 0.6, 0.4)}
    clock.set(ms("2026-10-26T00:30:00+01:00"))
    assert await money(engine) == {"spend": (0.6, 0.0, 0.4)}


async def test_a_reservation_that_expires_before_midnight_stays_in_its_day(
    store: Store, clock: FakeClock
) -> None:
    policy = BERLIN.replace("PERIOD", "day").replace("Berlin}", "Berlin, call_ttl: 1d}")
    engine = engine_on(policy, store, clock)
    clock.set(ms("2026-10-25T22:00:00+01:00"))
    assert (await engine.check(Call("alice", "t", "vanished", cost=0.6))).allowed
    clock.set(ms("2026-10-25T23:30:00+01:00"))  # expired at 23:00: spent in its own day
    assert await money(engine) == {"spend": (0.6, 0.0, 0.4)}
    clock.set(ms("2026-10-26T00:00:00+01:00"))
    assert await money(engine) == {"spend": (0.0, 0.0, 1.0)}
    # Its late settle (the record outlives it) corrects by the difference, in the new day.
    clock.set(ms("2026-10-26T00:10:00+01:00"))
    assert (await engine.settle("vanished", 0.8)).charged == {"spend": 0.8}
    assert await money(engine) == {"spend": (0.2, 0.0, 0.8)}


async def test_a_carried_over_reservation_is_charged_even_if_nothing_reads_it_meanwhile(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(BERLIN.replace("PERIOD", "day"), store, clock)
    clock.set(ms("2026-10-25T23:30:00+01:00"))
    assert (await engine.check(Call("alice", "t", "vanished", cost=0.6))).allowed
    if isinstance(store, RedisStore):
        # Redis expires keys on its own clock, not the fake one: check the TTL instead. The
        # reservation is charged at 00:30 in the new day and must count until its end.
        pttl = await store._client.pttl("rw:{spend|user=alice}:bg")
        needed = ms("2026-10-27T00:00:00+01:00") - clock.now_ms()
        assert pttl > needed - 1_000, pttl  # today: 1 h (a second of slack: Redis runs on)
        return
    assert isinstance(store, MemoryStore)
    # Same as the test above, minus the read at 00:05.
    clock.set(ms("2026-10-26T00:30:00+01:00"))
    assert await money(engine) == {"spend": (0.6, 0.0, 0.4)}  # today: (0.0, 0.0, 1.0)
