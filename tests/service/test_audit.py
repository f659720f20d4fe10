"""The audit trail: one JSON line per deny, ask, shadow deny and approved ask; `args`
only when the operator asks for them; GET /v1/denials (newest first, filtered, bounded),
on the memory store and on a real redis-server shared by several apps."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from ratewarden.clock import FakeClock
from ratewarden.policy import parse_policy
from ratewarden.service.app import create_app
from ratewarden.service.logs import configure_audit
from ratewarden.service.settings import Settings
from ratewarden.store import MemoryStore, Store, StoreError, store_from_url
from ratewarden.store.breaker import CircuitOpenError
from ratewarden.store.keys import DENIALS_KEY
from ratewarden.store.redis_store import RedisStore
from tests.helpers.app import serving
from tests.helpers.daemon import clean_environment, running_daemon
from tests.helpers.redis_server import RedisServer, free_port

FIELDS = {
    "violations",  # each verdict's detail: tests/service/test_refusal_detail.py
    "id",
    "time",
    "event",
    "decision",
    "user",
    "tool",
    "host_tool",
    "session",
    "team",
    "call_id",
    "rule",
    "rules",
    "reason",
    "message",
    "retry_after",
    "degraded",
}
SECRET = "sk-zq-0123456789-DO-NOT-LOG"

POLICY = """\
version: 1
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    rate: 1/minute
  - name: deploy-ask
    match: {tool: deploy}
    rate: 1/hour
    on_exceed: ask
  - name: notes-shadow
    match: {tool: notes}
    rate: 1/minute
    mode: shadow
  - name: banned
    match: {tool: rm}
    rate: 0/minute
"""


# -- fixtures and helpers ----------------------------------------------------------------


@pytest.fixture
def audit_to() -> Iterator[Callable[[str], None]]:
    """Point the audit logger somewhere (as `serve` does); put it back as it was after."""
    logger = logging.getLogger("ratewarden.audit")
    saved = (logger.handlers[:], logger.propagate, logger.level)
    logger.handlers[:] = []
    logger.propagate = True

    def configure(destination: str) -> None:
        for handler in logger.handlers:
            handler.close()  # configure_audit replaces handlers without closing them
        configure_audit(destination)

    yield configure
    for handler in logger.handlers:
        handler.close()
    logger.handlers[:], logger.propagate = saved[0], saved[1]
    logger.setLevel(saved[2])


@pytest.fixture
def audit_log(tmp_path: Path, audit_to: Callable[[str], None]) -> Path:
    path = tmp_path / "audit.log"
    audit_to(str(path))
    return path


def audit_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of the audit file, parsed; the file must end with a newline."""
    text = path.read_text(encoding="utf-8")
    if not text:
        return []
    assert text.endswith("\n"), text
    return [json.loads(line) for line in text[:-1].split("\n")]


@dataclass
class Daemon:
    http: httpx.AsyncClient
    registry: CollectorRegistry

    async def check(self, **body: Any) -> dict[str, Any]:
        response = await self.http.post("/v1/check", json=body)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    async def denials(self, **params: Any) -> list[dict[str, Any]]:
        response = await self.http.get("/v1/denials", params=params)
        assert response.status_code == 200, response.text
        found: list[dict[str, Any]] = response.json()["denials"]
        return found


@asynccontextmanager
async def daemon(
    policy_text: str = POLICY,
    store: Store | None = None,
    clock: FakeClock | None = None,
    audit_args: bool = False,
) -> AsyncIterator[Daemon]:
    registry = CollectorRegistry()
    settings = Settings(
        store_url="memory://", fail=None, store_timeout_ms=100, audit_args=audit_args
    )
    app = create_app(
        settings,
        store=store or MemoryStore(clock or FakeClock()),
        policy=parse_policy(policy_text.encode()),
        registry=registry,
    )
    async with serving(app) as http:
        yield Daemon(http, registry)


def redis_store(url: str, clock: FakeClock) -> Store:
    return RedisStore(aioredis.Redis.from_url(url), url, clock)


