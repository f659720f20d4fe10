"""Property tests: each limiter algorithm against a brute-force oracle, on a fake clock.

Every example drives a fresh counter through `store.evaluate([CounterOp(...)])` (one
variant goes through the Engine) and compares each decision with an oracle that keeps
the whole history, then checks the algorithm's guarantee directly on the admitted
timestamps. The same properties run on the memory store (many examples) and on a real
redis-server with the clock injected (fewer examples).

Real Redis expires keys on its own wall clock, not on the injected fake clock, so a key
whose TTL is a few ms (a fixed window a few ms before its end) could vanish between two
calls at the same fake instant. The real-Redis strategies therefore keep every TTL at
least tens of ms long: sliding windows (TTL = window), token buckets whose emission
interval is >= 200 ms, and fixed windows whose arrivals sit on a 50 ms grid. The memory
store expires on the fake clock and gets the unrestricted strategies.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import random
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Engine
from ratewarden.limiter.ops import (
    CallRecord,
    CounterOp,
    Evaluation,
    Hold,
    Kind,
    OpResult,
    Role,
)
from ratewarden.limiter.script import SettleStatus
from ratewarden.policy import parse_policy
from ratewarden.store import MemoryStore, Store
from ratewarden.store.base import StoreError
from ratewarden.store.keys import record_key
from ratewarden.store.redis_store import RedisStore
from tests.helpers.redis_server import RedisServer

LIMITS = (1, 2, 3, 10, 37)
WINDOWS = (1_000, 7_777, 60_000, 3_600_000)
START_MS = 1_700_000_000_000 + 17_345  # mid-minute, as the conftest clock

MEMORY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REDIS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

_keys = itertools.count()


def fresh_key(name: str) -> str:
    """A key no earlier example used (the real redis-server is shared by the session)."""
    return f"rw:{{prop-{name}-{next(_keys)}}}:x"


# ---------------------------------------------------------------------------- strategies


@st.composite
def arrivals(
    draw: st.DrawFn, window: int, limit: int, grid: int = 1, max_size: int = 120
) -> list[int]:
    """Sorted arrival offsets (ms from the start) with gaps in 0..2*window.

    Gaps are drawn from a mix of "dense" (about the emission interval, so limits are
    actually reached), "sparse" (up to two windows, so windows roll over) and exact edges.
    """
    top = 2 * window // grid
    dense = max(1, 2 * window // (limit * grid))
    # Exact edges too: a window, an emission interval, and one tick either side.
    step = window // limit // grid
    edges = sorted({top // 2 - 1, top // 2, top // 2 + 1, step - 1, step, step + 1} - {-1})
    gap = st.one_of(st.just(0), st.integers(0, dense), st.integers(0, top), st.sampled_from(edges))
    # Long enough to fill even the largest limit a few times over.
    size = draw(st.integers(1, min(max_size, 3 * limit + 10)))
    gaps = draw(st.lists(gap, min_size=size, max_size=size))
    return list(itertools.accumulate(g * grid for g in gaps))


@st.composite
def sliding_cases(draw: st.DrawFn, windows: Sequence[int] = WINDOWS) -> tuple[int, int, list[int]]:
    window = draw(st.sampled_from(windows))
    limit = draw(st.sampled_from(LIMITS))
    return limit, window, draw(arrivals(window, limit))


@st.composite
def bucket_cases(
    draw: st.DrawFn, windows: Sequence[int] = WINDOWS, min_interval: int = 0
) -> tuple[int, int, int, list[int]]:
    window = draw(st.sampled_from(windows))
    limit = draw(st.sampled_from([n for n in LIMITS if window / n >= min_interval]))
    burst = draw(st.sampled_from(sorted({1, 2, limit, limit + 3})))
    return limit, window, burst, draw(arrivals(window, limit))


@st.composite
def fixed_cases(
    draw: st.DrawFn, windows: Sequence[int] = WINDOWS, grid: int = 1
) -> tuple[int, int, int, list[int]]:
    window = draw(st.sampled_from(windows))
    limit = draw(st.sampled_from(LIMITS))
    # Where the first call falls inside its clock-aligned window.
    phase = draw(st.integers(0, window // grid - 1)) * grid
    return limit, window, phase, draw(arrivals(window, limit, grid))


# ---------------------------------------------------------------------------- oracles


def sliding_oracle(times: Sequence[int], limit: int, window: int) -> list[dict[str, int]]:
    """Brute force: admit iff fewer than `limit` admitted calls have ts > t - window."""
    admitted: list[int] = []  # sorted, as `times` is
    out = []
    for t in times:
        live = admitted[bisect.bisect_right(admitted, t - window) :]
        ok = len(live) < limit
        if ok:
            admitted.append(t)
            live.append(t)
        out.append(
            {
                "admitted": ok,
                "remaining": limit - len(live),
                # Denied: the oldest live call must leave the window first.
                "retry_after_ms": 0 if ok else min(live) + window - t,
                "reset_after_ms": max(live) + window - t if live else 0,
            }
        )
    return out


def assert_no_window_exceeds(admitted: Sequence[int], limit: int, window: int) -> None:
    """For every admitted a: at most `limit` admissions in [a - window + 1, a]."""
    for a in admitted:
        inside = sum(1 for b in admitted if a - window + 1 <= b <= a)
        assert inside <= limit, f"{inside} admissions in the window ending at {a}"


def fixed_oracle(times: Sequence[int], limit: int, window: int) -> list[dict[str, int]]:
    counts: dict[int, int] = {}
    out = []
    for t in times:
        start = t - t % window
        count = counts.get(start, 0)
        ok = count < limit
        if ok:
            counts[start] = count = count + 1
        out.append(
            {
                "admitted": ok,
                "remaining": max(0, limit - count),
                "retry_after_ms": 0 if ok else start + window - t,
                "reset_after_ms": start + window - t if count else 0,
            }
        )
    return out


# ---------------------------------------------------------------------------- drivers

Runner = Callable[[Callable[[Store, FakeClock], Coroutine[Any, Any, None]]], None]


def run_on_memory(body: Callable[[Store, FakeClock], Coroutine[Any, Any, None]]) -> None:
    clock = FakeClock(START_MS)
    asyncio.run(body(MemoryStore(clock), clock))


def redis_runner(server: RedisServer) -> Runner:
    def run(body: Callable[[Store, FakeClock], Coroutine[Any, Any, None]]) -> None:
        async def main() -> None:
            clock = FakeClock(START_MS)
            store = RedisStore(aioredis.Redis.from_url(server.url), server.url, clock)
            try:
                await store.start()
                await body(store, clock)
            finally:
                await store.close()

        asyncio.run(main())

    return run


async def drive(
    store: Store, clock: FakeClock, start: int, times: Sequence[int], op: CounterOp
) -> list[OpResult]:
    results = []
    for t in times:
        clock.set(start + t)
        [result] = (await store.evaluate([op])).results
        results.append(result)
    return results


def as_dicts(results: Sequence[OpResult]) -> list[dict[str, object]]:
    return [
        {
            "admitted": r.admitted,
            "remaining": r.remaining,
            "retry_after_ms": r.retry_after_ms,
            "reset_after_ms": r.reset_after_ms,
        }
        for r in results
    ]


# ---------------------------------------------------------------------------- sliding window


def check_sliding(run: Runner, limit: int, window: int, times: list[int]) -> None:
    op = CounterOp(fresh_key("sw"), Kind.SLIDING_WINDOW, Role.ENFORCE, limit, window)
    got: list[OpResult] = []

    async def body(store: Store, clock: FakeClock) -> None:
        got.extend(await drive(store, clock, START_MS, times, op))

    run(body)
    expected = sliding_oracle(times, limit, window)
    for i, (result, want) in enumerate(zip(as_dicts(got), expected, strict=True)):
        assert result == want, f"call {i} at +{times[i]} ms: {result} != {want}"
    admitted = [t for t, r in zip(times, got, strict=True) if r.admitted]
    assert_no_window_exceeds(admitted, limit, window)


@MEMORY
@given(case=sliding_cases())
def test_sliding_window_is_exact_on_memory(case: tuple[int, int, list[int]]) -> None:
    check_sliding(run_on_memory, *case)


@pytest.mark.redis
@REDIS
@given(case=sliding_cases())
def test_sliding_window_is_exact_on_real_redis(
    redis_server: RedisServer, case: tuple[int, int, list[int]]
) -> None:
    check_sliding(redis_runner(redis_server), *case)


@st.composite
def large_sliding_cases(draw: st.DrawFn) -> tuple[int, int, list[int]]:
    """Limits whose ring outgrows the script's whole-read prefix (4096 bytes, 681 entries),
    with enough arrivals to fill it, wrap its head and let part of it expire."""
    limit = draw(st.sampled_from((700, 1_000, 1_337)))
    window = draw(st.sampled_from((60_000, 3_600_000)))
    rng = random.Random(draw(st.integers(0, 2**32)))  # a seed: 3000+ gaps, cheaply drawn
    dense = 2 * window // limit  # about the emission interval: the limit is reached
    gaps = [
        rng.randint(0, dense) if rng.random() < 0.97 else rng.randint(0, window)
        for _ in range(3 * limit)
    ]
    return limit, window, list(itertools.accumulate(gaps))


@pytest.mark.redis
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=large_sliding_cases())
@pytest.mark.slow
def test_sliding_window_is_exact_on_real_redis_past_the_whole_read(
    redis_server: RedisServer, case: tuple[int, int, list[int]]
) -> None:
    """Entries past a ring's first 4096 bytes are read by GETRANGE, and a full ring's head
    wraps past that boundary: every answer must still be the oracle's."""
    limit, window, times = case
    assert sum(r["admitted"] for r in sliding_oracle(times, limit, window)) > limit
    check_sliding(redis_runner(redis_server), limit, window, times)


