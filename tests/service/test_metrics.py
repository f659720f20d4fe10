"""Prometheus metrics: exact counter values after scripted traffic, bounded label values,
no user identity in any label, and exact sums across `serve --workers 2`.

Every in-process test builds its own `CollectorRegistry` and a store on a fake clock, so
values are read with `registry.get_sample_value` and never leak between tests.
"""

from __future__ import annotations

import random
import string
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from ratewarden.clock import FakeClock
from ratewarden.policy import Policy, parse_policy
from ratewarden.service.app import create_app
from ratewarden.service.settings import Settings
from ratewarden.store import MemoryStore, Store, store_from_url
from ratewarden.store.redis_store import RedisStore
from tests.helpers.app import serving
from tests.helpers.daemon import clean_environment, running_daemon
from tests.helpers.redis_server import RedisServer, free_port

START_MS = 1_700_000_000_000 + 17_345  # mid-minute, like the shared `clock` fixture


@dataclass(repr=False)
class Rig:
    """An app in-process with its own registry, and the means to read it."""

    http: httpx.AsyncClient
    registry: CollectorRegistry
    clock: FakeClock
    policy: Policy

    def value(self, name: str, **labels: str) -> float:
        """A sample's value; 0 when it was never created (counters start at nothing)."""
        found = self.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    def total(self, name: str) -> float:
        """The sum of a sample over every label combination."""
        return sum(
            s.value for metric in self.registry.collect() for s in metric.samples if s.name == name
        )

    def series(self, name: str) -> dict[str, float]:
        """Every sample named `name`, keyed by its labels (`a=x,b=y`, sorted)."""
        return {
            ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())): s.value
            for metric in self.registry.collect()
            for s in metric.samples
            if s.name == name
        }

    def labels_of(self, name: str, label: str) -> set[str]:
        return {
            s.labels[label]
            for metric in self.registry.collect()
            for s in metric.samples
            if s.name == name and label in s.labels
        }

    async def check(self, **body: Any) -> dict[str, Any]:
        response = await self.http.post("/v1/check", json=body)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    async def settle(self, call_id: str, **body: Any) -> httpx.Response:
        return await self.http.post(f"/v1/calls/{call_id}/settle", json=body or None)


@asynccontextmanager
async def rig(
    policy_text: str, store: Store | None = None, clock: FakeClock | None = None
) -> AsyncIterator[Rig]:
    clock = clock or FakeClock(START_MS)
    registry = CollectorRegistry()
    policy = parse_policy(policy_text.encode())
    # Explicit values, so a RATEWARDEN_* variable in the test environment changes nothing.
    settings = Settings(store_url="memory://", fail=None, store_timeout_ms=100, audit_args=False)
    app = create_app(settings, store=store or MemoryStore(clock), policy=policy, registry=registry)
    async with serving(app) as http:
        yield Rig(http, registry, clock, policy)


def unreachable_store() -> Store:
    """A Redis store on a port nobody listens on: every operation fails at once."""
    return store_from_url(f"redis://127.0.0.1:{free_port()}/0", timeout_ms=100)


# -- every decision kind, counted exactly (memory and a real redis-server) --------------

SCENARIO_POLICY = """\
version: 1
tools:
  "browser_*": {label: browser, cost: 0}
  web_search: {cost: 0.125}
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    rate: 3/minute
  - name: browser-concurrency
    match: {tool: "browser_*"}
    concurrency: 1
  - name: search-spend
    match: {tool: web_search}
    budget: 0.50/day
    currency: EUR
  - name: deploy-ask
    match: {tool: deploy}
    rate: 1/hour
    on_exceed: ask
  - name: notes-shadow
    match: {tool: notes}
    rate: 1/minute
    mode: shadow
"""


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def scenario_store(request: pytest.FixtureRequest, clock: FakeClock) -> Store:
    if request.param == "memory":
        return MemoryStore(clock)
    url: str = request.getfixturevalue("redis_url")
    return RedisStore(aioredis.Redis.from_url(url), url, clock)


