"""A change of the runtime overrides rebuilds the policy from what it compiled before
(policy/compile.py `with_runtime`): the result is the policy a whole compile gives."""

from __future__ import annotations

import random

from ratewarden.policy import parse_policy
from ratewarden.policy.compile import with_runtime
from ratewarden.policy.schema import OverrideSpec

POLICY = b"""\
version: 1
groups:
  pro: [carol, u1]
  ops: [u2, team-3]
rules:
  - {name: terminal, match: {tool: terminal}, per: [user], rate: 2/minute}
  - {name: spend, match: {tool: browser}, per: [user], budget: 1/day}
overrides:
  - {users: [u1, "team-*"], rule: terminal, rate: 5/minute}
  - {groups: [ops], rule: spend, budget: 3/day}
"""
USERS = ["carol", "u1", "u2", "u3", "team-3", "team-9", "bot-1", "x"]


def a_runtime_override(rng: random.Random, n: int) -> tuple[str, OverrideSpec]:
    rule = rng.choice(["terminal", "spend", "gone"])
    users = rng.sample([*USERS, "team-*", "bot-*", "*-1", "u?"], rng.randint(0, 3))
    groups = rng.sample(["pro", "ops", "nobody"], rng.randint(0 if users else 1, 2))
    limit = {"terminal": {"rate": f"{n + 3}/minute"}, "spend": {"budget": f"{n + 3}/day"}}
    fields = limit.get(rule, {"unlimited": True})
    spec = OverrideSpec(users=users or None, groups=groups or None, rule=rule, **fields)
    return f"ovr_{n}", spec


def lookups(policy: object) -> dict[tuple[str, str], object]:
    groups = {"carol": {"pro"}, "u1": {"pro"}, "u2": {"ops"}, "team-3": {"ops"}}
    return {
        (rule.name, user): rule.overrides.find(user, frozenset(groups.get(user, ())))
        for rule in policy.rules  # type: ignore[attr-defined]
        for user in USERS
    }


def test_incremental_changes_give_the_policy_a_whole_compile_gives() -> None:
    rng = random.Random(25)
    base = parse_policy(POLICY)
    policy, runtime = base, list[tuple[str, OverrideSpec]]()
    for step in range(200):
        if runtime and rng.random() < 0.35:
            runtime.pop(rng.randrange(len(runtime)))
        else:
            runtime.insert(0, a_runtime_override(rng, step))  # newest first
        policy = with_runtime(policy, runtime)
        whole = parse_policy(POLICY, runtime=runtime)
        assert lookups(policy) == lookups(whole), step
        assert policy.idle_overrides == whole.idle_overrides
        assert policy.version == base.version