def test_sliding_oracle_catches_an_off_by_one() -> None:
    """The invariant check itself: 3 calls within 1000 ms under 2/1000 ms must be caught."""
    with pytest.raises(AssertionError, match="3 admissions"):
        assert_no_window_exceeds([0, 500, 999], 2, 1_000)
    assert_no_window_exceeds([0, 500, 1_000], 2, 1_000)


# Windows the policy syntax can express, for the Engine variant.
POLICY_WINDOWS = {"second": 1_000, "7s": 7_000, "minute": 60_000, "hour": 3_600_000}


@st.composite
def engine_cases(draw: st.DrawFn) -> tuple[int, str, list[int]]:
    window_text = draw(st.sampled_from(sorted(POLICY_WINDOWS)))
    limit = draw(st.sampled_from(LIMITS))
    return limit, window_text, draw(arrivals(POLICY_WINDOWS[window_text], limit, max_size=80))


def check_sliding_via_engine(run: Runner, limit: int, window_text: str, times: list[int]) -> None:
    window = POLICY_WINDOWS[window_text]
    rule = f"r{next(_keys)}"  # a fresh counter on the shared real redis-server
    policy = parse_policy(
        f"version: 1\nrules:\n"
        f"  - {{name: {rule}, match: {{tool: t}}, rate: {limit}/{window_text}}}\n"
        "  - {name: other-tool, match: {tool: other}, rate: 1/hour}\n".encode()
    )
    decisions = []

    async def body(store: Store, clock: FakeClock) -> None:
        engine = Engine(policy, store)
        for i, t in enumerate(times):
            clock.set(START_MS + t)
            # Generated call_ids (named=False) leave no call record: only counters here.
            call = Call(user="u", tool="t", call_id=f"{rule}-{i}", named=False)
            decisions.append(await engine.check(call))

    run(body)
    expected = sliding_oracle(times, limit, window)
    for i, (decision, want) in enumerate(zip(decisions, expected, strict=True)):
        assert decision.decision == ("allow" if want["admitted"] else "deny"), i
        [verdict] = decision.limits
        assert verdict.remaining == want["remaining"], i
        if not want["admitted"]:
            retry = want["retry_after_ms"]
            assert isinstance(retry, int)
            assert decision.retry_after == retry / 1000, i
            assert decision.message.startswith(f"Rate limit: max {limit} t calls per "), i
    admitted = [t for t, d in zip(times, decisions, strict=True) if d.allowed]
    assert_no_window_exceeds(admitted, limit, window)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=engine_cases())
