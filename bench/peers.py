"""ratewarden against the Python rate-limit libraries, on the same Redis, for one call.

The call must pass three rules: per user per minute, per tool per hour, per user+tool per
day. Each contender checks them the way its own documentation would have a user write it:

- `ratewarden`: `Engine(policy, store).check(Call(...))` in-process, with the RedisStore
  from `store_from_url`. The three rules are one policy; the engine sends them to Redis in
  one EVALSHA and consumes all of them or none. The Call carries a generated call_id
  (`named=False`), as the daemon builds it when the caller names none.
- `limits` (5.x): `limits.aio.strategies.MovingWindowRateLimiter` on `async+redis://`,
  three `hit()` calls in turn, stopping at the first refusal. Each `hit()` is its own
  script call and consumes as it goes: when the third limit refuses, the first two have
  already been charged. limits has no multi-limit check in one round trip (a `test()` of
  each limit before the `hit()`s would double the round trips and still not be atomic).
  `limits` uses redis-py (`implementation="redispy"`), the client the other two use, so the
  comparison is about the design and not the client; `limits_coredis` is the same code on
  the library's default client, coredis.
- `throttled` (throttled-py 3.5): three `throttled.asyncio.Throttled` instances with the
  `sliding_window` algorithm (the closest to the others' sliding windows; throttled's is
  approximate, two fixed windows weighted) on one `throttled.asyncio.RedisStore`, each
  `limit()`-ed in turn, stopping at the first refusal, which also consumes as it goes.

Fairness: one redis-server, one Redis database per contender (the URL's database plus 0, 1,
2, 3), flushed before it is used; the same N checks (users cycling over 1000, one tool,
every check allowed, which is verified) driven by the same number of asyncio tasks on the
same event loop (uvloop from the CLI), after the same warmup, which also opens every
pooled connection and loads every script. Only one contender runs at a time, so each has
the server to itself, but the N checks are split into rounds (5 by default) interleaved
across the contenders, the first one rotating, so that a busy neighbour on the host or a
growing window weighs on all of them alike; `checks_per_s_by_round` shows the spread.

Measured for each contender:

- `checks_per_s`: N over the wall time of the N checks.
- `commands_per_check`: the delta of the sum of `INFO commandstats` calls (read with a
  separate synchronous redis-py client; its own INFO calls are left out) over the run,
  divided by N. Commands run inside Lua scripts are counted by Redis too, so this is the
  number of commands Redis runs per check, not what crosses the network, nor their cost:
  ratewarden's exact sliding window reads a ring's first 4 kB in one GETRANGE and, once
  part of a larger ring has expired, binary-searches the rest with one GETRANGE per
  probe, so its count can grow with the log of how full the window is.
- `round_trips_per_check`: the client commands of one check made alone, seen by `MONITOR`
  (the entries not issued from a script). `single_check` has the MONITOR trace of that
  check, and the commandstats and `total_reads_processed` deltas around another single
  check as cross-checks. `server_reads_per_check` is the `total_reads_processed` delta over
  the whole run divided by N: below the round trips of a check alone when a client puts
  concurrent checks into one write (ratewarden's store writes concurrent EVALSHAs together
  on one pipelined connection; coredis multiplexes commands onto shared connections).
- `redis_cpu_us_per_check` (redis-server user+sys CPU, `INFO cpu`) and
  `client_cpu_us_per_check` (this process, `time.process_time`) over the run, divided by
  N: what a check costs each side, which wall time on a shared host hides.
- `consumes_on_deny`: an experiment, not a claim. With a user+tool/day limit of 2, two
  calls pass, the third is refused by that rule alone, and the user/minute counter is read
  through the contender's own API (`Engine.usage`, `get_window_stats`, `peek`) before and
  after it: True if the refused call used up part of the user/minute limit.

    python -m bench.peers --redis-url redis://127.0.0.1:6520/0 --checks 20000

The Redis must be a private one: the databases above are flushed. Port 6379 is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
import uvloop
from limits import (
    RateLimitItem,
    RateLimitItemPerDay,
    RateLimitItemPerHour,
    RateLimitItemPerMinute,
)
from limits.aio.storage import RedisStorage
from limits.aio.strategies import MovingWindowRateLimiter
from redis.utils import HIREDIS_AVAILABLE
from throttled.asyncio import RateLimiterType, Throttled, per_day, per_hour, per_min
from throttled.asyncio import RedisStore as ThrottledRedisStore

from bench.redis_server import refuse_shared
from ratewarden.calls import Call
from ratewarden.engine.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.store import Store, store_from_url
from ratewarden.vocabulary import daemon_call_id

TOOL = "terminal"
USERS = 1000
USER_MINUTE = 1000  # rule 1: per user per minute
TOOL_HOUR = 100_000  # rule 2: per tool per hour (ratewarden's sliding_window cap)
USER_TOOL_DAY = 10_000  # rule 3: per user+tool per day
DENY_DAY = 2  # rule 3 in the consumes_on_deny experiment
MAX_WARMUP = 2_000
PROBES = 2  # single checks after the run: one for INFO deltas, one under MONITOR
MAX_CHECKS = TOOL_HOUR - MAX_WARMUP - PROBES  # every check must stay allowed
STORE_TIMEOUT_MS = 5_000  # long enough that no check fails open under load


class Contender(Protocol):
    """One library set up for the three rules, on one Redis database."""

    async def check(self, user: str, tool: str) -> bool:
        """Whether the call passes all three rules (consuming the way the library does)."""
        ...

    async def used(self, user: str, tool: str) -> tuple[int, int]:
        """The user/minute and tool/hour counters, read through the library's own API."""
        ...

    async def close(self) -> None: ...


