"""Property test: loop rules keyed on results against a brute-force oracle, on a fake clock.

Random sequences of identical checks, settles (of a call allowed earlier, with a result
digest from a small alphabet or none, sometimes twice) and time steps go through the
Engine; an oracle that keeps the whole history says what each check must answer. The
rule (docs/policy.md, loops): every allowed call is counted at its check; a settle with
a digest other than the one kept (and not yet expired, a window after it was kept)
empties the counter and counts the settling call in it; a digest is then kept. A settle
without a digest, or a second settle, changes nothing.

On the memory store (many examples, time steps past the window) and a real redis-server
(fewer examples): Redis expires keys on its own clock, not the injected one, so there the
fake time stays inside one window, where nothing expires on either clock.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratewarden.arguments import result_digest
from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.store import MemoryStore, Store
from ratewarden.store.redis_store import RedisStore
from tests.helpers.redis_server import RedisServer

START_MS = 1_700_000_000_000 + 17_345
MEMORY = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REDIS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALPHABET = ("a", "b", "c")
_users = itertools.count()

# An action: ("check",), ("settle", which allowed call (index mod their number), answer
# or None), ("wait", ms).
Action = tuple[Any, ...]


def actions(max_wait: int) -> st.SearchStrategy[list[Action]]:
    check = st.just(("check",))
    settle = st.tuples(st.just("settle"), st.integers(0, 50), st.sampled_from((*ALPHABET, None)))
    wait = st.tuples(st.just("wait"), st.integers(0, max_wait))
    return st.lists(st.one_of(check, check, settle, settle, wait), min_size=1, max_size=60)


@dataclass
class Oracle:
    """The whole history, and each answer worked out from it from scratch."""

    algorithm: str
    limit: int
    window: int
    events: list[tuple[str, int, Any]] = field(default_factory=list)  # (what, time, digest)

    def counted(self, now: int) -> int:
        """Calls the counter holds at `now`: those since the last restart still inside
        the window (sliding), or inside the current clock-aligned window (fixed)."""
        since = [t for what, t, _ in self.events if what in ("count", "restart")]
        restarts = [i for i, (what, _, _) in enumerate(self.events) if what == "restart"]
        if restarts:
            since = [
                t for what, t, _ in self.events[restarts[-1] :] if what in ("count", "restart")
            ]
        if self.algorithm == "sliding_window":
            return sum(1 for t in since if t > now - self.window)
        start = now - now % self.window
        return sum(1 for t in since if t - t % self.window == start)

    def kept(self, now: int) -> str | None:
        """The digest kept: the last one a settle brought, if a window has not passed."""
        for what, t, digest in reversed(self.events):
            if what == "keep":
                return digest if t + self.window > now else None
        return None

    def check(self, now: int) -> tuple[bool, int]:
        used = self.counted(now)
        if used < self.limit:
            self.events.append(("count", now, None))
            return True, self.limit - used - 1
        return False, 0

    def settle(self, now: int, digest: str | None) -> None:
        if digest is None:
            return
        kept = self.kept(now)
        if kept is not None and kept != digest:
            self.events.append(("restart", now, None))
        self.events.append(("keep", now, digest))


async def run(
    store: Store, clock: FakeClock, algorithm: str, limit: int, window_s: int, steps: list[Action]
) -> None:
    text = f"""\
version: 1
defaults: {{algorithm: {algorithm}, call_ttl: 1d}}
rules:
  - {{name: loop, per: [user, tool, args], rate: {limit}/{window_s} seconds, same_result: true}}
"""
    engine = Engine(parse_policy(text.encode()), store, clock=clock, remember_refusals=False)
    oracle = Oracle(algorithm, limit, window_s * 1000)
    user = f"u{next(_users)}"  # a fresh counter on the shared redis-server
    allowed: list[str] = []
    settled: set[str] = set()
    for n, step in enumerate(steps):
        now = clock.now_ms()
        if step[0] == "wait":
            clock.advance(step[1])
        elif step[0] == "check":
            call = Call(user, "ci_status", f"{user}-{n}", args={"run": 1})
            decided = await engine.check(call)
            expected = oracle.check(now)
            got = (decided.allowed, int(decided.limits[0].remaining))
            assert got == expected, (n, step, oracle.events)
            assert decided.send_result is decided.allowed
            if decided.allowed:
                allowed.append(call.call_id)
        elif allowed:
            call_id = allowed[step[1] % len(allowed)]
            digest = None if step[2] is None else result_digest({"status": step[2]})
            found = await engine.settle(call_id, result_digest=digest)
            if call_id in settled:
                assert found.outcome == "already_settled"
            else:
                assert found.outcome == "settled"
                settled.add(call_id)
                oracle.settle(now, digest)


def on_memory(body: Callable[[Store, FakeClock], Coroutine[Any, Any, None]]) -> None:
    clock = FakeClock(START_MS)
    asyncio.run(body(MemoryStore(clock), clock))


@pytest.mark.parametrize("algorithm", ["sliding_window", "fixed_window"])
@MEMORY
@given(
    limit=st.sampled_from((1, 2, 3, 5)),
    window_s=st.sampled_from((10, 60)),
    steps=actions(max_wait=25_000),
)
def test_loop_rule_matches_the_oracle_on_memory(
    algorithm: str, limit: int, window_s: int, steps: list[Action]
) -> None:
    on_memory(lambda store, clock: run(store, clock, algorithm, limit, window_s, steps))


@pytest.mark.parametrize("algorithm", ["sliding_window", "fixed_window"])
@REDIS
@given(limit=st.sampled_from((1, 2, 3, 5)), steps=actions(max_wait=20_000))
def test_loop_rule_matches_the_oracle_on_redis(
    redis_server: RedisServer, algorithm: str, limit: int, steps: list[Action]
) -> None:
    """A window of 3 hours, fake time at most 60 steps of 20 s: nothing expires."""

    async def body() -> None:
        clock = FakeClock(START_MS)
        store = RedisStore(aioredis.Redis.from_url(redis_server.url), "redis", clock)
        try:
            await store.start()
            await run(store, clock, algorithm, limit, 3 * 3600, steps)
        finally:
            await store.close()

    asyncio.run(body())