async def test_every_decision_kind_is_counted_exactly(
    scenario_store: Store, clock: FakeClock
) -> None:
    async with rig(SCENARIO_POLICY, scenario_store, clock) as r:
        terminal = [await r.check(user="alice", tool="terminal") for _ in range(4)]
        browser = [await r.check(user="bob", tool="browser_open") for _ in range(2)]
        search = [await r.check(user="carol", tool="web_search") for _ in range(5)]
        deploy = [await r.check(user="dave", tool="deploy") for _ in range(2)]
        deploy.append(await r.check(user="dave", tool="deploy", approved=True))
        notes = [await r.check(user="erin", tool="notes") for _ in range(2)]
        unruled = await r.check(user="frank", tool="zzz")

        assert [d["decision"] for d in terminal] == ["allow"] * 3 + ["deny"]
        assert [d["decision"] for d in browser] == ["allow", "deny"]
        assert [d["decision"] for d in search] == ["allow"] * 4 + ["deny"]
        assert [(d["decision"], d["approved"]) for d in deploy] == [
            ("allow", False),
            ("ask", False),
            ("allow", True),
        ]
        assert [[s["rule"] for s in n["shadow"]] for n in notes] == [[], ["notes-shadow"]]
        assert unruled["decision"] == "allow"

        assert r.series("ratewarden_checks_total") == {
            "decision=allow,mode=enforce": 12,
            "decision=deny,mode=enforce": 3,
            "decision=ask,mode=enforce": 1,
            "decision=allow,mode=shadow": 1,
        }
        assert r.value("ratewarden_check_duration_seconds_count") == 17
        assert r.series("ratewarden_blocked_calls_total") == {
            "reason=rate,rule=terminal-per-minute,tool=terminal": 1,
            "reason=concurrency,rule=browser-concurrency,tool=browser": 1,
            "reason=budget,rule=search-spend,tool=web_search": 1,
        }
        assert r.series("ratewarden_ask_decisions_total") == {
            "reason=rate,rule=deploy-ask,tool=deploy": 1
        }
        assert r.series("ratewarden_approved_calls_total") == {"rule=deploy-ask,tool=deploy": 1}
        assert r.series("ratewarden_shadow_blocks_total") == {
            "reason=rate,rule=notes-shadow,tool=notes": 1
        }
        # Near the limit: the call that fills each rule (3/3, 1/1 slot, 0.50 of 0.50, 1/1).
        assert r.series("ratewarden_near_limit_total") == {
            "rule=terminal-per-minute,tool=terminal": 1,
            "rule=browser-concurrency,tool=browser": 1,
            "rule=search-spend,tool=web_search": 1,
            "rule=deploy-ask,tool=deploy": 1,
            "rule=notes-shadow,tool=notes": 1,
        }
        assert r.series("ratewarden_budget_reserved_total") == {
            "currency=EUR,rule=search-spend": 0.5
        }
        assert r.series("ratewarden_degraded_decisions_total") == {}
        assert r.series("ratewarden_store_errors_total") == {}
        # One round trip per check that has rules; `zzz` has none and never reaches the store.
        assert decision_store_operations(r) == {
            "operation=start": 1,
            "operation=evaluate": 16,
        }
        await settle_and_count(r, search, browser)


def decision_store_operations(r: Rig) -> dict[str, float]:
    """Store operations counted, but the audit trail's: it pushes the recent denials on a
    timer of its own (every 0.2 s), so whether a push has happened yet depends on how fast
    the machine runs the test, not on what the test did."""
    operations = r.series("ratewarden_store_duration_seconds_count")
    return {name: n for name, n in operations.items() if name != "operation=push_denials"}


async def settle_and_count(
    r: Rig, search: list[dict[str, Any]], browser: list[dict[str, Any]]
) -> None:
    """Settles: an actual cost, the estimate, twice (counts once), unknown, a slot."""
    first, second = search[0]["call_id"], search[1]["call_id"]
    assert (await r.settle(first, cost=0.0625)).json()["charged"] == {"search-spend": 0.0625}
    assert (await r.settle(second)).json()["charged"] == {"search-spend": 0.125}
    assert (await r.settle(second, cost=0.5)).json()["outcome"] == "already_settled"
    assert (await r.settle("never-checked")).status_code == 404
    assert (await r.settle(browser[0]["call_id"])).json()["outcome"] == "settled"

    assert r.series("ratewarden_budget_spent_total") == {"currency=EUR,rule=search-spend": 0.1875}
    assert r.series("ratewarden_settles_total") == {
        "outcome=settled": 3,
        "outcome=already_settled": 1,
        "outcome=unknown": 1,
    }
    assert decision_store_operations(r) == {
        "operation=start": 1,
        "operation=evaluate": 16,
        "operation=read_holds": 5,
        "operation=settle": 4,
    }
    # The slot is back: the next browser call is allowed and counted as one more check.
    assert (await r.check(user="bob", tool="browser_open"))["decision"] == "allow"
    assert r.value("ratewarden_check_duration_seconds_count") == 18


async def test_batch_checks_count_each_call(clock: FakeClock) -> None:
    async with rig(SCENARIO_POLICY, clock=clock) as r:
        calls = [{"user": "alice", "tool": "terminal"} for _ in range(5)]
        response = await r.http.post("/v1/check/batch", json={"calls": calls})
        assert [x["decision"] for x in response.json()["results"]] == ["allow"] * 3 + ["deny"] * 2
        assert r.value("ratewarden_checks_total", decision="allow", mode="enforce") == 3
        assert r.value("ratewarden_checks_total", decision="deny", mode="enforce") == 2
        blocked = "ratewarden_blocked_calls_total"
        assert r.value(blocked, tool="terminal", rule="terminal-per-minute", reason="rate") == 2
        assert r.value("ratewarden_check_duration_seconds_count") == 5