def test_sliding_window_via_engine_on_memory(case: tuple[int, str, list[int]]) -> None:
    check_sliding_via_engine(run_on_memory, *case)


@pytest.mark.redis
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=engine_cases())
def test_sliding_window_via_engine_on_real_redis(
    redis_server: RedisServer, case: tuple[int, str, list[int]]
) -> None:
    check_sliding_via_engine(redis_runner(redis_server), *case)


# ---------------------------------------------------------------------------- token bucket


def check_token_bucket(run: Runner, limit: int, window: int, burst: int, times: list[int]) -> None:
    """GCRA against an exact (rational) model, and the burst bound on the admissions.

    Model: emission interval I = window/limit; TAT starts at the first call. A call at t
    is conforming iff t >= max(TAT, t) + I - burst*I, and then TAT = max(TAT, t) + I.
    The store computes in floats, so at an exact tie (t == allow-at) it may deny; it
    must never admit a non-conforming call, and must admit every strictly conforming one.
    When I is a whole number of ms the float arithmetic is exact, and ties must admit.

    Bound: if k calls are admitted between a and b, TAT grew by k*I and the last one
    needed TAT_before <= b + (burst-1)*I with TAT_before >= a + (k-1)*I, so
    k <= burst + (b - a)/I, i.e. k <= burst + floor((b - a) * limit / window).
    """
    op = CounterOp(fresh_key("tb"), Kind.TOKEN_BUCKET, Role.ENFORCE, limit, window, burst)
    got: list[OpResult] = []

    async def body(store: Store, clock: FakeClock) -> None:
        got.extend(await drive(store, clock, START_MS, times, op))

    run(body)
    interval = Fraction(window, limit)
    tat: Fraction | None = None
    for i, (t, result) in enumerate(zip(times, got, strict=True)):
        base = Fraction(t) if tat is None else max(tat, Fraction(t))
        allow_at = base + interval - burst * interval
        where = f"call {i} at +{t} ms (allow at {float(allow_at)})"
        floats_exact = interval.denominator == 1
        if t > allow_at or (t == allow_at and floats_exact):
            assert result.admitted, where
        elif t < allow_at:
            assert not result.admitted, where
        if result.admitted:
            tat = base + interval
            assert result.retry_after_ms == 0, where
        else:
            exact = max(1, math.ceil(allow_at - t))
            tie = (allow_at - t).denominator == 1 and not floats_exact
            assert result.retry_after_ms in ({exact, exact + 1} if tie else {exact}), where
        # Remaining: whole emission intervals between TAT and the bucket's horizon.
        room = (t + burst * interval - (base + interval if result.admitted else base)) / interval
        remaining = max(0, min(burst, math.floor(room)))
        tie = room.denominator == 1 and not floats_exact
        allowed = {remaining, max(0, remaining - 1)} if tie else {remaining}
        assert result.remaining in allowed, where
    admitted = [t for t, r in zip(times, got, strict=True) if r.admitted]
    for i, j in itertools.combinations(range(len(admitted)), 2):
        span = admitted[j] - admitted[i]
        assert j - i + 1 <= burst + span * limit // window, (admitted[i], admitted[j])