class FlakyStore(MemoryStore):
    """A memory store whose recent-denials list can be made to fail."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.failing = False
        self.push_attempts = 0

    async def push_denials(self, entries: Sequence[str], keep: int) -> None:
        self.push_attempts += 1
        if self.failing:
            raise StoreError("ConnectionError: the list is down")
        await super().push_denials(entries, keep)


def without_volatile(entry: dict[str, Any]) -> dict[str, Any]:
    """`entry` without what changes per run, nor the verdicts' detail (tested on its own)."""
    return {k: v for k, v in entry.items() if k not in ("id", "time", "violations")}


# -- one line per notable decision -------------------------------------------------------


async def test_every_notable_decision_writes_exactly_one_line(
    audit_log: Path, clock: FakeClock
) -> None:
    async with daemon(clock=clock) as d:
        who = {"user": "alice", "session": "s-1", "team": "research"}
        allowed = [
            await d.check(**who, tool="terminal", call_id="t1"),
            await d.check(**who, tool="terminal", call_id="t1"),  # a replay
            await d.check(**who, tool="deploy"),
            await d.check(**who, tool="notes"),
            await d.check(**who, tool="unruled"),
        ]
        assert [a["decision"] for a in allowed] == ["allow"] * 5
        assert audit_lines(audit_log) == []

        deny = await d.check(**who, tool="terminal", call_id="t2")
        ask = await d.check(**who, tool="deploy", call_id="d2")
        shadow = await d.check(**who, tool="notes", call_id="n2")
        approved = await d.check(**who, tool="deploy", call_id="d3", approved=True)
        replayed = await d.check(**who, tool="notes", call_id="n2")  # shadow-denied once
        assert (deny["decision"], ask["decision"], shadow["decision"]) == ("deny", "ask", "allow")
        assert (approved["decision"], approved["approved"]) == ("allow", True)
        assert replayed["replayed"] is True

        lines = audit_lines(audit_log)
        assert [(x["event"], x["call_id"]) for x in lines] == [
            ("deny", "t2"),
            ("ask", "d2"),
            ("shadow_deny", "n2"),
            ("approved", "d3"),
        ]
        for line in lines:
            assert set(line) == FIELDS
            assert re.fullmatch(r"[0-9a-f]{32}", line["id"])
            assert datetime.fromisoformat(line["time"]).utcoffset() is not None
        assert len({x["id"] for x in lines}) == 4
        common = {
            "user": "alice",
            "session": "s-1",
            "team": "research",
            "degraded": False,
            "host_tool": None,
        }
        assert without_volatile(lines[0]) == {
            **common,
            "event": "deny",
            "decision": "deny",
            "tool": "terminal",
            "call_id": "t2",
            "rule": "terminal-per-minute",
            "rules": ["terminal-per-minute"],
            "reason": "rate",
            "message": deny["message"],
            "retry_after": deny["retry_after"],
        }
        assert deny["message"].startswith("Rate limit: max 1 terminal calls per minute")
        assert deny["retry_after"] == 60.0
        assert without_volatile(lines[1]) == {
            **common,
            "event": "ask",
            "decision": "ask",
            "tool": "deploy",
            "call_id": "d2",
            "rule": "deploy-ask",
            "rules": ["deploy-ask"],
            "reason": "rate",
            "message": ask["message"],
            "retry_after": ask["retry_after"],
        }
        assert without_volatile(lines[2]) == {
            **common,
            "event": "shadow_deny",
            "decision": "allow",
            "tool": "notes",
            "call_id": "n2",
            "rule": "notes-shadow",
            "rules": ["notes-shadow"],
            "reason": "rate",
            "message": shadow["shadow"][0]["message"],
            "retry_after": None,
        }
        assert without_volatile(lines[3]) == {
            **common,
            "event": "approved",
            "decision": "allow",
            "tool": "deploy",
            "call_id": "d3",
            "rule": "deploy-ask",
            "rules": ["deploy-ask"],
            "reason": "rate",
            "message": ask["message"],
            "retry_after": None,
        }
        # The recent list holds the very same entries, newest first.
        assert await d.denials() == lines[::-1]


