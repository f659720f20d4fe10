"""Who is blocked (service/activity.py): the in-process tally and its cap, the routes
`GET /v1/admin/blocked` and `/v1/admin/activity` and their parameters, on the memory
store in process; then the fleet on a real Redis (two `ratewarden serve` processes), a
noisy user who cannot push another out, and 10 000 users who cannot grow the store past
its caps (asserted on the Redis keys)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar, TypeVarTuple

import httpx
import pytest

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Decision, Verdict
from ratewarden.service.activity import (
    DECIDED,
    FLUSH_EVERY_S,
    OTHERS,
    REFUSED,
    RULE_DECIDED,
    RULE_REFUSED,
    WHY,
    ActivityRecorder,
    Tally,
)
from ratewarden.store import MemoryStore, Store, StoreError
from ratewarden.store.base import Layer
from ratewarden.store.keys import SKETCH_KEEP, USER_DENIALS_KEEP, USER_DENIALS_USERS
from tests.helpers.app import assert_error_shape, build_app, serving
from tests.helpers.daemon import Daemon, clean_environment, running_daemon
from tests.helpers.redis_server import RedisServer

T = TypeVar("T")
Args = TypeVarTuple("Args")
POLICY = """\
version: 1
rules:
  - name: no-evil
    match: {tool: "evil*"}
    deny: "no evil tools"
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 2/minute
"""


def verdict(rule: str, admitted: bool, message: str = "") -> Verdict:
    return Verdict(rule, "rate", admitted, 2, 0, None, 60.0, message)


def allowed(rule: str = "r") -> Decision:
    return Decision("allow", "c", limits=(verdict(rule, True),))


def denied(*rules: str) -> Decision:
    """Refused by `rules`; the last one's sentence is the decision's (the binding one)."""
    violations = tuple(verdict(r, False, f"{r} says no") for r in rules)
    return Decision("deny", "c", message=f"{rules[-1]} says no", violations=violations)


# -- the tally ------------------------------------------------------------------------------


def test_a_tally_counts_decisions_refusals_and_the_binding_rule() -> None:
    tally = Tally()
    tally.watched = frozenset({"ann"})  # refused lately: every decision of hers counts
    tally.count(allowed("r"), Call("ann", "terminal", "c"))
    tally.count(allowed("r"), Call("cy", "terminal", "c"))  # never refused: per rule only
    tally.count(denied("r", "s"), Call("ann", "terminal", "c"))
    tally.count(Decision("ask", "c", violations=(verdict("q", False),)), Call("bob", "web", "c"))
    adds = tally.take()
    assert adds is not None
    assert tally.refused == ["ann", "bob"]
    assert adds[DECIDED] == {'"ann"': 2, '"bob"': 1}
    assert adds[REFUSED] == {'"ann"': 1, '"bob"': 1}
    assert adds[WHY] == {'["ann", "s", "terminal"]': 1, '["bob", "q", "web"]': 1}
    assert adds[RULE_DECIDED] == {'"r"': 3, '"s"': 1, '"q"': 1}
    assert adds[RULE_REFUSED] == {'"r"': 1, '"s"': 1, '"q"': 1}
    assert tally.take() is None  # taken: the next flush starts from nothing


def test_a_tally_past_its_cap_counts_the_rest_as_others() -> None:
    tally = Tally(cap=3)
    for n in range(1_000):
        tally.count(denied("r"), Call(f"user-{n}", f"tool-{n}", "c"))
    tally.count(denied("r"), Call("user-1", "tool-1", "c"))  # one counted before the cap
    assert len(tally.users) == 4
    assert len(tally.why) == 4
    adds = tally.take()
    assert adds is not None
    assert adds[REFUSED] == {'"user-0"': 1, '"user-1"': 2, '"user-2"': 1, OTHERS: 997}
    assert adds[WHY][OTHERS] == 997
    assert sum(adds[WHY].values()) == 1_001


def test_hostile_names_stay_distinct_members() -> None:
    tally = Tally()
    names = ["null", '"null"', "a\x00b", "ü😀", "[1]", ""]
    for name in names:
        tally.count(denied("r"), Call(name, name, "c"))
    adds = tally.take()
    assert adds is not None
    assert len(adds[REFUSED]) == len(names)
    assert OTHERS not in adds[REFUSED]
    assert sorted(json.loads(m) for m in adds[REFUSED]) == sorted(names)


# -- the routes, in process -----------------------------------------------------------------


async def flushed(app: Any) -> None:
    recorder: ActivityRecorder = app.state.activity
    await recorder.flush()


async def test_blocked_lists_users_with_their_top_rule_and_tool() -> None:
    clock = FakeClock(1_700_000_000_000)
    app = build_app(POLICY, MemoryStore(clock))
    async with serving(app) as http:
        for user, tool, n in (("ann", "terminal", 6), ("bob", "evil-x", 3), ("cy", "terminal", 1)):
            for _ in range(n):
                await http.post("/v1/check", json={"user": user, "tool": tool})
        await flushed(app)
        answer = (await http.get("/v1/admin/blocked", params={"window": "15m"})).json()
        # ann's two calls allowed before her first refusal are not hers: she was not watched
        assert [(u["user"], u["refusals"], u["decisions"]) for u in answer["users"]] == [
            ("ann", 4, 4),
            ("bob", 3, 3),
        ]
        ann, bob = answer["users"]
        assert (ann["top_rule"], ann["top_tool"]) == ("terminal-per-minute", "terminal")
        assert (bob["top_rule"], bob["top_tool"], bob["top_tool_refusals"]) == (
            "no-evil",
            "evil-x",
            3,
        )
        assert answer["approximate"] is False
        assert answer["others"] == 0
        clock.advance(20 * 60_000)  # past the 15 minutes; still within the hour and day
        assert (await http.get("/v1/admin/blocked")).json()["users"] == []
        hour = (await http.get("/v1/admin/blocked", params={"window": "1h"})).json()
        assert [u["user"] for u in hour["users"]] == ["ann", "bob"]
        day = (await http.get("/v1/admin/blocked", params={"window": "1d", "limit": 1})).json()
        assert [u["user"] for u in day["users"]] == ["ann"]


async def test_activity_charts_a_user_a_rule_and_the_top_rules() -> None:
    clock = FakeClock(1_700_000_000_000)
    app = build_app(POLICY, MemoryStore(clock))
    async with serving(app) as http:
        for _ in range(3):  # allowed, allowed, refused
            await http.post("/v1/check", json={"user": "ann", "tool": "terminal"})
        await flushed(app)
        clock.advance(61_000)  # the next minute: her window is empty again
        for tool in ("terminal", "terminal", "evil"):  # allowed, allowed, refused
            await http.post("/v1/check", json={"user": "ann", "tool": tool})
        await flushed(app)
        user = (await http.get("/v1/admin/activity", params={"user": "ann"})).json()
        assert len(user["times"]) == 60
        assert user["times"][-1] % 60 == 0
        [series] = user["series"]
        # Refused once, she is watched: her allowed calls count from then on.
        assert (series["decisions"][-2:], series["refusals"][-2:]) == ([1, 3], [1, 1])
        rule = (await http.get("/v1/admin/activity", params={"rule": "no-evil"})).json()
        assert rule["series"][0]["refusals"][-2:] == [0, 1]
        top = (await http.get("/v1/admin/activity", params={"resolution": "hour"})).json()
        assert len(top["times"]) == 24
        assert {s["name"]: sum(s["refusals"]) for s in top["series"]} == {
            "terminal-per-minute": 1,
            "no-evil": 1,
        }


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/v1/admin/blocked", {"window": "2h"}, "window"),
        ("/v1/admin/blocked", {"window": ""}, "window"),
        ("/v1/admin/blocked", {"limit": "0"}, "limit"),
        ("/v1/admin/blocked", {"limit": str(10**30)}, "limit"),
        ("/v1/admin/blocked", {"limit": "1e3"}, "limit"),
        ("/v1/admin/activity", {"resolution": "second"}, "resolution"),
        ("/v1/admin/activity", {"user": ""}, "user"),
        ("/v1/admin/activity", {"user": "u" * 257}, "user"),
        ("/v1/admin/activity", {"rule": "r" * 65}, "rule"),
        ("/v1/admin/activity", {"user": "a", "rule": "b"}, "user"),
    ],
)
async def test_hostile_parameters_are_refused_naming_them(
    path: str, params: dict[str, str], field: str
) -> None:
    async with serving(build_app(POLICY)) as http:
        answer = await http.get(path, params=params)
    assert answer.status_code == 422, answer.text
    assert_error_shape(answer.json())
    assert field in [f["field"] for f in answer.json()["fields"]]


@pytest.mark.parametrize("user", ["\x00\x01\n\r", "<script>", "*", "{users}", "😀" * 64])
async def test_any_user_name_is_only_looked_up(user: str) -> None:
    async with serving(build_app(POLICY)) as http:
        await http.post("/v1/check", json={"user": user, "tool": "evil"})
        answer = await http.get("/v1/admin/activity", params={"user": user})
        denials = await http.get("/v1/denials", params={"user": user})
    assert answer.status_code == 200
    assert answer.json()["series"][0]["name"] == user
    assert [d["user"] for d in denials.json()["denials"]] == [user]


# -- the fleet, on a real Redis -------------------------------------------------------------


DENY_ALL = """\
version: 1
rules:
  - name: nothing-today
    match: {tool: "*"}
    deny: "closed"
