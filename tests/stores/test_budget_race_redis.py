"""Budgets under real concurrency, on a real redis-server whose `TIME` is the only clock.

Four spawned processes, each with its own Engine (system clock, which only picks the
budget period) and RedisStore (no injected clock), wait on a barrier and then fire 50
checks each, 5 at a time with `asyncio.gather`. The budget fits exactly 50 reservations: exactly 50
are allowed, and a separate connection sampling the budget hash in a tight loop during
the race never sees spent + reserved above the budget.

The same harness races 200 checks and 200 settles of ONE call_id: it is reserved once
and charged once. Last, an unsettled reservation with a 1 s TTL is charged at its
estimate by Redis time alone (bounded polling).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import traceback
from collections import Counter
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis

from ratewarden.calls import Call
from ratewarden.engine import CallIdConflict, Engine
from ratewarden.policy import parse_policy
from ratewarden.policy.periods import bounds
from ratewarden.store import store_from_url
from ratewarden.store.keys import record_key
from tests.helpers.races import race
from tests.helpers.redis_server import RedisServer

pytestmark = pytest.mark.redis

PROCESSES = 4
CALLS_PER_PROCESS = 50
WAVE = 5  # concurrent checks per process at a time
PAUSE_S = 0.01  # between one process's waves (see _race)
COST_MICROS = 100_000  # 0.10
FITS = 50
BUDGET_MICROS = FITS * COST_MICROS  # 5.00
BUDGET_KEY = "rw:{spend|user=alice}:bg"


def redis_now_ms(server: RedisServer) -> int:
    client = server.client()
    seconds, micros = client.time()
    client.close()
    return int(seconds * 1000 + micros // 1000)


def race_policy(server: RedisServer, extra: str = "") -> str:
    """A 5.00/day budget in a timezone whose day has more than 2 minutes left."""
    now = redis_now_ms(server)
    for zone in ("UTC", "Asia/Tokyo"):  # 9 hours apart: one of them is far from midnight
        if bounds("day", ZoneInfo(zone), now).end - now > 120_000:
            return (
                f"version: 1\ndefaults: {{timezone: {zone}{extra}}}\n"
                "rules:\n  - {name: spend, per: [user], budget: 5.00/day}\n"
            )
    raise AssertionError("unreachable: two midnights 9 hours apart")


async def _race(
    url: str, policy_text: str, barrier: Any, worker: int, mode: str
) -> tuple[float, float, list[str]]:
    store = store_from_url(url, timeout_ms=20_000)
    try:
        engine = Engine(parse_policy(policy_text.encode()), store)
        await store.start()  # connect and load the script before the race starts
        barrier.wait(timeout=60)
        started = time.time()
        if mode == "settle":
            settled = await asyncio.gather(
                *(engine.settle("one", 0.04) for _ in range(CALLS_PER_PROCESS))
            )
            outcomes = [f"{s.outcome} {s.charged}" for s in settled]
        elif mode == "check-and-settle":
            outcomes = []
            for _ in range(0, CALLS_PER_PROCESS, WAVE):
                outcomes += await asyncio.gather(
                    *(_check_once(engine) for _ in range(WAVE)),
                    *(_settle_once(engine) for _ in range(WAVE)),
                )
        else:
            # In waves: the store coalesces concurrent checks into one pipeline, which
            # Redis runs without interleaving another client; waves of a few keep the
            # four processes' pipelines interleaved, so the sampler sees the race. The
            # pause between waves leaves a core to the sampler: on two cores, four busy
            # workers and Redis can otherwise starve it for the whole (short) race.
            decisions = []
            for wave in range(0, CALLS_PER_PROCESS, WAVE):
                if wave:
                    await asyncio.sleep(PAUSE_S)
                decisions += await asyncio.gather(
                    *(
                        engine.check(
                            Call(
                                user="alice",
                                tool="terminal",
                                call_id="one" if mode == "same-id" else f"w{worker}-{i}",
                                cost=COST_MICROS / 1_000_000,
                            )
                        )
                        for i in range(wave, wave + WAVE)
                    )
                )
            outcomes = [
                d.decision
                + (" degraded" if d.degraded else "")
                + (" replayed" if d.replayed else "")
                for d in decisions
            ]
        finished = time.time()
    finally:
        await store.close()
    return started, finished, outcomes


def _worker(url: str, policy_text: str, barrier: Any, results: Any, worker: int, mode: str) -> None:
    try:
        results.put((worker, asyncio.run(_race(url, policy_text, barrier, worker, mode))))
    except BaseException:
        results.put((worker, traceback.format_exc()))


def run_race(
    url: str, policy_text: str, mode: str, per_call: int = 1
) -> tuple[Counter[str], float, float]:
    """Start the processes together; return the outcome counts and the race's span."""
    outcomes, exit_codes = race(_worker, (url, policy_text), PROCESSES, mode)
    counts: Counter[str] = Counter()
    spans = []
    for worker, outcome in outcomes:
        assert isinstance(outcome, tuple), f"worker {worker} failed:\n{outcome}"
        started, finished, decided = outcome
        assert len(decided) == per_call * CALLS_PER_PROCESS
        counts.update(decided)
        spans.append((started, finished))
    assert all(code == 0 for code in exit_codes)
    # The barrier worked: every process was still deciding when the last one started.
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans
    return counts, min(s for s, _ in spans), max(e for _, e in spans)


