"""`GET /v1/admin/spend`: what each budget rule charged per UTC day and scope, as JSON or
CSV, through the app in-process on a fake clock (the store's records are held to the
charges in tests/conformance/test_spend_records.py; here, the route's reading of them).

Attacked: every parameter with garbage, negative and huge values (a 422 naming it);
names that a spreadsheet would run as a formula (neutralised in CSV, kept exact in
JSON); glob characters and Unicode; a viewer may read, a check token may not.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest
import redis.asyncio as aioredis

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.store import MemoryStore, Store
from ratewarden.store.redis_store import RedisStore
from ratewarden.vocabulary import CallKind
from ratewarden.wire.bodies import ModelUsage
from tests.helpers.app import assert_error_shape, build_app, serving
from tests.helpers.redis_server import RedisServer

# 2023-11-14T22:13:37.345Z, as the conftest clock
START_MS = 1_700_000_017_345
DAY_MS = 86_400_000
POLICY = """\
version: 1
defaults: {timezone: UTC, reservation_ttl: 10m}
rules:
  - {name: daily-spend, per: [user], budget: 5.00/day, currency: USD}
  - {name: team-spend, per: [team], budget: 50.00/day, currency: EUR}
  - {name: per-minute, rate: 100/minute}
"""
TOKENS: dict[str, Any] = {"admin_tokens": ["adm"], "viewer_tokens": ["view"], "api_tokens": ["chk"]}
ADMIN = {"Authorization": "Bearer adm"}


async def spend_some(app: Any, calls: list[tuple[str, str, float, float | None]]) -> None:
    """Check and settle each (user, team, estimate, actual) through the engine."""
    engine = app.state.engine
    for i, (user, team, estimate, actual) in enumerate(calls):
        found = await engine.check(Call(user, "t", f"c{len(user)}-{i}", team=team, cost=estimate))
        assert found.allowed, found.message
        await engine.settle(f"c{len(user)}-{i}", actual)


async def test_rows_per_day_rule_and_scope_with_totals() -> None:
    clock = FakeClock(START_MS)
    app = build_app(POLICY, MemoryStore(clock), **TOKENS)
    async with serving(app) as http:
        await spend_some(app, [("alice", "red", 0.50, 0.30), ("bob", "red", 0.20, None)])
        clock.advance(2 * 3_600_000)  # past UTC midnight: a second day
        await spend_some(app, [("alice", "red", 0.10, 0.05)])
        answer = (await http.get("/v1/admin/spend", headers=ADMIN)).json()
        assert answer["since"] == "2023-11-09"
        assert answer["until"] == "2023-11-15"
        rows = [
            (r["day"], r["rule"], r["scope"], r["amount"], r["currency"]) for r in answer["rows"]
        ]
        assert rows == [
            ("2023-11-14", "daily-spend", {"user": "alice"}, 0.3, "USD"),
            ("2023-11-14", "daily-spend", {"user": "bob"}, 0.2, "USD"),
            ("2023-11-14", "team-spend", {"team": "red"}, 0.5, "EUR"),
            ("2023-11-15", "daily-spend", {"user": "alice"}, 0.05, "USD"),
            ("2023-11-15", "team-spend", {"team": "red"}, 0.05, "EUR"),
        ]
        assert answer["totals"] == [
            {"currency": "EUR", "amount": 0.55},
            {"currency": "USD", "amount": 0.55},
        ]
        assert answer["truncated"] is False
        assert answer["retention_days"] == 90
        alice = (await http.get("/v1/admin/spend?user=alice&since=1d", headers=ADMIN)).json()
        assert [(r["day"], r["amount"]) for r in alice["rows"]] == [("2023-11-15", 0.05)]
        red = await http.get(
            "/v1/admin/spend?team=red&rule=team-spend&since=2023-11-14&until=2023-11-14",
            headers=ADMIN,
        )
        assert [r["amount"] for r in red.json()["rows"]] == [0.5]
        both = await http.get("/v1/admin/spend?user=alice&team=red", headers=ADMIN)
        assert both.json()["rows"] == []  # no budget is per user and team at once


async def test_csv_for_chargeback_neutralises_formulas() -> None:
    clock = FakeClock(START_MS)
    app = build_app(POLICY, MemoryStore(clock), **TOKENS)
    hostile = ['=HYPERLINK("http://evil","x")', "+1+1", "-2", "@SUM(A1)", "\tx", "ユーザー*[?]"]
    async with serving(app) as http:
        await spend_some(app, [(name, name, 0.01, None) for name in hostile])
        got = await http.get("/v1/admin/spend?format=csv", headers=ADMIN)
        assert got.status_code == 200
        assert got.headers["content-type"] == "text/csv; charset=utf-8"
        assert got.headers["content-disposition"] == (
            'attachment; filename="ratewarden-spend-2023-11-08-2023-11-14.csv"'
        )
        table = list(csv.reader(io.StringIO(got.text)))
        assert table[0] == [
            "day", "rule", "user", "team", "scope", "amount", "currency", "model"
        ]  # fmt: skip
        users = {row[2] for row in table[1:] if row[1] == "daily-spend"}
        assert users == {"'" + name for name in hostile[:-1]} | {hostile[-1]}
        assert all(not cell.startswith(("=", "+", "-", "@", "\t")) for row in table for cell in row)
        assert {row[5] for row in table[1:]} == {"0.01"}  # amounts: plain numbers
        # JSON keeps every name exactly
        answer = (await http.get("/v1/admin/spend", headers=ADMIN)).json()
        assert {r["scope"].get("user") for r in answer["rows"]} - {None} == set(hostile)
        for name in hostile:
            one = await http.get("/v1/admin/spend", params={"user": name}, headers=ADMIN)
            assert [r["scope"] for r in one.json()["rows"]] == [{"user": name}], name


async def test_a_negative_amount_is_a_number_in_csv() -> None:
    clock = FakeClock(START_MS)
    app = build_app(POLICY, MemoryStore(clock), **TOKENS)
    engine = app.state.engine
    async with serving(app) as http:
        await engine.check(Call("alice", "t", "c1", cost=0.80))
        clock.advance(10 * 60_000)
        await engine.usage("alice")  # charged 0.80 at its estimate
        clock.advance(DAY_MS)  # tomorrow: the late settle only adds an excess, never refunds
        await engine.check(Call("alice", "t", "c2", cost=0.80))
        clock.advance(10 * 60_000)
        await engine.usage("alice")
        await engine.settle("c2", 0.000001)  # same day: refunds 0.799999
        table = list(csv.reader(io.StringIO((await http.get(
            "/v1/admin/spend?format=csv&user=alice&rule=daily-spend", headers=ADMIN
        )).text)))  # fmt: skip
        assert [row[5] for row in table[1:]] == ["0.8", "0.000001"]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("since=garbage", "since"),
        ("since=-7d", "since"),
        ("since=0d", "since"),
        ("since=99999d", "since"),
        ("since=3661d", "since"),
        ("since=2023-02-30", "since"),
        ("since=7d%0a", "since"),
        ("since=%D9%A7d", "since"),  # an Arabic-Indic 7
        ("since=%EF%BC%97d", "since"),  # a fullwidth 7
        ("until=%D9%A2%D9%A0%D9%A2%D9%A6-01-01", "until"),
        ("since=" + "9" * 40, "since"),
        ("until=tomorrow", "until"),
        ("until=2023-11-13&since=2023-11-14", "since"),
        ("format=xlsx", "format"),
        ("user=", "user"),
        ("user=" + "u" * 257, "user"),
        ("rule=" + "r" * 65, "rule"),
    ],
)
async def test_every_parameter_is_validated_naming_it(query: str, field: str) -> None:
    app = build_app(POLICY, MemoryStore(FakeClock(START_MS)), **TOKENS)
    async with serving(app) as http:
        got = await http.get(f"/v1/admin/spend?{query}", headers=ADMIN)
    assert got.status_code == 422, got.text
    body = got.json()
    assert_error_shape(body)
    assert any(f["field"].split(".")[-1] == field for f in body["fields"]), body


async def test_a_viewer_reads_it_and_a_check_token_does_not() -> None:
    app = build_app(POLICY, MemoryStore(FakeClock(START_MS)), **TOKENS)
    async with serving(app) as http:
        viewer = await http.get("/v1/admin/spend", headers={"Authorization": "Bearer view"})
        check = await http.get("/v1/admin/spend", headers={"Authorization": "Bearer chk"})
        nobody = await http.get("/v1/admin/spend")
    assert viewer.status_code == 200
    assert check.status_code == 403
    assert nobody.status_code == 401


async def test_rows_are_capped_and_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    from ratewarden.service import spend

    monkeypatch.setattr(spend, "MAX_ROWS", 3)
    clock = FakeClock(START_MS)
    app = build_app(POLICY, MemoryStore(clock), **TOKENS)
    async with serving(app) as http:
        await spend_some(app, [(f"u{i}", "red", 0.01, None) for i in range(5)])
        answer = (await http.get("/v1/admin/spend", headers=ADMIN)).json()
    assert len(answer["rows"]) == 3
    assert answer["truncated"] is True


MODEL_POLICY = """\
version: 1
defaults: {timezone: UTC, reservation_ttl: 10m}
models:
  "house-*": {input: 2, output: 8}