"""


@pytest.fixture
def fleet(redis_url: str, tmp_path: Path) -> Iterator[tuple[Daemon, Daemon]]:
    """Two `ratewarden serve` on one real Redis, refusing every call."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(DENY_ALL)
    flags = ("--store-url", redis_url, "--policy", str(policy))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    env = clean_environment()
    with (
        running_daemon(tmp_path / "a", *flags, env=env) as first,
        running_daemon(tmp_path / "b", *flags, env=env) as second,
    ):
        yield first, second


def refuse(daemon: Daemon, users: list[str], tool: str = "terminal") -> None:
    """One refused call for each of `users`, a batch of 100 a request."""
    with httpx.Client(base_url=daemon.url, trust_env=False, timeout=30) as http:
        for at in range(0, len(users), 100):
            calls = [{"user": u, "tool": tool} for u in users[at : at + 100]]
            answer = http.post("/v1/check/batch", json={"calls": calls})
            assert answer.status_code == 200, answer.text


def get(daemon: Daemon, path: str, **params: Any) -> Any:
    with httpx.Client(base_url=daemon.url, trust_env=False, timeout=10) as http:
        answer = http.get(path, params=params)
        assert answer.status_code == 200, answer.text
        return answer.json()


def eventually(probe: Any, within_s: float = 15.0) -> Any:
    """`probe()` once it is truthy (the daemons flush every 5 s), boundedly."""
    deadline = time.monotonic() + within_s
    while True:
        found = probe()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)  # bounded polling of daemons that flush on their own


