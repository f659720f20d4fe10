"""Model calls over HTTP (issue 31 items 1 to 3; docs/budgets.md), on every store.

The API runs in-process on memory, fakeredis and a real redis-server, the engine and
the store on one fake clock. A model call reserves its most, its settle charges its
usage priced by genai-prices (the oracle: `calc_price` itself), in the same budget as
the user's tool calls; token rates add a settle's tokens; each refusal is the sentence
docs/budgets.md shows; and every hostile body is a 422 that names its field.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from genai_prices import Usage, calc_price

from ratewarden.clock import FakeClock
from ratewarden.store import Store
from tests.helpers.app import assert_error_shape, build_app, serving
from tests.helpers.daemon import clean_environment, run_cli, running_daemon

POLICY = """\
version: 1
defaults: {timezone: UTC, max_output_tokens: 8000}
tools:
  terminal: {label: shell, cost: 0.05}
models:
  "my-local-*": {input: 0, output: 0}
rules:
  - {name: daily-spend, match: {kind: any}, per: [user], budget: 1.00/day}
  - {name: tool-calls, per: [user], rate: 1000/minute}
"""
TOKEN_POLICY = POLICY + (
    '  - {name: gpt-tokens, match: {model: "gpt-*"}, per: [user], rate: 60000 tokens/minute}\n'
)
USAGE = {"input_tokens": 12_345, "output_tokens": 6_789, "cache_read_tokens": 2_345}


def genai_micros(model: str, usage: dict[str, int]) -> int:
    """genai-prices' price of `usage`, rounded up to the micro-unit: the oracle."""
    return math.ceil(calc_price(Usage(**usage), model).total_price * Decimal(1_000_000))


@asynccontextmanager
async def api(store: Store, clock: FakeClock, policy: str = POLICY) -> AsyncIterator[Any]:
    app = build_app(policy, store=store)
    app.state.engine.clock = clock
    async with serving(app) as http:
        yield http