Opener = Callable[[str, int], Awaitable[Contender]]


def _policy_yaml(day_limit: int) -> str:
    return f"""\
version: 1
rules:
  - {{name: user-minute, per: [user], rate: {USER_MINUTE}/minute}}
  - {{name: tool-hour, per: [tool], rate: {TOOL_HOUR}/hour}}
  - {{name: user-tool-day, per: [user, tool], rate: {day_limit}/day}}
"""


class RatewardenContender:
    """The three rules as one policy: one EVALSHA per check, all or nothing."""

    def __init__(self, engine: Engine, store: Store) -> None:
        self._engine = engine
        self._store = store

    @classmethod
    async def open(cls, url: str, day_limit: int) -> RatewardenContender:
        store = await _ratewarden_store(url)
        policy = parse_policy(_policy_yaml(day_limit).encode(), "bench/peers.py")
        return cls(Engine(policy, store), store)

    async def check(self, user: str, tool: str) -> bool:
        call = Call(user=user, tool=tool, call_id=daemon_call_id(), named=False)  # as the daemon
        decision = await self._engine.check(call)
        if decision.degraded:  # the store failed and the fail mode decided: not a result
            raise RuntimeError(f"ratewarden could not reach Redis: {decision}")
        return decision.allowed

    async def used(self, user: str, tool: str) -> tuple[int, int]:
        found = {u.rule: u.used for u in await self._engine.usage(user, tool)}
        return int(found["user-minute"]), int(found["tool-hour"])

    async def close(self) -> None:
        await self._store.close()


async def _ratewarden_store(url: str) -> Store:
    """The daemon's own store for `url`, started."""
    store = store_from_url(url, timeout_ms=STORE_TIMEOUT_MS)
    await store.start()
    return store


class LimitsContender:
    """Three `MovingWindowRateLimiter.hit()` calls, stopping at the first refusal."""

    def __init__(self, storage: RedisStorage, day_limit: int) -> None:
        self._storage = storage
        self._limiter = MovingWindowRateLimiter(storage)
        self._user_minute: RateLimitItem = RateLimitItemPerMinute(USER_MINUTE)
        self._tool_hour: RateLimitItem = RateLimitItemPerHour(TOOL_HOUR)
        self._user_tool_day: RateLimitItem = RateLimitItemPerDay(day_limit)

    @classmethod
    def opener(cls, implementation: Literal["redispy", "coredis"]) -> Opener:
        async def open_limits(url: str, day_limit: int) -> Contender:
            return cls(RedisStorage(f"async+{url}", implementation=implementation), day_limit)

        return open_limits

    async def check(self, user: str, tool: str) -> bool:
        hit: Callable[..., Awaitable[bool]] = self._limiter.hit  # limits: untyped here
        return (
            await hit(self._user_minute, "user-minute", user)
            and await hit(self._tool_hour, "tool-hour", tool)
            and await hit(self._user_tool_day, "user-tool-day", user, tool)
        )

    async def used(self, user: str, tool: str) -> tuple[int, int]:
        minute = await self._limiter.get_window_stats(self._user_minute, "user-minute", user)
        hour = await self._limiter.get_window_stats(self._tool_hour, "tool-hour", tool)
        return USER_MINUTE - minute.remaining, TOOL_HOUR - hour.remaining

    async def close(self) -> None:
        # limits has no close(): disconnect the client its bridge built from the URL.
        client = self._storage.bridge.get_connection()
        if isinstance(client, aioredis.Redis):
            await client.aclose()
        else:  # coredis: its pool disconnects synchronously
            client.connection_pool.disconnect()


