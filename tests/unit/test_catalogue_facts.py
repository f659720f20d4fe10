"""The tool catalogue classifies a tool for callers that cannot say what it is (Envoy sees
a `tools/call`'s name, never the server's annotations): each flag the call leaves unsaid
comes from the tool's entry, a flag the call sends wins (docs/policy.md)."""

from __future__ import annotations

import asyncio

import pytest

from ratewarden.engine import Engine
from ratewarden.policy import PolicyError, parse_policy
from ratewarden.service.convert import to_call
from ratewarden.store import store_from_url
from ratewarden.wire.bodies import CheckRequest

DEMO = """\
version: 1
tools:
  read_file: {read_only: true}
  "search_*": {read_only: true, open_world: false}
  delete_file: {destructive: true, label: deletes}
rules:
  - name: demo-mode
    match: {read_only: false}
    deny: "Demo mode: only read-only tools are available"
"""


def decide(policy_text: str, **fields: object) -> str:
    policy = parse_policy(policy_text.encode())
    body = CheckRequest.model_validate({"user": "guest", **fields})
    engine = Engine(policy, store_from_url("memory://"))
    return asyncio.run(engine.check(to_call(body, policy.names, policy.tool_facts))).decision


def test_a_catalogued_read_only_tool_runs_and_others_are_refused() -> None:
    assert decide(DEMO, tool="read_file") == "allow"
    assert decide(DEMO, tool="search_web") == "allow"  # a glob's entry
    assert decide(DEMO, tool="delete_file") == "deny"
    assert decide(DEMO, tool="terminal") == "deny"  # not catalogued: unclassified


def test_the_callers_own_flag_wins_over_the_catalogue() -> None:
    assert decide(DEMO, tool="read_file", metadata={"read_only": False}) == "deny"
    assert decide(DEMO, tool="terminal", metadata={"read_only": True}) == "allow"


def test_unsaid_flags_are_filled_in_and_said_ones_kept() -> None:
    policy = parse_policy(DEMO.encode())
    assert policy.tool_facts is not None
    body = CheckRequest.model_validate(
        {"user": "u", "tool": "search_docs", "metadata": {"idempotent": True, "tags": ["x"]}}
    )
    facts = to_call(body, policy.names, policy.tool_facts).facts
    assert (facts.read_only, facts.open_world, facts.idempotent) == (True, False, True)
    assert facts.tags == frozenset({"x"})


def test_a_policy_that_classifies_nothing_adds_no_step() -> None:
    plain = parse_policy(b"version: 1\ntools:\n  terminal: {label: shell, cost: 0.01}\n")
    assert plain.tool_facts is None


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("{same_as: terminal, read_only: true}", "read_only does not apply with same_as"),
        ("{read_only: maybe}", "read_only"),
        ("{read_only: 1}", "read_only"),
        ("{destructive: 'true'}", "destructive"),
    ],
)
def test_a_bad_classification_is_refused_naming_it(entry: str, words: str) -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy(f"version: 1\ntools:\n  my_tool: {entry}\n".encode())
    assert words in str(raised.value)