async def test_batch_calls_are_audited_one_line_each(audit_log: Path) -> None:
    async with daemon() as d:
        calls = [{"user": "u", "tool": "rm", "call_id": f"b{i}"} for i in range(3)]
        calls.insert(1, {"user": "u", "tool": "terminal"})
        response = await d.http.post("/v1/check/batch", json={"calls": calls})
        assert [r["decision"] for r in response.json()["results"]] == [
            "deny",
            "allow",
            "deny",
            "deny",
        ]
        assert [(x["event"], x["call_id"]) for x in audit_lines(audit_log)] == [
            ("deny", "b0"),
            ("deny", "b1"),
            ("deny", "b2"),
        ]


async def test_an_approved_call_is_audited_under_the_rule_it_was_approved_past(
    audit_log: Path,
) -> None:
    policy = """\
version: 1
rules:
  - name: deploy-ask
    match: {tool: deploy}
    rate: 0/hour
    on_exceed: ask
  - name: deploy-shadow
    match: {tool: deploy}
    rate: 0/minute
    mode: shadow
"""
    async with daemon(policy) as d:
        answer = await d.check(user="u", tool="deploy", approved=True)
        assert (answer["decision"], answer["approved"]) == ("allow", True)
        [line] = audit_lines(audit_log)
        assert line["event"] == "approved"
        assert line["rule"] == "deploy-ask"
        assert "deploy-ask" in line["rules"]


async def test_an_approved_call_flagged_only_by_a_shadow_ask_rule_is_a_shadow_deny(
    audit_log: Path,
) -> None:
    policy = """\
version: 1
rules:
  - name: watch
    match: {tool: deploy}
    rate: 0/minute
    mode: shadow
    on_exceed: ask
"""
    async with daemon(policy) as d:
        answer = await d.check(user="u", tool="deploy", approved=True)
        assert answer["warnings"] == []
        [line] = audit_lines(audit_log)
        assert (line["event"], line["rule"]) == ("shadow_deny", "watch")


async def test_fail_closed_denials_are_audited_as_degraded(audit_log: Path) -> None:
    policy = """\
version: 1
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    rate: 1/minute
    fail: closed
  - name: deploy-ask
    match: {tool: deploy}
    rate: 1/hour
    on_exceed: ask
"""
    store = store_from_url(f"redis://127.0.0.1:{free_port()}/0", timeout_ms=100)
    async with daemon(policy, store=store) as d:
        closed = await d.check(user="u", tool="terminal", call_id="c1")
        opened = await d.check(user="u", tool="deploy", call_id="c2")  # fail: open default
        assert (closed["decision"], closed["degraded"]) == ("deny", True)
        assert (opened["decision"], opened["degraded"]) == ("allow", True)
        [line] = audit_lines(audit_log)
        assert without_volatile(line) == {
            "event": "deny",
            "decision": "deny",
            "user": "u",
            "tool": "terminal",
            "host_tool": None,
            "session": None,
            "team": None,
            "call_id": "c1",
            "rule": "terminal-per-minute",
            "rules": ["terminal-per-minute"],
            "reason": "unavailable",
            "message": "Tool guard unavailable; terminal calls are paused",
            "retry_after": None,
            "degraded": True,
        }
        # The list lives in the store, which is down: a clear 503, and deciding goes on.
        response = await d.http.get("/v1/denials")
        assert response.status_code == 503
        assert response.json()["error"] == "store_unavailable"
        again = await d.check(user="u", tool="terminal", call_id="c3")
        assert again["decision"] == "deny"
        assert [x["call_id"] for x in audit_lines(audit_log)] == ["c1", "c3"]


# -- args ------------------------------------------------------------------------------


