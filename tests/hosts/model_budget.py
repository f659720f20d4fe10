"""One daily budget over a user's model calls and tool calls: the shared scenario of the
model-call host proofs (issue 31, item 6; docs/budgets.md).

Each host's test drives the real framework with a scripted model that reports `USAGE`
for every answer, against one `ratewarden serve` with `POLICY`:

1. the user's model calls drain the 1.00 USD day by their real usage, each settle
   charging exactly `price_micros(MODEL, USAGE)` (genai-prices' own calculation, rounded
   up to the micro-unit: the oracle is computed here, not by the daemon);
2. a model call whose maximum cost is more than what is left is refused with the
   single-call message (`SINGLE_CALL`);
3. the next tool call is refused with the budget message of the same rule (`BUDGET`);
4. a second user is untouched (`spent_micros` is 0, their tool call allowed).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

import httpx

from tests.helpers.daemon import Daemon, read_usage

MODEL = "gpt-4o"  # genai-prices: 2.5 input, 1.25 cached input, 10 output USD per MTok
# What the scripted model reports for each answer: odd numbers, so that a cost is a
# fraction of a micro-unit (0.09582125 USD) and the rounding is tested too.
USAGE = {"input_tokens": 12_345, "output_tokens": 6_789, "cache_read_tokens": 2_345}
RULE = "daily-spend"
# `{timezone}`: a zone where it is about noon (test_one_budget_across_surfaces'
# midday_timezone), so the day cannot end between the calls.
POLICY = """\
version: 1
defaults:
  timezone: {timezone}
  max_output_tokens: 8000
tools:
  terminal: {{label: shell, cost: 0.05}}
rules:
  - name: daily-spend
    match: {{kind: any}}
    per: [user]
    budget: 1.00/day
"""
# The tool call refused once model calls spent the day (the rule's default message).
BUDGET = re.compile(r"^Budget exceeded for shell tools: spent 0\.\d\d of 1\.00 USD this day")
# A model call that could cost more than what is left (max_output_tokens 8000 and more).
SINGLE_CALL = re.compile(
    r"^This model call could cost up to \d+\.\d\d USD; \d+\.\d\d USD is left of today's "
    r"1\.00 USD budget: ask for a shorter answer or a smaller model"
)


def price_micros(model: str = MODEL, usage: dict[str, int] | None = None) -> int:
    """What `usage` of `model` costs in micro-USD by genai-prices, rounded up."""
    from genai_prices import Usage, calc_price

    price = calc_price(Usage(**(usage or USAGE)), model).total_price
    return math.ceil(price * Decimal(1_000_000))


def spent_micros(daemon: Daemon, user: str, rule: str = RULE) -> int:
    """What the daemon says `user` spent under `rule` today, in micro-USD."""
    used = read_usage(daemon.url, user).get(rule, {}).get("used", 0)
    return round(float(used) * 1_000_000)


def usage_body() -> dict[str, Any]:
    """The settle body of one scripted answer, as a host without an adapter sends it."""
    return {"status": "ok", "usage": USAGE}


def spend_rows(daemon: Daemon, user: str) -> list[dict[str, Any]]:
    """`user`'s rows of the spend history (GET /v1/admin/spend)."""
    answer = httpx.get(f"{daemon.url}/v1/admin/spend", params={"user": user}, trust_env=False)
    answer.raise_for_status()
    rows: list[dict[str, Any]] = answer.json()["rows"]
    return rows