async def test_usage_reads_are_store_operations_but_not_checks(clock: FakeClock) -> None:
    async with rig(SCENARIO_POLICY, clock=clock) as r:
        await r.check(user="alice", tool="terminal")
        response = await r.http.get("/v1/usage", params={"user": "alice", "tool": "terminal"})
        assert response.status_code == 200
        assert r.value("ratewarden_check_duration_seconds_count") == 1
        assert r.total("ratewarden_checks_total") == 1
        assert r.value("ratewarden_store_duration_seconds_count", operation="evaluate") == 2


# -- near the limit and soft limits: exact boundaries ----------------------------------

NEAR_POLICY = """\
version: 1
rules:
  - name: five
    match: {tool: five}
    rate: 5/minute
  - name: ten
    match: {tool: ten}
    rate: 10/minute
  - name: dollar
    match: {tool: spend}
    budget: 1.00/day
  - name: soft
    match: {tool: soft}
    budget: 1.00/day
    soft_limit: 50%
"""


async def test_near_limit_counts_from_exactly_80_percent_of_a_rate(clock: FakeClock) -> None:
    async with rig(NEAR_POLICY, clock=clock) as r:
        seen = []
        for _ in range(6):
            await r.check(user="u", tool="five")
            seen.append(r.value("ratewarden_near_limit_total", tool="five", rule="five"))
        # 4 of 5 is exactly 80%: calls 4 and 5 count; the refused 6th does not.
        assert seen == [0, 0, 0, 1, 2, 2]
        seen = []
        for _ in range(10):
            await r.check(user="u", tool="ten")
            seen.append(r.value("ratewarden_near_limit_total", tool="ten", rule="ten"))
        assert seen == [0] * 7 + [1, 2, 3]


async def test_near_limit_counts_from_exactly_80_percent_of_a_budget(clock: FakeClock) -> None:
    async with rig(NEAR_POLICY, clock=clock) as r:
        seen = []
        for _ in range(6):
            await r.check(user="u", tool="spend", cost=0.2)
            seen.append(r.value("ratewarden_near_limit_total", tool="spend", rule="dollar"))
        # 0.80 of 1.00 after the 4th call; the 6th is refused (1.00 is spent).
        assert seen == [0, 0, 0, 1, 2, 2]
        assert r.value("ratewarden_budget_reserved_total", rule="dollar", currency="USD") == 1.0


async def test_near_limit_at_exactly_80_percent_of_a_3_dollar_budget(clock: FakeClock) -> None:
    policy = "version: 1\nrules:\n  - name: three\n    budget: 3.00/day\n"
    async with rig(policy, clock=clock) as r:
        for _ in range(4):
            assert (await r.check(user="u", tool="t", cost=0.6))["decision"] == "allow"
        # 2.40 of 3.00 is exactly 80%.
        assert r.value("ratewarden_near_limit_total", tool="other", rule="three") == 1


async def test_soft_limit_counts_every_allowed_call_from_the_threshold(clock: FakeClock) -> None:
    async with rig(NEAR_POLICY, clock=clock) as r:
        seen = []
        decisions = []
        for _ in range(5):
            decisions.append((await r.check(user="u", tool="soft", cost=0.25))["decision"])
            seen.append(r.value("ratewarden_budget_soft_limit_total", rule="soft"))
        assert decisions == ["allow"] * 4 + ["deny"]
        # 0.50 of 1.00 (exactly the 50% soft limit) after the 2nd call.
        assert seen == [0, 1, 2, 3, 3]
        assert r.total("ratewarden_budget_soft_limit_total") == 3


# -- idempotent replays ------------------------------------------------------------------

REPLAY_POLICY = """\
version: 1
tools:
  web_search: {cost: 0.5}
rules:
  - name: spend
    match: {tool: web_search}
    budget: 1.00/day
  - name: watch
    match: {tool: web_search}
    rate: 1/minute
    mode: shadow
"""


async def test_a_replayed_check_is_not_counted_twice_in_money_or_near_limit(
    clock: FakeClock,
) -> None:
    async with rig(REPLAY_POLICY, clock=clock) as r:
        await r.check(user="u", tool="web_search", call_id="a")
        await r.check(user="u", tool="web_search", call_id="b")
        replay = await r.check(user="u", tool="web_search", call_id="b")
        assert replay["replayed"] is True
        assert r.value("ratewarden_budget_reserved_total", rule="spend", currency="USD") == 1.0
        # "b" filled the budget (and the 1/minute shadow rule was full since "a").
        assert r.value("ratewarden_near_limit_total", tool="web_search", rule="spend") == 1
        assert r.value("ratewarden_near_limit_total", tool="web_search", rule="watch") == 1
        assert r.value("ratewarden_check_duration_seconds_count") == 3
        assert r.total("ratewarden_checks_total") == 3
        await r.settle("b", cost=0.25)
        await r.settle("b", cost=0.25)
        assert r.value("ratewarden_budget_spent_total", rule="spend", currency="USD") == 0.25