async def test_args_are_never_written_unless_the_operator_turns_them_on(
    audit_log: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    args = {"command": f"curl -H 'Authorization: {SECRET}'", "nested": {"k": [SECRET]}}
    async with daemon() as d:
        for tool in ("terminal", "terminal", "deploy", "deploy", "notes", "notes", "rm"):
            await d.check(user="u", tool=tool, args=args)
        await d.check(user="u", tool="deploy", args=args, approved=True)
        batch = [{"user": "u", "tool": "rm", "args": args}]
        assert (await d.http.post("/v1/check/batch", json={"calls": batch})).status_code == 200
        lines = audit_lines(audit_log)
        assert [x["event"] for x in lines] == [
            "deny",
            "ask",
            "shadow_deny",
            "deny",
            "approved",
            "deny",
        ]
        assert all("args" not in x for x in lines)
        denials = await d.http.get("/v1/denials")
        metrics = await d.http.get("/metrics")
        for text in (audit_log.read_text(), denials.text, metrics.text, caplog.text):
            assert SECRET not in text
            assert "Authorization" not in text
        assert len(denials.json()["denials"]) == 6


async def test_args_are_audited_verbatim_when_turned_on(audit_log: Path) -> None:
    args = {"command": f"echo {SECRET}", "n": 3, "nested": {"list": [1, "é", None]}}
    async with daemon(audit_args=True) as d:
        await d.check(user="u", tool="rm", args=args, call_id="a1")
        await d.check(user="u", tool="rm", call_id="a2")  # no args given
        await d.check(user="u", tool="terminal", args=args)  # allowed: not audited
        lines = audit_lines(audit_log)
        assert [(x["call_id"], x.get("args", "absent")) for x in lines] == [
            ("a1", args),
            ("a2", "absent"),
        ]
        assert set(lines[0]) == {*FIELDS, "args"}
        assert [x.get("args") for x in await d.denials()] == [None, args]
        assert SECRET not in (await d.http.get("/metrics")).text


# -- GET /v1/denials ----------------------------------------------------------------------

FILTER_POLICY = """\
version: 1
rules:
  - name: burst
    match: {tool: [terminal, term]}
    rate: 0/minute
  - name: burst-2
    match: {tool: [term, web]}
    rate: 0/minute
"""


async def test_denials_filter_exactly_by_user_tool_and_rule(audit_log: Path) -> None:
    traffic = [
        ("alice", "terminal"),  # burst
        ("alicia", "terminal"),  # burst
        ("alice", "term"),  # burst and burst-2
        ("bob", "web"),  # burst-2
        ("alice", "web"),  # burst-2
        ("Alice", "terminal"),  # burst
    ]
    async with daemon(FILTER_POLICY) as d:
        for i, (user, tool) in enumerate(traffic):
            await d.check(user=user, tool=tool, call_id=f"c{i}")

        async def ids(**params: Any) -> list[str]:
            return [x["call_id"] for x in await d.denials(**params)]

        assert await ids() == ["c5", "c4", "c3", "c2", "c1", "c0"]
        assert await ids(user="alice") == ["c4", "c2", "c0"]
        assert await ids(user="ali") == []
        assert await ids(tool="term") == ["c2"]
        assert await ids(tool="terminal") == ["c5", "c1", "c0"]
        assert await ids(rule="burst") == ["c5", "c2", "c1", "c0"]
        assert await ids(rule="burst-2") == ["c4", "c3", "c2"]
        assert await ids(rule="burst-") == []
        assert await ids(user="alice", rule="burst-2") == ["c4", "c2"]
        assert await ids(user="alice", tool="terminal", rule="burst") == ["c0"]
        assert await ids(limit=2) == ["c5", "c4"]
        assert await ids(rule="burst", limit=3) == ["c5", "c2", "c1"]
        assert await ids(limit=1) == ["c5"]
        assert await ids(limit=1000) == ["c5", "c4", "c3", "c2", "c1", "c0"]
        assert (await d.denials(tool="term"))[0]["rules"] == ["burst", "burst-2"]


@pytest.mark.parametrize("limit", ["0", "1001", "-1", "ten", "1.5"])
async def test_denials_limit_out_of_range_is_a_422_naming_limit(limit: str) -> None:
    async with daemon() as d:
        response = await d.http.get("/v1/denials", params={"limit": limit})
        assert response.status_code == 422, response.text
        body = response.json()
        assert body["error"] == "invalid_request"
        assert [f["field"] for f in body["fields"]] == ["limit"]
        assert body["message"].startswith("limit: ")


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def denials_store(request: pytest.FixtureRequest, clock: FakeClock) -> Store:
    if request.param == "memory":
        return MemoryStore(clock)
    return redis_store(request.getfixturevalue("redis_url"), clock)


async def test_the_recent_list_keeps_the_newest_1000(
    denials_store: Store, clock: FakeClock, audit_to: Callable[[str], None]
) -> None:
    audit_to("off")  # 1100 lines on the log would only slow this down
    async with daemon(store=denials_store, clock=clock) as d:
        for start in range(0, 1100, 100):
            calls = [
                {"user": f"u{i % 3}", "tool": "rm", "call_id": f"c{i}"}
                for i in range(start, start + 100)
            ]
            response = await d.http.post("/v1/check/batch", json={"calls": calls})
            assert {r["decision"] for r in response.json()["results"]} == {"deny"}
        found = await d.denials(limit=1000)
        assert [x["call_id"] for x in found] == [f"c{i}" for i in range(1099, 99, -1)]
        assert [x["call_id"] for x in await d.denials()] == [
            f"c{i}" for i in range(1099, 999, -1)
        ]  # the default limit is 100
        assert [x["call_id"] for x in await d.denials(user="u1", limit=3)] == [
            "c1099",
            "c1096",
            "c1093",
        ]
        # Filters only see the kept entries: c0..c99 are gone for everyone.
        kept_u0 = [f"c{i}" for i in range(1098, 99, -3)]
        assert len(kept_u0) == 333
        assert [x["call_id"] for x in await d.denials(user="u0", limit=1000)] == kept_u0


@pytest.mark.redis
async def test_two_apps_on_one_redis_share_the_recent_list(
    redis_server: RedisServer, redis_url: str, clock: FakeClock, audit_log: Path
) -> None:
    async with (
        daemon(store=redis_store(redis_url, clock), clock=clock) as first,
        daemon(store=redis_store(redis_url, clock), clock=clock) as second,
    ):
        for i in range(3):
            await first.check(user="one", tool="rm", call_id=f"first-{i}")
        for i in range(2):
            await second.check(user="two", tool="rm", call_id=f"second-{i}")
        # The second app never flushed the first's entries: the first's background task
        # must have pushed them to the shared list.
        deadline = time.monotonic() + 5
        while True:
            seen = [x["call_id"] for x in await second.denials(user="one")]
            if seen or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)  # bounded polling for the background flush
        assert seen == ["first-2", "first-1", "first-0"]
        assert [x["call_id"] for x in await first.denials(user="two")] == ["second-1", "second-0"]
        everything = await first.denials()
        assert {x["call_id"] for x in everything} == {
            "first-0",
            "first-1",
            "first-2",
            "second-0",
            "second-1",
        }
        assert await second.denials() == everything

    raw = redis_server.client()
    stored = [json.loads(x) for x in raw.lrange(DENIALS_KEY, 0, -1)]
    raw.close()
    assert stored == everything
    assert sorted(x["call_id"] for x in audit_lines(audit_log)) == sorted(
        x["call_id"] for x in everything
    )


