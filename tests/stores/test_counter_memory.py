"""A sliding-window counter's Redis memory is bounded by its documented size.

The ring holds 8 bytes of header and 6 per admission in the window, at most
8 + 6 x limit. Redis must not hold much more than that: a string grown in place
keeps spare room (up to as much again), which a full ring used to carry forever.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.store.redis_store import RedisStore
from tests.helpers.redis_server import RedisServer

pytestmark = pytest.mark.redis

LIMIT = 10_000
KEY = "rw:{per-user|user=alice}:sw"


async def test_a_full_ring_takes_little_more_than_its_bytes(redis_server: RedisServer) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    store = RedisStore(client, redis_server.url, FakeClock(1_700_000_000_000))
    await store.start()
    policy = parse_policy(
        f"version: 1\nrules:\n  - {{name: per-user, per: [user], rate: {LIMIT}/hour}}\n".encode()
    )
    engine = Engine(policy, store)
    try:
        await client.flushall()
        for start in range(0, LIMIT, 100):
            decisions = await asyncio.gather(
                *(
                    engine.check(Call(user="alice", tool="t", call_id=f"c{i}", named=False))
                    for i in range(start, start + 100)
                )
            )
            assert {d.decision for d in decisions} == {"allow"}
        refused = await engine.check(Call(user="alice", tool="t", call_id="over", named=False))
        assert refused.decision == "deny"
        value_bytes = await client.strlen(KEY)
        held = await client.memory_usage(KEY)
        assert held is not None
    finally:
        await store.close()
    assert value_bytes == 8 + 6 * LIMIT
    # Key, object header and allocator rounding: under 10 % (it was 91 % grown in place).
    assert held < value_bytes * 1.1, (held, value_bytes)
