"""The store's activity log (store/base.py `ActivityLog`), the same on every store (the
memory store, fakeredis, a real Redis; and a real Redis Cluster, through
tests/helpers/redis_cluster.py `STORE_SUITES`): sketches add up and keep their top;
per-user lists keep each user's own refusals, bounded in length and in users."""

from __future__ import annotations

import json

from ratewarden.clock import FakeClock
from ratewarden.store import Store
from ratewarden.store.base import Layer, SketchCounts, UserDenialCaps

HOUR_MS = 3_600_000
CAPS = UserDenialCaps(keep=3, users=4, ttl_ms=HOUR_MS)


def member(user: str) -> str:
    return json.dumps(user)


async def test_sketches_add_up_per_bucket_and_sketch(store: Store) -> None:
    add = SketchCounts("m1", HOUR_MS, {"refused": {member("ann"): 2, member("bob"): 1}})
    await store.add_to_sketches([add], keep=10)
    again = SketchCounts("m1", HOUR_MS, {"refused": {member("ann"): 3}, "decided": {"x": 7}})
    other = SketchCounts("h1", HOUR_MS, {"refused": {member("bob"): 4}})
    await store.add_to_sketches([again, other], keep=10)
    assert await store.read_sketches(["m1", "h1", "m2"], "refused") == [
        {member("ann"): 5, member("bob"): 1},
        {member("bob"): 4},
        {},
    ]
    assert await store.sketch_scores(["m1", "h1", "m0"], "refused", member("bob")) == [1, 4, 0]
    assert await store.read_sketches(["m1"], "decided") == [{"x": 7}]


async def test_a_sketch_keeps_its_top_members_only(store: Store) -> None:
    counts = {member(f"user-{n:03}"): n for n in range(1, 201)}
    await store.add_to_sketches([SketchCounts("m5", HOUR_MS, {"refused": counts})], keep=50)
    kept = (await store.read_sketches(["m5"], "refused"))[0]
    assert kept == {member(f"user-{n:03}"): n for n in range(151, 201)}


async def test_hostile_members_are_kept_as_they_are(store: Store) -> None:
    names = ["a\x00b", "\n{x}:*", "ünï😀", "'); DROP", "a" * 256]
    counts = {json.dumps([n, "rule", n]): 1 for n in names}
    await store.add_to_sketches([SketchCounts("m9", HOUR_MS, {"why": counts})], keep=10)
    assert await store.read_sketches(["m9"], "why") == [counts]


async def test_each_user_keeps_their_own_refusals(store: Store, clock: FakeClock) -> None:
    noisy = [("noisy", f"n{i}") for i in range(500)]
    await store.push_user_denials([("quiet", "q0"), *noisy], clock.now_ms(), CAPS)
    await store.push_user_denials([("noisy", "n-last")], clock.now_ms() + 1, CAPS)
    assert await store.user_denials("quiet", 10) == ["q0"]
    assert await store.user_denials("noisy", 10) == ["n-last", "n499", "n498"]
    assert await store.user_denials("noisy", 1) == ["n-last"]
    assert await store.user_denials("nobody", 10) == []


async def test_only_the_most_recently_refused_users_keep_a_list(
    store: Store, clock: FakeClock
) -> None:
    for n in range(10):
        await store.push_user_denials([(f"user-{n}", f"e{n}")], clock.now_ms() + n, CAPS)
    kept = [n for n in range(10) if await store.user_denials(f"user-{n}", 5)]
    assert kept == [6, 7, 8, 9]


async def test_users_with_hostile_names_have_their_own_lists(
    store: Store, clock: FakeClock
) -> None:
    names = ["a:b", "a%3Ab", "{users}", "x\x00y", "😀", "*"]
    lines = [(n, f"for {n!r}") for n in names]
    for n, pair in enumerate(lines):  # one after the other: the last four are kept
        await store.push_user_denials([pair], clock.now_ms() + n, CAPS)
    kept = {n: await store.user_denials(n, 5) for n in names}
    assert {n: lines for n, lines in kept.items() if lines} == {
        n: [f"for {n!r}"] for n in names[-4:]
    }  # the cap of four users holds, and no name reads another's list


async def test_a_layer_passes_the_activity_operations_through(
    store: Store, clock: FakeClock
) -> None:
    layered = Layer(store)
    await layered.add_to_sketches([SketchCounts("m1", HOUR_MS, {"s": {"a": 1}})], keep=5)
    assert await layered.read_sketches(["m1"], "s") == [{"a": 1}]
    assert await layered.sketch_scores(["m1"], "s", "a") == [1]
    await layered.push_user_denials([("u", "e")], clock.now_ms(), CAPS)
    assert await layered.user_denials("u", 5) == ["e"]


async def test_an_empty_sketch_adds_nothing(store: Store) -> None:
    await store.add_to_sketches([SketchCounts("m1", HOUR_MS, {"s": {}, "t": {"a": 1}})], 5)
    assert await store.read_sketches(["m1"], "s") == [{}]
    assert await store.read_sketches(["m1"], "t") == [{"a": 1}]
    await store.add_to_sketches([SketchCounts("m2", HOUR_MS, {"s": {}})], 5)
    assert await store.read_sketches(["m2"], "s") == [{}]
