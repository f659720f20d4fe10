"""`redis+cluster://` on a real three-master Redis Cluster (started on free ports).

- The conformance table of tests/conformance/test_conformance.py, unchanged, with and without the
  dry run that precedes a multi-slot commit (without it, every refusal of a multi-slot
  call commits its earlier slots and gives them back).
- All or nothing across slots and nodes: a call whose per-user, per-tool and global
  counters (sliding window, token bucket, budget, concurrency, fixed window) sit on three
  nodes, refused by the last slot, leaves every node byte for byte as it was.
- Exactness under concurrency: four processes race a cross-slot call; exactly the limit
  is allowed and every other counter ends at exactly that count.
- Idempotency (replays, concurrent duplicates, conflicts), settle across slots, reset,
  the audit list, round trips per decision, and what an interrupted call gives back.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, cast

import pytest

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Engine
from ratewarden.engine.engine import CallIdConflict
from ratewarden.limiter.ops import Kind
from ratewarden.limiter.script import SettleStatus
from ratewarden.policy import parse_policy
from ratewarden.store import MemoryStore, StoreError, store_from_url
from ratewarden.store.cluster import ClusterStore, slot_of
from ratewarden.store.keys import (
    DENIALS_KEY,
    counter_key,
    notice_key,
    record_key,
    refusal_count_key,
)
from ratewarden.store.redis_store import RedisStore
from tests.conformance import test_conformance as conformance
from tests.helpers.races import race
from tests.helpers.redis_cluster import RedisClusterServers, running_cluster, store_tests

pytestmark = pytest.mark.redis

THIRDS = ((0, 5460), (5461, 10922), (10923, 16383))  # redis-cli's split over 3 masters


def rule_name(stem: str, slots: tuple[int, int], key: Callable[[str], str]) -> str:
    """The first `stem-N` whose counter key (as `key` builds it) hashes into `slots`."""
    for n in range(100_000):
        name = f"{stem}-{n}"
        if slots[0] <= slot_of(key(name)) <= slots[1]:
            return name
    raise AssertionError("unreachable")


def user_key(kind: Kind, user: str = "alice") -> Callable[[str], str]:
    return lambda name: counter_key(name, kind, [("user", user)])


def tool_key(kind: Kind, tool: str = "terminal") -> Callable[[str], str]:
    return lambda name: counter_key(name, kind, [("tool", tool)])


# Five counters of one call (alice, terminal) on three nodes; the global one has the
# highest slot, so it is the last to commit.
PER_USER = rule_name("per-user", THIRDS[0], user_key(Kind.SLIDING_WINDOW))
SPEND = rule_name("spend", THIRDS[0], user_key(Kind.BUDGET))
PER_TOOL = rule_name("per-tool", THIRDS[1], tool_key(Kind.TOKEN_BUCKET))
LANES = rule_name("lanes", THIRDS[1], tool_key(Kind.CONCURRENCY))
GLOBAL = rule_name("global", (15_000, 16_383), lambda n: counter_key(n, Kind.FIXED_WINDOW, []))
KEYS = {
    PER_USER: counter_key(PER_USER, Kind.SLIDING_WINDOW, [("user", "alice")]),
    SPEND: counter_key(SPEND, Kind.BUDGET, [("user", "alice")]),
    PER_TOOL: counter_key(PER_TOOL, Kind.TOKEN_BUCKET, [("tool", "terminal")]),
    LANES: counter_key(LANES, Kind.CONCURRENCY, [("tool", "terminal")]),
    GLOBAL: counter_key(GLOBAL, Kind.FIXED_WINDOW, []),
}
FIVE_SCOPES = f"""
version: 1
rules:
  - {{name: {PER_USER}, per: [user], rate: 5/minute}}
  - {{name: {PER_TOOL}, per: [tool], rate: 5/minute, algorithm: token_bucket}}
  - {{name: {SPEND}, per: [user], budget: 10.00/day}}
  - {{name: {LANES}, per: [tool], concurrency: 3}}
  - {{name: {GLOBAL}, per: [], rate: 2/minute, algorithm: fixed_window}}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    with running_cluster(tmp_path_factory.mktemp("cluster")) as servers:
        yield servers