class ThrottledContender:
    """Three `Throttled(using=sliding_window)` limiters, each `limit()`-ed in turn."""

    def __init__(self, store: ThrottledRedisStore, day_limit: int) -> None:
        self._store = store
        using = RateLimiterType.SLIDING_WINDOW.value
        self._user_minute = Throttled(using=using, quota=per_min(USER_MINUTE), store=store)
        self._tool_hour = Throttled(using=using, quota=per_hour(TOOL_HOUR), store=store)
        self._user_tool_day = Throttled(using=using, quota=per_day(day_limit), store=store)

    @classmethod
    async def open(cls, url: str, day_limit: int) -> ThrottledContender:
        return cls(ThrottledRedisStore(server=url), day_limit)

    async def check(self, user: str, tool: str) -> bool:
        if (await self._user_minute.limit(f"user-minute:{user}")).limited:
            return False
        if (await self._tool_hour.limit(f"tool-hour:{tool}")).limited:
            return False
        return not (await self._user_tool_day.limit(f"user-tool-day:{user}:{tool}")).limited

    async def used(self, user: str, tool: str) -> tuple[int, int]:
        minute = await self._user_minute.peek(f"user-minute:{user}")
        hour = await self._tool_hour.peek(f"tool-hour:{tool}")
        return minute.limit - minute.remaining, hour.limit - hour.remaining

    async def close(self) -> None:
        # throttled has no close(): its backend holds the redis-py client it built lazily.
        client = cast(aioredis.Redis, self._store._backend.get_client())
        await client.aclose(close_connection_pool=True)


@dataclass(frozen=True, slots=True)
class Entrant:
    name: str
    opener: Opener
    client: str
    algorithm: str


def _entrants() -> list[Entrant]:
    return [
        Entrant(
            "ratewarden",
            RatewardenContender.open,
            "redis-py",
            "sliding_window (exact), 3 rules in one EVALSHA",
        ),
        Entrant(
            "limits",
            LimitsContender.opener("redispy"),
            "redis-py (implementation='redispy')",
            "moving window (exact), 3 hit() calls",
        ),
        Entrant(
            "limits_coredis",
            LimitsContender.opener("coredis"),
            "coredis (limits' default)",
            "moving window (exact), 3 hit() calls",
        ),
        Entrant(
            "throttled",
            ThrottledContender.open,
            "redis-py",
            "sliding_window (approximate), 3 limit() calls",
        ),
    ]


@dataclass(frozen=True, slots=True)
class Counters:
    """Server-wide counters: commands executed (INFO excluded), socket reads, CPU seconds."""

    commands: int
    reads: int
    cpu: float


def _counters(admin: redis.Redis) -> Counters:
    info: dict[str, Any] = admin.info("stats", "commandstats", "cpu")
    commands = sum(
        int(stats["calls"])
        for name, stats in info.items()
        if name.startswith("cmdstat_") and name != "cmdstat_info"
    )
    cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return Counters(commands, int(info["total_reads_processed"]), cpu)


def _reads_baseline(admin: redis.Redis) -> int:
    """The reads one INFO snapshot adds to the delta between two snapshots."""
    first = _counters(admin)
    return _counters(admin).reads - first.reads


async def _drive(
    contender: Contender, count: int, concurrency: int, start: int = 0
) -> tuple[float, int]:
    """`count` checks from `concurrency` tasks; the wall time and how many were refused.

    Check i is made for user `(start + i) % USERS`, so consecutive batches keep cycling.
    """
    issued = 0
    refused = 0

    async def worker() -> None:
        nonlocal issued, refused
        while issued < count:
            index = start + issued
            issued += 1
            if not await contender.check(f"user-{index % USERS}", TOOL):
                refused += 1

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - began, refused