# -- a failing list never breaks deciding -------------------------------------------------


async def test_a_failing_recent_list_does_not_break_deciding(
    audit_log: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = FlakyStore(clock)
    store.failing = True
    async with daemon(store=store, clock=clock) as d:
        first = await d.check(user="u", tool="rm", call_id="lost")
        assert first["decision"] == "deny"
        assert [x["call_id"] for x in audit_lines(audit_log)] == ["lost"]
        # The flush fails, is logged, and the request still answers 200.
        assert await d.denials() == []
        assert store.push_attempts == 1
        warnings = [
            r for r in caplog.records if r.name == "ratewarden" and r.levelno >= logging.WARNING
        ]
        assert [r.levelno for r in warnings] == [logging.WARNING]
        assert warnings[0].getMessage().startswith("recent denials not stored: ")
        errors = d.registry.get_sample_value(
            "ratewarden_store_errors_total", {"operation": "push_denials"}
        )
        assert errors == 1

        # The background task meets the failure too, and keeps going.
        await d.check(user="u", tool="rm", call_id="also-lost")
        deadline = time.monotonic() + 5
        while store.push_attempts < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # bounded polling for the background flush
        assert store.push_attempts == 2
        store.failing = False
        await d.check(user="u", tool="rm", call_id="kept")
        while store.push_attempts < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert store.push_attempts == 3
        assert [json.loads(x)["call_id"] for x in await store.recent_denials(10)] == ["kept"]
        assert [x["call_id"] for x in await d.denials()] == ["kept"]
        assert [x["call_id"] for x in audit_lines(audit_log)] == ["lost", "also-lost", "kept"]
        assert (await d.check(user="u", tool="terminal"))["decision"] == "allow"


# -- where the lines go -------------------------------------------------------------------


async def test_audit_off_writes_nothing(
    audit_to: Callable[[str], None],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    audit_to("off")
    async with daemon() as d:
        for tool in ("terminal", "terminal", "deploy", "deploy", "notes", "notes", "rm"):
            await d.check(user="zq-off-user", tool=tool)
        assert len(await d.denials()) == 4  # the recent list still fills
    assert [r for r in caplog.records if r.name == "ratewarden.audit"] == []
    out, err = capfd.readouterr()
    assert "zq-off-user" not in out + err
    assert "zq-off-user" not in caplog.text


async def test_audit_to_stderr_writes_bare_json_lines(
    audit_to: Callable[[str], None], capfd: pytest.CaptureFixture[str]
) -> None:
    audit_to("-")
    async with daemon() as d:
        await d.check(user="u", tool="rm", call_id="e1")
        await d.check(user="u", tool="terminal", call_id="e2")
    out, err = capfd.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert (json.loads(line)["call_id"], json.loads(line)["event"]) == ("e1", "deny")


HOSTILE = [
    ('he said "hi"', 'tool"quoted'),
    ("line\nbreak\r\nand\ttab", "back\\slash\\n"),
    ("Émile 漢字 🙂 \u2028 \u2029", "工具🙂"),
    ("nul\u0000byte", "{}[],:"),
    ('{"user": "forged"}', '"}\n{"event": "allow'),
]


async def test_audit_lines_are_json_for_any_user_and_tool(audit_log: Path) -> None:
    policy = "version: 1\nrules:\n  - name: everything\n    rate: 0/minute\n"
    async with daemon(policy) as d:
        for i, (user, tool) in enumerate(HOSTILE):
            await d.check(user=user, tool=tool, session=user, team=tool, call_id=f"h{i}")
        lines = audit_lines(audit_log)  # one JSON object per "\n"-terminated line
        assert [(x["user"], x["tool"], x["session"], x["team"]) for x in lines] == [
            (user, tool, user, tool) for user, tool in HOSTILE
        ]
        assert [x["call_id"] for x in lines] == [f"h{i}" for i in range(len(HOSTILE))]
        assert {x["event"] for x in lines} == {"deny"}
        assert await d.denials() == lines[::-1]


def test_audit_file_takes_unicode_whatever_the_locale(tmp_path: Path) -> None:
    script = (
        "import logging, sys\n"
        "from ratewarden.service.logs import configure_audit\n"
        "configure_audit(sys.argv[1])\n"
        "logging.getLogger('ratewarden.audit').info('{\"user\": \"\\u00c9mile \\U0001f642\"}')\n"
    )
    path = tmp_path / "audit.log"
    env = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C", "PYTHONUTF8": "0"}
    env["PYTHONCOERCECLOCALE"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        env=env,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(path.read_text(encoding="utf-8")) == {"user": "Émile 🙂"}


# -- several workers ----------------------------------------------------------------------

WORKERS_POLICY = "version: 1\nrules:\n  - name: banned\n    match: {tool: rm}\n    rate: 0/minute\n"


@pytest.mark.redis
@pytest.mark.slow
def test_serve_with_two_workers_writes_one_audit_line_per_denial(
    tmp_path: Path, redis_server: RedisServer, redis_url: str
) -> None:
    audit = tmp_path / "audit.log"
    (tmp_path / "policy.yaml").write_text(WORKERS_POLICY)
    env = clean_environment(
        RATEWARDEN_AUDIT_LOG=str(audit), PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus")
    )
    (tmp_path / "prometheus").mkdir()
    flags = ("--workers", "2", "--store-url", redis_url, "--policy", "policy.yaml")
    with running_daemon(tmp_path, *flags, env=env, ready="/readyz", start_timeout_s=30) as served:
        url = served.url
        for i in range(20):
            with httpx.Client(trust_env=False, timeout=10) as http:
                body = {"user": "u", "tool": "rm", "call_id": f"w{i}"}
                assert http.post(f"{url}/v1/check", json=body).json()["decision"] == "deny"
        with httpx.Client(trust_env=False, timeout=10) as http:
            listed = http.get(f"{url}/v1/denials", params={"limit": 1000}).json()["denials"]
        assert len(listed) >= 1  # the shared list works; the log is what is missing
        assert audit.exists()
        assert sorted(x["call_id"] for x in audit_lines(audit)) == sorted(
            f"w{i}" for i in range(20)
        )


class UnwritableDenials(MemoryStore):
    """A store whose recent-denials list cannot be written, failing with `error`."""

    def __init__(self, error: StoreError) -> None:
        super().__init__(FakeClock())
        self.error = error

    async def push_denials(self, entries: Sequence[str], keep: int) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("error", "level"),
    [
        (StoreError("connection refused"), logging.WARNING),
        (CircuitOpenError("circuit open"), logging.DEBUG),
    ],
    ids=["store-error", "circuit-open"],
)
async def test_an_unstored_denial_warns_unless_the_circuit_is_open(
    caplog: pytest.LogCaptureFixture, error: StoreError, level: int
) -> None:
    """The breaker reports an outage once; the flusher must not add a line five times a
    second for as long as it lasts."""
    from ratewarden.service.audit import AuditTrail

    trail = AuditTrail(UnwritableDenials(error))
    trail._pending = [("alice", '{"event": "deny"}')]
    with caplog.at_level(logging.DEBUG, logger="ratewarden"):
        await trail.flush()
    found = [r for r in caplog.records if "recent denials not stored" in r.getMessage()]
    assert [r.levelno for r in found] == [level]
    assert trail._pending == []  # the lines were written to the log; the batch is not retried


async def test_an_audit_line_takes_its_time_and_id_from_what_it_is_given() -> None:
    """The trail's clock and id maker are injected, so a line is known to the byte."""
    from ratewarden.calls import Call
    from ratewarden.engine import Engine
    from ratewarden.service.audit import AuditTrail

    clock = FakeClock(1_700_000_017_345)
    store = MemoryStore(clock)
    policy = parse_policy(b"version: 1\nrules:\n  - {name: r, rate: 0/minute}\n")
    decision = await Engine(policy, store).check(Call("alice", "terminal", "c1"))
    ids = iter(["first", "second"])
    trail = AuditTrail(store, clock=clock, new_id=lambda: next(ids))
    trail.record(decision, Call("alice", "terminal", "c1"), None)
    clock.advance(1_500)
    trail.record(decision, Call("alice", "terminal", "c1"), None)
    first, second = (json.loads(line) for _, line in trail._pending)
    assert (first["id"], first["time"]) == ("first", "2023-11-14T22:13:37.345+00:00")
    assert (second["id"], second["time"]) == ("second", "2023-11-14T22:13:38.845+00:00")


async def test_a_refusal_record_names_the_rule_whose_message_it_carries() -> None:
    """Two rules refuse; the decision is worded by the one that holds longest (the hour),
    listed second: the record names that rule, with its message and kind, not the first."""
    from ratewarden.calls import Call
    from ratewarden.engine import Engine
    from ratewarden.service.audit import audit_entry

    clock = FakeClock(1_700_000_017_345)
    policy = parse_policy(
        b"version: 1\nrules:\n"
        b"  - {name: per-minute, match: {tool: terminal}, rate: 1/minute}\n"
        b"  - {name: per-hour, match: {tool: terminal}, rate: 1/hour}\n"
    )
    engine = Engine(policy, MemoryStore(clock))
    assert (await engine.check(Call("alice", "terminal", "c1"))).decision == "allow"
    decision = await engine.check(Call("alice", "terminal", "c2"))
    assert decision.decision == "deny"
    assert [v.rule for v in decision.violations] == ["per-minute", "per-hour"]
    entry = audit_entry(
        decision, Call("alice", "terminal", "c2"), None, now_ms=clock.now_ms(), entry_id="x"
    )
    assert entry is not None
    [worded] = [v for v in decision.violations if v.message == decision.message]
    assert worded.rule == "per-hour"
    assert entry["rule"] == "per-hour"
    assert entry["message"] == worded.message
    assert entry["reason"] == worded.kind
    assert entry["rules"] == ["per-minute", "per-hour"]  # every refusing rule, still listed
