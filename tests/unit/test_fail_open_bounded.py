"""Failing open is bounded (issue 26 item 4): while the store is unreachable, a fail-open
rule admits at most its limit per window for each counter, counted in this process, and
a concurrency cap at most its slots until settles free them. Fast: the engine on a store
that raises StoreError while `down`, on a fake clock. The real Redis and daemon version is
tests/stores/test_fail_open_redis.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Decision, Engine
from ratewarden.limiter.ops import CallRecord, CounterOp, Evaluation, Hold, Recorded
from ratewarden.limiter.script import SettleStatus
from ratewarden.policy import parse_policy
from ratewarden.store import MemoryStore, StoreError

POLICY = """\
version: 1
defaults: {fail: open}
tools:
  search: {cost: 0.30}
rules:
  - name: terminal-rate
    match: {tool: terminal}
    per: [user]
    rate: 5/minute
  - name: search-budget
    match: {tool: search}
    per: [user]
    budget: 1.00/day
  - name: browser-slots
    match: {tool: browser}
    per: [user]
    concurrency: 2
  - name: vault-closed
    match: {tool: vault}
    rate: 100/minute
    fail: closed
  - name: shadow-rate
    match: {tool: shadowed}
    rate: 1/minute
    mode: shadow
"""


class FlakyStore(MemoryStore):
    """A memory store that raises StoreError on every counter operation while `down`."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.down = False

    def _trouble(self) -> None:
        if self.down:
            raise StoreError("ConnectionError: refused")

    async def evaluate(
        self, ops: Sequence[CounterOp], record: CallRecord | None = None, dry_run: bool = False
    ) -> Evaluation:
        self._trouble()
        return await super().evaluate(ops, record, dry_run)

    async def read_holds(self, record_key: str) -> Recorded | None:
        self._trouble()
        return await super().read_holds(record_key)

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
        self._trouble()
        return await super().settle(
            record_key, call_id, actual, holds, fingerprint, result_digest, model
        )

    async def reset(self, pattern: str) -> int:
        self._trouble()
        return await super().reset(pattern)


@pytest.fixture
def store(clock: FakeClock) -> FlakyStore:
    found = FlakyStore(clock)
    found.down = True
    return found


def engine_on(store: FlakyStore, clock: FakeClock, policy: str = POLICY, **kw: Any) -> Engine:
    return Engine(parse_policy(policy.encode()), store, clock=clock, **kw)


async def calls(engine: Engine, tool: str, n: int, user: str = "alice") -> list[Decision]:
    return [await engine.check(Call(user, tool, f"{user}-{tool}-{i}")) for i in range(n)]


def outcomes(decisions: Sequence[Decision]) -> list[tuple[str, bool]]:
    return [(d.decision, d.degraded) for d in decisions]