async def test_a_replayed_check_is_not_counted_twice_as_a_shadow_block(clock: FakeClock) -> None:
    async with rig(REPLAY_POLICY, clock=clock) as r:
        await r.check(user="u", tool="web_search", call_id="a")
        await r.check(user="u", tool="web_search", call_id="b")  # the shadow rule is full
        replay = await r.check(user="u", tool="web_search", call_id="b")
        assert replay["replayed"] is True
        shadow = "ratewarden_shadow_blocks_total"
        assert r.value(shadow, tool="web_search", rule="watch", reason="rate") == 1


# -- approved asks -----------------------------------------------------------------------

APPROVAL_POLICY = """\
version: 1
tools:
  web_search: {cost: 0.25}
rules:
  - name: deploys
    match: {tool: deploy}
    rate: 1/hour
    on_exceed: ask
  - name: search-spend
    match: {tool: web_search}
    budget: 0.50/day
    on_exceed: ask
"""


async def test_each_approved_call_past_an_ask_rule_is_counted(clock: FakeClock) -> None:
    async with rig(APPROVAL_POLICY, clock=clock) as r:
        assert (await r.check(user="u", tool="deploy"))["decision"] == "allow"
        assert (await r.check(user="u", tool="deploy"))["decision"] == "ask"
        for _ in range(3):
            assert (await r.check(user="u", tool="deploy", approved=True))["approved"] is True
        assert r.value("ratewarden_approved_calls_total", tool="deploy", rule="deploys") == 3
        assert (
            r.value("ratewarden_ask_decisions_total", tool="deploy", rule="deploys", reason="rate")
            == 1
        )
        # An approved call within the limit went past nothing.
        assert (await r.check(user="v", tool="deploy", approved=True))["decision"] == "allow"
        assert r.value("ratewarden_approved_calls_total", tool="deploy", rule="deploys") == 3
        assert r.value("ratewarden_checks_total", decision="allow", mode="enforce") == 5


async def test_an_approval_is_not_counted_past_a_shadow_ask_rule(clock: FakeClock) -> None:
    policy = """\
version: 1
rules:
  - name: watch
    match: {tool: deploy}
    rate: 0/minute
    mode: shadow
    on_exceed: ask
"""
    async with rig(policy, clock=clock) as r:
        answer = await r.check(user="u", tool="deploy", approved=True)
        assert [s["rule"] for s in answer["shadow"]] == ["watch"]
        assert answer["warnings"] == []  # the engine approved past nothing
        shadow = "ratewarden_shadow_blocks_total"
        assert r.series(shadow) == {"reason=rate,rule=watch,tool=deploy": 1}
        assert r.series("ratewarden_approved_calls_total") == {}


async def test_money_reserved_by_approved_calls_past_a_budget_is_counted(
    clock: FakeClock,
) -> None:
    async with rig(APPROVAL_POLICY, clock=clock) as r:
        ids = []
        for _ in range(2):
            ids.append((await r.check(user="u", tool="web_search"))["call_id"])
        assert (await r.check(user="u", tool="web_search"))["decision"] == "ask"
        for _ in range(2):
            answer = await r.check(user="u", tool="web_search", approved=True)
            assert answer["approved"] is True
            ids.append(answer["call_id"])
        usage = await r.http.get("/v1/usage", params={"user": "u", "tool": "web_search"})
        assert usage.json()["limits"][0]["reserved"] == 1.0  # 4 calls x 0.25 are held
        for call_id in ids:
            await r.settle(call_id)
        assert r.value("ratewarden_budget_spent_total", rule="search-spend", currency="USD") == 1.0
        # Every reserved cent was reported as reserved before it was spent.
        assert (
            r.value("ratewarden_budget_reserved_total", rule="search-spend", currency="USD") == 1.0
        )


# -- the store unreachable --------------------------------------------------------------

DEGRADED_POLICY = """\
version: 1
rules:
  - name: closed-rule
    match: {tool: vault}
    rate: 10/minute
    fail: closed
  - name: open-rule
    match: {tool: notes}
    rate: 10/minute
    fail: open
"""


