"""The metrics behind the operator alerts (issue 30, item 7): HTTP answers by route
template and status with bounded labels, the standard process and Python metrics, the
failed-reload gauge, and budget reservations made and settled.

In-process, each app on its own `CollectorRegistry` (tests/service/test_metrics.py's rig).
"""

from __future__ import annotations

import asyncio
import random
import string
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter
from starlette.routing import Route

from ratewarden.clock import FakeClock
from ratewarden.policy import parse_policy
from ratewarden.service.metrics import (
    HTTP_CODES,
    NO_ROUTE,
    HttpAnswers,
    Metrics,
    route_patterns,
    status_code,
)
from tests.helpers.app import build_app, serving
from tests.service.test_metrics import rig
from tests.service.test_reload import BAD_POLICY, POLICY_A, make_app, sample, write

POLICY = """\
version: 1
tools:
  web_search: {cost: 0.125}
  free_search: {cost: 0}
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    rate: 3/minute
  - name: search-spend
    match: {tool: [web_search, free_search]}
    budget: 10.00/day
"""
RESPONSES = "ratewarden_http_responses_total"


def answers_by_label(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {
        (s.labels["route"], s.labels["code"]): s.value
        for m in registry.collect()
        for s in m.samples
        if s.name == RESPONSES
    }


async def test_answers_are_counted_by_route_template_and_status(clock: FakeClock) -> None:
    async with rig(POLICY, clock=clock) as r:
        for _ in range(4):  # 3 allowed, 1 denied: all answered 200
            await r.check(user="u", tool="terminal")
        assert (await r.http.post("/v1/check", json={"tool": 3})).status_code == 422
        assert (await r.http.post("/v1/check/batch", json={"calls": []})).status_code in {
            200, 422,
        }  # fmt: skip
        assert (await r.settle("never-checked")).status_code == 404
        assert (await r.http.get("/no/such/page")).status_code == 404
        assert (await r.http.get("/v1/check")).status_code == 405
        hook = await r.http.post("/v1/hooks/no-such-host", content=b"{}")
        assert (await r.http.get("/metrics")).status_code == 200  # flushes what came before
        assert ("/metrics", "200") not in answers_by_label(r.registry)  # its own: not yet
        assert (await r.http.get("/metrics")).status_code == 200
        counted = answers_by_label(r.registry)
    assert counted[("/v1/check", "200")] == 4
    assert counted[("/v1/check", "422")] == 1
    assert counted[("/v1/check", "405")] == 1
    assert counted[("/v1/calls/{call_id}/settle", "404")] == 1
    assert counted[(NO_ROUTE, "404")] == 1
    assert counted[("/v1/hooks/{host}", str(hook.status_code))] == 1
    assert counted.get(("/metrics", "200")) == 1, counted
    assert not [route for route, _ in counted if "never-checked" in route]


@pytest.mark.parametrize("hot", [True, False])
async def test_refusals_by_auth_and_the_body_cap_are_counted(hot: bool) -> None:
    """Refused before any route runs. On the decision routes, in front of the hot path,
    they are counted by class (`4xx`: 401, 403 or 413), the hot path's own answers
    exactly; elsewhere, and with no hot path, by their code."""
    app = build_app(POLICY, hot=hot, api_tokens=["check-token"], admin_tokens=["admin-token"])
    check = {"Authorization": "Bearer check-token"}
    admin = {"Authorization": "Bearer admin-token"}
    async with serving(app) as http:
        assert (await http.post("/v1/check", json={"user": "u", "tool": "t"})).status_code == 401
        big = {"user": "u", "tool": "t", "args": {"x": "y" * 2_000_000}}
        assert (await http.post("/v1/check", json=big, headers=check)).status_code == 413
        ok = await http.post("/v1/check", json={"user": "u", "tool": "t"}, headers=check)
        assert ok.status_code == 200
        bad = await http.post("/v1/check", json={"user": 3}, headers=check)
        assert bad.status_code == 422
        assert (await http.get("/v1/admin/stats", headers=check)).status_code == 403
        assert (await http.get("/v1/policy")).status_code == 401
        await http.get("/metrics", headers=admin)
        counted = answers_by_label(app.state.observer.metrics.registry)
    refused = (
        {("/v1/check", "4xx"): 2} if hot else {("/v1/check", "401"): 1, ("/v1/check", "413"): 1}
    )
    assert counted == {
        **refused,
        ("/v1/check", "200"): 1,
        ("/v1/check", "422"): 1,
        ("/v1/admin/stats", "403"): 1,
        ("/v1/policy", "401"): 1,
    }


async def test_a_flood_of_random_paths_creates_no_series(clock: FakeClock) -> None:
    """Random paths, path parameters, hook hosts and methods: the series stay those of
    the daemon's route templates and a fixed set of codes, however many requests."""
    rng = random.Random(30)

    def word() -> str:
        return "".join(rng.choices(string.ascii_letters + string.digits + "-_.%", k=12))

    async def flood(count: int) -> None:
        for _ in range(count):
            kind = rng.randrange(5)
            if kind == 0:
                await r.http.get(f"/{word()}/{word()}")
            elif kind == 1:
                await r.http.post(f"/v1/calls/{word()}/settle")
            elif kind == 2:
                await r.http.post(f"/v1/hooks/{word()}", content=word().encode())
            elif kind == 3:
                await r.http.request(rng.choice(["PUT", "DELETE", "PATCH"]), f"/v1/{word()}")
            else:
                await r.http.get(f"/console/{word()}", params={word(): word()})

    async with rig(POLICY, clock=clock) as r:
        await flood(150)
        await r.http.get("/metrics")  # flushes the counts into the counter
        first = answers_by_label(r.registry)
        await flood(600)
        await r.http.get("/metrics")
        then = answers_by_label(r.registry)
    templates = {template for _, template in route_patterns(build_app(POLICY).routes)}
    assert len(set(then) - set(first)) <= 2, set(then) - set(first)  # 600 new paths
    assert sum(then.values()) == 750 + 1  # and the first scrape
    assert {route for route, _ in then} <= templates | {NO_ROUTE}
    assert {code for _, code in then} <= {str(c) for c in HTTP_CODES}
    assert len(then) <= 12, sorted(then)


def test_every_documented_route_is_a_route_label() -> None:
    """The daemon's routes, those of its included routers too, are the `route` values."""
    app = build_app(POLICY)
    templates = {template for _, template in route_patterns(app.routes)}
    assert set(app.openapi()["paths"]) <= templates
    assert {"/v1/check", "/v1/check/batch", "/v1/hooks/{host}", "/metrics"} <= templates


def test_answer_labels_are_bounded_whatever_the_caller_passes() -> None:
    registry = CollectorRegistry()
    counter = Counter("answers", "test", ("route", "code"), registry=registry)

    settle = Route("/v1/calls/{call_id}/settle", endpoint=lambda request: None)
    answers = HttpAnswers(counter, [settle])
    for i in range(500):
        answers.count(f"/raw/path/{i}", 200 + i % 400)  # not a template: NO_ROUTE
    assert not next(iter(counter.collect())).samples  # counted, not yet flushed
    answers.flush()
    samples = next(iter(counter.collect())).samples
    assert {s.labels["route"] for s in samples} == {NO_ROUTE}
    codes = {s.labels["code"] for s in samples}
    assert codes <= {str(c) for c in HTTP_CODES} | {"2xx", "3xx", "4xx", "5xx"}
    assert len(answers._incs) <= 400  # one bound child per (template, status) at most
    assert answers.route_of({"path": "/v1/calls/abc/settle"}) == settle.path_format
    assert answers.route_of({"path": "/v1/calls/abc/settle/more"}) == NO_ROUTE
    assert [status_code(s) for s in (200, 299, 418, 599, 999, 42)] == [
        "200", "2xx", "4xx", "5xx", "5xx", "1xx",
    ]  # fmt: skip


async def test_answers_reach_the_counter_within_a_second_without_a_scrape(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other workers' answers must reach their files without a scrape of their own."""
    monkeypatch.setattr(HttpAnswers, "FLUSH_INTERVAL_S", 0.01)
    async with rig(POLICY, clock=clock) as r:
        await r.check(user="u", tool="terminal")
        for _ in range(200):  # bounded: 2 s at most
            if answers_by_label(r.registry):
                break
            await asyncio.sleep(0.01)
        assert answers_by_label(r.registry) == {("/v1/check", "200"): 1}


async def test_process_and_python_metrics_are_exposed(clock: FakeClock) -> None:
    async with rig(POLICY, clock=clock) as r:
        text = (await r.http.get("/metrics")).text
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_start_time_seconds",
        "python_info",
        "python_gc_collections_total",
    ):
        assert f"\n{name}" in text, name


async def test_reservations_made_and_settled_are_counted_per_rule(clock: FakeClock) -> None:
    async with rig(POLICY, clock=clock) as r:
        first = await r.check(user="u", tool="web_search")
        await r.check(user="u", tool="web_search")
        await r.check(user="u", tool="free_search")  # no cost: nothing reserved
        await r.check(user="u", tool="terminal")  # not a budget
        assert r.value("ratewarden_budget_reservations_total", rule="search-spend") == 2
        assert r.total("ratewarden_budget_reservations_total") == 2
        assert r.total("ratewarden_budget_settled_reservations_total") == 0
        assert (await r.settle(first["call_id"], cost=0.1)).status_code == 200
        assert (await r.settle(first["call_id"])).status_code == 200  # already settled
        settled = "ratewarden_budget_settled_reservations_total"
        assert r.value(settled, rule="search-spend") == 1


async def test_the_reload_failed_gauge_follows_the_last_reload(policy_file: Path) -> None:
    app = make_app(policy_file)
    async with serving(app) as client:
        assert sample(app, "ratewarden_policy_reload_failed") == 0
        write(policy_file, BAD_POLICY)
        assert (await client.post("/v1/admin/reload")).status_code == 422
        assert sample(app, "ratewarden_policy_reload_failed") == 1  # the old one serves
        write(policy_file, POLICY_A.replace("version: 1", "version: 1\n# edited"))
        assert (await client.post("/v1/admin/reload")).status_code == 200
        assert sample(app, "ratewarden_policy_reload_failed") == 0


def test_reload_failed_is_a_gauge_set_and_cleared() -> None:
    metrics = Metrics(CollectorRegistry())

    def read() -> float | None:
        return metrics.registry.get_sample_value("ratewarden_policy_reload_failed")

    assert read() == 0
    metrics.policy_load_failed()
    assert read() == 1
    metrics.policy_loaded(parse_policy(b"version: 1\nrules: []\n"))
    assert read() == 0


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY_A)
    return path
