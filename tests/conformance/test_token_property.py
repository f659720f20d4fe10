"""Property test: a token rate (Kind.TOKENS) against a brute-force oracle, on a fake clock.

Each example runs checks, settles (some of refused calls, some repeated, some after the
rule is gone) and dry reads on one counter, and compares every answer with an oracle
that keeps every settle's (time, tokens): a check admits iff the tokens settled in its
clock-aligned window are fewer than the limit, and never adds any; a settle adds its
tokens to the window it lands in, once, and only for a call that was allowed. On the
memory store (many examples) and on a real redis-server with the clock injected (fewer;
times on a 100 ms grid, so no key's TTL is a few ms: Redis expires on its own clock).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratewarden.clock import FakeClock
from ratewarden.limiter.ops import CallRecord, CounterOp, Hold, Kind, OpResult, Role
from ratewarden.limiter.script import SettleStatus
from ratewarden.store import Store
from ratewarden.store.keys import record_key
from tests.conformance.test_limiter_property import (
    MEMORY,
    REDIS,
    START_MS,
    WINDOWS,
    Runner,
    fresh_key,
    redis_runner,
    run_on_memory,
)
from tests.helpers.redis_server import RedisServer

TOKEN_LIMITS = (0, 1, 100, 1_000, 4_096)
RECORD_TTL_MS = 10**11  # outlives every example: an expired record is another test's matter

Event = tuple[int, str, int, int]  # (gap in ms, what, which earlier call, tokens)


@st.composite
def token_cases(
    draw: st.DrawFn, windows: Sequence[int] = WINDOWS, grid: int = 1
) -> tuple[int, int, int, list[Event]]:
    window = draw(st.sampled_from(windows))
    limit = draw(st.sampled_from(TOKEN_LIMITS))
    phase = draw(st.integers(0, window // grid - 1)) * grid  # the first event in its window
    steps = window // grid
    gap = st.one_of(
        st.just(0), st.integers(0, steps // 8), st.integers(0, 2 * steps), st.just(steps)
    ).map(lambda g: g * grid)
    what = st.sampled_from(("check", "check", "settle", "settle", "again", "gone", "read"))
    tokens = st.one_of(
        st.just(0),
        st.integers(0, 2 * limit + 2),
        st.sampled_from((max(0, limit - 1), limit, limit + 1)),
        st.integers(0, 100_000_000),  # one field of a model call at most (MAX_TOKENS)
    )
    events = draw(st.lists(st.tuples(gap, what, st.integers(0, 999), tokens), max_size=50))
    return limit, window, phase, events


def expected_check(used: int, limit: int, window: int, now: int) -> OpResult:
    ends_in = now - now % window + window - now
    admitted = used < limit
    retry = None if limit == 0 else (0 if admitted else ends_in)
    return OpResult(admitted, used, max(0, limit - used), retry, ends_in if used else 0)


def check_tokens(run: Runner, limit: int, window: int, phase: int, events: list[Event]) -> None:
    key = fresh_key("tk")
    op = CounterOp(key, Kind.TOKENS, Role.ENFORCE, limit, window, rule="tokens")
    start = START_MS - START_MS % window + phase
    # The oracle: every settle that added, (time, tokens); each call's state.
    added: list[tuple[int, int]] = []
    calls: list[str] = []  # "open", "refused" or "settled", by check
    trace: list[str] = []

    def used_at(now: int) -> int:
        aligned = now - now % window
        return sum(tokens for at, tokens in added if at - at % window == aligned)

    async def body(store: Store, clock: FakeClock) -> None:
        now = start
        for gap, what, which, tokens in events:
            now += gap
            clock.set(now)
            trace.append(f"+{now - start} {what} {which} {tokens}")
            if what in ("check", "read") or not calls:
                dry = what == "read"
                call_id = f"{key}-{len(calls)}"
                record = CallRecord(record_key(call_id), call_id, "fp", RECORD_TTL_MS, False)
                found = await store.evaluate([op], None if dry else record, dry_run=dry)
                want = expected_check(used_at(now), limit, window, now)
                assert found.results == [want], trace
                if not dry:
                    calls.append("open" if want.admitted else "refused")
                continue
            # A settle or a settle after the rule is gone: of a call still open, if any;
            # `again`: of any call (a second settle, or the settle of a refused one).
            open_calls = [n for n, state in enumerate(calls) if state == "open"]
            pool = open_calls if what != "again" and open_calls else range(len(calls))
            n = pool[which % len(pool)]
            call_id = f"{key}-{n}"
            recorded = await store.read_holds(record_key(call_id))
            assert (recorded is None) == (calls[n] == "refused"), trace
            period = (0, 0, 0) if what == "gone" else (limit, window, 0)
            holds = (
                [Hold(h.kind, h.key, tokens, h.rule, period) for h in recorded.holds]
                if recorded
                else []
            )
            assert not recorded or [(h.kind, h.key) for h in holds] == [(Kind.TOKENS, key)], trace
            settled = await store.settle(record_key(call_id), call_id, None, holds, "fp")
            if calls[n] == "refused":
                assert settled == (SettleStatus.UNKNOWN, []), trace
            elif calls[n] == "settled":
                assert settled == (SettleStatus.ALREADY_SETTLED, []), trace
            else:
                assert settled == (SettleStatus.SETTLED, [0]), trace
                calls[n] = "settled"
                if what != "gone" and tokens:
                    added.append((now, tokens))
        # The guarantee itself: the window's count is the sum of what its settles added.
        clock.set(now)
        [last] = (await store.evaluate([op], None, dry_run=True)).results
        assert last.used == used_at(now), trace

    run(body)


@MEMORY
@given(case=token_cases())
def test_token_window_matches_the_oracle_on_memory(case: tuple[int, int, int, list[Event]]) -> None:
    check_tokens(run_on_memory, *case)


@pytest.mark.redis
@REDIS
@given(case=token_cases(windows=(1_000, 7_700, 60_000, 3_600_000), grid=100))
def test_token_window_matches_the_oracle_on_real_redis(
    redis_server: RedisServer, case: tuple[int, int, int, list[Event]]
) -> None:
    check_tokens(redis_runner(redis_server), *case)
