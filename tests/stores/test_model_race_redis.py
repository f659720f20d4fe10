"""Model calls and tool calls racing for one budget, on a real redis-server (issue 31:
"exact under concurrency like every counter").

Four spawned processes, each with its own Engine and RedisStore, wait on a barrier and
fire model calls (each reserving its most, 0.01) and tool calls (0.01 each) against one
`kind: any` budget of 1.00, in waves; every allowed model call is settled at once with a
usage worth half its reservation. A separate process samples the budget hash all along:
spent + reserved never passes the budget, and at the end what is spent is exactly what
the settled usage cost (priced by genai-prices' own `calc_price`), what is reserved
exactly what the allowed tool calls hold.
"""

from __future__ import annotations

import asyncio
import math
import time
import traceback
from collections import Counter
from decimal import Decimal
from typing import Any

import pytest
from genai_prices import Usage, calc_price

from ratewarden.calls import Call
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.store import store_from_url
from ratewarden.vocabulary import CallKind
from ratewarden.wire.bodies import ModelUsage
from tests.helpers.races import race
from tests.helpers.redis_server import RedisServer
from tests.stores.test_budget_race_redis import BUDGET_KEY, Sampler, race_policy

pytestmark = pytest.mark.redis

PROCESSES = 4
WAVES = 8
WAVE = 4  # model calls and as many tool calls per wave, per process
BUDGET_MICROS = 1_000_000
RESERVED = 10_000  # gpt-4o: 1 000 output tokens at 10 USD per million, no input
USED = {"input_tokens": 0, "output_tokens": 500}  # half of it


def model_policy(server: RedisServer) -> str:
    """race_policy's day (far from midnight), one budget over tools and models."""
    return race_policy(server).replace(
        "budget: 5.00/day}", "match: {kind: any}, budget: 1.00/day}"
    ) + ("tools:\n  terminal: {cost: 0.01}\n")


async def _model_call(engine: Engine, worker: int, i: int) -> str:
    call = Call("alice", "gpt-4o", f"m{worker}-{i}", kind=CallKind.MODEL, max_output_tokens=1000)
    decided = await engine.check(call)
    if not decided.allowed:
        return "model deny"
    settled = await engine.settle(call.call_id, usage=ModelUsage(**USED))
    return f"model {settled.outcome}"


async def _tool_call(engine: Engine, worker: int, i: int) -> str:
    decided = await engine.check(Call("alice", "terminal", f"t{worker}-{i}"))
    return f"tool {decided.decision}"


async def _race(
    url: str, policy_text: str, barrier: Any, worker: int
) -> tuple[float, float, list[str]]:
    store = store_from_url(url, timeout_ms=20_000)
    try:
        engine = Engine(parse_policy(policy_text.encode()), store)
        await store.start()
        barrier.wait(timeout=60)
        started, outcomes = time.time(), []
        for wave in range(WAVES):
            await asyncio.sleep(0.01)  # a core left to the sampler (test_budget_race_redis)
            calls = range(wave * WAVE, (wave + 1) * WAVE)
            outcomes += await asyncio.gather(
                *(_model_call(engine, worker, i) for i in calls),
                *(_tool_call(engine, worker, i) for i in calls),
            )
        return started, time.time(), outcomes
    finally:
        await store.close()


def _worker(url: str, policy_text: str, barrier: Any, results: Any, worker: int) -> None:
    try:
        results.put((worker, asyncio.run(_race(url, policy_text, barrier, worker))))
    except BaseException:
        results.put((worker, traceback.format_exc()))


def test_model_and_tool_calls_share_a_budget_without_overspend(
    redis_server: RedisServer, redis_url: str
) -> None:
    sampler = Sampler(redis_server)
    sampler.start()
    try:
        outcomes, exit_codes = race(_worker, (redis_url, model_policy(redis_server)), PROCESSES)
    finally:
        samples = sampler.finish()
    assert all(code == 0 for code in exit_codes)
    counts: Counter[str] = Counter()
    for worker, outcome in outcomes:
        assert isinstance(outcome, tuple), f"worker {worker} failed:\n{outcome}"
        counts.update(outcome[2])
    assert sum(counts.values()) == PROCESSES * WAVES * WAVE * 2
    assert counts["model deny"] + counts["tool deny"] > 0  # the budget did run out
    assert counts["model settled"] > 0
    assert counts["tool allow"] > 0

    over = [(s, r) for _, s, r in samples if s + r > BUDGET_MICROS]
    assert over == []
    assert len(samples) >= 10

    price = math.ceil(calc_price(Usage(**USED), "gpt-4o").total_price * Decimal(1_000_000))
    assert price == RESERVED // 2
    client = redis_server.client()
    spent, reserved = client.hmget(BUDGET_KEY, ["s", "r"])
    client.close()
    assert int(spent or 0) == counts["model settled"] * price  # exact, every settle once
    assert int(reserved or 0) == counts["tool allow"] * RESERVED  # no model call still held
    assert int(spent or 0) + int(reserved or 0) <= BUDGET_MICROS
