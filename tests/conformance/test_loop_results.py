"""Issue 29, loops keyed on results (`same_result: true`), on every store.

A poll of a changing world (a CI run) sends the same call and gets a different answer
each time: under `rate: 3/10min, same_result: true` it is never refused; once the
answer stops changing, the 4th identical call with the same result is. A settle without
a result digest counts the call as an identical one (as a rule without `same_result`
would), a second settle of the same call changes nothing, and the result kept beside
the counter expires with the window. On memory, fakeredis, a real redis-server and
(tests/stores/test_store_cluster.py) Redis Cluster, with every rate algorithm.
"""

from __future__ import annotations

import itertools

import pytest

from ratewarden.arguments import result_digest
from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Decision, Engine
from ratewarden.policy import parse_policy
from ratewarden.store import MemoryStore, Store
from ratewarden.store.redis_store import RedisStore

ALGORITHMS = ("sliding_window", "token_bucket", "fixed_window")
CODE = {"sliding_window": "sw", "token_bucket": "tb", "fixed_window": "fw"}
WINDOW_MS = 600_000
SAME_RESULT_3 = (
    "Repeated call: ci_status returned the same result 3 times in a row; change the "
    "arguments or the approach"
)

_ids = itertools.count()


def policy(algorithm: str, same_result: bool = True, extra: str = "") -> str:
    return f"""\
version: 1
defaults: {{algorithm: {algorithm}}}
tools: {{ci_status: {{cost: 0.5}}}}
rules:
  - name: poll-loop
    match: {{tool: ci_status}}
    per: [user, tool, args]
    rate: 3/10min
    same_result: {"true" if same_result else "false"}
{extra}"""


def engine_on(text: str, store: Store, clock: FakeClock) -> Engine:
    return Engine(parse_policy(text.encode()), store, clock=clock, remember_refusals=False)


def ci_call(user: str = "alice", run: int = 7) -> Call:
    return Call(user, "ci_status", f"poll-{next(_ids)}", args={"run": run})


async def poll(
    engine: Engine, clock: FakeClock, answer: str | None, user: str = "alice"
) -> Decision:
    """One poll a second: check, and if allowed, settle with the answer's digest (None:
    a settle without one)."""
    clock.advance(1_000)
    call = ci_call(user)
    decided = await engine.check(call)
    if decided.allowed:
        digest = None if answer is None else result_digest({"status": answer})
        settled = await engine.settle(call.call_id, result_digest=digest)
        assert settled.outcome == "settled"
    return decided


def answered(status: str) -> str:
    """The digest of the tool's answer `{"status": status}`."""
    return result_digest({"status": status})


async def used(engine: Engine, user: str = "alice") -> int:
    probe = Call(user, "ci_status", "", args={"run": 7})
    plans = engine._plans(engine.policy, engine.policy.applicable(probe))
    ops = [engine._op(engine.policy, plan, probe) for plan in plans]
    found = await engine.store.evaluate(ops, dry_run=True)
    return found.results[0].used


async def kept_result_ttl(store: Store, key: str) -> int | None:
    """The kept result's time to live in ms (None: not there)."""
    if isinstance(store, MemoryStore):
        now = store.clock.now_ms()
        found = store._cells.values.get(key)
        return None if found is None or found[1] <= now else found[1] - now
    assert isinstance(store, RedisStore)
    ttl = await store._client.pttl(key)
    return None if ttl < 0 else int(ttl)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_poll_whose_answer_changes_is_never_refused(
    store: Store, clock: FakeClock, algorithm: str
) -> None:
    engine = engine_on(policy(algorithm), store, clock)
    answers = ["queued", "queued", "running", "running", "running-2", "running-2"] * 3
    for answer in answers:
        decided = await poll(engine, clock, answer)
        assert decided.allowed, (answer, decided.message)
        assert decided.send_result
    # The answer stops changing: three calls get it, the 4th is refused.
    for _ in range(3):
        assert (await poll(engine, clock, "passed")).allowed
    refused = await poll(engine, clock, "passed")
    assert not refused.allowed
    assert refused.message == SAME_RESULT_3
    assert not refused.send_result
    assert [v.rule for v in refused.violations] == ["poll-loop"]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_the_same_result_is_refused_on_the_fourth_call(
    store: Store, clock: FakeClock, algorithm: str
) -> None:
    engine = engine_on(policy(algorithm), store, clock)
    for _ in range(3):
        assert (await poll(engine, clock, "failed")).allowed
    assert (await poll(engine, clock, "failed")).message == SAME_RESULT_3
    # Other arguments are another call, counted apart.
    other = Call("alice", "ci_status", "other", args={"run": 8})
    assert (await engine.check(other)).allowed


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_settle_without_a_digest_counts_as_an_identical_call(
    store: Store, clock: FakeClock, algorithm: str
) -> None:
    engine = engine_on(policy(algorithm), store, clock)
    assert (await poll(engine, clock, "a")).allowed  # kept: a
    assert (await poll(engine, clock, None)).allowed  # no digest: counts on, a kept
    assert (await poll(engine, clock, None)).allowed
    assert await used(engine) == 3
    assert not (await poll(engine, clock, None)).allowed
    # And a digest after digest-less settles is compared with the last one kept.
    other = engine_on(policy(algorithm), store, clock)
    assert (await poll(other, clock, None, user="bob")).allowed  # nothing kept
    assert (await poll(other, clock, "x", user="bob")).allowed  # kept: x (none before)
    assert await used(other, "bob") == 2
    assert (await poll(other, clock, "y", user="bob")).allowed  # differs: restarts
    assert await used(other, "bob") == 1


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_a_second_settle_of_the_same_call_changes_nothing(
    store: Store, clock: FakeClock, algorithm: str
) -> None:
    engine = engine_on(policy(algorithm), store, clock)
    assert (await poll(engine, clock, "a")).allowed
    assert (await poll(engine, clock, "a")).allowed
    call = ci_call()
    assert (await engine.check(call)).allowed
    assert await used(engine) == 3
    first = await engine.settle(call.call_id, result_digest=answered("b"))
    assert first.outcome == "settled"
    assert await used(engine) == 1  # restarted: this call is the first to get b
    again = await engine.settle(call.call_id, result_digest=answered("c"))
    assert again.outcome == "already_settled"
    assert await used(engine) == 1
    # b is still the result kept: a call getting b counts on.
    assert (await poll(engine, clock, "b")).allowed
    assert await used(engine) == 2


