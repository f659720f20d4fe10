"""Redis memory per active sliding-window counter, and proof that every key expires.

Two limits are measured, each `per: [user]` with `algorithm: sliding_window` (also the
policy default): `10/minute` (its window is a parameter, so a quick run can use
`10/2s`) and `10000/day`. A counter is one Redis string: an 8-byte header, then one
6-byte timestamp per admission still kept, appended lazily up to `limit` entries (the
documented bound is 8 + 6 x limit bytes of value); every admission sets its TTL to the
window.

Everything goes through ratewarden's public API in process (`store_from_url`, `Engine`,
`parse_policy`, `Call`), so the keys and values are exactly the daemon's. Decisions are
made concurrently with `asyncio.gather`, `concurrency` at a time. The Redis server must
be a private one: it is FLUSHALLed before every phase.

Per limit, in order:

1. Counters. FLUSHALL, read `INFO memory` used_memory, make one decision per distinct
   user (each is admitted: one counter holding one entry), read used_memory again.
   bytes_per_counter = (after - before) / users. The calls carry no call_id of the
   caller's (`Call.named=False`, what the daemon does for a request without
   `call_id`), and a sliding window holds nothing to settle, so no call record is
   written: the delta is counters only, including their share of Redis' main and
   expires hash tables. One counter's `STRLEN` and `MEMORY USAGE`, the key count
   (DBSIZE) and the PTTL of every counter key (SCAN) are reported: the largest PTTL must
   be at most the window, and no counter may lack a TTL.
2. Full counter. FLUSHALL, then one user admitted `limit` times (10, or 10 000 for the
   day limit: one user only), and one more call that must be refused; that one key's
   `STRLEN` (expected 8 + 6 x limit) and `MEMORY USAGE`.
3. Call records, separately. A caller that names its call (`call_id`, an idempotency
   key) gets a record `rw:call:{id}` for every allowed call, kept `call_ttl` (default
   1 h) so a re-check is answered from it. FLUSHALL, the same users again, now with
   named calls (UUIDs): bytes_per_record = (this delta - the counters' delta) / users,
   plus the mean `MEMORY USAGE` of up to 1000 records and their PTTL.
4. Expiry. For the short limit, phase 3 runs with `call_ttl` equal to the window (the
   bytes of a record do not depend on its TTL), and after its last admission the
   benchmark waits for DBSIZE to reach 0: counters and records gone. A day cannot be
   waited out: the proof is phase 1's largest PTTL (at most one day, and every counter
   has one), and, in addition, the same limit scaled down (`10000/3s`, users named
   calls plus one full 10 000-entry counter, `call_ttl` 3 s) is shown to empty the
   database too (when deciding takes longer than that window, early keys are already
   gone before the wait starts). If DBSIZE is still above 0 at the deadline (window +
   margin), a SCAN (which deletes keys already past their TTL) tells keys that Redis had
   not yet reclaimed from keys that did not expire.

    python -m bench.memory --redis-url redis://127.0.0.1:6530/0 --users 100000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from bench.redis_server import refuse_shared
from ratewarden.calls import Call
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.store import Store, store_from_url

RULE = "per-user"
TOOL = "search"
SHORT_LIMIT = 10
DAY_LIMIT = 10_000
DAY_S = 86_400
HEADER_BYTES, ENTRY_BYTES = 8, 6  # counters.lua: the ring's header and one timestamp
COUNTER_MATCH = "rw:{*"  # every counter (keys.py); call records are `rw:call:{...}`
RECORD_MATCH = "rw:call:{*"
RECORD_SAMPLE = 1000
SCAN_COUNT = 1000
POLL_S = 0.1
STORE_TIMEOUT_S = 10.0
MEMORY_FIELDS = ("used_memory", "used_memory_dataset", "mem_clients_normal")


def window_text(seconds: int) -> str:
    """A rate's window in the policy syntax: `minute`, `day`, else `Ns`."""
    named = {1: "second", 60: "minute", 3_600: "hour", DAY_S: "day"}
    return named.get(seconds, f"{seconds}s")