@pytest.fixture
async def make_cluster_store(
    cluster: RedisClusterServers,
) -> AsyncIterator[Callable[..., ClusterStore]]:
    """Cluster stores on an emptied cluster, built from the URL as the daemon does."""
    cluster.flush()
    made: list[ClusterStore] = []

    def make(clock: FakeClock | None = None, precheck: bool = True) -> ClusterStore:
        store = store_from_url(cluster.url, timeout_ms=2_000, clock=clock)
        assert isinstance(store, ClusterStore)
        store.precheck = precheck
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


@pytest.fixture(params=[True, False], ids=["precheck", "no-precheck"])
async def cluster_store(
    request: pytest.FixtureRequest,
    make_cluster_store: Callable[..., ClusterStore],
    clock: FakeClock,
) -> ClusterStore:
    store = make_cluster_store(clock, precheck=request.param)
    await store.start()
    return store


# ------------------------------------------------------------------------ conformance


@pytest.mark.parametrize("scenario", conformance.SCENARIOS, ids=lambda s: s.name)
async def test_conformance_scenario_on_cluster(
    scenario: conformance.Scenario, cluster_store: ClusterStore, clock: FakeClock
) -> None:
    await conformance.test_scenario(scenario, cluster_store, clock)


@pytest.mark.parametrize("scenario", conformance.TOKEN_SCENARIOS, ids=lambda s: s.name)
async def test_token_scenario_on_cluster(
    scenario: conformance.TokenScenario, cluster_store: ClusterStore, clock: FakeClock
) -> None:
    await conformance.run_token_scenario(scenario, cluster_store, clock)


def test_the_token_scenarios_span_several_slots() -> None:
    """A call's token rate, its other counter and its record each in a slot of its own."""
    for scenario in conformance.TOKEN_SCENARIOS[1:]:
        keys = [conformance.token_key(scenario, name) for name in scenario.counters]
        assert len({slot_of(key) for key in [*keys, record_key("a")]}) == 3, scenario.name


def test_the_scenarios_do_span_several_slots() -> None:
    """Otherwise the table would not exercise the multi-slot protocol at all."""
    spanning = 0
    for scenario in conformance.SCENARIOS:
        policy = parse_policy(scenario.policy.encode())
        names = [rule.name for rule in policy.rules]
        slots = {slot_of(counter_key(n, Kind.SLIDING_WINDOW, [("user", "alice")])) for n in names}
        spanning += len(slots) > 1
    assert spanning >= 5


# --------------------------------------------------------------------- all or nothing


def raw_state(cluster: RedisClusterServers) -> dict[str, tuple[int, object, int]]:
    """Every key on every node: (node, value, pttl)."""
    state: dict[str, tuple[int, object, int]] = {}
    for node, client in enumerate(cluster.clients()):
        for raw in client.scan_iter(match="rw:*"):
            key = cast("bytes", raw).decode()  # redis-py types both decodings
            kind = cast("bytes", client.type(raw)).decode()
            value: object
            if kind == "hash":
                value = client.hgetall(raw)
            elif kind == "zset":
                value = client.zrange(raw, 0, -1, withscores=True)
            elif kind == "list":
                value = client.lrange(raw, 0, -1)
            else:
                value = client.get(raw)
            state[key] = (node, value, client.pttl(raw))
        client.close()
    return state


def assert_same_state(
    before: dict[str, tuple[int, object, int]], after: dict[str, tuple[int, object, int]]
) -> None:
    assert set(after) == set(before), set(after) ^ set(before)
    for key, (node, value, ttl) in before.items():
        assert after[key][:2] == (node, value), key
        # Real time passes between the snapshots (fake time does too): TTLs stay close.
        assert abs(after[key][2] - ttl) < 3_000, (key, ttl, after[key][2])