@pytest.mark.parametrize("algorithm", ALGORITHMS)
async def test_the_kept_result_expires_with_the_window(
    store: Store, clock: FakeClock, algorithm: str
) -> None:
    engine = engine_on(policy(algorithm), store, clock)
    assert (await poll(engine, clock, "a")).allowed
    digest = result_digest({"run": 7})  # the args digest: the same canonical JSON
    key = f"rw:{{poll-loop|user=alice|tool=ci_status|args={digest}}}:{CODE[algorithm]}:r"
    ttl = await kept_result_ttl(store, key)
    assert ttl is not None
    assert 0 < ttl <= WINDOW_MS
    if isinstance(store, MemoryStore):  # the fake clock moves its expiry
        clock.advance(WINDOW_MS)
        assert await kept_result_ttl(store, key) is None


async def test_a_budget_beside_a_loop_rule_is_charged_as_before(
    store: Store, clock: FakeClock
) -> None:
    extra = "  - {name: spend, match: {tool: ci_status}, budget: 10/day}\n"
    engine = engine_on(policy("sliding_window", extra=extra), store, clock)
    call = ci_call()
    decided = await engine.check(call)
    assert decided.allowed
    assert decided.send_result
    settled = await engine.settle(call.call_id, 0.25, result_digest=answered("a"))
    assert (settled.outcome, settled.charged) == ("settled", {"spend": 0.25})
    usage = {u.rule: (u.used, u.reserved) for u in await engine.usage("alice", "ci_status")}
    assert usage["spend"] == (0.25, 0.0)


@pytest.mark.parametrize("same_result", [False, True])
async def test_only_a_rule_keyed_on_results_asks_for_the_result(
    store: Store, clock: FakeClock, same_result: bool
) -> None:
    engine = engine_on(policy("sliding_window", same_result=same_result), store, clock)
    decided = await engine.check(ci_call())
    assert decided.send_result is same_result
    # Without same_result, a changing answer does not help: the 4th identical call is
    # refused with the identical-call sentence.
    assert (await poll(engine, clock, "a")).allowed
    assert (await poll(engine, clock, "b")).allowed
    found = await poll(engine, clock, "c")
    assert found.allowed is same_result
    if not same_result:
        assert found.message is not None
        assert "with the same arguments" in found.message


async def test_a_settle_after_the_rule_is_gone_leaves_the_counter_alone(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(policy("sliding_window"), store, clock)
    for _ in range(2):
        assert (await poll(engine, clock, "a")).allowed
    call = ci_call()
    assert (await engine.check(call)).allowed
    engine.policy = parse_policy(policy("sliding_window", same_result=False).encode())
    settled = await engine.settle(call.call_id, result_digest=answered("b"))
    assert settled.outcome == "settled"
    assert await used(engine) == 3  # no restart: the rule in force is not keyed on results


async def test_a_refusal_is_not_remembered_past_a_new_result(
    store: Store, clock: FakeClock
) -> None:
    """The daemon remembers rate refusals until their wait ends (engine/refusals.py); a
    loop rule keyed on results is lifted sooner, by any call's settle that brings a new
    result, so its refusals are not remembered."""
    engine = Engine(parse_policy(policy("sliding_window").encode()), store, clock=clock)
    calls = [ci_call() for _ in range(3)]
    for call in calls:
        assert (await engine.check(call)).allowed
    assert (await engine.check(ci_call())).message == SAME_RESULT_3
    assert len(engine.refusals) == 0
    settled = await engine.settle(calls[0].call_id, result_digest=answered("a"))
    assert settled.outcome == "settled"
    assert not (await engine.check(ci_call())).allowed  # a was the first result kept
    await engine.settle(calls[1].call_id, result_digest=answered("b"))  # restarts
    assert (await engine.check(ci_call())).allowed


async def test_a_restart_counts_at_the_users_own_limit(store: Store, clock: FakeClock) -> None:
    """An override's limit is the user's: a token bucket restarted at the rule's own rate
    would space its units twice as far apart as alice's, and admit one call fewer."""
    extra = "overrides:\n  - {users: [alice], rule: poll-loop, rate: 6/10min}\n"
    engine = engine_on(policy("token_bucket", extra=extra), store, clock)
    assert (await poll(engine, clock, "a")).allowed
    assert (await poll(engine, clock, "b")).allowed  # restarts: one unit of alice's six
    allowed = [(await poll(engine, clock, "b")).allowed for _ in range(6)]
    assert allowed == [True] * 5 + [False]


async def test_a_reset_forgets_the_kept_result_with_the_counter(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(policy("sliding_window"), store, clock)
    for answer in ("a", "a"):
        assert (await poll(engine, clock, answer)).allowed
    digest = result_digest({"run": 7})
    key = f"rw:{{poll-loop|user=alice|tool=ci_status|args={digest}}}:sw"
    assert await kept_result_ttl(store, key + ":r") is not None
    assert await engine.reset(user="alice") == 2  # the counter and its kept result
    assert await kept_result_ttl(store, key + ":r") is None
    assert await used(engine) == 0