async def test_a_fail_open_rate_admits_its_limit_then_refuses_with_its_own_message(
    store: FlakyStore, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    found = await calls(engine, "terminal", 8)
    assert outcomes(found) == [("allow", True)] * 5 + [("deny", True)] * 3
    refusal = found[-1]
    assert refusal.message.startswith("Rate limit: max 5 terminal calls per minute")
    assert [(v.rule, v.kind) for v in refusal.violations] == [("terminal-rate", "rate")]
    assert refusal.retry_after is not None
    assert 0 < refusal.retry_after <= 60


async def test_each_counter_has_its_own_local_count_and_its_window_rolls(
    store: FlakyStore, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    assert [d.decision for d in await calls(engine, "terminal", 6)].count("allow") == 5
    bob = await calls(engine, "terminal", 6, user="bob")  # per: [user]: bob's own counter
    assert [d.decision for d in bob].count("allow") == 5
    clock.advance(60_000)  # a new window: five more, not more
    later = await calls(engine, "terminal", 7)
    assert [d.decision for d in later] == ["allow"] * 5 + ["deny"] * 2


async def test_a_fail_open_budget_admits_at_most_the_budget(
    store: FlakyStore, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    found = await calls(engine, "search", 5)  # 0.30 each against 1.00
    assert outcomes(found) == [("allow", True)] * 3 + [("deny", True)] * 2
    assert found[-1].violations[0].kind == "budget"


async def test_a_fail_open_cap_admits_its_slots_until_a_settle_frees_one(
    store: FlakyStore, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    first = await calls(engine, "browser", 3)
    assert outcomes(first) == [("allow", True), ("allow", True), ("deny", True)]
    assert first[-1].message.startswith("Concurrency limit: max 2 browser calls at once")
    settled = await engine.settle(first[0].call_id)  # the real store is still down
    assert settled.outcome == "settled"
    assert (await engine.settle(first[0].call_id)).outcome == "already_settled"
    again = await engine.check(Call("alice", "browser", "again"))
    assert (again.decision, again.degraded) == ("allow", True)
    assert (await engine.check(Call("alice", "browser", "more"))).decision == "deny"


async def test_a_degraded_call_is_settled_locally_after_the_store_is_back(
    store: FlakyStore, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    held = await calls(engine, "browser", 2)
    store.down = False
    healthy = await engine.check(Call("alice", "browser", "healthy"))
    assert (healthy.decision, healthy.degraded) == ("allow", False)  # the store's count
    assert (await engine.settle(held[0].call_id)).outcome == "settled"
    store.down = True  # the freed local slot is there for the next outage
    after = [await engine.check(Call("alice", "browser", f"next-{i}")) for i in range(2)]
    assert outcomes(after) == [("allow", True), ("deny", True)]


async def test_fail_closed_still_refuses_and_consumes_no_local_count(
    store: FlakyStore, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    found = await calls(engine, "vault", 3)
    assert outcomes(found) == [("deny", True)] * 3
    assert found[0].violations[0].kind == "unavailable"
    assert found[0].message == "Tool guard unavailable; vault calls are paused"


async def test_a_shadow_rule_never_refuses_while_the_store_is_down(
    store: FlakyStore, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    assert outcomes(await calls(engine, "shadowed", 4)) == [("allow", True)] * 4


async def test_the_local_count_is_ignored_while_the_store_answers(
    store: FlakyStore, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    await calls(engine, "terminal", 5)
    store.down = False
    healthy = await calls(engine, "terminal", 5)  # the real counter is the truth
    assert outcomes(healthy) == [("allow", False)] * 5


async def test_the_local_count_holds_at_most_its_cap_of_keys(
    store: FlakyStore, clock: FakeClock
) -> None:
    """A flood of distinct users in a long outage: memory stays bounded, and a counter
    that finds no room refuses (by the unavailable message) rather than admit uncounted."""
    engine = engine_on(store, clock, local_keys=10)
    found = [await engine.check(Call(f"user{i}", "terminal", f"c{i}")) for i in range(30)]
    assert outcomes(found[:10]) == [("allow", True)] * 10
    assert outcomes(found[10:]) == [("deny", True)] * 20
    assert found[-1].violations[0].kind == "unavailable"
    assert engine.local.key_count() <= 10
    # The users already counted keep their count.
    assert (await engine.check(Call("user0", "terminal", "c0-again"))).decision == "allow"
    clock.advance(61_000)  # their windows ended: room again
    assert (await engine.check(Call("late", "terminal", "late"))).decision == "allow"


def test_a_cap_below_one_key_is_refused(store: FlakyStore, clock: FakeClock) -> None:
    with pytest.raises(ValueError, match="local_keys"):
        engine_on(store, clock, local_keys=0)


LOOP_POLICY = """\
version: 1
defaults: {fail: open}
rules:
  - {name: ci-loop, per: [user, tool, args], rate: 3/10 minutes, same_result: true}
"""


async def test_a_loop_rule_keyed_on_results_restarts_in_the_local_count(
    store: FlakyStore, clock: FakeClock
) -> None:
    """Counted in this process while the store is down, a loop hold is recorded there
    too, and its settle (also while down) compares the result there."""
    from ratewarden.arguments import result_digest

    engine = engine_on(store, clock, LOOP_POLICY)

    async def poll(i: int, answer: str) -> Decision:
        call = Call("alice", "ci_status", f"loop-{i}", args={"run": 7})
        decided = await engine.check(call)
        if decided.allowed:
            digest = result_digest({"state": answer})
            assert (await engine.settle(call.call_id, result_digest=digest)).outcome == "settled"
        return decided

    answers = ["queued", "queued", "running", "running", "done", "done", "done", "done"]
    found = [await poll(i, answer) for i, answer in enumerate(answers)]
    assert outcomes(found) == [("allow", True)] * 7 + [("deny", True)]
    assert all(d.send_result for d in found[:7])
    assert found[-1].message.startswith("Repeated call: ci_status returned the same result")