async def _check_once(engine: Engine) -> str:
    call = Call(user="alice", tool="terminal", call_id="one", cost=COST_MICROS / 1_000_000)
    try:
        found = await engine.check(call)
    except CallIdConflict as exc:
        return "409 settled" if "already settled" in str(exc) else "409 other"
    return found.decision + (" replayed" if found.replayed else "")


async def _settle_once(engine: Engine) -> str:
    return (await engine.settle("one", 0.04)).outcome


def _sample(port: int, stop: Any, ready: Any, samples: Any) -> None:
    """HMGET s r of the budget hash from its own connection, as fast as it can, until
    `stop`; then put the (time, spent, reserved) samples on `samples`."""
    client = redis.Redis(port=port)
    found: list[tuple[float, int, int]] = []
    ready.set()
    while not stop.is_set():
        spent, reserved = client.hmget(BUDGET_KEY, ["s", "r"])
        found.append((time.time(), int(spent or 0), int(reserved or 0)))
    client.close()
    samples.put(found)


class Sampler:
    """The sampler in a process of its own: as a thread of the test process it could go
    a whole (short) race without the interpreter lock, in a large test session."""

    def __init__(self, server: RedisServer) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.stop, self.ready, self.queue = ctx.Event(), ctx.Event(), ctx.Queue()
        self.process = ctx.Process(
            target=_sample, args=(server.port, self.stop, self.ready, self.queue)
        )

    def start(self) -> None:
        self.process.start()
        assert self.ready.wait(timeout=60), "the sampler did not start"

    def finish(self) -> list[tuple[float, int, int]]:
        self.stop.set()
        samples: list[tuple[float, int, int]] = self.queue.get(timeout=60)
        self.process.join(timeout=30)
        return samples