@MEMORY
@given(case=bucket_cases())
def test_token_bucket_matches_gcra_on_memory(case: tuple[int, int, int, list[int]]) -> None:
    check_token_bucket(run_on_memory, *case)


@pytest.mark.redis
@REDIS
@given(case=bucket_cases(windows=(7_777, 60_000, 3_600_000), min_interval=200))
def test_token_bucket_matches_gcra_on_real_redis(
    redis_server: RedisServer, case: tuple[int, int, int, list[int]]
) -> None:
    check_token_bucket(redis_runner(redis_server), *case)


async def test_token_bucket_burst_then_steady_rate() -> None:
    """Hand-checked GCRA: 3/minute, burst 3 -> 3 at once, then one every 20 s."""
    clock = FakeClock(START_MS)
    store = MemoryStore(clock)
    op = CounterOp("tb", Kind.TOKEN_BUCKET, Role.ENFORCE, 3, 60_000, 3)
    got = [(await store.evaluate([op])).results[0] for _ in range(4)]
    assert [r.admitted for r in got] == [True, True, True, False]
    assert [r.remaining for r in got] == [2, 1, 0, 0]
    assert got[3].retry_after_ms == 20_000
    clock.advance(19_999)
    assert not (await store.evaluate([op])).results[0].admitted
    clock.advance(1)
    assert (await store.evaluate([op])).results[0].admitted
    assert not (await store.evaluate([op])).results[0].admitted


# ---------------------------------------------------------------------------- fixed window