def whole_seconds(seconds: float) -> int:
    """Rates and durations count whole units: round a window to seconds, at least 1."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"a window must be a positive number of seconds, got {seconds!r}")
    return max(1, round(seconds))


def policy_yaml(limit: int, window_s: int, call_ttl_s: int | None = None) -> bytes:
    """One `per: [user]` sliding-window rule; `call_ttl_s` shortens the call records' TTL."""
    lines = ["version: 1"]
    if call_ttl_s is not None:  # call_ttl must be at least lease_timeout and reservation_ttl
        lines += [
            "defaults:",
            f"  call_ttl: {call_ttl_s}s",
            "  lease_timeout: 1s",
            "  reservation_ttl: 1s",
        ]
    lines += [
        "rules:",
        f"  - {{name: {RULE}, per: [user], rate: {limit}/{window_text(window_s)},"
        " algorithm: sliding_window}",
    ]
    return ("\n".join(lines) + "\n").encode()


def user_name(i: int) -> str:
    return f"user-{i:07d}"


def anonymous_call(user: str, i: int) -> Call:
    """A call without a caller-chosen call_id: no record is kept for a sliding window."""
    return Call(user=user, tool=TOOL, call_id=f"rw-anon-{i}", named=False)


def named_call(user: str, i: int) -> Call:
    """A call whose caller sent a call_id (a UUID): its record is kept `call_ttl`."""
    del i
    return Call(user=user, tool=TOOL, call_id=str(uuid.uuid4()), named=True)


@dataclass
class Tally:
    allowed: int = 0
    refused: int = 0
    seconds: float = 0.0
    finished_at: float = 0.0  # time.monotonic() when the last decision came back

    def as_dict(self) -> dict[str, Any]:
        total = self.allowed + self.refused
        return {
            "allowed": self.allowed,
            "refused": self.refused,
            "seconds": round(self.seconds, 3),
            "decisions_per_s": round(total / self.seconds) if self.seconds else None,
        }


class Bench:
    """A private Redis (admin connection) and the engine's store on the same server."""

    def __init__(self, redis_url: str, concurrency: int) -> None:
        self.url = redis_url
        self.concurrency = concurrency
        self.admin: aioredis.Redis = aioredis.Redis.from_url(redis_url, decode_responses=True)
        # The daemon's own store; timeouts are generous: a slow answer would be a
        # fail-open decision that wrote nothing.
        self.store: Store = store_from_url(redis_url, timeout_ms=int(STORE_TIMEOUT_S * 1000))

    async def start(self) -> None:
        await self.store.start()  # loads the counters script before any "before" figure

    async def close(self) -> None:
        await self.store.close()
        await self.admin.aclose()

    def engine(self, policy: bytes) -> Engine:
        return Engine(parse_policy(policy, source="<bench.memory>"), self.store)

    async def flush(self) -> None:
        """FLUSHALL, and wait out any lazy freeing, so the next `before` is settled."""
        await self.admin.flushall(asynchronous=False)
        while int((await self.admin.info("memory")).get("lazyfree_pending_objects", 0)):
            await asyncio.sleep(POLL_S)

    async def memory(self) -> dict[str, int]:
        info: dict[str, Any] = await self.admin.info("memory")
        return {name: int(info[name]) for name in MEMORY_FIELDS}

    async def warm(self, engine: Engine) -> None:
        """One throwaway round of decisions, then FLUSHALL: connections are open and Redis'
        one-time allocations made before `before` is read (they would swamp a small run)."""
        await self.decide(engine, self.concurrency, lambda i: anonymous_call(f"warm-{i}", i))
        await self.flush()

    async def decide(
        self, engine: Engine, count: int, make: Callable[[int], Call], first: int = 0
    ) -> Tally:
        """`count` decisions, `concurrency` at a time; a degraded one aborts the benchmark."""
        tally = Tally()
        began = time.perf_counter()
        for start in range(first, first + count, self.concurrency):
            stop = min(start + self.concurrency, first + count)
            found = await asyncio.gather(*(engine.check(make(i)) for i in range(start, stop)))
            for decision in found:
                if decision.degraded:
                    raise RuntimeError("the store did not answer (a fail-open decision)")
                if decision.allowed:
                    tally.allowed += 1
                else:
                    tally.refused += 1
        tally.seconds = time.perf_counter() - began
        tally.finished_at = time.monotonic()
        return tally

    async def keys(self, match: str) -> list[str]:
        return [key async for key in self.admin.scan_iter(match=match, count=SCAN_COUNT)]

    async def ttl_survey(self, match: str) -> dict[str, Any]:
        """PTTL of every key `match` names: the largest, the smallest, and any without TTL."""
        keys = await self.keys(match)
        ttls: list[int] = []
        for start in range(0, len(keys), SCAN_COUNT):
            async with self.admin.pipeline(transaction=False) as pipe:
                for key in keys[start : start + SCAN_COUNT]:
                    pipe.pttl(key)
                ttls += await pipe.execute()
        return {
            "keys": len(keys),
            "max_pttl_ms": max(ttls, default=None),
            "min_pttl_ms": min(ttls, default=None),
            "keys_without_ttl": sum(1 for t in ttls if t < 0),  # -1: would never expire
        }

    async def key_size(self, key: str) -> dict[str, Any]:
        return {
            "key": key,
            "key_bytes": len(key.encode()),
            "value_bytes": await self.admin.strlen(key),
            "memory_usage": await self.admin.memory_usage(key, samples=0),
            "pttl_ms": await self.admin.pttl(key),
        }

    async def wait_empty(self, window_s: int, since: float) -> dict[str, Any]:
        """Poll DBSIZE until 0 or until window + margin after `since` (the last admission)."""
        keys_before = await self.admin.dbsize()
        deadline = since + window_s + max(5.0, 0.25 * window_s)
        waited_from = time.monotonic()
        keys = keys_before
        while keys and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            keys = await self.admin.dbsize()
        now = time.monotonic()
        found: dict[str, Any] = {
            "keys_before_wait": keys_before,
            "keys_after_expiry": keys,
            "expired": keys == 0,
            "seconds_waited": round(now - waited_from, 3),
            "seconds_after_last_admission": round(now - since, 3),
        }
        # SCAN deletes keys already past their TTL: what is left never expired.
        found["counter_keys_after"] = len(await self.keys(COUNTER_MATCH))
        found["record_keys_after"] = len(await self.keys(RECORD_MATCH))
        found["keys_after_scan"] = await self.admin.dbsize()
        return found


