"""Loop rules keyed on results, exact under real concurrency (issue 29).

Four spawned processes, each with its own Engine and RedisStore on Redis `TIME`, run the
same phases together (a shared barrier between phases), 60 calls each at once:

- `poll`: check, and settle each allowed call with the same result: no settle restarts
  the count, so exactly the limit is allowed in total.
- `check` then `settle` with a new result: every settle brings the same new result, so
  the first to land restarts the count (this call its first unit) and the others find
  it kept: after the race the counter holds exactly one call, and a `poll` with that
  result allows exactly limit - 1 more.
- `check` then `settle:*`: every settle brings a result of its own, so each restarts
  the count in turn; the last to land leaves exactly one call counted, whatever the
  order, and a `check` allows exactly limit - 1 more.
"""

from __future__ import annotations

import asyncio
import traceback
from collections import Counter
from typing import Any

import pytest

from ratewarden.arguments import result_digest
from ratewarden.calls import Call
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.store import store_from_url
from tests.helpers.races import race
from tests.helpers.redis_server import RedisServer

pytestmark = pytest.mark.redis

PROCESSES = 4
CALLS = 60
LIMIT = 20


def loop_policy(algorithm: str) -> str:
    burst = f", burst: {LIMIT}" if algorithm == "token_bucket" else ""
    return (
        "version: 1\nrules:\n"
        f"  - {{name: loop, per: [user, tool, args], rate: {LIMIT}/hour,"
        f" algorithm: {algorithm}{burst}, same_result: true}}\n"
    )


def ci_call(worker: int, phase: int, i: int) -> Call:
    return Call("alice", "ci_status", f"w{worker}-p{phase}-{i}", args={"run": 7})


async def _phases(
    url: str, policy_text: str, barrier: Any, worker: int, phases: list[str]
) -> list[list[str]]:
    store = store_from_url(url, timeout_ms=20_000)
    outcomes: list[list[str]] = []
    try:
        engine = Engine(parse_policy(policy_text.encode()), store)
        await store.start()
        allowed: list[str] = []
        for n, phase in enumerate(phases):
            what, _, answer = phase.partition(":")
            digest = result_digest({"status": answer}) if answer else None
            own = answer == "*"  # each settle its own result
            barrier.wait(timeout=60)

            async def one(
                i: int, what: str = what, n: int = n, digest: str | None = digest, own: bool = own
            ) -> str:
                if what == "settle":
                    if own:
                        digest = result_digest({"status": f"w{worker}-{i}"})
                    return (await engine.settle(allowed[i], result_digest=digest)).outcome
                call = ci_call(worker, n, i)
                decided = await engine.check(call)
                said = f"{decided.decision}{' degraded' if decided.degraded else ''}"
                if decided.allowed and what == "check":
                    allowed.append(call.call_id)
                if decided.allowed and what == "poll":
                    await engine.settle(call.call_id, result_digest=digest)
                return said

            count = len(allowed) if what == "settle" else CALLS
            outcomes.append(list(await asyncio.gather(*(one(i) for i in range(count)))))
    finally:
        await store.close()
    return outcomes


def _worker(
    url: str, policy_text: str, phases: list[str], barrier: Any, results: Any, worker: int
) -> None:
    try:
        results.put((worker, asyncio.run(_phases(url, policy_text, barrier, worker, phases))))
    except BaseException:
        results.put((worker, traceback.format_exc()))


def run_phases(url: str, policy_text: str, phases: list[str]) -> list[Counter[str]]:
    """Every process runs the phases together; how many calls got each answer, by phase."""
    outcomes, exit_codes = race(_worker, (url, policy_text, phases), PROCESSES)
    counts = [Counter[str]() for _ in phases]
    for worker, outcome in outcomes:
        assert isinstance(outcome, list), f"worker {worker} failed:\n{outcome}"
        for phase, answers in enumerate(outcome):
            counts[phase].update(answers)
    assert all(code == 0 for code in exit_codes)
    return counts


@pytest.mark.parametrize("algorithm", ["sliding_window", "token_bucket"])
def test_polls_getting_the_same_result_are_allowed_exactly_the_limit(
    redis_server: RedisServer, redis_url: str, algorithm: str
) -> None:
    (polled,) = run_phases(redis_url, loop_policy(algorithm), ["poll:failed"])
    assert polled == {"allow": LIMIT, "deny": PROCESSES * CALLS - LIMIT}


@pytest.mark.parametrize("algorithm", ["sliding_window", "token_bucket"])
def test_a_new_result_restarts_the_count_exactly_once(
    redis_server: RedisServer, redis_url: str, algorithm: str
) -> None:
    policy = loop_policy(algorithm)

    async def first_poll() -> None:  # the result kept before the race: "running"
        store = store_from_url(redis_url, timeout_ms=5_000)
        try:
            engine = Engine(parse_policy(policy.encode()), store)
            call = ci_call(99, 0, 0)
            assert (await engine.check(call)).allowed
            digest = result_digest({"status": "running"})
            assert (await engine.settle(call.call_id, result_digest=digest)).outcome == "settled"
        finally:
            await store.close()

    asyncio.run(first_poll())
    checked, settled, polled = run_phases(
        redis_url, policy, ["check", "settle:passed", "poll:passed"]
    )
    assert checked == {"allow": LIMIT - 1, "deny": PROCESSES * CALLS - LIMIT + 1}
    assert settled == {"settled": LIMIT - 1}
    # One restart: the counter held one call ("passed"), so limit - 1 more are allowed.
    assert polled == {"allow": LIMIT - 1, "deny": PROCESSES * CALLS - LIMIT + 1}


@pytest.mark.parametrize("algorithm", ["sliding_window", "token_bucket"])
def test_settles_each_with_its_own_result_leave_exactly_one_call_counted(
    redis_server: RedisServer, redis_url: str, algorithm: str
) -> None:
    checked, settled, after = run_phases(
        redis_url, loop_policy(algorithm), ["check", "settle:*", "check"]
    )
    assert checked == {"allow": LIMIT, "deny": PROCESSES * CALLS - LIMIT}
    assert settled == {"settled": LIMIT}
    assert after == {"allow": LIMIT - 1, "deny": PROCESSES * CALLS - LIMIT + 1}
