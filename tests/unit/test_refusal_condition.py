"""A refusal's `condition` (docs/api.md, "A refusal's detail"): what an access or `args`
rule's `match` asks, worked out once at load in `policy explain`'s words."""

from __future__ import annotations

from ratewarden.calls import Call
from ratewarden.policy import parse_policy

POLICY = b"""\
version: 1
groups: {pro: [alice]}
rules:
  - name: everything
    match:
      tool: [terminal, "shell_*"]
      user: [alice]
      session: ["ci-*"]
      team: [red]
      group: pro
      destructive: true
      tags: [prod]
      args: {command: {regex: 'rm\\s'}, "options.force": {in: [true]}}
    deny: "no"
  - {name: bare, deny: "never"}
  - {name: on-args, match: {args: {url: {contains: "internal"}}}, rate: 1/minute}
  - {name: counted, match: {tool: terminal, destructive: true}, rate: 1/minute}
"""


def rules() -> dict[str, str | None]:
    return {rule.name: rule.condition for rule in parse_policy(POLICY).rules}


def test_an_access_rule_states_every_condition_of_its_match_as_explain_words_them() -> None:
    policy = parse_policy(POLICY)
    rule = policy.rules[0]
    call = Call(user="alice", tool="terminal", call_id="c", args={"command": "x"})
    explained = [text for text, _ in rule.match.conditions(call, frozenset({"pro"}))]
    assert rule.condition == " and ".join(explained)
    assert rule.condition is not None
    assert rule.condition.startswith("tool in ['terminal', 'shell_*'] and user in ['alice']")
    assert rule.condition.endswith("and args.options.force is one of [true]"), rule.condition


def test_only_access_and_args_rules_carry_a_condition() -> None:
    found = rules()
    assert found["bare"] is None  # it covers every call: nothing to say
    assert found["on-args"] == "args.url contains 'internal'"
    assert found["counted"] is None  # a counting rule's refusal is its count, not a match