def check_fixed(run: Runner, limit: int, window: int, phase: int, times: list[int]) -> None:
    op = CounterOp(fresh_key("fw"), Kind.FIXED_WINDOW, Role.ENFORCE, limit, window)
    start = START_MS - START_MS % window + phase
    got: list[OpResult] = []

    async def body(store: Store, clock: FakeClock) -> None:
        got.extend(await drive(store, clock, start, times, op))

    run(body)
    absolute = [start + t for t in times]
    expected = fixed_oracle(absolute, limit, window)
    for i, (result, want) in enumerate(zip(as_dicts(got), expected, strict=True)):
        assert result == want, f"call {i} at {absolute[i]}: {result} != {want}"
    per_window: dict[int, int] = {}
    for t, r in zip(absolute, got, strict=True):
        if r.admitted:
            per_window[t // window] = per_window.get(t // window, 0) + 1
    assert all(n <= limit for n in per_window.values()), per_window


@MEMORY
@given(case=fixed_cases())
def test_fixed_window_counts_per_aligned_window_on_memory(
    case: tuple[int, int, int, list[int]],
) -> None:
    check_fixed(run_on_memory, *case)


@pytest.mark.redis
@REDIS
@given(case=fixed_cases(windows=(1_000, 7_750, 60_000, 3_600_000), grid=50))
def test_fixed_window_counts_per_aligned_window_on_real_redis(
    redis_server: RedisServer, case: tuple[int, int, int, list[int]]
) -> None:
    check_fixed(redis_runner(redis_server), *case)


# ---------------------------------------------------------------------------- limit changes


def check_limit_changes(
    run: Runner, window: int, phases: Sequence[tuple[int, Sequence[int]]]
) -> list[bool]:
    """Run phases of (limit, arrival offsets) on one counter; compare with the oracle.

    The oracle keeps the whole history, so it is exact under any limit: admit iff
    fewer than the *current* limit of the admitted calls are inside the window.
    """
    key = fresh_key("resize")
    schedule = [(limit, t) for limit, times in phases for t in times]
    got: list[bool] = []

    async def body(store: Store, clock: FakeClock) -> None:
        for limit, t in schedule:
            clock.set(START_MS + t)
            op = CounterOp(key, Kind.SLIDING_WINDOW, Role.ENFORCE, limit, window)
            got.append((await store.evaluate([op])).results[0].admitted)

    run(body)
    admitted: list[int] = []
    for i, ((limit, t), ok) in enumerate(zip(schedule, got, strict=True)):
        want = sum(1 for a in admitted if a > t - window) < limit
        assert ok == want, f"call {i} at +{t} ms under limit {limit}: {ok} != {want}"
        if ok:
            admitted.append(t)
    return got


@st.composite
def one_limit_change(draw: st.DrawFn) -> tuple[int, list[tuple[int, list[int]]]]:
    window = draw(st.sampled_from((1_000, 7_777, 60_000)))
    before, after = draw(st.sampled_from([(10, 4), (4, 10)]))
    times = draw(arrivals(window, 10, max_size=60))
    cut = draw(st.integers(0, len(times)))
    return window, [(before, times[:cut]), (after, times[cut:])]


@pytest.mark.redis
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=one_limit_change())
def test_limit_change_keeps_exactness_on_memory_and_real_redis(
    redis_server: RedisServer, case: tuple[int, list[tuple[int, list[int]]]]
) -> None:
    """A reload from 10 to 4 (ring shrinks) or 4 to 10 (ring grows) on a live counter."""
    window, phases = case
    on_memory = check_limit_changes(run_on_memory, window, phases)
    on_redis = check_limit_changes(redis_runner(redis_server), window, phases)
    assert on_memory == on_redis


@pytest.mark.redis
def test_ring_shrink_then_grow_on_a_full_rotated_ring(redis_server: RedisServer) -> None:
    """Hand-picked: the Redis ring has wrapped (head != 0) before each resize."""
    window = 60_000
    phases = [
        # 4 slots: 0..3 fill the ring, 61_000 and 62_000 overwrite slots 0 and 1 (head 2).
        (4, [0, 1, 2, 3, 30_000, 30_001, 61_000, 62_000]),
        # Grows: 2, 3, 61_000, 62_000 kept; 2 live + 8 new = 10; the last two wrap.
        (10, [62_001 + i for i in range(8)]),
        # Shrinks a full, wrapped 10-slot ring with 10 live entries.
        (4, [63_000, 121_001, 122_006, 122_007, 122_008]),
    ]
    on_memory = check_limit_changes(run_on_memory, window, phases)
    on_redis = check_limit_changes(redis_runner(redis_server), window, phases)
    assert on_memory == on_redis
    assert on_memory == [
        *[True] * 4,
        False,  # 30_000: 4 live
        False,
        True,  # 61_000: 0..3 have left the window
        True,
        *[True] * 8,  # limit 10: 61_000, 62_000 live, room for 8
        False,  # 63_000: 10 live, limit 4
        False,  # 121_001: 61_000 left, 9 live
        True,  # 122_006: only 62_007, 62_008 live
        True,
        True,  # 122_008: 62_008 left; 122_006, 122_007 live
    ]


