"""Token rates, exact under real concurrency (issue 31, item 2).

Four spawned processes, each with its own RedisStore on Redis `TIME`, run the same
phases on one token-rate counter together (a shared barrier between phases), CALLS
calls each at once:

- `check`: the window is empty; every check is admitted and none adds anything.
- `settle`: every process settles its own calls and, at the same time, the calls of the
  next process (the same call, the same tokens): each call is settled exactly once, and
  the window's count is exactly the sum of every call's tokens. Checks run beside the
  settles, each answer consistent (admitted iff the tokens it saw are under the limit).
- `check` again: the window holds more than the limit; every check is refused and sees
  exactly the sum.

The window is 100 days long (clock-aligned), so the race does not straddle a turn over;
a run that does (once in 100 days) is skipped, not passed.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections import Counter
from typing import Any

import pytest

from ratewarden.limiter.ops import CallRecord, CounterOp, Hold, Kind, Role
from ratewarden.limiter.script import SettleStatus
from ratewarden.store import store_from_url
from ratewarden.store.keys import record_key
from tests.helpers.races import race
from tests.helpers.redis_server import RedisServer

pytestmark = pytest.mark.redis

PROCESSES = 4
CALLS = 50
LIMIT = 1_000
WINDOW_MS = 100 * 86_400_000
KEY = "rw:{race-tokens|user=alice}:tk"


def tokens_of(worker: int, i: int) -> int:
    return 10 + 7 * worker + i  # distinct per call: a lost or doubled settle shows


TOTAL = sum(tokens_of(w, i) for w in range(PROCESSES) for i in range(CALLS))


def call_id(worker: int, i: int) -> str:
    return f"race-w{worker}-{i}"


def op() -> CounterOp:
    return CounterOp(KEY, Kind.TOKENS, Role.ENFORCE, LIMIT, WINDOW_MS, rule="tokens")


async def _phases(url: str, barrier: Any, worker: int) -> list[list[str]]:
    store = store_from_url(url, timeout_ms=20_000)
    outcomes: list[list[str]] = []
    try:
        await store.start()
        gate = asyncio.Semaphore(24)  # in flight per process: within the client's pool

        async def check(i: int) -> str:
            cid = call_id(worker, i)
            record = CallRecord(record_key(cid), cid, f"fp-{cid}", 600_000, False)
            [found] = (await store.evaluate([op()], record)).results
            assert found.admitted == (found.used < LIMIT), found
            return f"{'allow' if found.admitted else 'deny'} {found.used}"

        async def settle(owner: int, i: int) -> str:
            cid = call_id(owner, i)
            async with gate:
                return await settle_one(cid, tokens_of(owner, i))

        async def settle_one(cid: str, tokens: int) -> str:
            recorded = await store.read_holds(record_key(cid))
            assert recorded is not None
            [hold] = recorded.holds
            filled = Hold(hold.kind, hold.key, tokens, hold.rule, (LIMIT, WINDOW_MS, 0))
            status, charged = await store.settle(
                record_key(cid), cid, None, [filled], recorded.fingerprint
            )
            assert charged == ([0] if status is SettleStatus.SETTLED else []), charged
            return status.name

        async def peek(i: int) -> str:  # a check beside the settles: consistent, whatever it saw
            async with gate:
                [found] = (await store.evaluate([op()], None, dry_run=True)).results
            assert found.admitted == (found.used < LIMIT), found
            assert found.remaining == max(0, LIMIT - found.used), found
            return "peek"

        barrier.wait(timeout=60)
        outcomes.append(list(await asyncio.gather(*(check(i) for i in range(CALLS)))))
        barrier.wait(timeout=60)
        nxt = (worker + 1) % PROCESSES
        mine = [settle(worker, i) for i in range(CALLS)]
        theirs = [settle(nxt, i) for i in range(CALLS)]
        peeks = [peek(i) for i in range(CALLS)]
        settled = await asyncio.gather(
            *(x for trio in zip(mine, theirs, peeks, strict=True) for x in trio)
        )
        outcomes.append([s for s in settled if s != "peek"])
        barrier.wait(timeout=60)
        outcomes.append(list(await asyncio.gather(*(check(i + CALLS) for i in range(CALLS)))))
    finally:
        await store.close()
    return outcomes


def _worker(url: str, barrier: Any, results: Any, worker: int) -> None:
    try:
        results.put((worker, asyncio.run(_phases(url, barrier, worker))))
    except BaseException:
        results.put((worker, traceback.format_exc()))


def window_start(redis_server: RedisServer) -> int:
    client = redis_server.client()
    seconds, micros = client.time()
    client.close()
    now = int(seconds) * 1000 + int(micros) // 1000
    return now - now % WINDOW_MS


def test_concurrent_settles_add_exactly_and_checks_refuse_past_the_limit(
    redis_server: RedisServer, redis_url: str
) -> None:
    before = window_start(redis_server)
    started = time.monotonic()
    outcomes, exit_codes = race(_worker, (redis_url,), PROCESSES)
    if window_start(redis_server) != before:
        pytest.skip("the 100-day window turned over during the race")
    counts = [Counter[str]() for _ in range(3)]
    for worker, outcome in outcomes:
        assert isinstance(outcome, list), f"worker {worker} failed:\n{outcome}"
        for phase, answers in enumerate(outcome):
            counts[phase].update(answers)
    assert all(code == 0 for code in exit_codes)
    checked, settled, after = counts
    assert checked == {"allow 0": PROCESSES * CALLS}  # checks take nothing, even at once
    # Each call settled once (by its owner or its neighbour), the other attempt refused.
    assert settled == {"SETTLED": PROCESSES * CALLS, "ALREADY_SETTLED": PROCESSES * CALLS}
    assert after == {f"deny {TOTAL}": PROCESSES * CALLS}
    client = redis_server.client()
    stored = client.get(KEY)
    ttl = client.pttl(KEY)
    client.close()
    assert stored == f"{before}:{TOTAL}".encode()
    assert 0 < ttl <= before + WINDOW_MS - int(time.time() * 1000) + 1_000
    assert time.monotonic() - started < 90