def observed(decision: Any) -> dict[str, object]:
    return {**conformance.observed_check(decision), "replayed": decision.replayed}


async def test_a_call_refused_by_its_last_slot_consumes_nothing_on_any_node(
    cluster: RedisClusterServers, cluster_store: ClusterStore, clock: FakeClock
) -> None:
    slots = {name: slot_of(key) for name, key in KEYS.items()}
    assert len(set(slots.values())) == 5
    assert max(slots.values()) == slots[GLOBAL]  # the global counter commits last
    assert len({cluster.node_for_slot(s) for s in slots.values()}) == 3
    releases = 0
    real_release = cluster_store._release

    async def counting_release(*args: Any) -> Any:
        nonlocal releases
        releases += 1
        return await real_release(*args)

    cluster_store._release = counting_release  # type: ignore[method-assign,assignment]
    # The same steps on the embedded store (the Lua script's Python twin) give the answers.
    memory_clock = FakeClock(clock.now_ms())
    twin = Engine(parse_policy(FIVE_SCOPES.encode()), MemoryStore(memory_clock))
    engine = Engine(parse_policy(FIVE_SCOPES.encode()), cluster_store)
    start = clock.now_ms()

    async def both(at: int, call: Call) -> dict[str, object]:
        clock.set(start + at)
        memory_clock.set(start + at)
        got = observed(await engine.check(call))
        assert got == observed(await twin.check(call)), call
        return got

    alice = Call(user="alice", tool="terminal", call_id="a1", cost=0.5)
    assert (await both(0, alice))["decision"] == "allow"
    # bob exhausts the global counter (2 per minute) through his own counters and tool.
    assert (await both(100, Call(user="bob", tool="ls", call_id="b1", cost=0.5)))[
        "decision"
    ] == "allow"
    before = raw_state(cluster)
    refused = await both(200, Call(user="alice", tool="terminal", call_id="a2", cost=0.5))
    assert refused["decision"] == "deny"
    assert refused["violations"] == (GLOBAL,)
    assert refused["remaining"] == {PER_USER: 4, PER_TOOL: 4, SPEND: 9.5, LANES: 2, GLOBAL: 0}
    after = raw_state(cluster)
    assert_same_state(before, after)
    assert record_key("a2") not in after  # no record, no pending marker
    # Without the dry run the four earlier slots were committed, then given back.
    assert releases == (0 if cluster_store.precheck else 4)
    # A new clock-aligned minute: the same call goes through, counted once everywhere.
    again = await both(
        conformance.MINUTE_ENDS_AT, Call(user="alice", tool="terminal", call_id="a3", cost=0.5)
    )
    assert again["decision"] == "allow"
    assert again["remaining"] == {PER_USER: 3, PER_TOOL: 4, SPEND: 9.0, LANES: 1, GLOBAL: 1}


# ------------------------------------------------------------------------ concurrency

PROCESSES, CHECKS, LIMIT = 4, 100, 50
TIGHT = rule_name("tight", THIRDS[1], tool_key(Kind.TOKEN_BUCKET))
RACE_POLICY = f"""
version: 1
rules:
  - {{name: {PER_USER}, per: [user], rate: 1000/hour}}
  - {{name: {SPEND}, per: [user], budget: 10000.00/day}}
  - {{name: {TIGHT}, per: [tool], rate: {LIMIT}/hour, algorithm: token_bucket, burst: {LIMIT}}}
  - {{name: {LANES}, per: [tool], concurrency: 1000}}
  - {{name: {GLOBAL}, per: [], rate: 1000/hour}}
"""


async def _race(url: str, precheck: bool, barrier: Any, worker: int) -> list[str]:
    store = store_from_url(url, timeout_ms=20_000)  # Redis TIME: no injected clock
    assert isinstance(store, ClusterStore)
    store.precheck = precheck
    try:
        engine = Engine(parse_policy(RACE_POLICY.encode()), store)
        await store.start()
        barrier.wait(timeout=60)
        decisions = await asyncio.gather(
            *(
                engine.check(Call("alice", "terminal", f"w{worker}-{i}", cost=1.0))
                for i in range(CHECKS)
            )
        )
    finally:
        await store.close()
    return [f"{d.decision}{' degraded' if d.degraded else ''}" for d in decisions]


