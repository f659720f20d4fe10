"""Failing open is bounded, on a real daemon whose real redis-server has been stopped.

One `ratewarden serve` process (RATEWARDEN_WORKERS=1: one process, so one local count)
starts on a healthy Redis, which is then stopped for good. A fail-open rate of 5/minute
admits exactly 5 calls of a user and refuses the rest by its own message, a fail-open
budget admits at most the budget, a fail-open concurrency cap its slots until a settle
frees one, a fail-closed rule refuses everything; every answer says `degraded: true`, and
the degraded metric counts each one. Two such daemons on one stopped Redis, raced with
concurrent checks, admit exactly twice the limit: the bound is per process. The fast
engine-level twin is tests/unit/test_fail_open_bounded.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from ratewarden.wire.bodies import CheckResponse
from tests.helpers.daemon import Daemon, clean_environment, running_daemon
from tests.helpers.redis_server import running_redis

pytestmark = pytest.mark.redis

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
    per: [user]
    rate: 100/minute
    fail: closed
"""


@contextlib.contextmanager
def daemons_on_a_stopped_redis(directory: Path, count: int) -> Iterator[list[Daemon]]:
    """`count` one-worker daemons that started on one healthy Redis, which is then stopped."""
    (directory / "policy.yaml").write_text(POLICY)
    env = clean_environment(
        RATEWARDEN_WORKERS="1",
        RATEWARDEN_STATE_FILE="off",
        RATEWARDEN_RELOAD_INTERVAL_S="0",
    )
    with running_redis(directory / "redis") as server, contextlib.ExitStack() as stack:
        flags = ("--store-url", server.url, "--policy", "policy.yaml", "--log-level", "warning")
        daemons = [
            stack.enter_context(running_daemon(directory, *flags, env=env)) for _ in range(count)
        ]
        for daemon in daemons:
            with httpx.Client(base_url=daemon.url, trust_env=False, timeout=10.0) as http:
                healthy = check(http, "warm-up", "terminal")
                assert (healthy["decision"], healthy["degraded"]) == ("allow", False)
        server.stop()
        with pytest.raises(redis.ConnectionError), server.client() as gone:
            gone.ping()  # down for good
        yield daemons