async def measured(
    bench: Bench, engine: Engine, users: int, make_call: Callable[[str, int], Call]
) -> tuple[Tally, dict[str, Any], dict[str, Any]]:
    """One call per user on a warmed engine: the tally, and Redis' memory before and after."""
    await bench.warm(engine)
    before = await bench.memory()
    tally = await bench.decide(engine, users, lambda i: make_call(user_name(i), i))
    return tally, before, await bench.memory()


async def counters_phase(bench: Bench, policy: bytes, users: int) -> dict[str, Any]:
    """One admission per user, anonymous calls: the memory of `users` counters alone."""
    engine = bench.engine(policy)
    tally, before, after = await measured(bench, engine, users, anonymous_call)
    delta = after["used_memory"] - before["used_memory"]
    clients = after["mem_clients_normal"] - before["mem_clients_normal"]
    survey = await bench.ttl_survey(COUNTER_MATCH)
    sample = await bench.key_size(next(iter(await bench.keys(COUNTER_MATCH)), ""))
    return {
        "users": users,
        "decisions": tally.as_dict(),
        "keys": await bench.admin.dbsize(),
        "counter_keys": survey["keys"],
        "record_keys": len(await bench.keys(RECORD_MATCH)),
        "used_memory_before": before["used_memory"],
        "used_memory_after": after["used_memory"],
        "used_memory_delta": delta,
        "clients_memory_delta": clients,
        "bytes_per_counter": round(delta / users, 1),
        # Client buffers are part of used_memory and vary a little between reads.
        "bytes_per_counter_excluding_clients": round((delta - clients) / users, 1),
        "one_counter": sample,
        "max_pttl_ms": survey["max_pttl_ms"],
        "min_pttl_ms": survey["min_pttl_ms"],
        "keys_without_ttl": survey["keys_without_ttl"],
    }