async def test_fail_closed_and_fail_open_are_counted_with_the_store_errors() -> None:
    async with rig(DEGRADED_POLICY, store=unreachable_store()) as r:
        vault = [await r.check(user="u", tool="vault") for _ in range(2)]
        notes = [await r.check(user="u", tool="notes") for _ in range(3)]
        unruled = await r.check(user="u", tool="zzz")
        assert [(v["decision"], v["degraded"]) for v in vault] == [("deny", True)] * 2
        assert [v["violations"][0]["kind"] for v in vault] == ["unavailable"] * 2
        assert [(n["decision"], n["degraded"]) for n in notes] == [("allow", True)] * 3
        assert (unruled["decision"], unruled["degraded"]) == ("allow", False)

        assert r.value("ratewarden_degraded_decisions_total", decision="deny") == 2
        assert r.value("ratewarden_degraded_decisions_total", decision="allow") == 3
        assert r.total("ratewarden_degraded_decisions_total") == 5
        blocked = "ratewarden_blocked_calls_total"
        assert r.value(blocked, tool="vault", rule="closed-rule", reason="unavailable") == 2
        assert r.total(blocked) == 2
        assert r.value("ratewarden_checks_total", decision="deny", mode="enforce") == 2
        assert r.value("ratewarden_checks_total", decision="allow", mode="enforce") == 4
        assert r.value("ratewarden_check_duration_seconds_count") == 6

        errors = "ratewarden_store_errors_total"
        assert r.value(errors, operation="start") == 1  # at start-up, and the app kept going
        assert r.value(errors, operation="evaluate") == 5
        assert r.value("ratewarden_store_duration_seconds_count", operation="evaluate") == 5
        assert (await r.http.get("/readyz")).json()["answering"] == "fail mode"
        assert r.value(errors, operation="ping") == 1
        assert (await r.http.get("/v1/usage", params={"user": "u"})).status_code == 503
        assert r.value(errors, operation="evaluate") == 6
        assert r.value(errors, operation="settle") == 0
        assert (await r.settle("x")).status_code == 503
        assert r.value(errors, operation="read_holds") == 1
        # Every failed operation was also timed.
        for operation in ("start", "evaluate", "ping", "read_holds"):
            assert r.value(
                "ratewarden_store_duration_seconds_count", operation=operation
            ) == r.value(errors, operation=operation)


# -- bounded labels, and no user identity ------------------------------------------------

LABEL_POLICY = """\
version: 1
tools:
  terminal: {}
  web_search: {cost: 0}
  "browser_*": {label: browser}
  "mcp__*": {}
rules:
  - name: everything
    per: []
    rate: 0/minute
  - name: files
    match: {tool: "file_*"}
    rate: 100/minute
  - name: deploys
    match: {tool: deploy}
    rate: 100/minute
"""
NAMED_LABELS = {"terminal", "web_search", "deploy", "browser", "mcp__*", "file_*", "other"}


def expected_tool_label(tool: str) -> str:
    """The label the policy above should give `tool` (SPEC §7: named, label, glob, other)."""
    if tool in ("terminal", "web_search", "deploy"):
        return tool
    for prefix, label in (("browser_", "browser"), ("mcp__", "mcp__*"), ("file_", "file_*")):
        if tool.startswith(prefix):
            return label
    return "other"


def random_tools(count: int) -> list[str]:
    rng = random.Random(20240607)
    alphabet = string.ascii_letters + string.digits + "_-.:/ é漢🙂"
    prefixes = ["", "", "", "browser_", "mcp__", "file_", "terminal", "deploy", "Browser_"]
    return [
        rng.choice(prefixes) + "".join(rng.choices(alphabet, k=rng.randint(1, 24)))
        for _ in range(count)
    ]


async def test_tool_labels_stay_within_what_the_policy_names() -> None:
    edge = ["terminal", "web_search", "deploy", "TERMINAL", "terminal ", "browser_", "mcp__"]
    edge += ["file_", "default", "other", "browser", "deploy2", "xbrowser_1", "file"]
    tools = random_tools(200) + edge
    async with rig(LABEL_POLICY) as r:
        for i, tool in enumerate(tools):
            answer = await r.check(user=f"user-{i}", tool=tool)
            assert answer["decision"] == "deny", tool
        labels = set()
        for name in (
            "ratewarden_blocked_calls_total",
            "ratewarden_near_limit_total",
            "ratewarden_shadow_blocks_total",
        ):
            labels |= r.labels_of(name, "tool")
        assert labels <= NAMED_LABELS
        expected = Counter(expected_tool_label(tool) for tool in tools)
        assert len(expected) == len(NAMED_LABELS)  # every kind of label was exercised
        blocked = {
            label: r.value(
                "ratewarden_blocked_calls_total", tool=label, rule="everything", reason="rate"
            )
            for label in NAMED_LABELS
        }
        assert blocked == {label: float(n) for label, n in expected.items()}


async def test_a_glob_in_a_rules_tool_list_labels_its_own_matches() -> None:
    policy = """\
version: 1
rules:
  - name: shell-and-files
    match: {tool: [terminal, "file_*"]}
    rate: 0/minute
"""
    async with rig(policy) as r:
        await r.check(user="u", tool="file_delete")
        await r.check(user="u", tool="terminal")
        blocked = "ratewarden_blocked_calls_total"
        assert r.value(blocked, tool="terminal", rule="shell-and-files", reason="rate") == 1
        assert r.value(blocked, tool="file_*", rule="shell-and-files", reason="rate") == 1


IDENTITY_POLICY = """\
version: 1
tools:
  web_search: {cost: 0.25}
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    rate: 1/minute
  - name: deploy-ask
    match: {tool: deploy}
    rate: 0/minute
    on_exceed: ask
  - name: notes-shadow
    match: {tool: notes}
    rate: 0/minute
    mode: shadow
  - name: spend
    match: {tool: web_search}
    budget: 1.00/day
    soft_limit: 50%
  - name: browser-slots
    match: {tool: browser}
    concurrency: 1
"""