@pytest.mark.redis
@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_limit_shrink_then_grow_within_one_window(redis_server: RedisServer, kind: str) -> None:
    run = run_on_memory if kind == "memory" else redis_runner(redis_server)
    phases = [
        (10, [100 * i for i in range(1, 11)]),  # 10 admitted by +1.0 s
        (4, [1_100, 1_200]),  # denied (10 live) -- and the log is cut to 4 entries
        (10, [1_300 + 100 * i for i in range(10)]),  # all must be denied: 10 still live
    ]
    check_limit_changes(run, 60_000, phases)


# ---------------------------------------------------------------------------- twin parity

BUDGET_PERIODS = (600_000, 3_600_000)  # short periods: a run rolls over several times
COSTS = (0, 250_000, 1_000_000, 3_000_000)  # micro-units; 3.00 exceeds some budgets
RECORD_TTL = 36_000_000  # outlives every run, on the fake clock and on Redis's own


@dataclass(frozen=True)
class Counter:
    """One counter of the parity mix (a call picks some of them, each with a role)."""

    kind: Kind
    limit: int  # calls, slots, or micro-units
    window_ms: int  # rate window, lease timeout, or reservation TTL
    burst: int = 0
    period_ms: int = 0  # budgets: the length of the (clock-aligned) period


@dataclass(frozen=True)
class CheckStep:
    gap: int
    picks: tuple[tuple[int, Role, int], ...]  # (counter, role, cost for budgets)
    call: int  # the call_id's number: an earlier one makes a repeated check
    user: int  # the fingerprint: an earlier call_id with another user is a conflict
    named: bool  # the caller chose the call_id: replays read, recorded even without holds
    dry_run: bool
    lag: int  # the daemon computed the budget period this long ago (its clock lags)


@dataclass(frozen=True)
class SettleStep:
    gap: int
    call: int
    actual: int | None  # None: settle at the estimate
    forgotten: bool  # the budget rule is gone from the policy: no period, (0, 0, 0)


Step = CheckStep | SettleStep


def draw_counter(draw: st.DrawFn) -> Counter:
    kind = draw(st.sampled_from(list(Kind)))
    window = draw(st.sampled_from((7_750, 60_000, 3_600_000)))
    if kind is Kind.BUDGET:
        limit = draw(st.sampled_from((0, 1_000_000, 2_500_000, 10_000_000)))
        return Counter(kind, limit, window, period_ms=draw(st.sampled_from(BUDGET_PERIODS)))
    if kind is Kind.CONCURRENCY:
        return Counter(kind, draw(st.sampled_from((0, 1, 2, 3))), window)
    limit = draw(st.sampled_from((0, 1, 2, 3, 10)))
    burst = draw(st.sampled_from((1, 2, 5))) if kind is Kind.TOKEN_BUCKET else limit
    return Counter(kind, limit, window, max(burst, 1))


@st.composite
def parity_cases(draw: st.DrawFn) -> tuple[list[Counter], list[Step]]:
    """A few counters of every kind, then checks touching a subset of them and settles.

    Checks sometimes repeat an earlier call_id (answered from its record, or a conflict
    when another user reuses it) and are sometimes dry runs; settles release slots and
    swap reservations for an actual cost (or charge the estimate).
    """
    counters = [draw_counter(draw) for _ in range(draw(st.integers(1, 4)))]
    picks = st.lists(
        st.tuples(
            st.integers(0, len(counters) - 1), st.sampled_from(list(Role)), st.sampled_from(COSTS)
        ),
        min_size=1,
        max_size=len(counters),
        unique_by=lambda pick: pick[0],
    )
    # Times on a 50 ms grid keep real-Redis TTLs long (see the module docstring).
    gap = st.one_of(st.just(0), st.integers(0, 40), st.integers(0, 2_400)).map(lambda g: g * 50)
    steps: list[Step] = []
    calls = 0
    for _ in range(draw(st.integers(1, 60))):
        if calls and draw(st.integers(0, 4)) == 0:
            actual = draw(st.one_of(st.none(), st.sampled_from(COSTS)))
            forgotten = draw(st.integers(0, 5)) == 0
            steps.append(SettleStep(draw(gap), draw(st.integers(0, calls - 1)), actual, forgotten))
            continue
        repeat = calls and draw(st.integers(0, 5)) == 0
        call = draw(st.integers(0, calls - 1)) if repeat else calls
        calls += not repeat
        steps.append(
            CheckStep(
                draw(gap),
                tuple(draw(picks)),
                call,
                draw(st.sampled_from((0, 0, 0, 1))),
                draw(st.booleans()),
                draw(st.integers(0, 9)) == 0,
                draw(st.sampled_from((0, 0, 30_000, 300_000))),
            )
        )
    return counters, steps


