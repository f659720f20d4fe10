"""Issue 25 item 1 through the engine, on every store: arguments that could not be sent
whole are never decided as no arguments.

Each call is built the way every adapter and hook builds it (`names.check_request`, then
the daemon's `to_call`), so a padding that used to leave the arguments out is exactly
what these calls carry. A condition on a cut path reads as holding in a rule's `match`
(the refusing rule applies, the counting rule counts) and as failing in its `unless:`
(nothing is excused on what could not be read).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.service.convert import to_call
from ratewarden.store import Store
from ratewarden.wire.names import check_request

ROOT_DELETE = "Refusing destructive root delete"
POLICY = f"""
version: 1
rules:
  - name: no-root-delete
    match:
      tool: terminal
      args: {{command: {{regex: '\\brm\\s+-rf\\s+/'}}}}
    deny: "{ROOT_DELETE}"
  - name: only-listing-for-guests
    match: {{tool: shell, user: "guest-*"}}
    unless: {{args: {{command: {{prefix: "ls "}}}}}}
    deny: "guests may only list"
  - name: same-call-repeats
    match: {{tool: poll}}
    per: [user, tool, args]
    rate: 3/10 minutes
  - name: paid-api-budget
    match: {{tool: fetch, args: {{url: {{prefix: "https://paid.example/"}}}}}}
    per: [user]
    budget: 1.00/day
"""


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


PADDINGS: dict[str, Any] = {
    "over 64 KiB": {"pad": "x" * 70_000},
    "deeper than 32 levels": {"deep": nested(40)},
    "more items than a body holds": {"many": list(range(5_000))},
    "1e400": '{"command": "rm -rf /", "n": 1e400}',  # JSON text, as hosts send it
    "an integer past 4300 digits": {"n": 10**5000},
    "NaN": {"n": math.nan},
    "strings of escapes": {"escapes": ["\x01" * 100] * 3_900},
    "a lone surrogate": {"s": "\ud800"},
}


def padded(command: str, name: str) -> Any:
    pad = PADDINGS[name]
    if isinstance(pad, str):
        return pad.replace("rm -rf /", command)
    return {"command": command, **pad}


def call(user: str, tool: str, args: Any, cost: float | None = None) -> Call:
    request = check_request(user=user, tool=tool, args=args)
    if cost is not None:
        request = request.model_copy(update={"cost": cost})
    return to_call(request)


def engine_on(store: Store, clock: FakeClock) -> Engine:
    return Engine(parse_policy(POLICY.encode()), store, clock=clock, remember_refusals=False)


@pytest.mark.parametrize("name", sorted(PADDINGS))
async def test_a_padded_root_delete_is_refused_with_the_rules_message(
    name: str, store: Store, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    decided = await engine.check(call("u", "terminal", padded("rm -rf /", name)))
    assert (decided.decision, decided.message) == ("deny", ROOT_DELETE)


@pytest.mark.parametrize("name", ["over 64 KiB", "1e400", "deeper than 32 levels"])
async def test_a_harmless_command_padded_alike_is_read_whole_and_allowed(
    name: str, store: Store, clock: FakeClock
) -> None:
    """Only the paths that were cut are unknown: `command` itself was sent whole."""
    engine = engine_on(store, clock)
    decided = await engine.check(call("u", "terminal", padded("ls -la", name)))
    assert decided.decision == "allow"


async def test_unreadable_arguments_meet_every_condition_of_a_match(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    for text in ("not json at all", "[1, 2, 3]", "[" * 100_000):
        decided = await engine.check(call("u", "terminal", text))
        assert (decided.decision, decided.message) == ("deny", ROOT_DELETE), text


async def test_unless_excuses_nothing_it_could_not_read(store: Store, clock: FakeClock) -> None:
    engine = engine_on(store, clock)
    assert (await engine.check(call("guest-1", "shell", {"command": "ls -la"}))).decision == (
        "allow"
    )
    cut = {"command": "ls " + "-" * 70_000}  # starts with "ls ", but it was cut to be sent
    assert (await engine.check(call("guest-1", "shell", cut))).decision == "deny"
    assert (await engine.check(call("guest-1", "shell", padded("ls -la", "1e400")))).decision == (
        "allow"  # another argument was cut: `command` was read whole
    )


@pytest.mark.parametrize("name", ["over 64 KiB", "1e400", "more items than a body holds"])
async def test_a_loop_rule_counts_padded_calls(name: str, store: Store, clock: FakeClock) -> None:
    engine = engine_on(store, clock)
    same = padded("check the deploy", name)
    decided = [(await engine.check(call("u", "poll", same))).decision for _ in range(4)]
    assert decided == ["allow", "allow", "allow", "deny"]
    # Padded apart, they count apart (the digest of what was cut tells them apart).
    other = {"command": "check the deploy", "pad": "z" * 70_000}
    assert (await engine.check(call("u", "poll", other))).decision == "allow"


async def test_an_argument_matched_budget_charges_padded_calls(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(store, clock)
    url = "https://paid.example/search?q=" + "q" * 70_000  # the url itself was cut
    for _ in range(2):
        assert (await engine.check(call("u", "fetch", {"url": url}, cost=0.5))).decision == "allow"
    third = await engine.check(call("u", "fetch", {"url": url}, cost=0.5))
    assert third.decision == "deny"
    assert third.message.startswith("Budget exceeded")