def top(daemon: Daemon, **params: Any) -> dict[str, int]:
    answer = get(daemon, "/v1/admin/blocked", **params)
    return {u["user"]: u["refusals"] for u in answer["users"]}


@pytest.mark.timeout(120)
def test_the_fleet_sums_refusals_through_every_daemon(fleet: tuple[Daemon, Daemon]) -> None:
    first, second = fleet
    refuse(first, ["ann"] * 3 + ["bob"])
    refuse(second, ["ann"] * 2 + ["cy"] * 4, tool="web")
    want = {"ann": 5, "cy": 4, "bob": 1}
    for daemon in fleet:  # either daemon answers for both
        assert eventually(lambda d=daemon: top(d) == want), top(daemon)
    ann = get(second, "/v1/admin/blocked")["users"][0]
    assert (ann["user"], ann["top_rule"], ann["top_tool"]) == ("ann", "nothing-today", "terminal")
    series = get(first, "/v1/admin/activity", user="ann")["series"][0]
    assert sum(series["refusals"]) == 5
    assert sum(series["decisions"]) == 5


@pytest.mark.timeout(180)
def test_a_noisy_user_pushes_out_no_one_else(
    fleet: tuple[Daemon, Daemon], redis_server: RedisServer
) -> None:
    first, second = fleet
    refuse(first, ["quiet"])
    refuse(second, ["noisy"] * 3_000)
    assert eventually(lambda: top(first).get("noisy") == 3_000), top(first)
    assert top(first)["quiet"] == 1  # still in the top list
    # The shared list holds the newest 1 000 of every user: all the noisy one's. The
    # quiet user's own list still has their refusal.
    shared = get(first, "/v1/denials", limit=1000)["denials"]
    assert {d["user"] for d in shared} == {"noisy"}
    quiet = get(second, "/v1/denials", user="quiet")["denials"]
    assert [(d["user"], d["rule"]) for d in quiet] == [("quiet", "nothing-today")]
    noisy = get(first, "/v1/denials", user="noisy", limit=1000)["denials"]
    assert len(noisy) == 1000  # its own list and the shared one, together