def budget_period(counter: Counter, now: int, lag: int = 0) -> tuple[int, int, int]:
    """(start, end, next end) of the clock-aligned period containing `now - lag`."""
    length = counter.period_ms
    start = (now - lag) - (now - lag) % length
    return start, start + length, start + 2 * length


def parity_op(
    counter: Counter, key: str, index: int, role: Role, cost: int, now: int, lag: int
) -> CounterOp:
    if counter.kind is not Kind.BUDGET:
        return CounterOp(
            key,
            counter.kind,
            role,
            counter.limit,
            counter.window_ms,
            counter.burst,
            rule=f"c{index}",
        )
    period = budget_period(counter, now, lag)
    # Reservations may outlive their period: the counter is kept until the period in
    # which they expire has ended, so both stores still charge them.
    return CounterOp(
        key, Kind.BUDGET, role, counter.limit, counter.window_ms, 0, cost, period, f"c{index}"
    )


@pytest.mark.redis
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=parity_cases())
def test_memory_and_lua_agree_on_every_field(
    redis_server: RedisServer, case: tuple[list[Counter], list[Step]]
) -> None:
    """The Python twin and the Lua script, op for op and field for field, on every kind:
    roles, limit 0, all or nothing, budget reservations across period rollovers,
    concurrency leases, call records (replays, conflicts), dry runs and settles."""
    counters, steps = case
    on_memory, on_redis = run_twins(redis_server, counters, steps)
    for i, (mine, theirs) in enumerate(zip(on_memory, on_redis, strict=True)):
        assert mine == theirs, f"step {i}: {steps[i]}"


def run_twins(
    redis_server: RedisServer, counters: list[Counter], steps: list[Step]
) -> tuple[list[object], list[object]]:
    """Every step's answer on the memory store, then on the real Redis.

    On the fake clock the memory store expires keys and the real Redis keeps them. An
    expired counter answers as a fresh one either way, except when a settle reaches a
    budget whose key is gone (memory: nothing left to charge; Redis: the stale counter
    is charged). The memory run notes such settles and both runs leave them out.
    """
    namespace = f"twin{next(_keys)}"  # keys and call_ids no earlier example used
    keys = [f"rw:{{{namespace}-{i}}}:{c.kind.value}" for i, c in enumerate(counters)]
    skipped: list[bool] = []  # per settle step; decided by the memory run

    def with_period(hold: Hold, now: int, forgotten: bool) -> Hold:
        if hold.kind is not Kind.BUDGET or forgotten:
            return hold
        return replace(hold, period=budget_period(counters[int(hold.rule[1:])], now))

    async def settle(store: Store, call_id: str, step: SettleStep, now: int, n: int) -> object:
        found = await store.read_holds(record_key(call_id))
        holds = (
            None if found is None else [with_period(h, now, step.forgotten) for h in found.holds]
        )
        if isinstance(store, MemoryStore):
            skipped.append(
                any(h.kind is Kind.BUDGET and store._cells.get(h.key, now) is None for h in holds)
                if holds is not None
                else False
            )
        if skipped[n]:
            return "skipped"
        if holds is None:
            return None
        return holds, await store.settle(record_key(call_id), call_id, step.actual, holds)

    def run(runner: Runner) -> list[object]:
        out: list[object] = []

        async def body(store: Store, clock: FakeClock) -> None:
            now = START_MS - START_MS % 60_000
            settles = itertools.count()
            for step in steps:
                now += step.gap
                clock.set(now)
                call_id = f"{namespace}-call-{step.call}"
                if isinstance(step, SettleStep):
                    out.append(await settle(store, call_id, step, now, next(settles)))
                    continue
                ops = [
                    parity_op(counters[i], keys[i], i, role, cost, now, step.lag)
                    for i, role, cost in step.picks
                ]
                record = CallRecord(
                    record_key(call_id), call_id, f"user{step.user}|t", RECORD_TTL, step.named
                )
                out.append(await store.evaluate(ops, record, step.dry_run))

        runner(body)
        return out

    return run(run_on_memory), run(redis_runner(redis_server))