def _race_worker(url: str, precheck: bool, barrier: Any, results: Any, worker: int) -> None:
    try:
        results.put((worker, asyncio.run(_race(url, precheck, barrier, worker))))
    except BaseException:
        results.put((worker, traceback.format_exc()))


@pytest.mark.parametrize("precheck", [True, False], ids=["precheck", "no-precheck"])
@pytest.mark.slow
def test_exactly_the_limit_is_allowed_across_slots_under_concurrency(
    cluster: RedisClusterServers, precheck: bool
) -> None:
    cluster.flush()
    slots = sorted(
        slot_of(k)
        for k in (*KEYS.values(), counter_key(TIGHT, Kind.TOKEN_BUCKET, [("tool", "terminal")]))
    )
    tight_slot = slot_of(counter_key(TIGHT, Kind.TOKEN_BUCKET, [("tool", "terminal")]))
    assert slots[0] < tight_slot < slots[-1]  # slots commit before it and after it
    outcomes, _ = race(_race_worker, (cluster.url, precheck), PROCESSES)
    counts: Counter[str] = Counter()
    for worker, outcome in outcomes:
        assert isinstance(outcome, list), f"worker {worker} failed:\n{outcome}"
        counts.update(outcome)
    assert counts == {"allow": LIMIT, "deny": PROCESSES * CHECKS - LIMIT}

    async def usage() -> dict[str, tuple[float, float | None]]:
        store = store_from_url(cluster.url, timeout_ms=5_000)
        try:
            engine = Engine(parse_policy(RACE_POLICY.encode()), store)
            found = await engine.usage("alice", "terminal")
            return {u.rule: (u.used, u.reserved) for u in found}
        finally:
            await store.close()

    # Every refused call gave back whatever it had committed: each counter moved by
    # exactly the allowed calls (the budget holds their 50 reservations of 1.00).
    assert asyncio.run(usage()) == {
        PER_USER: (LIMIT, None),
        SPEND: (0, float(LIMIT)),
        TIGHT: (LIMIT, None),
        LANES: (LIMIT, None),
        GLOBAL: (LIMIT, None),
    }
    records = cluster.keys("rw:call:*")
    assert len(records) == LIMIT  # the allowed calls; no refusal left a claim behind
    clients = cluster.clients()
    for key, node in records.items():
        assert clients[node].hget(key, "s") == b"open"
    for client in clients:
        client.close()


# ----------------------------------------------------------------- idempotency, settle