@pytest.mark.slow  # 12 000 users through a real daemon
@pytest.mark.timeout(300)
def test_ten_thousand_users_keep_every_key_within_its_cap(
    fleet: tuple[Daemon, Daemon], redis_server: RedisServer
) -> None:
    first, second = fleet
    users = [f"user-{n:05}" for n in range(12_000)]
    refuse(first, users[::2])
    refuse(second, users[1::2])
    client = redis_server.client()

    def flushed_all() -> bool:
        answer = get(first, "/v1/admin/blocked", limit=100)
        counted = sum(u["refusals"] for u in answer["users"])
        return bool(answer["approximate"]) and counted == 100

    assert eventually(flushed_all, 30)
    time.sleep(FLUSH_EVERY_S + 1)  # the last flushes of both daemons
    sketches = list(client.scan_iter(match="rw:activity:*", count=1000))
    assert sketches, "no sketch written"
    sizes = {key: client.zcard(key) for key in sketches}
    assert max(sizes.values()) == SKETCH_KEEP  # full, and no more
    index = "rw:denials:{users}"
    assert client.zcard(index) == USER_DENIALS_USERS
    lists = list(client.scan_iter(match=index + ":*", count=1000))
    assert len(lists) == USER_DENIALS_USERS
    assert max(client.llen(key) for key in lists) <= USER_DENIALS_KEEP
    assert client.llen("rw:denials") == 1000
    memory = sum(client.memory_usage(key) or 0 for key in [*sketches, index, *lists])
    print(f"who-is-blocked keys after 12 000 users: {memory / 1e6:.1f} MB")


# -- off the decision path --------------------------------------------------------------------


class Recording(Layer):
    """A store that notes each operation it is asked for, by name."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.operations: list[str] = []

    async def around(
        self, operation: str, function: Callable[[*Args], Awaitable[T]], *args: *Args
    ) -> T:
        self.operations.append(operation)
        return await function(*args)


async def test_a_decision_asks_the_store_for_nothing_more() -> None:
    """Allowed checks (nothing to audit) between two flushes: each is one `evaluate`, the
    counting is in process; the flush then adds the second's tally in one operation."""
    store = Recording(MemoryStore(FakeClock(1_700_000_000_000)))
    app = build_app(POLICY.replace("2/minute", "1000/minute"), store)
    async with serving(app) as http:
        before = len(store.operations)
        for n in range(50):
            await http.post("/v1/check", json={"user": f"u{n}", "tool": "terminal"})
        during = store.operations[before:]
        await flushed(app)
        flush = store.operations[before + len(during) :]
    assert during == ["evaluate"] * 50
    assert flush == ["read_sketches", "add_to_sketches"]  # whom the fleet refused; the tally


class Refusing(Layer):
    async def around(
        self, operation: str, function: Callable[[*Args], Awaitable[T]], *args: *Args
    ) -> T:
        if operation == "add_to_sketches":
            raise StoreError("down")
        return await function(*args)


async def test_a_flush_the_store_refuses_is_dropped_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(1_700_000_000_000)
    tally = Tally()
    recorder = ActivityRecorder(tally, Refusing(MemoryStore(clock)), clock)
    with caplog.at_level(logging.WARNING, logger="ratewarden.activity"):
        for _ in range(3):
            tally.count(denied("r"), Call("ann", "terminal", "c"))
            await recorder.flush()  # no exception: the flusher goes on
            clock.advance(1_000)
    assert tally.take() is None  # dropped, not kept to grow
    said = [r for r in caplog.records if "not stored" in r.getMessage()]
    assert len(said) == 1  # once a minute at most


async def test_a_user_refused_by_another_process_is_watched_here_too() -> None:
    clock = FakeClock(1_700_000_000_000)
    store = MemoryStore(clock)
    here, there = Tally(), Tally()
    recorders = ActivityRecorder(here, store, clock), ActivityRecorder(there, store, clock)
    there.count(denied("r"), Call("ann", "terminal", "c"))
    await recorders[1].flush()
    here.count(allowed("r"), Call("ann", "terminal", "c"))
    before = here.take()
    assert before is not None
    assert before[DECIDED] == {}  # not watched here yet: counted for its rule only
    await recorders[0].flush()  # a flush reads whom the fleet refused (every 10 s)
    assert here.watched == {"ann"}
    here.count(allowed("r"), Call("ann", "terminal", "c"))
    adds = here.take()
    assert adds is not None
    assert adds[DECIDED] == {'"ann"': 1}


def test_the_watched_users_here_are_bounded_and_expire() -> None:
    clock = FakeClock(1_700_000_000_000)
    tally = Tally()
    recorder = ActivityRecorder(tally, MemoryStore(clock), clock)
    recorder._watch([f"user-{n}" for n in range(SKETCH_KEEP + 500)], clock.now_ms())
    assert len(tally.watched) == SKETCH_KEEP
    assert "user-0" not in tally.watched  # the oldest go first
    clock.advance(3_600_001)
    recorder._watch(["fresh"], clock.now_ms())
    assert tally.watched == {"fresh"}