async def test_no_user_identity_appears_anywhere_in_the_exposition(clock: FakeClock) -> None:
    users = ["zq-user-alpha-7731", "discord:zq9911882", "zq Émile «quoted»", "ZQ-OPS-BOB"]
    sessions, teams = ["zq-session-4471"], ["zq-team-5820"]
    secrets = [*users, *sessions, *teams, "zq-call-id-3344"]
    async with rig(IDENTITY_POLICY, clock=clock) as r:
        for i, user in enumerate(users):
            who = {"user": user, "session": sessions[0], "team": teams[0]}
            for tool in ("terminal", "terminal", "deploy", "notes", "browser", "browser"):
                await r.check(**who, tool=tool)
            await r.check(**who, tool="deploy", approved=True)
            for j in range(5):
                await r.check(**who, tool="web_search", call_id=f"zq-call-id-3344-{i}-{j}")
            await r.settle(f"zq-call-id-3344-{i}-0", cost=0.125)
            await r.http.get("/v1/usage", params={"user": user})
        assert (await r.http.get("/v1/denials")).status_code == 200
        text = (await r.http.get("/metrics")).text
        assert r.total("ratewarden_blocked_calls_total") > 0  # the paths above did run
        assert r.total("ratewarden_shadow_blocks_total") > 0
        assert r.total("ratewarden_approved_calls_total") > 0
        assert r.total("ratewarden_budget_soft_limit_total") > 0
        lowered = text.lower()
        for secret in secrets:
            for piece in (secret, *secret.split(":")):
                assert piece.lower() not in lowered, piece
        assert "zq" not in lowered
        values = {v for m in r.registry.collect() for s in m.samples for v in s.labels.values()}
        assert not values & set(secrets)


# -- the exposition itself --------------------------------------------------------------

SPEC_TYPES = {
    "ratewarden_checks_total": "counter",
    "ratewarden_blocked_calls_total": "counter",
    "ratewarden_shadow_blocks_total": "counter",
    "ratewarden_check_duration_seconds": "histogram",
    "ratewarden_store_errors_total": "counter",
    "ratewarden_budget_spent_total": "counter",
    "ratewarden_ask_decisions_total": "counter",
    "ratewarden_approved_calls_total": "counter",
    "ratewarden_near_limit_total": "counter",
    "ratewarden_budget_soft_limit_total": "counter",
    "ratewarden_degraded_decisions_total": "counter",
    "ratewarden_store_duration_seconds": "histogram",
    "ratewarden_budget_reserved_total": "counter",
    "ratewarden_settles_total": "counter",
    "ratewarden_policy_reloads_total": "counter",
    "ratewarden_policy_info": "gauge",
}


async def test_metrics_endpoint_speaks_the_prometheus_text_format(clock: FakeClock) -> None:
    async with rig(SCENARIO_POLICY, clock=clock) as r:
        await r.check(user="u", tool="terminal")
        response = await r.http.get("/metrics")
        assert response.status_code == 200
        content_type = response.headers["content-type"]
        assert content_type == CONTENT_TYPE_LATEST
        assert content_type.split(";")[0] == "text/plain"
        assert "charset=utf-8" in content_type
        text = response.text
        families = list(text_string_to_metric_families(text))
        ours = {f.name for f in families if f.name.startswith("ratewarden_")}
        assert len(ours) >= len(SPEC_TYPES)
        lines = text.splitlines()
        for family in families:
            exposed = family.name + ("_total" if family.type == "counter" else "")
            helps = [x for x in lines if x.startswith(f"# HELP {exposed} ")]
            types = [x for x in lines if x == f"# TYPE {exposed} {family.type}"]
            assert len(helps) == 1, exposed
            assert len(helps[0]) > len(f"# HELP {exposed} "), exposed
            assert len(types) == 1, exposed
        for name, kind in SPEC_TYPES.items():
            assert f"# TYPE {name} {kind}" in lines, name
            assert any(x.startswith(f"# HELP {name} ") for x in lines), name
        assert 'ratewarden_checks_total{decision="allow",mode="enforce"} 1.0' in lines
        assert "ratewarden_check_duration_seconds_count 1.0" in lines


async def test_policy_info_names_the_version_in_force(clock: FakeClock) -> None:
    async with rig(SCENARIO_POLICY, clock=clock) as r:
        version = r.policy.version
        assert version
        assert r.value("ratewarden_policy_info", version=version) == 1
        assert r.labels_of("ratewarden_policy_info", "version") == {version}
        assert r.value("ratewarden_policy_reloads_total", result="ok") == 1
        assert r.value("ratewarden_policy_reloads_total", result="error") == 0
        served = (await r.http.get("/v1/policy")).json()["version"]
        assert served == version
    async with rig(NEAR_POLICY, clock=clock) as other:
        assert other.policy.version != version
        assert other.labels_of("ratewarden_policy_info", "version") == {other.policy.version}


