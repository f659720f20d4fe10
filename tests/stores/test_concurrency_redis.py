"""Exactness under real concurrency: several processes, one real redis-server.

Four spawned processes each build their own Engine and RedisStore (no injected clock:
time is Redis `TIME`, as in production), wait on a shared barrier, then fire 400 checks
at once with `asyncio.gather` over their own connection. However the 1 600 checks
interleave, exactly the limit is allowed, and a refused call consumes nothing.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections import Counter
from typing import Any

import pytest

from ratewarden.calls import Call
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.store import store_from_url
from tests.helpers.races import race
from tests.helpers.redis_server import RedisServer

pytestmark = pytest.mark.redis

PROCESSES = 4
CHECKS_PER_PROCESS = 400  # enough that every process is still deciding when the last starts
LIMIT = 50


async def _checks(
    url: str, policy_text: str, barrier: Any, worker: int
) -> tuple[float, float, list[str]]:
    store = store_from_url(url, timeout_ms=20_000)
    try:
        engine = Engine(parse_policy(policy_text.encode()), store)
        await store.start()  # connect and load the script before the race starts
        barrier.wait(timeout=60)
        started = time.time()
        decisions = await asyncio.gather(
            *(
                engine.check(Call(user="alice", tool="terminal", call_id=f"w{worker}-{i}"))
                for i in range(CHECKS_PER_PROCESS)
            )
        )
        finished = time.time()
    finally:
        await store.close()
    # A degraded answer would mean the store failed and fail-open allowed the call.
    return (
        started,
        finished,
        [f"{d.decision}{' degraded' if d.degraded else ''}" for d in decisions],
    )


def _worker(url: str, policy_text: str, barrier: Any, results: Any, worker: int) -> None:
    try:
        results.put((worker, asyncio.run(_checks(url, policy_text, barrier, worker))))
    except BaseException:
        results.put((worker, traceback.format_exc()))


def run_race(url: str, policy_text: str) -> Counter[str]:
    """Start the processes together and return how many checks got each decision."""
    outcomes, exit_codes = race(_worker, (url, policy_text), PROCESSES)
    counts: Counter[str] = Counter()
    spans = []
    for worker, outcome in outcomes:
        assert isinstance(outcome, tuple), f"worker {worker} failed:\n{outcome}"
        started, finished, decisions = outcome
        assert len(decisions) == CHECKS_PER_PROCESS
        counts.update(decisions)
        spans.append((started, finished))
    assert all(code == 0 for code in exit_codes)
    # The barrier worked: every process was still deciding when the last one started.
    assert max(start for start, _ in spans) < min(end for _, end in spans), spans
    return counts


def fixed_window_rate(server: RedisServer, limit: int) -> str:
    """A clock-aligned window whose current period has more than 2 minutes left."""
    client = server.client()
    seconds, micros = client.time()
    client.close()
    now_ms = seconds * 1000 + micros // 1000
    for text, window_ms in ((f"{limit}/day", 86_400_000), (f"{limit}/23 hours", 82_800_000)):
        if window_ms - now_ms % window_ms > 120_000:
            return text
    raise AssertionError("unreachable: day and 23-hour boundaries are hours apart")


def single_rule_policy(algorithm: str, server: RedisServer) -> str:
    if algorithm == "sliding_window":
        rule = f"rate: {LIMIT}/hour"
    elif algorithm == "token_bucket":
        # Emission interval 72 s: no token comes back while the test runs.
        rule = f"rate: {LIMIT}/hour, algorithm: token_bucket, burst: {LIMIT}"
    else:
        rule = f"rate: {fixed_window_rate(server, LIMIT)}, algorithm: fixed_window"
    return f"version: 1\nrules:\n  - {{name: tight, {rule}}}\n"


@pytest.mark.parametrize("algorithm", ["sliding_window", "token_bucket", "fixed_window"])
def test_exactly_the_limit_is_allowed_under_concurrency(
    redis_server: RedisServer, redis_url: str, algorithm: str
) -> None:
    counts = run_race(redis_url, single_rule_policy(algorithm, redis_server))
    assert counts == {"allow": LIMIT, "deny": PROCESSES * CHECKS_PER_PROCESS - LIMIT}


def test_refused_calls_consume_nothing_under_concurrency(
    redis_server: RedisServer, redis_url: str
) -> None:
    """Three rules per call; the tight one sits in the middle. The loose counters must
    end at exactly the number of allowed calls: no refused call left a mark."""
    policy = (
        "version: 1\nrules:\n"
        "  - {name: loose-sw, per: [user], rate: 1000/hour}\n"
        f"  - {{name: tight, per: [user, tool], rate: {LIMIT}/hour,"
        f" algorithm: token_bucket, burst: {LIMIT}}}\n"
        f"  - {{name: loose-fw, per: [user], rate: {fixed_window_rate(redis_server, 1000)},"
        " algorithm: fixed_window}\n"
    )
    counts = run_race(redis_url, policy)
    assert counts == {"allow": LIMIT, "deny": PROCESSES * CHECKS_PER_PROCESS - LIMIT}

    async def usage() -> dict[str, tuple[float, float | None]]:
        store = store_from_url(redis_url, timeout_ms=5_000)
        try:
            engine = Engine(parse_policy(policy.encode()), store)
            return {u.rule: (u.used, u.remaining) for u in await engine.usage("alice", "terminal")}
        finally:
            await store.close()

    assert asyncio.run(usage()) == {
        "loose-sw": (LIMIT, 1000 - LIMIT),
        "tight": (LIMIT, 0),
        "loose-fw": (LIMIT, 1000 - LIMIT),
    }