async def test_replays_duplicates_conflicts_and_settle_across_slots(
    make_cluster_store: Callable[..., ClusterStore], clock: FakeClock
) -> None:
    store = make_cluster_store(clock)
    await store.start()
    engine = Engine(parse_policy(FIVE_SCOPES.encode()), store, clock=clock)
    call = Call(user="alice", tool="terminal", call_id="job-1", cost=2.0)
    first = await engine.check(call)
    assert first.allowed
    assert not first.replayed
    again = await engine.check(call)
    assert again.replayed
    assert [v.remaining for v in again.limits] == [v.remaining for v in first.limits]
    # Five copies of one new call at once: one is decided, four wait for it and replay.
    copies = await asyncio.gather(
        *(engine.check(Call("alice", "terminal", "job-2", cost=2.0)) for _ in range(5))
    )
    assert sorted(d.replayed for d in copies) == [False, True, True, True, True]
    usage = {u.rule: u for u in await engine.usage("alice", "terminal")}
    assert usage[PER_USER].used == 2
    assert usage[SPEND].reserved == 4.0
    assert usage[LANES].used == 2
    with pytest.raises(CallIdConflict):
        await engine.check(Call("mallory", "terminal", "job-1"))
    # Settle: the budget (one slot) and the lane (another) are settled together, once.
    settled = await engine.settle("job-1", 0.5)
    assert (settled.outcome, settled.charged) == ("settled", {SPEND: 0.5})
    assert (await engine.settle("job-1", 0.5)).outcome == "already_settled"
    assert (await engine.settle("never-seen")).outcome == "unknown"
    # Another user's credential cannot settle it (the record says whose call it is).
    assert (await engine.settle("job-2", 5.0, lambda user: user == "bob")).outcome == "unknown"
    usage = {u.rule: u for u in await engine.usage("alice", "terminal")}
    assert (usage[SPEND].used, usage[SPEND].reserved) == (0.5, 2.0)
    assert usage[LANES].used == 1
    # The mark is made only on the record read (its fingerprint), in its own slot.
    found = await store.read_holds(record_key("job-2"))
    assert found is not None
    status, _ = await store.settle(record_key("job-2"), "job-2", None, found.holds, "bob|x")
    assert status == SettleStatus.UNKNOWN
    assert (await engine.settle("job-2", 0.5, lambda user: user == "alice")).outcome == "settled"


async def test_reset_and_the_audit_list_reach_every_node(
    cluster: RedisClusterServers, make_cluster_store: Callable[..., ClusterStore], clock: FakeClock
) -> None:
    store = make_cluster_store(clock)
    await store.start()
    engine = Engine(parse_policy(FIVE_SCOPES.encode()), store, clock=clock)
    for user in ("alice", "bob"):
        assert (await engine.check(Call(user, "terminal", f"{user}-1", cost=0.1))).allowed
    nodes = set(cluster.keys("rw:{*").values())
    assert len(nodes) == 3
    deleted = await engine.reset(user="alice")
    assert deleted == 2  # her sliding window and her budget
    assert {u.rule: u.used for u in await engine.usage("alice")}[PER_USER] == 0
    assert {u.rule: u.used for u in await engine.usage("bob")}[PER_USER] == 1
    await store.push_denials(["one", "two", "three"], keep=2)
    assert await store.recent_denials(10) == ["three", "two"]
    assert DENIALS_KEY in cluster.keys("rw:denials")
    await store.ping()


async def test_notification_claims_and_tallies_reach_keys_on_every_node(
    cluster: RedisClusterServers, make_cluster_store: Callable[..., ClusterStore], clock: FakeClock
) -> None:
    """Each notification key stands alone (store/keys.py): a tally's pipeline sends each
    to its own node, and a claim is taken once wherever it lands."""
    store = make_cluster_store(clock)
    await store.start()
    keys = [refusal_count_key("r", f"user-{n}", 0) for n in range(12)]
    assert len({slot_of(key) for key in keys}) > 1
    assert await store.tally([(key, n, 60_000) for n, key in enumerate(keys, 1)]) == list(
        range(1, 13)
    )
    assert await store.tally([(keys[0], 5, 60_000)]) == [6]
    claim = notice_key("budget.exhausted", "daily", [("user", "alice")], 0)
    assert [await store.claim(claim, 60_000) for _ in range(3)] == [True, False, False]


async def test_the_fleet_poll_is_one_script_on_one_node(
    make_cluster_store: Callable[..., ClusterStore], clock: FakeClock
) -> None:
    """Its keys share the overrides' hash tag: the poll's script runs on their node."""
    store = make_cluster_store(clock)
    await store.start()
    assert await store.announce("reset") == 1
    await store.put_override("ovr_1", "{}", 10)
    state = await store.beat("host:1/10", '{"n": 1}', 10_000)
    assert (state.overrides_version, dict(state.changes)) == (1, {"reset": 1})
    assert await store.reports() == {"host:1/10": '{"n": 1}'}