@pytest.fixture(scope="module")
def down(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with daemons_on_a_stopped_redis(tmp_path_factory.mktemp("fail-open"), 1) as (daemon,):
        yield daemon


@pytest.fixture
def http(down: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=down.url, trust_env=False, timeout=10.0) as client:
        yield client


def check(http: httpx.Client, user: str, tool: str, call_id: str | None = None) -> Any:
    body = {"user": user, "tool": tool, **({"call_id": call_id} if call_id else {})}
    response = http.post("/v1/check", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def outcomes(answers: list[Any]) -> list[tuple[str, bool]]:
    return [(a["decision"], a["degraded"]) for a in answers]


def degraded_metric(http: httpx.Client, decision: str) -> float:
    wanted = f'ratewarden_degraded_decisions_total{{decision="{decision}"}}'
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(wanted):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_fail_open_rate_admits_exactly_its_limit_then_refuses(http: httpx.Client) -> None:
    answers = [check(http, "alice", "terminal") for _ in range(12)]
    assert outcomes(answers) == [("allow", True)] * 5 + [("deny", True)] * 7
    refusal = answers[-1]
    assert refusal["message"].startswith("Rate limit: max 5 terminal calls per minute")
    assert [(v["rule"], v["kind"]) for v in refusal["violations"]] == [("terminal-rate", "rate")]
    # Another user's counter is its own.
    assert [check(http, "bob", "terminal")["decision"] for _ in range(6)].count("allow") == 5


def test_a_fail_open_budget_admits_at_most_the_budget(http: httpx.Client) -> None:
    answers = [check(http, "carol", "search") for _ in range(6)]  # 0.30 each of 1.00
    assert outcomes(answers) == [("allow", True)] * 3 + [("deny", True)] * 3
    assert answers[-1]["violations"][0]["kind"] == "budget"


def test_a_fail_open_cap_admits_its_slots_until_a_settle_frees_one(http: httpx.Client) -> None:
    held = [check(http, "dave", "browser", f"dave-{i}") for i in range(3)]
    assert outcomes(held) == [("allow", True), ("allow", True), ("deny", True)]
    assert held[-1]["message"].startswith("Concurrency limit: max 2 browser calls at once")
    # Clients settle what holds a slot; a degraded answer counted here does hold one.
    assert CheckResponse.model_validate(held[0]).holds
    settled = http.post("/v1/calls/dave-0/settle", json={})
    assert settled.status_code == 200, settled.text
    assert settled.json()["outcome"] == "settled"
    after = [check(http, "dave", "browser", f"dave-next-{i}") for i in range(2)]
    assert outcomes(after) == [("allow", True), ("deny", True)]


def test_fail_closed_refuses_every_call(http: httpx.Client) -> None:
    answers = [check(http, "erin", "vault") for _ in range(8)]
    assert outcomes(answers) == [("deny", True)] * 8
    assert {a["violations"][0]["kind"] for a in answers} == {"unavailable"}


def test_the_degraded_metric_counts_every_degraded_answer(http: httpx.Client) -> None:
    allowed, denied = degraded_metric(http, "allow"), degraded_metric(http, "deny")
    answers = [check(http, "frank", "terminal") for _ in range(7)]
    answers += [check(http, "frank", "vault") for _ in range(2)]
    assert outcomes(answers) == [("allow", True)] * 5 + [("deny", True)] * 4
    assert degraded_metric(http, "allow") - allowed == 5
    assert degraded_metric(http, "deny") - denied == 4


async def race_checks(url: str, user: str, tool: str, count: int) -> list[tuple[str, bool]]:
    """`count` checks sent at once, each on its own connection."""
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=30.0, limits=limits) as c:
        bodies = [{"user": user, "tool": tool} for _ in range(count)]
        answers = await asyncio.gather(*(c.post("/v1/check", json=b) for b in bodies))
    assert {a.status_code for a in answers} == {200}
    return [(a.json()["decision"], a.json()["degraded"]) for a in answers]


@pytest.mark.slow  # two processes raced
async def test_two_processes_admit_exactly_twice_the_limit_and_the_budget(
    tmp_path: Path,
) -> None:
    with daemons_on_a_stopped_redis(tmp_path, 2) as daemons:
        rates = await asyncio.gather(*(race_checks(d.url, "gina", "terminal", 30) for d in daemons))
        budgets = await asyncio.gather(*(race_checks(d.url, "gina", "search", 10) for d in daemons))
    for found in rates:  # each process: exactly its own 5
        assert sorted(found) == [("allow", True)] * 5 + [("deny", True)] * 25
    for found in budgets:  # each process: 3 x 0.30 of its own 1.00
        assert sorted(found) == [("allow", True)] * 3 + [("deny", True)] * 7


def test_an_adapter_settles_a_degraded_call_that_holds_a_local_slot(down: Daemon) -> None:
    """The hermes plugin (as adk, contextforge, openai_agents and pydantic_ai) skipped the
    settle of every degraded answer: a slot counted locally stayed held until its lease
    ran out, and the user's next browser calls were refused meanwhile."""
    from ratewarden.client import Guard
    from ratewarden.integrations.hermes import RatewardenPlugin

    plugin = RatewardenPlugin(guard=Guard(down.url), user=lambda hook: "erin")
    try:
        for turn in range(4):  # one slot at a time, each freed by its post hook
            call = {"args": {}, "tool_call_id": f"c{turn}", "session_id": "s"}
            assert plugin.pre_tool_call(tool_name="browser", **call) is None, turn
            plugin.post_tool_call(tool_name="browser", result="ok", **call)
        with httpx.Client(base_url=down.url, trust_env=False, timeout=10.0) as http:
            # Both slots free: two held at once, the third refused.
            held = [check(http, "erin", "browser", f"erin-{i}") for i in range(3)]
    finally:
        plugin.guard.close()
    assert outcomes(held) == [("allow", True), ("allow", True), ("deny", True)]


def test_a_daemon_without_its_store_stays_ready_and_says_why(http: httpx.Client) -> None:
    """Issue 26 item 5 on a real process: ready means "can answer", by the fail mode too
    (on e32fe6e /readyz was 503 here, and every pod would have left its Service)."""
    ready = http.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert (ready.json()["status"], ready.json()["answering"]) == ("ready", "fail mode")
    assert ready.json()["store"].startswith("unavailable: ")
    health = http.get("/healthz")
    assert health.status_code == 200
    assert health.json()["store"].startswith("unavailable: ")