rules:
  - {name: daily-spend, match: {kind: any}, per: [user], budget: 5.00/day}
"""


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_rows_say_the_part_model_calls_spent(backend: str, redis_server: RedisServer) -> None:
    """A day of one model call (priced usage: 0.006) and one tool call (0.25): the row's
    amount is both, its `model` the model call's part, in JSON and CSV; a day of tool
    calls only says 0."""
    clock = FakeClock(START_MS)
    store: Store = MemoryStore(clock)
    if backend == "redis":
        redis_server.client().flushall()
        store = RedisStore(aioredis.Redis.from_url(redis_server.url), redis_server.url, clock)
    app = build_app(MODEL_POLICY, store, **TOKENS)
    engine = app.state.engine
    async with serving(app) as http:
        model = Call("alice", "house-7b", "m1", kind=CallKind.MODEL, input_tokens=1000,
                     max_output_tokens=2000)  # fmt: skip
        assert (await engine.check(model)).allowed
        assert (await engine.check(Call("alice", "browse", "t1", cost=0.25))).allowed
        await engine.settle("m1", usage=ModelUsage(input_tokens=1000, output_tokens=500))
        await engine.settle("t1", 0.25)
        clock.advance(2 * 3_600_000)  # past UTC midnight: a day of tool calls only
        assert (await engine.check(Call("alice", "browse", "t2", cost=0.10))).allowed
        await engine.settle("t2", None)
        answer = (await http.get("/v1/admin/spend?user=alice", headers=ADMIN)).json()
        rows = [(r["day"], r["amount"], r["model"]) for r in answer["rows"]]
        assert rows == [("2023-11-14", 0.256, 0.006), ("2023-11-15", 0.1, 0.0)]
        got = await http.get("/v1/admin/spend?user=alice&format=csv", headers=ADMIN)
        table = list(csv.reader(io.StringIO(got.text)))
        assert [(row[0], row[5], row[7]) for row in table[1:]] == [
            ("2023-11-14", "0.256", "0.006"), ("2023-11-15", "0.1", "0"),
        ]  # fmt: skip