async def check(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await http.post("/v1/check", json={"user": "alice", **body})
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def model_check(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    return await check(http, kind="model", **{"model": "gpt-4o", **body})


async def settle(http: httpx.AsyncClient, call_id: str, body: Any) -> dict[str, Any]:
    response = await http.post(f"/v1/calls/{call_id}/settle", json=body)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def spent_micros(http: httpx.AsyncClient, user: str = "alice") -> tuple[int, int]:
    response = await http.get("/v1/usage", params={"user": user})
    item = {i["rule"]: i for i in response.json()["limits"]}["daily-spend"]
    return round(item["used"] * 1_000_000), round(item["reserved"] * 1_000_000)


async def test_a_model_call_reserves_its_most_and_is_charged_its_usage(
    store: Store, clock: FakeClock
) -> None:
    async with api(store, clock) as http:
        allowed = await model_check(http, input_tokens=1000, max_output_tokens=2000)
        assert allowed["allowed"], allowed
        most = genai_micros("gpt-4o", {"input_tokens": 1000, "output_tokens": 2000})
        assert await spent_micros(http) == (0, most)  # 0.0225: its most, held
        settled = await settle(http, allowed["call_id"], {"status": "ok", "usage": USAGE})
        price = genai_micros("gpt-4o", USAGE)
        assert price == 95_822  # 0.09582125 rounded up
        assert settled["charged"] == {"daily-spend": price / 1_000_000}
        assert settled["tokens"] == 12_345 + 6_789
        assert await spent_micros(http) == (price, 0)  # more than reserved: what it cost
        again = await settle(http, allowed["call_id"], {"status": "ok", "usage": USAGE})
        assert again["outcome"] == "already_settled"
        assert await spent_micros(http) == (price, 0)


async def test_no_max_output_reserves_the_policys_default(store: Store, clock: FakeClock) -> None:
    async with api(store, clock) as http:
        await model_check(http, input_tokens=10)
        most = genai_micros("gpt-4o", {"input_tokens": 10, "output_tokens": 8000})
        assert await spent_micros(http) == (0, most)


async def test_one_budget_drains_by_model_usage_then_refuses_tools_and_big_calls(
    store: Store, clock: FakeClock
) -> None:
    async with api(store, clock) as http:
        for _ in range(10):
            call = await model_check(http, input_tokens=100, max_output_tokens=1000)
            assert call["allowed"], call
            await settle(http, call["call_id"], {"status": "ok", "usage": USAGE})
        price = genai_micros("gpt-4o", USAGE)
        assert await spent_micros(http) == (10 * price, 0)  # exact: 0.958220
        big = await model_check(http, input_tokens=100, max_output_tokens=8000)
        assert big["decision"] == "deny"
        assert big["message"] == (
            "This model call could cost up to 0.09 USD; 0.04 USD is left of today's 1.00 USD "
            "budget: ask for a shorter answer or a smaller model"
        )
        small = await model_check(http, input_tokens=100, max_output_tokens=1000)
        assert small["allowed"]  # 0.01025 fits what is left: a smaller call runs
        tool = await check(http, tool="terminal")
        assert tool["decision"] == "deny"
        assert tool["message"].startswith(
            "Budget exceeded for shell tools: 0.96 spent and 0.01 held by calls in flight of "
            "1.00 USD this day (retry in "
        )
        await settle(http, small["call_id"], {"status": "ok", "usage": USAGE})
        spent = await model_check(http, max_output_tokens=1)
        assert spent["message"].startswith(
            "Budget exceeded for model calls: 1.05 spent of 1.00 USD this day (retry in "
        )
        assert await spent_micros(http, "bob") == (0, 0)  # another user: untouched
        bob = await check(http, user="bob", tool="terminal")
        assert bob["allowed"]


async def test_a_refusal_while_calls_hold_the_budget_says_so(
    store: Store, clock: FakeClock
) -> None:
    async with api(store, clock) as http:
        for _ in range(12):  # 12 x 0.08 held, of 1.00
            assert (await model_check(http, max_output_tokens=8000))["allowed"]
        bigger = await model_check(http, max_output_tokens=8000)
        assert bigger["message"] == (
            "This model call could cost up to 0.08 USD; 0.04 USD is left of today's 1.00 USD "
            "budget: ask for a shorter answer or a smaller model"
        )
        for _ in range(4):  # 0.01 each: the budget is wholly held
            assert (await model_check(http, max_output_tokens=1000))["allowed"]
        held = await model_check(http, max_output_tokens=1)
        assert held["message"].startswith(
            "Budget exceeded for model calls: 0.00 spent and 1.00 held by calls in flight of "
            "1.00 USD this day"
        )


async def test_a_model_nothing_prices_is_refused_and_a_free_one_runs(
    store: Store, clock: FakeClock
) -> None:
    async with api(store, clock) as http:
        unknown = await model_check(http, model="no-such-model-anywhere")
        assert unknown["decision"] == "deny"
        assert unknown["message"] == (
            "No price is known for model no-such-model-anywhere: ask the operator to add it "
            "to the policy's models"
        )
        assert unknown["violations"][0]["rule"] == "daily-spend"
        free = await model_check(http, model="my-local-llama", input_tokens=10**6)
        assert free["allowed"]
        assert (await settle(http, free["call_id"], {"usage": USAGE}))["charged"] == {
            "daily-spend": 0.0
        }


async def test_a_token_rate_refuses_once_settles_fill_its_window(
    store: Store, clock: FakeClock
) -> None:
    async with api(store, clock, TOKEN_POLICY) as http:
        for _ in range(3):  # 3 x 19 134 tokens: 57 402 of 60 000
            call = await model_check(http, max_output_tokens=10)
            assert call["allowed"]
            await settle(http, call["call_id"], {"usage": USAGE})
        open_call = await model_check(http, max_output_tokens=10)
        assert open_call["allowed"]  # the window is not full: a check adds nothing
        await settle(http, open_call["call_id"], {"usage": USAGE})  # 76 536: past it
        refused = await model_check(http, max_output_tokens=10)
        assert refused["decision"] == "deny"
        assert refused["message"].startswith("Rate limit: max 60000 model tokens per minute")
        other = await model_check(http, model="claude-sonnet-4-5", max_output_tokens=10)
        assert other["allowed"]  # the rule names gpt-* models only
        clock.advance(60_000)
        later = await model_check(http, max_output_tokens=10)
        assert later["allowed"], later  # a new window


async def test_a_replayed_model_check_is_the_same_call_and_another_shape_a_conflict(
    store: Store, clock: FakeClock
) -> None:
    async with api(store, clock) as http:
        first = await model_check(http, call_id="m-1", input_tokens=5, max_output_tokens=50)
        again = await model_check(http, call_id="m-1", input_tokens=5, max_output_tokens=50)
        assert again["replayed"]
        assert again["call_id"] == first["call_id"]
        other = await http.post(
            "/v1/check",
            json={"user": "alice", "kind": "model", "model": "gpt-4o", "call_id": "m-1",
                  "input_tokens": 5, "max_output_tokens": 5000},
        )  # fmt: skip
        assert other.status_code == 409
        as_tool = await http.post(
            "/v1/check", json={"user": "alice", "tool": "gpt-4o", "call_id": "m-1"}
        )
        assert as_tool.status_code == 409


async def test_usage_on_a_tool_call_is_refused_and_charges_nothing(
    store: Store, clock: FakeClock
) -> None:
    async with api(store, clock) as http:
        tool = await check(http, tool="terminal")
        response = await http.post(f"/v1/calls/{tool['call_id']}/settle", json={"usage": USAGE})
        assert response.status_code == 422
        assert_error_shape(response.json())
        assert response.json()["fields"][0]["field"] == "usage"
        assert await spent_micros(http) == (0, 50_000)  # its estimate, still held


HOSTILE_CHECKS = [
    ({"kind": "model"}, "model"),
    ({"kind": "model", "model": "m", "tool": "other"}, "tool"),
    ({"kind": "model", "model": "gpt-4o", "cost": 0}, "cost"),
    ({"kind": "model", "model": "gpt-4o", "args": {"a": 1}}, "args"),
    ({"kind": "model", "model": "gpt-4o", "host": "codex"}, "host"),
    ({"kind": "model", "model": "gpt-4o", "metadata": {"read_only": True}}, "metadata"),
    ({"tool": "terminal", "input_tokens": 5}, "input_tokens"),
    ({"tool": "terminal", "model": "gpt-4o"}, "model"),
    ({"kind": "modle", "model": "gpt-4o"}, "kind"),
    ({"kind": "model", "model": "gpt-4o", "input_tokens": -1}, "input_tokens"),
    ({"kind": "model", "model": "gpt-4o", "input_tokens": 10**9}, "input_tokens"),
    ({"kind": "model", "model": "gpt-4o", "input_tokens": "5"}, "input_tokens"),
    ({"kind": "model", "model": "gpt-4o", "input_tokens": True}, "input_tokens"),
    ({"kind": "model", "model": "gpt-4o", "input_tokens": 1.5}, "input_tokens"),
    ({"kind": "model", "model": "gpt-4o", "max_output_tokens": 10**30}, "max_output_tokens"),
    ({"kind": "model", "model": "x" * 300}, "model"),
    ({"kind": "model", "model": "gpt\u0000-4o"}, "model"),
    ({"kind": "model", "model": ["gpt-4o"]}, "model"),
]


@pytest.mark.parametrize(("body", "field"), HOSTILE_CHECKS)
async def test_a_hostile_model_check_is_a_422_naming_its_field(
    body: dict[str, Any], field: str, store: Store, clock: FakeClock
) -> None:
    async with api(store, clock) as http:
        response = await http.post("/v1/check", json={"user": "alice", **body})
        assert response.status_code == 422, response.text
        assert_error_shape(response.json())
        assert field in response.json()["message"], response.json()
        assert await spent_micros(http) == (0, 0)  # nothing reserved


HOSTILE_USAGE = [
    ({"input_tokens": -1}, "input_tokens"),
    ({"input_tokens": 10, "cache_read_tokens": 11}, "cache_read_tokens"),
    ({"input_tokens": 10, "cache_read_tokens": 6, "cache_write_tokens": 5}, "cache_write_tokens"),
    ({"output_tokens": "9"}, "output_tokens"),
    ({"output_tokens": 10**9}, "output_tokens"),
    ({"input_tokens": 1, "audio_tokens": 1}, "audio_tokens"),
]


@pytest.mark.parametrize(("usage", "field"), HOSTILE_USAGE)
async def test_a_hostile_usage_is_a_422_and_the_call_stays_open(
    usage: dict[str, Any], field: str, store: Store, clock: FakeClock
) -> None:
    async with api(store, clock) as http:
        call = await model_check(http, max_output_tokens=100)
        response = await http.post(f"/v1/calls/{call['call_id']}/settle", json={"usage": usage})
        assert response.status_code == 422, response.text
        assert field in response.text
        settled = await settle(http, call["call_id"], {"usage": USAGE})
        assert settled["outcome"] == "settled"  # nothing lost: it settles once, properly


def test_the_command_line_checks_and_settles_a_model_call(tmp_path: Path) -> None:
    """`ratewarden check --model` and `settle --input-tokens ...` against a real daemon."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    with running_daemon(tmp_path, "--policy", str(policy)) as served:
        env = clean_environment(RATEWARDEN_URL=served.url)
        checked = run_cli(
            "check", "--user", "carol", "--model", "gpt-4o", "--input-tokens", "1000",
            "--max-output-tokens", "2000", env=env,
        )  # fmt: skip
        assert (checked.returncode, checked.stderr) == (0, ""), checked.stderr
        call_id = checked.stdout.split("call_id=")[1].split()[0]
        settled = run_cli(
            "settle", call_id, "--input-tokens", "12345", "--output-tokens", "6789",
            "--cache-read-tokens", "2345", env=env,
        )  # fmt: skip
        assert settled.returncode == 0, settled.stderr
        assert settled.stdout == f"{call_id}: settled (daily-spend 0.10)\n"
        mixed = run_cli("check", "--user", "carol", "--model", "m", "--cost", "1", env=env)
        assert mixed.returncode == 2
        assert "cost: not for a model call" in mixed.stderr
        both = run_cli("check", "--user", "carol", "--model", "m", "--tool", "t", env=env)
        assert both.returncode == 2
        assert "not allowed with argument" in both.stderr
