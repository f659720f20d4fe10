"""A token rate's edges, on every store (memory, fakeredis, a real redis-server), on a
fake clock: what a hostile or broken settle cannot do to the window, and what Redis keeps.

The engine fills a hold's tokens from the settle's usage (at most MAX_TOKENS per field,
never negative); these hand the store what the engine never should, to show the counter
holds anyway: a negative count adds nothing, a huge one saturates at TOKEN_CEILING (an
exact integer in the script's doubles) and still refuses.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from ratewarden.clock import FakeClock
from ratewarden.limiter.algorithms.token_window import TOKEN_CEILING
from ratewarden.limiter.ops import CallRecord, CounterOp, Hold, Kind, OpResult, Role
from ratewarden.limiter.script import SettleStatus
from ratewarden.store import Store
from ratewarden.store.keys import record_key
from ratewarden.store.redis_store import RedisStore
from tests.conformance.test_conformance import MINUTE_ENDS_AT

KEY = "rw:{tokens|user=alice}:tk"
WINDOW = 60_000


def op(limit: int = 1_000, role: Role = Role.ENFORCE) -> CounterOp:
    return CounterOp(KEY, Kind.TOKENS, role, limit, WINDOW, rule="tokens")


async def allowed(store: Store, call_id: str) -> None:
    record = CallRecord(record_key(call_id), call_id, "fp", 3_600_000, False)
    assert (await store.evaluate([op()], record)).results[0].admitted


async def settle(store: Store, call_id: str, tokens: int) -> tuple[SettleStatus, list[int]]:
    hold = Hold(Kind.TOKENS, KEY, tokens, "tokens", (1_000, WINDOW, 0))
    return await store.settle(record_key(call_id), call_id, None, [hold], "fp")


async def read(store: Store) -> OpResult:
    return (await store.evaluate([op()], None, dry_run=True)).results[0]


async def test_a_negative_count_adds_nothing_and_a_huge_one_saturates(store: Store) -> None:
    for n in range(4):
        await allowed(store, f"c{n}")
    assert await settle(store, "c0", 700) == (SettleStatus.SETTLED, [0])
    assert await settle(store, "c1", -(10**9)) == (SettleStatus.SETTLED, [0])
    assert (await read(store)).used == 700  # not taken back
    assert await settle(store, "c2", 10 * TOKEN_CEILING) == (SettleStatus.SETTLED, [0])
    assert await settle(store, "c3", 10**8) == (SettleStatus.SETTLED, [0])
    found = await read(store)
    assert (found.admitted, found.used, found.remaining) == (False, TOKEN_CEILING, 0)


async def test_a_refused_shadow_token_rate_still_counts_its_call(store: Store) -> None:
    """A shadow rule reports what enforcing would do: its window counts every call."""
    await allowed(store, "big")
    assert await settle(store, "big", 5_000) == (SettleStatus.SETTLED, [0])
    record = CallRecord(record_key("s"), "s", "fp", 3_600_000, False)
    found = await store.evaluate([op(role=Role.SHADOW)], record)
    assert not found.results[0].admitted
    assert await settle(store, "s", 1) == (SettleStatus.SETTLED, [0])
    assert (await read(store)).used == 5_001


async def test_the_window_key_expires_when_its_window_ends(
    redis_url: str, clock: FakeClock
) -> None:
    """On Redis, the only key a token rate writes lives until its aligned window ends."""
    store = RedisStore(aioredis.Redis.from_url(redis_url), redis_url, clock)
    try:
        await allowed(store, "a")
        client = aioredis.Redis.from_url(redis_url)
        assert await client.exists(KEY) == 0  # a check writes nothing
        clock.advance(1_000)
        assert await settle(store, "a", 42) == (SettleStatus.SETTLED, [0])
        assert await client.get(KEY) == f"{clock.now_ms() - 1_000 - 37_345}:42".encode()
        assert MINUTE_ENDS_AT - 1_000 - 50 < await client.pttl(KEY) <= MINUTE_ENDS_AT - 1_000
        await client.aclose()
    finally:
        await store.close()
