"""All or nothing: when any enforcing rule refuses a call, no counter moves.

A call matches three rules with three different algorithms. One of them (the "tight"
rule, counted per tool) has been exhausted by another user; the two others (per user)
would still admit. The refused call must leave every counter exactly as it was, as
seen through `Engine.usage` and through the store's raw state, on all three stores,
and must leave no call record behind (only allowed calls are recorded).
"""

from __future__ import annotations

import copy
import fnmatch

import pytest

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Engine
from ratewarden.limiter.ops import CallRecord, CounterOp, Kind, Role
from ratewarden.policy import parse_policy
from ratewarden.store import MemoryStore, Store
from ratewarden.store.keys import all_keys_pattern, record_key
from ratewarden.store.redis_store import RedisStore

ALGORITHMS = ("sliding_window", "token_bucket", "fixed_window")
CODES = {"sliding_window": "sw", "token_bucket": "tb", "fixed_window": "fw"}


async def raw_state(store: Store) -> dict[str, object]:
    """Every key the store holds (counters and call records), byte for byte (TTLs aside)."""
    if isinstance(store, MemoryStore):
        return {key: copy.deepcopy(value) for key, (value, _) in store._cells.values.items()}
    assert isinstance(store, RedisStore)
    client = store._client
    # Not the daemon's own bookkeeping (runtime overrides, the fleet's reports: `rw:admin:`).
    keys = [k async for k in client.scan_iter(match="rw:*") if not k.startswith(b"rw:admin:")]
    state: dict[str, object] = {}
    for key in keys:
        assert await client.pttl(key) > 0, key  # every key expires
        kind = (await client.type(key)).decode()
        if kind == "hash":  # a call record (or a budget)
            state[key.decode()] = await client.hgetall(key)
        elif kind == "zset":  # concurrency slots
            state[key.decode()] = await client.zrange(key, 0, -1, withscores=True)
        else:
            assert kind == "string", (key, kind)
            state[key.decode()] = await client.get(key)
    return state


def counters(state: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in state.items() if fnmatch.fnmatchcase(k, all_keys_pattern())}


def records(state: dict[str, object]) -> set[str]:
    return {k for k in state if k.startswith("rw:call:")}


def policy_with_tight_rule(tight: str, position: int) -> bytes:
    loose = [
        f"  - {{name: loose-{CODES[a]}, per: [user], rate: 5/minute, algorithm: {a}}}"
        for a in ALGORITHMS
        if a != tight
    ]
    loose.insert(position, f"  - {{name: tight, per: [tool], rate: 2/minute, algorithm: {tight}}}")
    return ("version: 1\nrules:\n" + "\n".join(loose) + "\n").encode()


@pytest.mark.parametrize(
    "position", [0, 1, 2], ids=["first-denies", "second-denies", "third-denies"]
)
@pytest.mark.parametrize("tight", ALGORITHMS)
async def test_a_refused_call_consumes_nothing(
    store: Store, clock: FakeClock, tight: str, position: int
) -> None:
    engine = Engine(parse_policy(policy_with_tight_rule(tight, position)), store)
    names = [r.name for r in engine.policy.rules]
    assert names[position] == "tight"

    first = await engine.check(Call(user="alice", tool="terminal", call_id="a1"))
    clock.advance(100)
    other = await engine.check(Call(user="bob", tool="terminal", call_id="b1"))
    assert (first.decision, other.decision) == ("allow", "allow")
    clock.advance(100)

    usage_before = await engine.usage("alice", tool="terminal")
    assert [(u.rule, u.used) for u in usage_before] == [
        (name, 2 if name == "tight" else 1) for name in names
    ]
    state_before = await raw_state(store)
    assert len(counters(state_before)) == 5  # tight, and two loose counters for each user
    # The caller named both allowed calls (call_id given), so each left a record.
    assert records(state_before) == {record_key("a1"), record_key("b1")}
    assert len(state_before) == 7

    for i in range(3):
        engine.refusals.clear()  # each attempt goes to the store (not a remembered refusal)
        refused = await engine.check(Call(user="alice", tool="terminal", call_id=f"a-refused-{i}"))
        assert refused.decision == "deny"
        assert [v.rule for v in refused.violations] == ["tight"]
        assert refused.message.startswith("Rate limit: max 2 terminal calls per minute (retry in ")
        # The loose rules admitted the call (4 of 5 left before it) and were not charged.
        assert {v.rule: v.remaining for v in refused.limits} == {
            name: 0 if name == "tight" else 4 for name in names
        }

    # No counter moved, and no record was left for the refused calls.
    assert await raw_state(store) == state_before
    assert await engine.usage("alice", tool="terminal") == usage_before

    # Another tool has its own tight counter: allowed, and now the loose ones do move.
    allowed = await engine.check(Call(user="alice", tool="ls", call_id="a2"))
    assert allowed.decision == "allow"
    assert {v.rule: v.remaining for v in allowed.limits} == {
        name: 1 if name == "tight" else 3 for name in names
    }
    state_after = await raw_state(store)
    assert counters(state_after) != counters(state_before)
    assert records(state_after) == {record_key("a1"), record_key("b1"), record_key("a2")}