async def full_phase(bench: Bench, policy: bytes, limit: int) -> dict[str, Any]:
    """One user admitted `limit` times, then refused once: the largest a counter gets."""
    await bench.flush()
    engine = bench.engine(policy)
    tally = await bench.decide(engine, limit, lambda i: anonymous_call("full-user", i))
    refused = not (await engine.check(anonymous_call("full-user", limit))).allowed
    keys = await bench.keys(COUNTER_MATCH)
    if len(keys) != 1:
        raise RuntimeError(f"expected one counter key, found {len(keys)}")
    size = await bench.key_size(keys[0])
    bound = HEADER_BYTES + ENTRY_BYTES * limit
    return {
        "admissions": tally.allowed,
        "next_call_refused": refused,
        "documented_value_bytes": bound,
        "value_bytes": size["value_bytes"],
        "memory_usage": size["memory_usage"],
        "memory_usage_over_value": size["memory_usage"] - size["value_bytes"],
        "pttl_ms": size["pttl_ms"],
        "key": size["key"],
    }


async def records_phase(
    bench: Bench, policy: bytes, users: int, counters_delta: int
) -> tuple[dict[str, Any], Tally]:
    """Named calls for the same users: counters plus one record each; records by difference."""
    engine = bench.engine(policy)
    tally, before, after = await measured(bench, engine, users, named_call)
    delta = after["used_memory"] - before["used_memory"]
    records = await bench.keys(RECORD_MATCH)
    sample = records[:RECORD_SAMPLE]
    sizes = [size for key in sample if (size := await bench.admin.memory_usage(key, samples=0))]
    ttls = [await bench.admin.pttl(key) for key in sample]
    return {
        "users": users,
        "named_calls": True,
        "decisions": tally.as_dict(),
        "keys": await bench.admin.dbsize(),
        "counter_keys": len(await bench.keys(COUNTER_MATCH)),
        "record_keys": len(records),
        "used_memory_delta_with_records": delta,
        "bytes_per_record": round((delta - counters_delta) / users, 1),
        "record_memory_usage_mean": round(sum(sizes) / len(sizes), 1) if sizes else None,
        "record_key_bytes": len(sample[0].encode()) if sample else None,
        "records_sampled": len(sample),
        "call_ttl_ms": engine.policy.call_ttl_ms,
        "max_record_pttl_ms": max(ttls, default=None),
    }, tally


async def short_limit(bench: Bench, users: int, window_s: int) -> dict[str, Any]:
    window_ms = window_s * 1000
    policy = policy_yaml(SHORT_LIMIT, window_s)
    counters = await counters_phase(bench, policy, users)
    full = await full_phase(bench, policy, SHORT_LIMIT)
    # Records expire with the counters here (call_ttl = window); a record's bytes do not
    # depend on its TTL.
    records, tally = await records_phase(
        bench,
        policy_yaml(SHORT_LIMIT, window_s, call_ttl_s=window_s),
        users,
        counters["used_memory_delta"],
    )
    expiry = await bench.wait_empty(window_s, tally.finished_at)
    return {
        "rate": f"{SHORT_LIMIT}/{window_text(window_s)}",
        "window_ms": window_ms,
        **_headline(counters, full, expiry),
        "counters": counters,
        "full_counter": full,
        "call_records": records,
        "expiry": {"rate": f"{SHORT_LIMIT}/{window_text(window_s)}", **expiry},
    }


async def day_limit(bench: Bench, users: int, scaled_window_s: int) -> dict[str, Any]:
    window_ms = DAY_S * 1000
    policy = policy_yaml(DAY_LIMIT, DAY_S)
    counters = await counters_phase(bench, policy, users)
    full = await full_phase(bench, policy, DAY_LIMIT)
    records, _ = await records_phase(bench, policy, users, counters["used_memory_delta"])
    # A day cannot be waited out: the same limit over a few seconds, named calls (so
    # records too, their call_ttl the window) and one full 10 000-entry counter.
    scaled = policy_yaml(DAY_LIMIT, scaled_window_s, call_ttl_s=scaled_window_s)
    await bench.flush()
    engine = bench.engine(scaled)
    full_tally = await bench.decide(engine, DAY_LIMIT, lambda i: anonymous_call("full-user", i))
    largest = max([await bench.admin.strlen(k) for k in await bench.keys(COUNTER_MATCH)] or [0])
    # Keys written early may expire while later calls are still being decided (when that
    # takes longer than the window): what is left when the wait starts can be less than
    # what was written.
    named = await bench.decide(engine, users, lambda i: named_call(user_name(i), i))
    expiry = await bench.wait_empty(scaled_window_s, named.finished_at)
    return {
        "rate": f"{DAY_LIMIT}/day",
        "window_ms": window_ms,
        **_headline(counters, full, expiry),
        "expires_within_window": counters["keys_without_ttl"] == 0
        and (counters["max_pttl_ms"] or 0) <= window_ms,
        "counters": counters,
        "full_counter": full,
        "call_records": records,
        "expiry": {
            "rate": f"{DAY_LIMIT}/{window_text(scaled_window_s)}",
            "scaled_down": True,
            "named_calls_allowed": named.allowed,  # each wrote a counter and a record
            "full_counter_admissions": full_tally.allowed,
            "full_counter_value_bytes": largest,
            "seconds_deciding": round(named.seconds + full_tally.seconds, 3),
            **expiry,
        },
    }