async def _monitor(url: str, action: Callable[[], Awaitable[object]]) -> list[str]:
    """The commands Redis ran while `action` ran, as MONITOR reports them.

    Commands run by a Lua script come out as `lua:NAME`, client commands as `NAME`.
    """
    marker = f"bench-peers-{uuid.uuid4().hex}"
    watcher = redis.Redis.from_url(url)
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    failed: list[BaseException] = []

    def watch() -> None:
        try:
            with watcher.monitor() as monitor:  # type: ignore[no-untyped-call]
                ready.set()
                for entry in monitor.listen():
                    if entry["command"] == f"ECHO {marker}":
                        return
                    seen.append(entry)
        except BaseException as exc:  # reported to the caller, not lost in the thread
            failed.append(exc)
            ready.set()

    closer = redis.Redis.from_url(url)
    closer.ping()  # connect (and SELECT the database) now, not inside the trace
    thread = threading.Thread(target=watch, name="bench-peers-monitor", daemon=True)
    thread.start()
    try:
        await asyncio.to_thread(ready.wait, 10.0)
        if failed:
            raise RuntimeError(f"MONITOR failed: {failed[0]}")
        try:
            await action()
        finally:
            closer.echo(marker)
            await asyncio.to_thread(thread.join, 10.0)
    finally:
        closer.close()
        watcher.close()
    return [
        ("lua:" if entry["client_type"] == "lua" else "") + entry["command"].split(" ", 1)[0]
        for entry in seen
    ]


async def _deny_experiment(contender: Contender) -> dict[str, Any]:
    """Pass DENY_DAY calls, then one the user+tool/day rule alone refuses; what did it use?"""
    user = "deny-user"
    if time.time() % 60 > 55:  # keep the experiment inside one clock minute
        await asyncio.sleep(60.5 - time.time() % 60)
    for _ in range(DENY_DAY):
        if not await contender.check(user, TOOL):
            raise RuntimeError("a call under every limit was refused")
    minute_before, hour_before = await contender.used(user, TOOL)
    allowed = await contender.check(user, TOOL)
    minute_after, hour_after = await contender.used(user, TOOL)
    if allowed:
        raise RuntimeError(f"the call past the {DENY_DAY}/day limit was allowed")
    return {
        "refused_by": "user-tool-day",
        "user_minute_consumed": minute_after - minute_before,
        "tool_hour_consumed": hour_after - hour_before,
    }


def _with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{db}"))


def _base_db(url: str) -> int:
    refuse_shared(url)
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError(f"expected a redis:// or rediss:// URL, got {url!r}")
    path = parts.path.strip("/")
    return int(path) if path else 0


@dataclass(slots=True)
class Tally:
    """One contender's measured checks, summed over the rounds."""

    checks: int = 0
    seconds: float = 0.0
    refused: int = 0
    commands: int = 0
    reads: int = 0
    redis_cpu: float = 0.0
    client_cpu: float = 0.0
    by_round: list[float] = field(default_factory=list)  # checks/s in each round


def _flush(url: str) -> None:
    with redis.Redis.from_url(url) as client:
        client.flushdb()