async def test_raw_ops_blocked_by_one_enforcing_op(store: Store, clock: FakeClock) -> None:
    """At the store interface: a shadow, a forced and two enforcing ops; the last refuses."""
    minute = 60_000

    def op(key: str, kind: Kind, limit: int, role: Role) -> CounterOp:
        return CounterOp(f"rw:{{aon-{key}}}:x", kind, role, limit, minute, limit)

    def record(call_id: str) -> CallRecord:
        return CallRecord(record_key(call_id), call_id, "u|t", 3_600_000, named=True)

    shadow = op("shadow", Kind.SLIDING_WINDOW, 3, Role.SHADOW)
    forced = op("forced", Kind.TOKEN_BUCKET, 3, Role.FORCED)
    loose = op("loose", Kind.FIXED_WINDOW, 3, Role.ENFORCE)
    tight = op("tight", Kind.SLIDING_WINDOW, 1, Role.ENFORCE)

    [taken] = (await store.evaluate([tight])).results
    assert taken.admitted
    before = await raw_state(store)
    clock.advance(1_000)
    for i in range(3):
        found = await store.evaluate([shadow, forced, loose, tight], record(f"refused-{i}"))
        assert (found.replayed, found.conflict) == (False, False)
        results = found.results
        assert [r.admitted for r in results] == [True, True, True, False]
        assert [r.remaining for r in results] == [3, 3, 3, 0]  # nothing was taken
        assert results[3].retry_after_ms == 59_000
    assert await raw_state(store) == before  # no counter moved, and no record was written

    # Once the tight op admits, every op is charged once (the forced one always).
    clock.advance(59_000)
    found = await store.evaluate([shadow, forced, loose, tight], record("allowed"))
    assert [r.admitted for r in found.results] == [True, True, True, True]
    assert [r.remaining for r in found.results] == [2, 2, 2, 0]
    assert records(await raw_state(store)) == {record_key("allowed")}


async def test_dry_run_consumes_nothing(store: Store, clock: FakeClock) -> None:
    ops = [
        CounterOp(f"rw:{{dry-{k.value}}}:x", k, Role.ENFORCE, 2, 60_000, 2)
        for k in (Kind.SLIDING_WINDOW, Kind.TOKEN_BUCKET, Kind.FIXED_WINDOW)
    ]
    # Even with a record the caller would keep: a dry run records nothing.
    record = CallRecord(record_key("dry"), "dry", "u|t", 3_600_000, named=True)
    for _ in range(5):
        results = (await store.evaluate(ops, record, dry_run=True)).results
        assert [(r.admitted, r.used, r.remaining) for r in results] == [(True, 0, 2)] * 3
    assert await raw_state(store) == {}


async def test_dry_run_with_a_reduced_limit_changes_nothing(store: Store, clock: FakeClock) -> None:
    key = "rw:{dry-resize}:sw"
    for _ in range(10):
        [result] = (
            await store.evaluate([CounterOp(key, Kind.SLIDING_WINDOW, Role.ENFORCE, 10, 60_000)])
        ).results
        assert result.admitted
        clock.advance(100)
    before = await raw_state(store)
    shrunk = CounterOp(key, Kind.SLIDING_WINDOW, Role.ENFORCE, 4, 60_000)
    [peek] = (await store.evaluate([shrunk], dry_run=True)).results
    assert (peek.admitted, peek.remaining) == (False, 0)
    assert await raw_state(store) == before