@pytest.mark.redis
def test_a_reservation_made_twice_under_one_call_id_leaves_nothing_behind(
    redis_server: RedisServer,
) -> None:
    """Found by the parity test above: a call_id checked twice (a generated id is not read
    back, so both checks commit) used to add both estimates to `reserved` but keep one
    `h:` entry, so one estimate was held for good, charged by no expiry, released by no
    settle. The memory store's counter expired on the fake clock at the period's end and
    answered 0; the real Redis kept it and carried the stray 0.25 into the next period.
    A repeated check now replaces the call's reservation: both stores answer 0."""
    counters = [
        Counter(Kind.SLIDING_WINDOW, 0, 7_750, 1),
        Counter(Kind.BUDGET, 2_500_000, 7_750, period_ms=600_000),
    ]
    reserve = CheckStep(0, ((1, Role.SHADOW, 250_000),), 0, 0, False, False, 0)
    forgotten = SettleStep(0, 0, None, forgotten=True)  # the budget rule is gone: (0, 0, 0)
    # The first step is 420 s before the end of its clock-aligned 10-minute budget period.
    look = CheckStep(420_000, ((0, Role.SHADOW, 0), (1, Role.SHADOW, 0)), 1, 0, False, True, 0)
    steps: list[Step] = [reserve, reserve, forgotten, forgotten, look]
    on_memory, on_redis = run_twins(redis_server, counters, steps)
    for name, out in (("memory", on_memory), ("redis", on_redis)):
        first, again, settled, twice, after = out
        assert isinstance(first, Evaluation), name
        assert isinstance(again, Evaluation), name
        assert (first.results[0].reserved, again.results[0].reserved) == (250_000, 250_000), name
        assert isinstance(settled, tuple), name
        assert settled[1] == (SettleStatus.SETTLED, [250_000]), name
        assert isinstance(twice, tuple), name
        assert twice[1] == (SettleStatus.ALREADY_SETTLED, []), name
        assert isinstance(after, Evaluation), name
        window, spend = after.results
        assert (window.admitted, window.remaining) == (False, 0), name  # limit 0, shadow
        assert (spend.used, spend.reserved, spend.remaining) == (0, 0, 2_500_000), name
        assert spend.reset_after_ms == 600_000, name  # at the next period's start
    assert on_memory == on_redis


@pytest.mark.redis
def test_amounts_of_a_hundred_million_and_more_survive_the_lua_twin(
    redis_server: RedisServer,
) -> None:
    """Budgets have no upper bound and a call may cost up to 1e9: both twins stay exact."""
    cost = 123_456_789_012_345  # 123,456,789.012345 in micro-units
    namespace = f"big{next(_keys)}"
    start = START_MS - START_MS % 3_600_000
    period = (start, start + 3_600_000, start + 7_200_000)
    op = CounterOp(
        f"rw:{{{namespace}}}:bg", Kind.BUDGET, Role.ENFORCE, 900_000_000_000_000, 3_600_000,
        cost=cost, period=period, rule="big",
    )  # fmt: skip

    def run(runner: Runner) -> list[object]:
        out: list[object] = []

        async def body(store: Store, clock: FakeClock) -> None:
            call_id = f"{namespace}-call"
            record = CallRecord(record_key(call_id), call_id, "u|t", RECORD_TTL, named=True)
            out.append(await store.evaluate([op], record))
            out.append(await store.evaluate([op], record))  # answered from the record
            found = await store.read_holds(record.key)
            holds = [replace(h, period=period) for h in (found.holds if found else [])]
            out.append(holds)
            try:
                out.append(await store.settle(record.key, call_id, cost + 1, holds))
            except StoreError as exc:
                out.append(f"settle failed: {exc}")
            out.append(await store.evaluate([op], dry_run=True))

        runner(body)
        return out

    on_memory = run(run_on_memory)
    first, replay, _, settled, after = on_memory
    assert isinstance(first, Evaluation)
    assert isinstance(replay, Evaluation)
    assert isinstance(after, Evaluation)
    [reserved] = first.results
    assert (reserved.reserved, replay.results, replay.replayed) == (cost, [reserved], True)
    assert settled == (0, [cost + 1])
    assert (after.results[0].used, after.results[0].reserved) == (cost + 1, 0)
    on_redis = run(redis_runner(redis_server))
    for i, (mine, theirs) in enumerate(zip(on_memory, on_redis, strict=True)):
        assert mine == theirs, f"step {i}"