def test_concurrent_reservations_never_overspend(redis_server: RedisServer, redis_url: str) -> None:
    sampler = Sampler(redis_server)
    sampler.start()
    try:
        counts, started, finished = run_race(redis_url, race_policy(redis_server), "distinct")
    finally:
        samples = sampler.finish()
    assert counts == {"allow": FITS, "deny": PROCESSES * CALLS_PER_PROCESS - FITS}

    # At no sampled instant did spent + reserved exceed the budget...
    over = [(s, r) for _, s, r in samples if s + r > BUDGET_MICROS]
    assert over == []
    # ...and the sampler did watch the race itself, not just before and after it.
    during = [(s, r) for at, s, r in samples if started <= at <= finished]
    assert len(during) >= 10, (
        len(samples),
        len(during),
        samples[:1],
        samples[-1:],
        started,
        finished,
    )
    assert any(0 < r < BUDGET_MICROS for _, r in during), during[:5] + during[-5:]

    client = redis_server.client()
    budget: dict[bytes, bytes] = client.hgetall(BUDGET_KEY)  # type: ignore[assignment]
    assert (int(budget[b"s"]), int(budget[b"r"])) == (0, FITS * COST_MICROS)
    holds = {k: v for k, v in budget.items() if k.startswith(b"h:")}
    assert len(holds) == FITS
    assert {v.split(b":")[0] for v in holds.values()} == {str(COST_MICROS).encode()}
    # Exactly the allowed calls left a record; the refused ones left nothing.
    records: list[bytes] = sorted(client.scan_iter(match="rw:call:*"))
    assert records == sorted(record_key(k.decode()[2:]).encode() for k in holds)
    assert sorted(client.scan_iter(match="rw:*")) == sorted([BUDGET_KEY.encode(), *records])
    client.close()


def test_one_call_id_checked_and_settled_by_many_at_once_counts_once(
    redis_server: RedisServer, redis_url: str
) -> None:
    policy = race_policy(redis_server)
    counts, _, _ = run_race(redis_url, policy, "same-id")
    assert counts == {"allow": 1, "allow replayed": PROCESSES * CALLS_PER_PROCESS - 1}
    client = redis_server.client()
    assert client.hmget(BUDGET_KEY, ["s", "r"]) == [b"0", str(COST_MICROS).encode()]

    counts, _, _ = run_race(redis_url, policy, "settle")
    assert counts == {
        "settled {'spend': 0.04}": 1,
        "already_settled {}": PROCESSES * CALLS_PER_PROCESS - 1,
    }
    assert client.hmget(BUDGET_KEY, ["s", "r"]) == [b"40000", b"0"]
    assert client.hget(record_key("one"), "s") == b"settled"
    client.close()


def test_hole3_a_settled_call_id_is_never_run_again_by_racing_processes(
    redis_server: RedisServer, redis_url: str
) -> None:
    """Four processes check and settle ONE call_id at once, over and over: it is admitted
    once, charged once, and once settled every later check of it is a 409 (issue 15)."""
    counts, _, _ = run_race(redis_url, race_policy(redis_server), "check-and-settle", 2)
    assert counts["allow"] == 1  # admitted once: never decided afresh after its settle
    assert counts["settled"] == 1
    assert counts["409 settled"] > 0  # the race did reach checks after the settle
    assert counts["409 other"] == counts["deny"] == 0
    assert sum(counts.values()) == 2 * PROCESSES * CALLS_PER_PROCESS
    client = redis_server.client()
    assert client.hmget(BUDGET_KEY, ["s", "r"]) == [b"40000", b"0"]  # one charge, no hold
    client.close()


async def test_an_unsettled_reservation_is_charged_on_redis_time(
    redis_server: RedisServer, redis_url: str
) -> None:
    """reservation_ttl 1 s, no injected clock: the charge happens by Redis TIME alone."""
    extra = ", reservation_ttl: 1s, lease_timeout: 1s, call_ttl: 1s"
    store = store_from_url(redis_url, timeout_ms=2_000)
    engine = Engine(parse_policy(race_policy(redis_server, extra).encode()), store)

    async def spend() -> tuple[float, float | None, float | None]:
        [usage] = await engine.usage("alice")
        return usage.used, usage.reserved, usage.remaining

    try:
        started = time.monotonic()
        reserved_at = datetime.now(UTC)
        assert (await engine.check(Call("alice", "t", "gone", cost=0.3))).allowed
        assert await spend() == (0.0, 0.3, 4.7)
        while (found := await spend()) != (0.3, 0.0, 4.7):
            assert found == (0.0, 0.3, 4.7), found
            assert time.monotonic() - started < 3.0, f"never charged (reserved {reserved_at})"
            await asyncio.sleep(0.02)  # bounded polling on real time
        assert time.monotonic() - started >= 0.95  # not before its TTL ran out
    finally:
        await store.close()