# -- several workers: one merged view ----------------------------------------------------

WORKERS_POLICY = """\
version: 1
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 10000/minute
  - name: banned
    match: {tool: rm}
    rate: 0/minute
"""
WORKERS_START_TIMEOUT_S = 30.0  # two workers to fork and answer


def one_request(method: str, url: str, body: dict[str, Any] | None = None) -> httpx.Response:
    """One request on a fresh connection, so the kernel may hand it to either worker."""
    with httpx.Client(trust_env=False, timeout=10.0) as http:
        return http.request(method, url, json=body)


def checks_by_worker(directory: Path) -> dict[str, float]:
    """ratewarden_checks_total per worker, read from each worker's own counter file."""
    found = {}
    for path in sorted(directory.glob("counter_*.db")):
        metrics = MultiProcessCollector.merge([str(path)], accumulate=True)  # type: ignore[no-untyped-call]
        found[path.stem] = sum(
            s.value for m in metrics for s in m.samples if s.name == "ratewarden_checks_total"
        )
    return found


def scrape(url: str) -> dict[str, float]:
    """Every sample of one /metrics answer, keyed by name and sorted labels."""
    response = one_request("GET", f"{url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            key = s.name + "".join(f"|{k}={v}" for k, v in sorted(s.labels.items()))
            samples[key] = s.value
    return samples


def plant_stale_counter(directory: Path) -> None:
    """A counter file from a previous run, with 1000 checks; `serve` must not merge it."""
    stale = MmapedDict(str(directory / "counter_999999.db"))  # type: ignore[no-untyped-call]
    key = mmap_key(
        "ratewarden_checks",
        "ratewarden_checks_total",
        ["decision", "mode"],
        ["allow", "enforce"],
        "stale",
    )
    stale.write_value(key, 1000.0, 0.0)  # type: ignore[no-untyped-call]
    stale.close()  # type: ignore[no-untyped-call]


@pytest.mark.redis
@pytest.mark.slow
def test_two_workers_report_exact_sums_on_every_scrape(
    tmp_path: Path, redis_server: RedisServer, redis_url: str
) -> None:
    multiproc = tmp_path / "prometheus"
    multiproc.mkdir()
    plant_stale_counter(multiproc)
    (tmp_path / "policy.yaml").write_text(WORKERS_POLICY)
    env = clean_environment(PROMETHEUS_MULTIPROC_DIR=str(multiproc))
    flags = ("--store-url", redis_url, "--policy", "policy.yaml")
    with (
        running_daemon(tmp_path, "--workers", "2", *flags, env=env, ready="/readyz",
                       start_timeout_s=WORKERS_START_TIMEOUT_S) as served,
        ThreadPoolExecutor(8) as pool,
    ):  # fmt: skip
        url = served.url
        assert not (multiproc / "counter_999999.db").exists()
        allowed = denied = 0
        # Fresh connections, 8 at a time, until both workers have decided some (bounded).
        for _ in range(20):
            bodies = [{"user": f"u{i % 7}", "tool": "rm" if i % 4 == 0 else "terminal"}
                      for i in range(100)]  # fmt: skip
            answers = list(pool.map(lambda b: one_request("POST", f"{url}/v1/check", b), bodies))
            assert all(a.status_code == 200 for a in answers)
            decisions = Counter(a.json()["decision"] for a in answers)
            assert decisions == {"allow": 75, "deny": 25}
            allowed += 75
            denied += 25
            per_worker = checks_by_worker(multiproc)
            if len(per_worker) == 2 and all(per_worker.values()):
                break
        per_worker = checks_by_worker(multiproc)
        assert len(per_worker) == 2, per_worker
        assert all(per_worker.values()), per_worker  # both workers served checks
        total = allowed + denied
        assert sum(per_worker.values()) == total

        for _ in range(8):
            samples = scrape(url)
            checks = {k: v for k, v in samples.items() if k.startswith("ratewarden_checks_total|")}
            assert checks == {
                "ratewarden_checks_total|decision=allow|mode=enforce": allowed,
                "ratewarden_checks_total|decision=deny|mode=enforce": denied,
            }
            assert samples["ratewarden_check_duration_seconds_count"] == total
            evaluate = "ratewarden_store_duration_seconds_count|operation=evaluate"
            assert samples[evaluate] == total
            blocked = "ratewarden_blocked_calls_total|reason=rate|rule=banned|tool=rm"
            assert samples[blocked] == denied
            # One policy load per worker; the info gauge is 1 whichever worker answers.
            assert samples["ratewarden_policy_reloads_total|result=ok"] == 2
            info = [k for k in samples if k.startswith("ratewarden_policy_info|")]
            assert len(info) == 1
            assert samples[info[0]] == 1


def test_every_metric_is_stated_once_in_the_table_and_typed_on_the_class() -> None:
    from prometheus_client import CollectorRegistry

    from ratewarden.service.metrics import METRICS, Metrics

    annotated = {name for name in Metrics.__annotations__ if not name.startswith("_")}
    assert annotated == set(METRICS)
    built = Metrics(CollectorRegistry())
    for attribute, spec in METRICS.items():
        metric = getattr(built, attribute)
        assert isinstance(metric, spec.type), attribute
        assert metric._name == spec.name.removesuffix("_total")
    assert len({spec.name for spec in METRICS.values()}) == len(METRICS)


def test_metrics_are_slotted_so_a_new_metric_costs_a_decision_nothing() -> None:
    """An instance dict of 30 attributes or more stops sharing its keys, and each
    attribute read of a decision's metrics is a dict lookup (metrics.py says what it
    cost); slots are read by index whatever their number."""
    from prometheus_client import CollectorRegistry

    from ratewarden.service.metrics import METRICS, Metrics

    metrics = Metrics(CollectorRegistry())
    assert not hasattr(metrics, "__dict__")
    assert len(Metrics.__slots__) >= 30  # past the shared-keys limit: only slots keep it fast
    assert all(getattr(metrics, name) is not None for name in METRICS)


MODEL_POLICY = """\
version: 1
defaults:
  model_price: {input: 1, output: 1}
models:
  "house-*": {input: 2, output: 8}
rules:
  - {name: daily-spend, match: {kind: any}, per: [user], budget: 5.00/day}
  - {name: team-spend, match: {kind: any}, per: [team], budget: 50.00/day}
  - {name: one-gpt5, match: {model: "gpt-5*"}, per: [user], rate: 1/minute}
"""


async def test_model_calls_are_labelled_by_the_policys_pattern_never_their_name(
    clock: FakeClock,
) -> None:
    """A model call's decisions carry the pattern it matched (`house-*`, `gpt-5*`) or
    `other`; its tokens are counted by direction, its spend once however many budgets
    charged it (two here), never under its raw name."""
    async with rig(MODEL_POLICY, clock=clock) as r:
        call = {"user": "u", "team": "red", "kind": "model", "model": "house-7b",
                "input_tokens": 1000, "max_output_tokens": 1000}  # fmt: skip
        assert (await r.check(**call, call_id="m1"))["decision"] == "allow"
        # Reserved: its most cost, 1000 in at 2 and 1000 out at 8 per million: 0.01 USD.
        reserved = r.value("ratewarden_budget_reserved_total", rule="daily-spend", currency="USD")
        assert reserved == pytest.approx(0.01)
        usage = {"input_tokens": 1000, "output_tokens": 500, "cache_read_tokens": 600,
                 "cache_write_tokens": 100}  # fmt: skip
        settled = await r.settle("m1", status="ok", usage=usage)
        assert settled.status_code == 200, settled.text
        tokens = r.series("ratewarden_model_tokens_total")
        assert tokens == {
            "direction=input,model=house-*": 1000, "direction=output,model=house-*": 500,
            "direction=cache_read,model=house-*": 600, "direction=cache_write,model=house-*": 100,
        }  # fmt: skip
        charged = settled.json()["charged"]
        assert set(charged) == {"daily-spend", "team-spend"}  # two budgets charged it...
        spent = r.series("ratewarden_model_spend_total")
        assert spent == {"currency=USD,model=house-*": charged["daily-spend"]}  # ...once
        assert r.value("ratewarden_budget_spent_total", rule="team-spend", currency="USD") > 0

        gpt5 = {"user": "u", "kind": "model", "model": "gpt-5-mini", "input_tokens": 10}
        assert (await r.check(**gpt5))["decision"] == "allow"
        assert (await r.check(**gpt5))["decision"] == "deny"
        assert r.value("ratewarden_blocked_calls_total", tool="gpt-5*", rule="one-gpt5",
                       reason="rate") == 1  # fmt: skip
        other = {"user": "u", "kind": "model", "model": "mystery-1", "call_id": "m2"}
        assert (await r.check(**other))["decision"] == "allow"
        await r.settle("m2", status="ok", usage={"input_tokens": 5, "output_tokens": 7})
        assert r.value("ratewarden_model_tokens_total", model="other", direction="output") == 7
        exposition = (await r.http.get("/metrics")).text
        for raw in ("house-7b", "gpt-5-mini", "mystery-1"):
            assert raw not in exposition


async def test_a_tool_calls_settle_counts_no_model_series(clock: FakeClock) -> None:
    async with rig(MODEL_POLICY, clock=clock) as r:
        assert (await r.check(user="u", tool="t", cost=0.5, call_id="t1"))["decision"] == "allow"
        assert (await r.settle("t1", cost=0.25)).status_code == 200
        assert r.total("ratewarden_model_spend_total") == 0
        assert r.total("ratewarden_model_tokens_total") == 0
        assert r.value("ratewarden_budget_spent_total", rule="daily-spend", currency="USD") == 0.25
