"""Resets are deliberate and recorded (issue 26, item 6): `POST /v1/admin/reset` answers
what it forgot, writes an audit line (who, what, the values before) and counts itself.
The command line's `ratewarden reset` is tested in test_cli_reset.py."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import pytest

from ratewarden.clock import FakeClock
from ratewarden.store import MemoryStore
from tests.helpers.app import build_app, serving

ADMIN, CHECK = "admin-token-0123456789", "check-token-0123456789"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
AS_CHECK = {"Authorization": f"Bearer {CHECK}"}
POLICY = """\
version: 1
defaults: {timezone: UTC}
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 5/minute
  - name: daily-spend
    match: {tool: browser}
    per: [user]
    budget: 5/day
    currency: USD
"""
SPEND = {"rule": "daily-spend", "kind": "budget", "used": 1.2, "reserved": 0.5, "currency": "USD"}
TERMINAL = {"rule": "terminal-per-minute", "kind": "rate", "used": 2, "reserved": None,
            "currency": None}  # fmt: skip


async def spend_and_count(client: httpx.AsyncClient, user: str = "alice") -> None:
    """1.20 spent and 0.50 reserved on daily-spend; two terminal calls counted."""
    for body in (
        {"user": user, "tool": "browser", "cost": 1.5, "call_id": f"{user}-b1"},
        {"user": user, "tool": "browser", "cost": 0.5, "call_id": f"{user}-b2"},
        {"user": user, "tool": "terminal"},
        {"user": user, "tool": "terminal"},
    ):
        answer = await client.post("/v1/check", json=body, headers=AS_CHECK)
        assert answer.json()["allowed"] is True, answer.text
    settled = await client.post(f"/v1/calls/{user}-b1/settle", json={"cost": 1.2}, headers=AS_CHECK)
    assert settled.status_code == 200, settled.text


def make_app() -> Any:
    return build_app(
        POLICY,
        MemoryStore(FakeClock()),
        api_tokens=[CHECK],
        admin_tokens=[ADMIN],
        admin_names=["ops-ana"],
    )


def audit_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ratewarden.audit"]
    return [line for line in lines if line["event"] == "counters_reset"]


async def test_a_reset_answers_what_it_forgot_and_is_audited_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ratewarden.audit")
    async with serving(make_app()) as client:
        await spend_and_count(client)
        await spend_and_count(client, "bob")
        one = {"user": "alice", "rule": "daily-spend"}
        spend = await client.post("/v1/admin/reset", json=one, headers=AS_ADMIN)
        everything = await client.post("/v1/admin/reset", json={"user": "alice"}, headers=AS_ADMIN)
        for_all = {"rule": "terminal-per-minute"}
        rule = await client.post("/v1/admin/reset", json=for_all, headers=AS_ADMIN)
        metrics = (await client.get("/metrics")).text
    assert spend.json() == {"deleted": 1, "forgotten": [SPEND]}
    assert everything.json() == {"deleted": 1, "forgotten": [TERMINAL]}  # spend gone already
    assert rule.json() == {"deleted": 1, "forgotten": None}  # bob's: nothing read first
    first, second, third = audit_lines(caplog)
    assert first == {"event": "counters_reset", "by": "ops-ana", "user": "alice",
                     "rule": "daily-spend", "deleted": 1, "forgotten": [SPEND],
                     "at": first["at"]}  # fmt: skip
    assert (second["user"], second["rule"], second["forgotten"]) == ("alice", None, [TERMINAL])
    assert (third["user"], third["rule"], third["forgotten"]) == (None, "terminal-per-minute", None)
    assert third["by"] == "ops-ana"
    assert 'ratewarden_resets_total{target="user_rule"} 1.0' in metrics
    assert 'ratewarden_resets_total{target="user"} 1.0' in metrics
    assert 'ratewarden_resets_total{target="rule"} 1.0' in metrics
    assert "alice" not in metrics  # never a user's name as a label


async def test_a_refused_reset_is_neither_audited_nor_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="ratewarden.audit")
    async with serving(make_app()) as client:
        unknown = {"user": "alice", "rule": "no-such-rule"}
        refused = await client.post("/v1/admin/reset", json=unknown, headers=AS_ADMIN)
        by_checker = await client.post("/v1/admin/reset", json=unknown, headers=AS_CHECK)
        metrics = (await client.get("/metrics")).text
    assert (refused.status_code, by_checker.status_code) == (422, 403)
    assert audit_lines(caplog) == []
    assert 'ratewarden_resets_total{target="user_rule"} 0.0' in metrics
