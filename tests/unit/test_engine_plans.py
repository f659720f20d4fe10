"""The engine's per-rule plans (engine.py `_Plan`): made once per policy, never stale.

A plan holds what an applied rule contributes to every call (key parts, kind, limit,
roles). It must be made once per rule the policy shares, not per call or per user (or
memory would grow with the users); a reload must take effect at once; and reads that
build their own rule list (`usage`) must not leave plans behind.
"""

from __future__ import annotations

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Engine
from ratewarden.policy import Policy, parse_policy
from ratewarden.store import MemoryStore

NOW = 1_700_000_000_000

POLICY = """\
version: 1
rules:
  - {name: per-user, per: [user], rate: LIMIT/minute}
  - {name: per-tool, per: [tool], rate: 1000/minute, algorithm: fixed_window}
  - {name: vip-slots, per: [user], concurrency: 2, match: {user: vip}}
"""


def policy(limit: int) -> Policy:
    return parse_policy(POLICY.replace("LIMIT", str(limit)).encode())


async def test_plans_are_made_per_rule_not_per_call_or_user() -> None:
    engine = Engine(policy(3), MemoryStore(FakeClock(NOW)))
    for user in ["u1", "u2", "vip"] * 3:
        await engine.check(Call(user=user, tool="terminal", call_id=f"{user}-first"))
    # The policy shares its Applied per distinct set of rules and limits: everyone's
    # (per-user, per-tool) and vip's (per-user, per-tool, vip-slots), so five plans.
    assert len(engine._plan_of) == 5
    for i in range(200):
        await engine.check(Call(user=f"user-{i}", tool=f"tool-{i % 7}", call_id=str(i)))
    assert len(engine._plan_of) == 5  # more users and tools: no more plans
    for i in range(50):
        await engine.usage(f"u{i}", tool="terminal")
    assert len(engine._plan_of) == 5  # usage builds its own rule list: it leaves no plans


async def test_a_reload_takes_effect_on_the_next_call() -> None:
    engine = Engine(policy(2), MemoryStore(FakeClock(NOW)))
    decisions = [
        (await engine.check(Call(user="alice", tool="t", call_id=f"a{i}"))).decision
        for i in range(3)
    ]
    assert decisions == ["allow", "allow", "deny"]
    engine.policy = policy(5)  # what a reload does
    decision = await engine.check(Call(user="alice", tool="t", call_id="a3"))
    assert decision.decision == "allow"
    assert [v.limit for v in decision.limits if v.rule == "per-user"] == [5]