def _headline(
    counters: dict[str, Any], full: dict[str, Any], expiry: dict[str, Any]
) -> dict[str, Any]:
    """The figures asked for, flat; the phases below carry the detail."""
    return {
        "users": counters["users"],
        "keys": counters["keys"],
        "bytes_per_counter": counters["bytes_per_counter"],
        "value_bytes": counters["one_counter"]["value_bytes"],
        "memory_usage": counters["one_counter"]["memory_usage"],
        "full_counter_value_bytes": full["value_bytes"],
        "full_counter_memory_usage": full["memory_usage"],
        "max_pttl_ms": counters["max_pttl_ms"],
        "keys_after_expiry": expiry["keys_after_expiry"],
        "expired": expiry["expired"],
        "seconds_waited": expiry["seconds_waited"],
    }


async def run_memory(
    redis_url: str,
    *,
    users: int = 100_000,
    short_window_s: float = 60.0,
    scaled_window_s: float = 3.0,
    concurrency: int = 256,
) -> dict[str, Any]:
    """Measure both limits on the private Redis at `redis_url` (FLUSHALLed) and report.

    `short_window_s` is the window of the 10-call limit (60: `10/minute`), rounded to
    whole seconds; `scaled_window_s` is the window of the scaled-down 10 000-call limit
    whose expiry is shown instead of waiting a day.
    """
    if users < 1 or concurrency < 1:
        raise ValueError("users and concurrency must be at least 1")
    refuse_shared(redis_url)
    bench = Bench(redis_url, concurrency)
    try:
        await bench.start()
        server: dict[str, Any] = await bench.admin.info("server")
        short = await short_limit(bench, users, whole_seconds(short_window_s))
        day = await day_limit(bench, users, whole_seconds(scaled_window_s))
        memory: dict[str, Any] = await bench.admin.info("memory")
        await bench.flush()
    finally:
        await bench.close()
    return {
        "redis": {
            "version": server["redis_version"],
            "mem_allocator": memory.get("mem_allocator"),
            "used_memory_at_end": int(memory["used_memory"]),
            "used_memory_human_at_end": memory.get("used_memory_human"),
        },
        "users": users,
        "concurrency": concurrency,
        "notes": [
            "bytes_per_counter = INFO used_memory delta / users after one admission per "
            "user, calls without call_id (no call records exist in that phase)",
            "call_records: the same users with named calls (call_id given); "
            "bytes_per_record = (delta with records - counters' delta) / users",
            "memory_usage: MEMORY USAGE of one key (key, value with its unused capacity, "
            "object, main dict entry); it leaves out the key's expires-dict entry and its "
            "share of the hash tables' bucket arrays, which bytes_per_counter includes",
            "expiry of 10000/day: max_pttl_ms over every counter, plus a scaled-down "
            "window actually waited out (expiry.rate)",
        ],
        "limits": {"short": short, "day": day},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.memory", description=__doc__.split("\n", 1)[0]
    )
    parser.add_argument("--redis-url", required=True, help="a private Redis (it is flushed)")
    parser.add_argument("--users", type=int, default=100_000)
    parser.add_argument("--short-window", type=float, default=60.0, help="seconds (10/…)")
    parser.add_argument("--scaled-window", type=float, default=3.0, help="seconds (10000/…)")
    parser.add_argument("--concurrency", type=int, default=256)
    args = parser.parse_args(argv)
    coro = run_memory(
        args.redis_url,
        users=args.users,
        short_window_s=args.short_window,
        scaled_window_s=args.scaled_window,
        concurrency=args.concurrency,
    )
    try:
        import uvloop
    except ImportError:
        result = asyncio.run(coro)
    else:
        result = uvloop.run(coro)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
