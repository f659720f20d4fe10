"""Redis stores (`redis://`, `rediss://`, `unix://`): one EVALSHA per decision.

Concurrent decisions share round trips: their EVALSHAs are written together on one
pipelined connection (store/coalesce.py), still one script call, and so one atomic
step, per decision.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Collection, Sequence
from functools import lru_cache
from typing import Any

import redis.asyncio as aioredis

from ratewarden.clock import Clock, SystemClock
from ratewarden.limiter.ops import (
    CallRecord,
    CounterOp,
    Evaluation,
    Hold,
    Kind,
    Recorded,
    Role,
)
from ratewarden.limiter.script import (
    RECORD_FIELDS,
    SPEND_RETENTION_DAYS,
    ScriptMode,
    SettleStatus,
    decide_head,
    evaluation_of,
    held_values,
    hold_keys,
    hold_values,
    recorded,
    rule_values,
    settle_head,
    source,
)
from ratewarden.store.base import FleetState, StoreError
from ratewarden.store.coalesce import Encoded, ScriptPipeline, encoded
from ratewarden.store.keys import (
    BUDGET_PATTERN,
    DENIALS_KEY,
    FLEET_ALIVE_KEY,
    FLEET_CHANGES_KEY,
    FLEET_REPORTS_KEY,
    OVERRIDES_KEY,
    OVERRIDES_VERSION_KEY,
    SWEEP_CLAIM_KEY,
)
from ratewarden.store.redis_activity import RedisActivity
from ratewarden.store.redis_errors import REDIS_ERRORS, store_error, store_errors

__all__ = [
    "REDIS_ERRORS",
    "SYSTEM_CLOCK",
    "RedisKeyspace",
    "RedisStore",
    "connection_options",
    "store_error",
    "store_errors",
]

_RESET_BATCH = 500
SYSTEM_CLOCK = SystemClock()


def connection_options() -> dict[str, Any]:
    """Options for redis-py's asyncio clients that depend on its version.

    redis-py 8's default maintenance-notification mode ("auto") skips the pool's check
    for connections the server closed: after a Redis restart every pooled connection
    would fail one command. Turned off where the asyncio client has the option (8.0 on);
    older asyncio clients (the `limits` and `throttled-py` packages pin redis<8) have no
    such mode and get nothing.
    """
    parameters = inspect.signature(aioredis.Redis.__init__).parameters
    if "maint_notifications_config" not in parameters:
        return {}
    from redis.maint_notifications import MaintNotificationsConfig

    return {"maint_notifications_config": MaintNotificationsConfig(enabled=False)}


# KEYS: the overrides hash, its version. ARGV: the ids the reader holds already. Returns
# {version, every id, {id, document} of the others}: a change moves what it adds, not
# every document (1 000 of 100 glob users are about 2.5 MB).
_READ_OVERRIDES = """
local known = {}
for i = 1, #ARGV do known[ARGV[i]] = true end
local ids, fresh = redis.call('HKEYS', KEYS[1]), {}
for _, id in ipairs(ids) do
  if not known[id] then
    fresh[#fresh + 1] = id
    fresh[#fresh + 1] = redis.call('HGET', KEYS[1], id)
  end
end
return {tonumber(redis.call('GET', KEYS[2]) or '0'), ids, fresh}
"""
# KEYS: the overrides hash, its version. ARGV: id, document, cap, then ids to drop first
# (expired). The count and the write in one script: daemons racing cannot pass the cap.
# Returns {new version}, or {-1} when `cap` others are stored (the version still moves
# when expired ones were dropped, so every daemon reads them gone).
_PUT_OVERRIDE = """
local dropped = 0
for i = 4, #ARGV do dropped = dropped + redis.call('HDEL', KEYS[1], ARGV[i]) end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0
    and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then
  if dropped > 0 then redis.call('INCR', KEYS[2]) end
  return {-1}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return {redis.call('INCR', KEYS[2])}
"""
_REMOVE_OVERRIDE = """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then return {-1} end
return {redis.call('INCR', KEYS[2])}
"""

# KEYS: the overrides version, the change counts, the reports, the alive set. ARGV:
# member, report, ttl (ms). Expiries are on Redis TIME, one clock for every process.
# Returns {overrides version, {change, count, ...}}: a process's whole poll.
_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now)
if #dead > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  redis.call('HDEL', KEYS[3], unpack(dead))
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[4], now + tonumber(ARGV[3]), ARGV[1])
return {tonumber(redis.call('GET', KEYS[1]) or '0'), redis.call('HGETALL', KEYS[2])}
"""
# KEYS: the sweep's claim. ARGV: member, ttl (ms). Taken if free (SET NX PX), renewed if
# ours, else left: {1} ours now, {0} another's.
_CLAIM_SWEEP = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if held then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
return 1
"""
# KEYS: the reports, the alive set. Returns {members, their reports} of the live ones.
_REPORTS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')
if #live == 0 then return {{}, {}} end
return {live, redis.call('HMGET', KEYS[1], unpack(live))}
"""


def _due(found: object) -> int | None:
    """A budget counter's `n` as read; None for a key that is not one of ours (another
    type, whose HGET failed, or a field that is not a number): the walk passes it by."""
    if isinstance(found, bytes) and found.isdigit():
        return int(found)
    return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisKeyspace(RedisActivity):
    """What the single-node and the cluster store do alike: plain commands on `_client`."""

    _client: Any  # redis.asyncio.Redis or RedisCluster
    _clock: Clock | None  # injected in tests; else Redis `TIME` inside the script

    @property
    def clock(self) -> Clock:
        """What picks budget periods; Redis `TIME` decides everything else."""
        return self._clock or SYSTEM_CLOCK

    async def reset(self, pattern: str) -> int:
        deleted = 0
        with store_errors():
            batch: list[bytes] = []
            async for key in self._client.scan_iter(match=pattern, count=_RESET_BATCH):
                batch.append(key)
                if len(batch) >= _RESET_BATCH:
                    deleted += await self._client.unlink(*batch)
                    batch = []
            if batch:
                deleted += await self._client.unlink(*batch)
        return deleted

    async def spend_records(self, pattern: str, cap: int) -> list[tuple[str, int]]:
        found: list[tuple[str, int]] = []
        with store_errors():
            keys: list[bytes] = []
            async for key in self._client.scan_iter(match=pattern, count=_RESET_BATCH):
                keys.append(key)
                if len(keys) >= cap:
                    break
            for start in range(0, len(keys), _RESET_BATCH):
                batch = keys[start : start + _RESET_BATCH]
                values = await self._get_many(batch)
                found += [(_text(k), int(v)) for k, v in zip(batch, values, strict=True) if v]
        return found

    # The budget sweep (service/sweep.py): a walk of the budget counters that goes on
    # from call to call (SCAN's cursor, every primary of a cluster), and each counter's
    # earliest reservation expiry read beside its key, in pipelines of _RESET_BATCH.
    _budget_walk: AsyncIterator[bytes] | None = None

    async def claim_sweep(self, member: str, ttl_ms: int) -> bool:
        with store_errors():
            taken = await self._client.eval(_CLAIM_SWEEP, 1, SWEEP_CLAIM_KEY, member, ttl_ms)
        return bool(taken)

    async def budget_counters(self, count: int) -> tuple[list[tuple[str, int | None]], bool]:
        with store_errors():
            keys, ended = await self._walk_budgets(count)
            if not keys and ended:  # the last step stopped at the walk's very end: begin
                keys, ended = await self._walk_budgets(count)  # the next, not a tick idle
            found: list[tuple[str, int | None]] = []
            for start in range(0, len(keys), _RESET_BATCH):
                batch = keys[start : start + _RESET_BATCH]
                async with self._client.pipeline(transaction=False) as pipe:
                    for key in batch:
                        pipe.hget(key, "n")
                    dues = await pipe.execute(raise_on_error=False)
                found += [
                    (k.decode(), _due(due))
                    for k, due in zip(batch, dues, strict=True)
                    if k.isascii()  # ours are percent-encoded; another's is passed by
                ]
        return found, ended

    async def _walk_budgets(self, count: int) -> tuple[list[bytes], bool]:
        """Up to `count` more keys of the walk (a new one if none is under way), and
        whether it ended."""
        walk = self._budget_walk
        if walk is None:
            walk = self._client.scan_iter(match=BUDGET_PATTERN, count=_RESET_BATCH)
        keys: list[bytes] = []
        try:
            while len(keys) < count:
                keys.append(await anext(walk))
        except StopAsyncIteration:
            self._budget_walk = None
            return keys, True
        except BaseException:  # a failed or cancelled SCAN: the next call starts again
            self._budget_walk = None
            raise
        self._budget_walk = walk
        return keys, False

    async def _get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of `keys` (None for one that expired since the scan)."""
        values: list[bytes | None] = await self._client.mget(keys)
        return values

    async def recent_denials(self, count: int) -> list[str]:
        with store_errors():
            found: list[bytes | str] = await self._client.lrange(DENIALS_KEY, 0, count - 1)
        return [line.decode() if isinstance(line, bytes) else line for line in found]

    # Runtime overrides: each change is one script (the document and the version move
    # together); both keys share a hash tag, so a cluster runs it on one node.

    async def overrides_version(self) -> int:
        with store_errors():
            found = await self._client.get(OVERRIDES_VERSION_KEY)
        return int(found or 0)

    async def read_overrides(
        self, known: Collection[str] = ()
    ) -> tuple[int, dict[str, str | None]]:
        with store_errors():
            version, ids, flat = await self._client.eval(
                _READ_OVERRIDES, 2, OVERRIDES_KEY, OVERRIDES_VERSION_KEY, *known
            )
        found: dict[str, str | None] = dict.fromkeys(map(_text, ids))
        found.update((_text(k), _text(v)) for k, v in zip(flat[::2], flat[1::2], strict=True))
        return int(version), found

    async def put_override(
        self, override_id: str, document: str, cap: int, drop: Sequence[str] = ()
    ) -> int | None:
        args = [override_id, document, str(cap), *drop]
        version, _ = await self._overrides(_PUT_OVERRIDE, args)
        return None if int(version) < 0 else int(version)

    async def remove_override(self, override_id: str) -> int | None:
        version, _ = await self._overrides(_REMOVE_OVERRIDE, [override_id])
        return None if int(version) < 0 else int(version)

    async def _overrides(self, script: str, args: list[str]) -> tuple[int, list[Any]]:
        with store_errors():
            reply = await self._client.eval(script, 2, OVERRIDES_KEY, OVERRIDES_VERSION_KEY, *args)
        return reply[0], reply[1] if len(reply) > 1 else []

    # The fleet (service/fleet.py): its keys share the overrides' hash tag, so a poll is
    # one script on one node.

    async def beat(self, member: str, report: str, ttl_ms: int) -> FleetState:
        keys = (OVERRIDES_VERSION_KEY, FLEET_CHANGES_KEY, FLEET_REPORTS_KEY, FLEET_ALIVE_KEY)
        with store_errors():
            version, flat = await self._client.eval(_BEAT, 4, *keys, member, report, ttl_ms)
        changes = {_text(k): int(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
        return FleetState(int(version), changes)

    async def announce(self, change: str) -> int:
        with store_errors():
            count: int = await self._client.hincrby(FLEET_CHANGES_KEY, change, 1)
        return int(count)

    async def reports(self) -> dict[str, str]:
        with store_errors():
            members, found = await self._client.eval(
                _REPORTS, 2, FLEET_REPORTS_KEY, FLEET_ALIVE_KEY
            )
        pairs = zip(members, found, strict=True)
        return {_text(m): _text(r) for m, r in pairs if r is not None}

    # The notifier's (service/notify.py): plain commands; each key stands alone, so a
    # cluster sends each to its node (a pipeline of many is one round trip per node).

    async def claim(self, key: str, ttl_ms: int) -> bool:
        with store_errors():
            taken = await self._client.set(key, b"1", nx=True, px=max(1, ttl_ms))
        return bool(taken)

    async def tally(self, counts: Sequence[tuple[str, int, int]]) -> list[int]:
        if not counts:
            return []
        with store_errors():
            async with self._client.pipeline(transaction=False) as pipe:
                for key, count, ttl_ms in counts:
                    pipe.incrby(key, count)
                    pipe.pexpire(key, max(1, ttl_ms))
                replies = await pipe.execute()
        return [int(total) for total in replies[::2]]

    async def ping(self) -> None:
        with store_errors():
            await self._client.ping()


@lru_cache(maxsize=4096)  # one entry per distinct rule and limit, per role
def _rule_arguments(kind: Kind, role: Role, limit: int, window_ms: int, burst: int) -> Encoded:
    """The first five of an op's values, which come from its rule: encoded once."""
    return encoded(*rule_values(kind, role, limit, window_ms, burst))


@lru_cache(maxsize=4096)  # a tool's usual cost and the current budget period: few values
def _held_arguments(cost: int, start: int, end: int, next_end: int) -> Encoded:
    """Four of the other five values of an op that holds something (all but its line)."""
    return encoded(*held_values(cost, (start, end, next_end)))


_NOTHING_HELD = encoded(*held_values(0, (0, 0, 0)), "")  # the other five, holding nothing


class RedisStore(RedisKeyspace):
    """Runs the counters script (limiter/script.py) by SHA; time is Redis `TIME` unless a
    clock is injected.

    The injected clock exists for tests, so the same fake-clock scenarios run on the
    memory store, fakeredis and a real redis-server.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        description: str,
        clock: Clock | None = None,
        spend_retention_days: int = SPEND_RETENTION_DAYS,
    ) -> None:
        self._client = client
        self._description = description
        self._clock = clock
        self._script = ScriptPipeline(client, source(spend_retention_days))

    @property
    def description(self) -> str:
        return self._description

    async def start(self) -> None:
        try:
            await self._script.load()
        except REDIS_ERRORS as exc:
            raise StoreError(f"cannot load the counters script: {exc}") from exc

    async def evaluate(
        self, ops: Sequence[CounterOp], record: CallRecord | None = None, dry_run: bool = False
    ) -> Evaluation:
        keys = [record.key if record else "rw:call:{}", *(op.key for op in ops)]
        args: list[Any] = decide_head(self._now(), dry_run, record)
        for op in ops:
            args.append(_rule_arguments(op.kind, op.role, op.limit, op.window_ms, op.burst))
            if op.rule:  # a hold, or a loop rule's op its settle must reach
                args += (_held_arguments(op.cost, *op.period), op.hold_line)
            else:
                args.append(_NOTHING_HELD)
        return evaluation_of(ops, await self._run(keys, args))

    async def read_holds(self, record_key: str) -> Recorded | None:
        with store_errors():
            found: list[Any] = await self._client.hmget(record_key, RECORD_FIELDS)
        return recorded(found)

    async def settle(
        self,
        record_key: str,
        call_id: str,
        actual: int | None,
        holds: Sequence[Hold],
        fingerprint: str = "",
        result_digest: str | None = None,
        model: bool = False,
    ) -> tuple[SettleStatus, list[int]]:
        now = self._now()
        args: list[Any] = settle_head(ScriptMode.SETTLE, now, call_id, actual, result_digest, model)
        args.append(fingerprint)
        for hold in holds:
            args += hold_values(hold)
        reply = await self._run([record_key, *hold_keys(holds)], args)
        return SettleStatus(reply[0]), reply[1:]

    async def sweep_budget(self, key: str, period: tuple[int, int, int]) -> int:
        reply = await self._run([key], [ScriptMode.SWEEP.value, self._now(), *period])
        return int(reply[0])

    async def push_denials(self, entries: Sequence[str], keep: int) -> None:
        with store_errors():
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.lpush(DENIALS_KEY, *entries)
                pipe.ltrim(DENIALS_KEY, 0, keep - 1)
                await pipe.execute()

    def _now(self) -> str:
        return str(self._clock.now_ms()) if self._clock else ""

    async def _run(self, keys: list[str], args: list[Any]) -> list[int]:
        # `store_errors()` written out: every decision passes here, and a generator-based
        # context manager (a generator, its object, a StopIteration) was the largest cost
        # the counted decision path could shed (docs/benchmarks.md, 2026-11-29).
        try:
            reply: list[int] = await self._script.call(keys, args)
        except REDIS_ERRORS as exc:
            raise store_error(exc) from exc
        return reply

    async def close(self) -> None:
        await self._script.aclose()
        await self._client.aclose()