def _rounds(checks: int, rounds: int) -> list[int]:
    """`checks` split into `rounds` near-equal batches (fewer if there are fewer checks)."""
    count = min(rounds, checks)
    return [checks // count + (1 if i < checks % count else 0) for i in range(count)]


async def _throughput(
    opened: dict[str, Contender],
    admin: redis.Redis,
    batches: Sequence[int],
    concurrency: int,
    warmup: int,
    baseline: int,
) -> dict[str, Tally]:
    """Interleave the contenders, batch by batch, rotating who goes first each round."""
    names = list(opened)
    tallies = {name: Tally() for name in names}
    for number, size in enumerate(batches):
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            tally = tallies[name]
            before, cpu_before = _counters(admin), time.process_time()
            seconds, refused = await _drive(
                opened[name], size, concurrency, start=warmup + tally.checks
            )
            after, cpu_after = _counters(admin), time.process_time()
            tally.checks += size
            tally.seconds += seconds
            tally.refused += refused
            tally.commands += after.commands - before.commands
            tally.reads += after.reads - before.reads - baseline
            tally.redis_cpu += after.cpu - before.cpu
            tally.client_cpu += cpu_after - cpu_before
            tally.by_round.append(round(size / seconds, 1))
    for name, tally in tallies.items():
        if tally.refused:
            raise RuntimeError(f"{name} refused {tally.refused} checks under every limit")
    return tallies


async def _single_check(
    contender: Contender, url: str, admin: redis.Redis, baseline: int
) -> dict[str, Any]:
    """One check between two INFO snapshots, and another one under MONITOR."""
    before = _counters(admin)
    await contender.check("user-0", TOOL)
    after = _counters(admin)
    trace = await _monitor(url, lambda: contender.check("user-1", TOOL))
    return {
        "commands": after.commands - before.commands,
        "reads": after.reads - before.reads - baseline,
        "trace": trace,
    }


async def _consumes_on_deny(entrant: Entrant, url: str) -> dict[str, Any]:
    _flush(url)
    contender = await entrant.opener(url, DENY_DAY)
    try:
        return await _deny_experiment(contender)
    finally:
        await contender.close()
        _flush(url)


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


async def run_peers(
    redis_url: str, *, checks: int, concurrency: int = 32, rounds: int = 5
) -> dict[str, Any]:
    """Measure ratewarden, limits and throttled-py on `redis_url`; a JSON-ready dict.

    The `checks` of each contender are split into `rounds` batches, interleaved with the
    other contenders' batches, so a noisy neighbour on the host slows all of them alike.
    """
    if not 1 <= checks <= MAX_CHECKS:
        raise ValueError(f"checks must be 1..{MAX_CHECKS} (the tool/hour limit is {TOOL_HOUR})")
    if concurrency < 1 or rounds < 1:
        raise ValueError("concurrency and rounds must be at least 1")
    base = _base_db(redis_url)
    warmup = min(MAX_WARMUP, max(4 * concurrency, checks // 10))
    entrants = _entrants()
    urls = {e.name: _with_db(redis_url, base + offset) for offset, e in enumerate(entrants)}
    opened: dict[str, Contender] = {}
    singles: dict[str, dict[str, Any]] = {}
    with redis.Redis.from_url(redis_url) as admin:
        server = admin.info("server")
        baseline = _reads_baseline(admin)
        try:
            for entrant in entrants:
                _flush(urls[entrant.name])
                opened[entrant.name] = await entrant.opener(urls[entrant.name], USER_TOOL_DAY)
            for contender in opened.values():  # opens the pooled connections, loads scripts
                await _drive(contender, warmup, concurrency)
            tallies = await _throughput(
                opened, admin, _rounds(checks, rounds), concurrency, warmup, baseline
            )
            for name, contender in opened.items():
                singles[name] = await _single_check(contender, urls[name], admin, baseline)
        finally:
            for contender in opened.values():
                await contender.close()
    results: dict[str, Any] = {}
    for entrant in entrants:
        name, tally = entrant.name, tallies[entrant.name]
        deny = await _consumes_on_deny(entrant, urls[name])
        results[name] = {
            "client": entrant.client,
            "algorithm": entrant.algorithm,
            "db": base + entrants.index(entrant),
            "seconds": round(tally.seconds, 4),
            "checks_per_s": round(tally.checks / tally.seconds, 1),
            "checks_per_s_by_round": tally.by_round,
            "commands_per_check": round(tally.commands / tally.checks, 3),
            "round_trips_per_check": sum(
                1 for command in singles[name]["trace"] if not command.startswith("lua:")
            ),
            "server_reads_per_check": round(tally.reads / tally.checks, 3),
            "redis_cpu_us_per_check": round(tally.redis_cpu / tally.checks * 1e6, 1),
            "client_cpu_us_per_check": round(tally.client_cpu / tally.checks * 1e6, 1),
            "single_check": singles[name],
            "consumes_on_deny": deny["user_minute_consumed"] > 0,
            "deny_experiment": deny,
        }
    results["ratewarden"]["store"] = "store_from_url"
    rate = {name: results[name]["checks_per_s"] for name in urls}
    return {
        **results,
        "ratio_vs_limits": round(rate["ratewarden"] / rate["limits"], 2),
        "ratio_vs_limits_coredis": round(rate["ratewarden"] / rate["limits_coredis"], 2),
        "ratio_vs_throttled": round(rate["ratewarden"] / rate["throttled"], 2),
        "settings": {
            "checks": checks,
            "concurrency": concurrency,
            "rounds": len(_rounds(checks, rounds)),
            "warmup": warmup,
            "users": USERS,
            "tool": TOOL,
            "rules": {
                "user-minute": f"{USER_MINUTE}/minute per user",
                "tool-hour": f"{TOOL_HOUR}/hour per tool",
                "user-tool-day": f"{USER_TOOL_DAY}/day per user+tool",
            },
            "deny_experiment_day_limit": DENY_DAY,
            "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
            "hiredis": bool(HIREDIS_AVAILABLE),
            "redis_server": server.get("redis_version"),
        },
        "versions": {
            name: _version(name)
            for name in ("ratewarden", "limits", "throttled-py", "redis", "coredis", "hiredis")
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers", description=__doc__.split("\n", 1)[0] if __doc__ else None
    )
    parser.add_argument("--redis-url", required=True, help="a private redis-server: redis://H:P/DB")
    parser.add_argument("--checks", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved batches per library")
    args = parser.parse_args(argv)
    result = uvloop.run(
        run_peers(
            args.redis_url, checks=args.checks, concurrency=args.concurrency, rounds=args.rounds
        )
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
