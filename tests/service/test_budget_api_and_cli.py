"""Issue 3 over HTTP and on the command line.

The API runs in-process (httpx over ASGI, the app's lifespan included) on each of the
three stores, with the engine and the store on one fake clock. The CLI tests start a
real `ratewarden serve` and run `ratewarden check|usage|settle` against it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest

from ratewarden.clock import FakeClock, SystemClock
from ratewarden.policy.periods import bounds
from ratewarden.store import Store
from tests.conformance.test_budgets import SECONDS_TO_DAY_END, raw_state
from tests.helpers.app import assert_error_shape, build_app, serving
from tests.helpers.daemon import clean_environment, running_daemon

POLICY = """\
version: 1
defaults: {timezone: UTC}
tools:
  "browser_*": {label: browser, cost: 0.05}
rules:
  - {name: calls, per: [user], rate: 100/minute}
  - {name: browser-slots, match: {tool: "browser_*"}, per: [user], concurrency: 2}
  - {name: spend, per: [user], budget: 5.00/day, currency: USD, soft_limit: 80%}
  - {name: deploys, match: {tool: deploy}, per: [user], rate: 0/minute, on_exceed: ask}
"""


@asynccontextmanager
async def api(store: Store, clock: FakeClock, policy: str = POLICY) -> AsyncIterator[Any]:
    app = build_app(policy, store=store)
    app.state.engine.clock = clock  # budget periods on the same clock as the store
    async with serving(app) as http:
        yield http


async def check(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await http.post("/v1/check", json={"user": "alice", **body})
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def settle(http: httpx.AsyncClient, call_id: str, body: Any = None) -> httpx.Response:
    return await http.post(f"/v1/calls/{call_id}/settle", json=body)


async def usage(http: httpx.AsyncClient, **params: str) -> dict[str, dict[str, Any]]:
    response = await http.get("/v1/usage", params={"user": "alice", **params})
    assert response.status_code == 200, response.text
    return {item["rule"]: item for item in response.json()["limits"]}


def spend_item(used: float, reserved: float, remaining: float) -> dict[str, Any]:
    return {
        "rule": "spend",
        "kind": "budget",
        "algorithm": "budget",
        "mode": "enforce",
        "limit": 5.0,
        "window": None,
        "used": used,
        "reserved": reserved,
        "remaining": remaining,
        "reset_after": SECONDS_TO_DAY_END,
        "scope": {"user": "alice"},
        "currency": "USD",
        "period": "day",
    }


def slots_item(used: int) -> dict[str, Any]:
    return {
        "rule": "browser-slots",
        "kind": "concurrency",
        "algorithm": "concurrency",
        "mode": "enforce",
        "limit": 2,
        "window": None,
        "used": used,
        "reserved": None,
        "remaining": 2 - used,
        "reset_after": 0.0,
        "scope": {"user": "alice"},
        "currency": None,
        "period": None,
    }


async def test_check_reserves_settle_replaces_and_usage_shows_both(
    store: Store, clock: FakeClock
) -> None:
    async with api(store, clock) as http:
        first = await check(http, tool="browser_open", call_id="c1", cost=2.0)
        assert (first["decision"], first["allowed"], first["replayed"]) == ("allow", True, False)
        assert {x["rule"]: x for x in first["limits"]}["spend"] == {
            "rule": "spend",
            "kind": "budget",
            "limit": 5.0,
            "window": None,
            "tokens": False,
            "remaining": 3.0,
            "reset_after": SECONDS_TO_DAY_END,
            "spent": 0.0,
            "reserved": 2.0,
            "currency": "USD",
            "period": "day",
        }
        await check(http, tool="browser_click", call_id="c2")  # catalogue cost 0.05
        found = await usage(http, tool="browser_open")
        assert found["spend"] == spend_item(0.0, 2.05, 2.95)
        assert found["browser-slots"] == slots_item(2)
        assert (found["calls"]["used"], found["calls"]["remaining"]) == (2, 98)

        replay = await check(http, tool="browser_open", call_id="c1", cost=2.0)
        assert replay == {**first, "replayed": True}
        assert await usage(http, tool="browser_open") == found

        settled = await settle(http, "c1", {"cost": 0.5, "status": "ok", "duration_ms": 12.5})
        assert (settled.status_code, settled.json()) == (
            200,
            {"call_id": "c1", "outcome": "settled", "charged": {"spend": 0.5}},
        )
        again = await settle(http, "c1", {"cost": 3.0})
        assert (again.status_code, again.json()) == (
            200,
            {"call_id": "c1", "outcome": "already_settled", "charged": {}},
        )
        found = await usage(http, tool="browser_open")
        assert found["spend"] == spend_item(0.5, 0.05, 4.45)
        assert found["browser-slots"] == slots_item(1)

        # No body at all: charged at the estimate.
        bare = await http.post("/v1/calls/c2/settle")
        assert bare.json() == {"call_id": "c2", "outcome": "settled", "charged": {"spend": 0.05}}
        found = await usage(http, tool="browser_open")
        assert (found["spend"], found["browser-slots"]) == (
            spend_item(0.55, 0.0, 4.45),
            slots_item(0),
        )


async def test_denial_and_soft_limit_over_http(store: Store, clock: FakeClock) -> None:
    async with api(store, clock) as http:
        quiet = await check(http, tool="terminal", call_id="a", cost=3.99)
        assert quiet["warnings"] == []
        flagged = await check(http, tool="browser_open", call_id="b", cost=0.01)
        assert (flagged["decision"], flagged["warnings"]) == (
            "allow",
            ["Budget soft limit: browser tools at 80% of 5.00 USD this day (spend)"],
        )
        assert (await settle(http, "b", {"cost": 2.0})).json()["charged"] == {"spend": 2.0}
        denied = await check(http, tool="browser_open", call_id="c")
        assert denied["decision"] == "deny"
        assert denied["message"] == (
            "Budget exceeded for browser tools: 2.00 spent and 3.99 held by calls in flight of "
            "5.00 USD this day (retry in 1h46m)"
        )
        assert denied["retry_after"] == SECONDS_TO_DAY_END
        assert denied["violations"] == [
            {
                "rule": "spend",
                "kind": "budget",
                "limit": 5.0,
                "window": None,
                "remaining": 0.0,
                "retry_after": SECONDS_TO_DAY_END,
                "message": denied["message"],
                "spent": 2.0,
                "reserved": 3.99,
                "currency": "USD",
                "period": "day",
                "scope": {"user": "alice"},
                "used": 2.0,  # spent; what calls in flight hold is `reserved`
                "condition": None,
            }
        ]
        assert denied["warnings"] == []


async def test_ask_then_approved_over_http(store: Store, clock: FakeClock) -> None:
    async with api(store, clock) as http:
        asked = await check(http, tool="deploy", call_id="d1")
        assert (asked["decision"], asked["allowed"], asked["approved"]) == ("ask", False, False)
        assert asked["message"] == "Rate limit: max 0 deploy calls per minute"
        assert (await usage(http, tool="deploy"))["deploys"]["used"] == 0
        approved = await check(http, tool="deploy", call_id="d1", approved=True)
        assert (approved["decision"], approved["allowed"], approved["approved"]) == (
            "allow",
            True,
            True,
        )
        assert approved["warnings"] == [
            "approved past deploys: Rate limit: max 0 deploy calls per minute"
        ]
        counted = await usage(http, tool="deploy")
        assert (counted["calls"]["used"], counted["spend"]["used"]) == (1, 0.0)


async def test_a_call_id_reused_by_another_user_or_tool_is_a_409(
    store: Store, clock: FakeClock
) -> None:
    async with api(store, clock) as http:
        await check(http, tool="browser_open", call_id="mine")
        before = await raw_state(store)
        for body in (
            {"user": "bob", "tool": "browser_open", "call_id": "mine"},
            {"user": "alice", "tool": "terminal", "call_id": "mine"},
        ):
            refused = await http.post("/v1/check", json=body)
            assert refused.status_code == 409
            assert_error_shape(refused.json())
            message = (
                "call_id 'mine' was already used for another call (a different user, tool, "
                "session, team, cost, metadata, approval or args)"
            )
            assert refused.json() == {
                "error": "call_id_conflict",
                "message": message,
                "fields": [{"field": "call_id", "message": message}],
            }
        batch = await http.post(
            "/v1/check/batch",
            json={"calls": [{"user": "bob", "tool": "t"}, {"user": "bob", "tool": "t",
                                                           "call_id": "mine"}]},
        )  # fmt: skip
        assert batch.status_code == 409
        assert [f["field"] for f in batch.json()["fields"]] == ["calls[1].call_id"]
        # Nothing of the refusals was counted (the batch's first call was, as decided).
        after = await raw_state(store)
        assert {k: v for k, v in after.items() if "bob" not in k and "rw-" not in k} == before


async def test_settling_an_unknown_call_is_a_404_naming_call_id(
    store: Store, clock: FakeClock
) -> None:
    async with api(store, clock) as http:
        for call_id in ("never", "refused"):
            if call_id == "refused":
                assert (await check(http, tool="t", call_id="refused", cost=9.0))["decision"] == (
                    "deny"
                )
            response = await settle(http, call_id, {"cost": 1.0})
            assert response.status_code == 404
            message = (
                f"no allowed call {call_id!r} holds anything to settle "
                "(never checked, refused, or its record expired)"
            )
            assert response.json() == {
                "error": "unknown_call",
                "message": message,
                "fields": [{"field": "call_id", "message": message}],
            }
        assert await raw_state(store) == {}


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"cost": -0.01}, "cost", "Input should be greater than or equal to 0"),
        ({"cost": "0.5"}, "cost", "Input should be a valid number"),
        ({"cost": True}, "cost", "Input should be a valid number"),
        ({"cost": 2e9}, "cost", "Input should be less than or equal to 1000000000"),
        ({"cost": 1.0, "costs": 1.0}, "costs", "unknown field"),
        ({"status": ""}, "status", "String should have at least 1 character"),
        ({"duration_ms": -1}, "duration_ms", "Input should be greater than or equal to 0"),
        ({"duration_ms": True}, "duration_ms", "Input should be a valid number"),
        ({"duration_ms": "12"}, "duration_ms", "Input should be a valid number"),
        ([1.0], "body", "Input should be a valid dictionary or object to extract fields from"),
    ],
)
@pytest.mark.slow
async def test_a_bad_settle_body_is_a_422_naming_the_field_and_settles_nothing(
    store: Store, clock: FakeClock, body: Any, field: str, message: str
) -> None:
    async with api(store, clock) as http:
        await check(http, tool="browser_open", call_id="c1", cost=1.0)
        before = await raw_state(store)
        refused = await settle(http, "c1", body)
        assert refused.status_code == 422
        assert_error_shape(refused.json())
        assert refused.json()["fields"] == [{"field": field, "message": message}]
        assert await raw_state(store) == before
        good = await settle(http, "c1", {"cost": 0.25})
        assert good.json()["outcome"] == "settled"


async def test_settle_path_validation(store: Store, clock: FakeClock) -> None:
    async with api(store, clock) as http:
        long_id = await settle(http, "x" * 129, {"cost": 1.0})
        assert long_id.status_code == 422
        assert [f["field"] for f in long_id.json()["fields"]] == ["call_id"]


async def test_admin_reset_one_rule_or_all_of_a_users_counters(
    store: Store, clock: FakeClock
) -> None:
    async with api(store, clock) as http:
        await check(http, tool="browser_open", call_id="a1", cost=1.0)
        await check(http, user="bob", tool="browser_open", call_id="b1", cost=2.0)

        for body, field, problem in (
            ({}, "body", "name a user, a rule, or both"),
            ({"user": "alice", "rule": "nope"}, "rule", "unknown rule 'nope'"),
            ({"user": "alice", "extra": 1}, "extra", "unknown field"),
        ):
            refused = await http.post("/v1/admin/reset", json=body)
            assert refused.status_code == 422
            assert refused.json()["fields"] == [{"field": field, "message": problem}]
        assert (await usage(http, tool="browser_open"))["spend"]["reserved"] == 1.0

        one = await http.post("/v1/admin/reset", json={"user": "alice", "rule": "spend"})
        held = {"rule": "spend", "kind": "budget", "used": 0.0, "reserved": 1.0, "currency": "USD"}
        assert one.json() == {"deleted": 1, "forgotten": [held]}  # what it held (test_resets)
        found = await usage(http, tool="browser_open")
        assert (found["spend"]["used"], found["spend"]["reserved"]) == (0.0, 0.0)
        assert (found["browser-slots"]["used"], found["calls"]["used"]) == (1, 1)
        bob = await usage(http, user="bob", tool="browser_open")
        assert (bob["spend"]["reserved"], bob["calls"]["used"]) == (2.0, 1)

        everything = await http.post("/v1/admin/reset", json={"user": "alice"})
        assert everything.json()["deleted"] == 2
        found = await usage(http, tool="browser_open")
        assert [(r, found[r]["used"]) for r in ("calls", "browser-slots")] == [
            ("calls", 0),
            ("browser-slots", 0),
        ]
        assert sorted(k for k in await raw_state(store) if "alice" in k) == []

        # A rule for everyone.
        rule = await http.post("/v1/admin/reset", json={"rule": "spend"})
        assert rule.json() == {"deleted": 1, "forgotten": None}  # not read for everyone
        bob = await usage(http, user="bob", tool="browser_open")
        assert (bob["spend"]["reserved"], bob["calls"]["used"]) == (0.0, 1)

        # The call record survives a reset: its settle still answers, and brings back
        # none of the spend the reset cleared (the cost equals the cleared estimate).
        late = await settle(http, "a1", {"cost": 1.0})
        assert (late.status_code, late.json()["outcome"]) == (200, "settled")
        found = await usage(http, tool="browser_open")
        assert (found["spend"]["used"], found["spend"]["reserved"]) == (0.0, 0.0)


# -- the command line against a real `ratewarden serve` ---------------------------------


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    command, *rest = args
    return subprocess.run(
        [sys.executable, "-m", "ratewarden", command, "--url", url, *rest],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def stable_zone() -> str:
    """A timezone whose current day has more than 2 minutes left (the daemon's clock)."""
    now = SystemClock().now_ms()
    return next(
        zone
        for zone in ("UTC", "Asia/Tokyo")
        if bounds("day", ZoneInfo(zone), now).end - now > 120_000
    )


def table(stdout: str) -> list[list[str]]:
    """The usage table as cells (the title line first), checked to be aligned in columns;
    a time until reset (wall-clock dependent) reads `<n>s`."""
    title, *lines = stdout.splitlines()
    rows = [[title]]
    starts = [m.start() for m in re.finditer(r"(?:^|(?<=  ))\S", lines[0])]
    for line in lines:
        found = [m.start() for m in re.finditer(r"(?:^|(?<=  ))\S", line)]
        assert found == starts, f"misaligned columns:\n{stdout}"
        cells = re.split(r" {2,}", line)
        rows.append(["<n>s" if re.fullmatch(r"[1-9]\d*s", c) else c for c in cells])
    return rows


@pytest.mark.slow
def test_settle_and_usage_commands_against_a_real_daemon(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.replace("timezone: UTC", f"timezone: {stable_zone()}"))
    with running_daemon(tmp_path, "--policy", str(policy)) as served:
        url = served.url
        for call_id, cost in (("c1", ["--cost", "0.3"]), ("c2", [])):
            done = cli(url, "check", "--user", "alice", "--tool", "browser_open",
                       "--call-id", call_id, *cost)  # fmt: skip
            assert (done.returncode, done.stderr) == (0, "")

        shown = cli(url, "usage", "--user", "alice", "--tool", "browser_open")
        assert shown.returncode == 0, shown.stderr
        # (What RESETS IN should say for held slots is open: a settle or the lease frees them.)
        rows = table(shown.stdout)
        rows[3][5] = "?"
        assert rows == [
            ["usage for alice, tool browser_open"],
            ["RULE", "KIND", "LIMIT", "USED", "REMAINING", "RESETS IN", "MODE"],
            ["calls", "rate", "100/minute", "2", "98", "<n>s", "enforce"],
            ["browser-slots", "concurrency", "2 at once", "2", "0", "?", "enforce"],
            ["spend", "budget", "5.00 USD/day", "0.00 (+0.35 reserved)", "4.65", "<n>s", "enforce"],
        ]

        settled = cli(url, "settle", "c1", "--cost", "0.2")
        assert (settled.returncode, settled.stdout, settled.stderr) == (
            0,
            "c1: settled (spend 0.20)\n",
            "",
        )
        again = cli(url, "settle", "c1", "--cost", "0.9")
        assert (again.returncode, again.stdout) == (0, "c1: already settled\n")
        estimate = cli(url, "settle", "c2", "--json")
        assert estimate.returncode == 0
        assert httpx.Response(200, content=estimate.stdout).json() == {
            "call_id": "c2",
            "outcome": "settled",
            "charged": {"spend": 0.05},
        }
        unknown = cli(url, "settle", "nope")
        assert (unknown.returncode, unknown.stdout) == (1, "")
        assert unknown.stderr == (
            "ratewarden: no allowed call 'nope' holds anything to settle "
            "(never checked, refused, or its record expired)\n"
        )
        bad = cli(url, "settle", "c2", "--cost", "-1")
        assert (bad.returncode, bad.stderr) == (
            2,
            "ratewarden: --cost: Input should be greater than or equal to 0\n",
        )

        shown = cli(url, "usage", "--user", "alice", "--tool", "browser_open")
        assert table(shown.stdout)[2:] == [
            ["calls", "rate", "100/minute", "2", "98", "<n>s", "enforce"],
            ["browser-slots", "concurrency", "2 at once", "0", "2", "-", "enforce"],
            ["spend", "budget", "5.00 USD/day", "0.25", "4.75", "<n>s", "enforce"],
        ]
