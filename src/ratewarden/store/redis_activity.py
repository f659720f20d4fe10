"""Who is refused, on Redis and Redis Cluster (store/base.py `ActivityLog`).

A bucket's sketches share a hash tag, and so do the per-user lists and their index
(store/keys.py). Writes and reads are pipelines of plain commands (a cluster's splits
them by node); one script trims the index, and the lists of the users it drops, when it
has grown past its cap. No script runs for them otherwise: a store's scripts stay the
decisions' (tests/stores/test_refusal_cache_redis.py counts them). Nothing here is on
the decision path: the writes come from background flushes (service/activity.py,
service/audit.py), the reads from the console.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ratewarden.store.base import SketchCounts, UserDenialCaps
from ratewarden.store.keys import (
    USER_DENIALS_INDEX_KEY,
    activity_key,
    encode,
    user_denials_key,
)
from ratewarden.store.redis_errors import store_errors

# KEYS: the index. ARGV: how many users to keep. Drops the users refused longest ago past
# that, their lists with them (same hash tag: same node), in one step: a list is never
# left without its index entry, nor an entry without its list being deleted.
_TRIM_USER_DENIALS = """
local over = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
if over <= 0 then return 0 end
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, over - 1)) do
  redis.call('DEL', KEYS[1] .. ':' .. member)
end
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1)
return over
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisActivity:
    """The `ActivityLog` part of the Redis stores, on their `_client`."""

    _client: Any  # redis.asyncio.Redis or RedisCluster

    async def add_to_sketches(self, adds: Sequence[SketchCounts], keep: int) -> None:
        """Plain commands in one pipeline, no script: each is atomic, and the sketch is a
        count, not an invariant to keep (a trim racing another flush's increment keeps a
        top K all the same). A cluster's pipeline sends each bucket's to its node."""
        with store_errors():
            async with self._client.pipeline(transaction=False) as pipe:
                for add in adds:
                    for sketch, counts in add.counts.items():
                        if not counts:
                            continue  # nothing to add, nothing to trim
                        key = activity_key(add.bucket, sketch)
                        for member, count in counts.items():
                            pipe.zincrby(key, count, member)
                        pipe.zremrangebyrank(key, 0, -keep - 1)
                        pipe.pexpire(key, add.ttl_ms)
                await pipe.execute()

    async def read_sketches(self, buckets: Sequence[str], sketch: str) -> list[dict[str, int]]:
        with store_errors():
            async with self._client.pipeline(transaction=False) as pipe:
                for bucket in buckets:
                    pipe.zrange(activity_key(bucket, sketch), 0, -1, withscores=True)
                found = await pipe.execute()
        return [{_text(m): round(score) for m, score in pairs} for pairs in found]

    async def sketch_scores(self, buckets: Sequence[str], sketch: str, member: str) -> list[int]:
        with store_errors():
            async with self._client.pipeline(transaction=False) as pipe:
                for bucket in buckets:
                    pipe.zscore(activity_key(bucket, sketch), member)
                found = await pipe.execute()
        return [round(score or 0) for score in found]

    async def push_user_denials(
        self, entries: Sequence[tuple[str, str]], now_ms: int, caps: UserDenialCaps
    ) -> None:
        """Each user's entries, the index's times and its count in one pipeline of plain
        commands; past `caps.users`, one script trims the index and the lists together."""
        by_user: dict[str, list[str]] = {}
        for user, line in entries:
            by_user.setdefault(user, []).append(line)
        if not by_user:
            return
        index = USER_DENIALS_INDEX_KEY
        with store_errors():
            async with self._client.pipeline(transaction=False) as pipe:
                for user, lines in by_user.items():
                    key = user_denials_key(user)
                    pipe.lpush(key, *lines[-caps.keep :])  # older ones: trimmed at once
                    pipe.ltrim(key, 0, caps.keep - 1)
                    pipe.pexpire(key, caps.ttl_ms)
                    pipe.zadd(index, {encode.__wrapped__(user): now_ms})
                pipe.zremrangebyscore(index, "-inf", now_ms - caps.ttl_ms)  # lists expired
                pipe.pexpire(index, caps.ttl_ms)
                pipe.zcard(index)
                indexed = (await pipe.execute())[-1]
            if int(indexed) > caps.users:
                await self._client.eval(_TRIM_USER_DENIALS, 1, index, caps.users)

    async def user_denials(self, user: str, count: int) -> list[str]:
        with store_errors():
            found: list[bytes | str] = await self._client.lrange(
                user_denials_key(user), 0, count - 1
            )
        return [_text(line) for line in found]
