"""Who is refused, on Redis and Redis Cluster (store/base.py `ActivityLog`).

A bucket's sketches share a hash tag, and so do the per-user lists and their index
(store/keys.py): each write is one script on one node, each read one pipeline (a
cluster's splits it by node). Nothing here is on the decision path: the writes come from
background flushes (service/activity.py, service/audit.py), the reads from the console.
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

# KEYS: one bucket's sketches. ARGV: keep, ttl (ms), then per key: n, then n pairs of
# member, count. Each sketch keeps its `keep` highest members: a bounded top-k.
_ADD_TO_SKETCHES = """
local keep, ttl, at = tonumber(ARGV[1]), ARGV[2], 3
for i = 1, #KEYS do
  local n = tonumber(ARGV[at])
  at = at + 1
  for _ = 1, n do
    redis.call('ZINCRBY', KEYS[i], ARGV[at + 1], ARGV[at])
    at = at + 2
  end
  redis.call('ZREMRANGEBYRANK', KEYS[i], 0, -keep - 1)
  redis.call('PEXPIRE', KEYS[i], ttl)
end
return 0
"""
# KEYS: the index, then one list per user. ARGV: keep, users, ttl (ms), now (ms), then per
# list: the user's index member (encoded), n, n entries oldest first. The users trimmed
# out of the index lose their lists in the same step (same hash tag: same node).
_PUSH_USER_DENIALS = """
local keep, users, ttl, now = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local at = 5
for i = 2, #KEYS do
  local member, n = ARGV[at], tonumber(ARGV[at + 1])
  at = at + 2
  for _ = 1, n do
    redis.call('LPUSH', KEYS[i], ARGV[at])
    at = at + 1
  end
  redis.call('LTRIM', KEYS[i], 0, keep - 1)
  redis.call('PEXPIRE', KEYS[i], ttl)
  redis.call('ZADD', KEYS[1], now, member)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ttl))
local over = redis.call('ZCARD', KEYS[1]) - users
if over > 0 then
  for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, over - 1)) do
    redis.call('DEL', KEYS[1] .. ':' .. member)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1)
end
redis.call('PEXPIRE', KEYS[1], ttl)
return 0
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisActivity:
    """The `ActivityLog` part of the Redis stores, on their `_client`."""

    _client: Any  # redis.asyncio.Redis or RedisCluster

    async def add_to_sketches(self, adds: Sequence[SketchCounts], keep: int) -> None:
        with store_errors():
            for add in adds:  # one script per bucket: one hash tag each
                keys: list[str] = []
                args: list[Any] = [keep, add.ttl_ms]
                for sketch, counts in add.counts.items():
                    if not counts:
                        continue  # nothing to add, nothing to trim
                    keys.append(activity_key(add.bucket, sketch))
                    args.append(len(counts))
                    for member, count in counts.items():
                        args += (member, count)
                if keys:
                    await self._client.eval(_ADD_TO_SKETCHES, len(keys), *keys, *args)

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
        by_user: dict[str, list[str]] = {}
        for user, line in entries:
            by_user.setdefault(user, []).append(line)
        if not by_user:
            return
        keys = [USER_DENIALS_INDEX_KEY]
        args: list[Any] = [caps.keep, caps.users, caps.ttl_ms, now_ms]
        for user, lines in by_user.items():
            kept = lines[-caps.keep :]  # the older ones would be trimmed at once
            keys.append(user_denials_key(user))
            args += (encode.__wrapped__(user), len(kept), *kept)
        with store_errors():
            await self._client.eval(_PUSH_USER_DENIALS, len(keys), *keys, *args)

    async def user_denials(self, user: str, count: int) -> list[str]:
        with store_errors():
            found: list[bytes | str] = await self._client.lrange(
                user_denials_key(user), 0, count - 1
            )
        return [_text(line) for line in found]