async def test_a_node_that_lost_the_script_gets_it_again(
    cluster: RedisClusterServers, make_cluster_store: Callable[..., ClusterStore], clock: FakeClock
) -> None:
    """A restarted or promoted node has an empty script cache: that node gets the script
    by EVAL on first use, whatever the other nodes do."""
    store = make_cluster_store(clock)
    await store.start()
    engine = Engine(parse_policy(FIVE_SCOPES.encode()), store, clock=clock)
    assert (await engine.check(Call("alice", "terminal", "c1", cost=0.1))).allowed
    for client in cluster.clients():
        client.script_flush()
        client.close()
    decision = await engine.check(Call("alice", "terminal", "c2", cost=0.1))
    assert (decision.allowed, decision.degraded) == (True, False)
    assert (await engine.settle("c1")).outcome == "settled"


# ----------------------------------------------------------------------- round trips


async def test_round_trips_per_decision(
    make_cluster_store: Callable[..., ClusterStore], clock: FakeClock
) -> None:
    store = make_cluster_store(clock)
    await store.start()
    scripts: list[str] = []
    real_run = store._run

    async def counting_run(keys: list[str], args: list[Any]) -> list[int]:
        scripts.append(str(args[0]))
        return await real_run(keys, args)

    store._run = counting_run  # type: ignore[method-assign]
    one_rule = Engine(parse_policy(b"version: 1\nrules:\n  - {name: r, rate: 5/minute}\n"), store)
    # One slot, no record (a generated call_id, nothing held): one script call, as on a
    # single node.
    await one_rule.check(Call("alice", "terminal", "generated-1", named=False))
    assert scripts == ["group"]
    scripts.clear()
    # A named call: claim the call_id, commit, record.
    await one_rule.check(Call("alice", "terminal", "named-1"))
    assert scripts == ["claim", "group", "record"]
    scripts.clear()
    # Five slots: claim and five dry runs at once, five commits, the record.
    five = Engine(parse_policy(FIVE_SCOPES.encode()), store, clock=clock)
    await five.check(Call("alice", "terminal", "named-2", cost=0.1))
    assert Counter(scripts) == {"claim": 1, "group": 10, "record": 1}
    assert scripts[-1] == "record"


# ------------------------------------------------------------------ interrupted calls


async def interrupted(
    store: ClusterStore, clock: FakeClock, fail_on: str, how: str
) -> dict[str, tuple[float, float | None]]:
    """Decide one five-slot call whose commit in `fail_on`'s slot is sent and executed,
    but whose reply never arrives (`how`: an error, or a deadline that cancels it)."""
    real_group = store._group

    async def losing_reply(group: Any, ops: Any, now: str, call_id: str, *, dry: bool) -> Any:
        reply = await real_group(group, ops, now, call_id, dry=dry)
        if not dry and any(ops[i].key == KEYS[fail_on] for i in group.indices):
            if how == "error":
                raise StoreError("the reply was lost")
            await asyncio.sleep(30)  # cancelled by the deadline below
        return reply

    store._group = losing_reply  # type: ignore[method-assign]
    engine = Engine(parse_policy(FIVE_SCOPES.encode()), store, clock=clock)
    call = Call("alice", "terminal", "cut", cost=1.0)
    if how == "error":
        decision = await engine.check(call)
        assert (decision.decision, decision.degraded) == ("allow", True)  # fail: open
    else:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await engine.check(call)
    deadline = time.monotonic() + 5
    while store._background and time.monotonic() < deadline:  # the give-back runs
        await asyncio.sleep(0.01)
    assert not store._background
    store._group = real_group  # type: ignore[method-assign]
    return {u.rule: (u.used, u.reserved) for u in await engine.usage("alice", "terminal")}


@pytest.mark.parametrize("how", ["error", "deadline"])
async def test_an_interrupted_call_gives_back_all_but_the_uncertain_rate_unit(
    cluster: RedisClusterServers,
    make_cluster_store: Callable[..., ClusterStore],
    clock: FakeClock,
    how: str,
) -> None:
    """docs/cluster.md, worst case: the commits that were answered are taken back; in the
    slot whose answer was lost, a reservation or a slot is released (keyed by call_id)
    but a rate unit stays counted until it expires."""
    store = make_cluster_store(clock)
    await store.start()
    usage = await interrupted(store, clock, PER_TOOL, how)
    assert usage == {
        PER_USER: (0, None),  # committed before, given back
        PER_TOOL: (1, None),  # its reply was lost: stays counted (over-count by one)
        SPEND: (0, 0.0),  # given back
        LANES: (0, None),  # committed before (or never reached): not held
        GLOBAL: (0, None),  # never reached
    }
    assert record_key("cut") not in cluster.keys("rw:call:*")  # the claim was dropped
    cluster.flush()
    usage = await interrupted(store, clock, LANES, how)
    assert usage[LANES] == (0, None)  # a lost slot commit: the lease is released anyway
    assert usage[PER_USER] == (0, None)
    assert usage[SPEND] == (0, 0.0)


async def test_a_call_whose_record_reply_is_lost_is_given_back_whole(
    cluster: RedisClusterServers, make_cluster_store: Callable[..., ClusterStore], clock: FakeClock
) -> None:
    """The last step (the record) ran, but its reply was lost: every slot is given back,
    and the record this check wrote is dropped, so a retry decides afresh."""
    store = make_cluster_store(clock)
    await store.start()
    real_run = store._run

    async def losing_record(keys: list[str], args: list[Any]) -> list[int]:
        reply = await real_run(keys, args)
        if args[0] == "record":
            raise StoreError("the reply was lost")
        return reply

    store._run = losing_record  # type: ignore[method-assign]
    engine = Engine(parse_policy(FIVE_SCOPES.encode()), store, clock=clock)
    decision = await engine.check(Call("alice", "terminal", "cut", cost=1.0))
    assert (decision.decision, decision.degraded) == ("allow", True)
    deadline = time.monotonic() + 5
    while store._background and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    store._run = real_run  # type: ignore[method-assign]
    assert cluster.keys("rw:*") == {}  # nothing counted, reserved, leased or recorded
    retry = await engine.check(Call("alice", "terminal", "cut", cost=1.0))
    assert (retry.allowed, retry.replayed, retry.degraded) == (True, False, False)


# ------------------------------------------------- the store-based suites, on the cluster


class ClusterSeenAsRedis(ClusterStore, RedisStore):
    """The cluster store, for the suites' raw-state helpers: they read `store._client` when
    the store is a RedisStore, and a RedisCluster client answers the same commands (SCAN
    on every primary, the others in the slot of their key). Every store method is the
    cluster store's (it comes first in the MRO)."""


@pytest.fixture(params=[True, False], ids=["precheck", "no-precheck"])
async def store(
    request: pytest.FixtureRequest,
    make_cluster_store: Callable[..., ClusterStore],
    clock: FakeClock,
) -> ClusterStore:
    """Overrides conftest's `store` for this module: the suites below run on the cluster,
    with and without the dry look (without it, refusals commit and give back)."""
    made = make_cluster_store(clock)
    seen = ClusterSeenAsRedis(
        made._client, made.description, clock, timeout_ms=2_000, precheck=request.param
    )
    await seen.start()
    return seen


globals().update(store_tests("cluster"))


@pytest.mark.slow  # waits out a give-back's 20 s on a real cluster
async def test_close_stops_a_give_back_that_outlives_its_wait(
    make_cluster_store: Callable[..., ClusterStore], clock: FakeClock
) -> None:
    """A give-back still running when the store closes is cancelled, not left to reopen
    connections after the close (they leaked when the event loop ended)."""
    store = make_cluster_store(clock)
    await store.start()
    reached: list[str] = []

    async def slow_give_back() -> None:
        await asyncio.sleep(60)
        reached.append("after the close")  # would reconnect here
        await store._client.get("rw:after-close")

    store._spawn(slow_give_back())
    (task,) = store._background
    await store.close()
    assert task.cancelled()
    assert not store._background
    assert reached == []
