"""One table of scenarios, run on every store: memory, fakeredis and a real redis-server.

Each scenario is a policy and a list of steps at fixed offsets of a fake clock. Every
step states the full expected outcome (decision, retry_after, message, remaining per
rule, shadow verdicts, warnings, approval) worked out by hand from the policy, so the
Lua script and its Python twin are held to the same, independently derived answers.

The conftest clock starts 37.345 s into a minute (and 13 min 37.345 s into an hour),
so the first clock-aligned minute window ends 22_655 ms after the start.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

import pytest
import redis.asyncio as aioredis

from ratewarden.calls import UNCLASSIFIED, Call, ToolFacts
from ratewarden.clock import FakeClock
from ratewarden.engine import Decision, Engine
from ratewarden.limiter.ops import CallRecord, CounterOp, Hold, Kind, Role
from ratewarden.limiter.script import SettleStatus
from ratewarden.policy import Policy, PolicyError, parse_policy
from ratewarden.store import MemoryStore, Store
from ratewarden.store.keys import all_keys_pattern, record_key
from ratewarden.store.redis_store import RedisStore
from tests.helpers.redis_server import RedisServer

MINUTE_ENDS_AT = 22_655  # ms after the clock's start


@dataclass(frozen=True)
class Check:
    at: int  # ms after the clock's start
    user: str
    decision: str
    remaining: dict[str, int]  # every rule that applied -> remaining after the call
    retry_after: float | None = None
    message: str = ""
    violations: tuple[str, ...] | None = None  # None: every rule in `remaining`, if refused
    shadow: dict[str, str] = field(default_factory=dict)  # shadow rule -> its message
    warnings: tuple[str, ...] = ()
    approved: bool = False
    tool: str = "terminal"
    session: str | None = None
    facts: ToolFacts = UNCLASSIFIED
    ask_approved: bool = False  # the call carries approved: true
    cost: float | None = None


@dataclass(frozen=True)
class Usage:
    at: int
    user: str
    # (rule, limit, used, remaining, reset_after), in policy order
    expected: tuple[tuple[str, float | None, float, float | None, float], ...]
    tool: str | None = None


@dataclass(frozen=True)
class Settle:
    at: int
    of: int  # the index of the check step whose call settles
    cost: float
    outcome: str = "settled"


@dataclass(frozen=True)
class Scenario:
    name: str
    policy: str
    steps: tuple[Check | Usage | Settle, ...]


def rate_msg(limit: int, label: str, window: str, retry: str | None = None) -> str:
    suffix = f" (retry in {retry})" if retry else ""
    return f"Rate limit: max {limit} {label} calls per {window}{suffix}"


SCENARIOS = [
    Scenario(
        "sliding-window-edges",
        """
version: 1
rules:
  - {name: term, match: {tool: terminal}, rate: 3/minute}
""",
        (
            Check(0, "alice", "allow", {"term": 2}),
            Check(1_000, "alice", "allow", {"term": 1}),
            Check(2_000, "alice", "allow", {"term": 0}),
            Check(
                3_000, "alice", "deny", {"term": 0}, 57.0, rate_msg(3, "terminal", "minute", "57s")
            ),
            # 1 ms before the first call leaves the window: still refused, retry rounds up.
            Check(
                59_999, "alice", "deny", {"term": 0}, 0.001, rate_msg(3, "terminal", "minute", "1s")
            ),
            # Exactly one window after the first call: it no longer counts.
            Check(60_000, "alice", "allow", {"term": 0}),
            Check(
                60_001, "alice", "deny", {"term": 0}, 0.999, rate_msg(3, "terminal", "minute", "1s")
            ),
            Check(60_001, "bob", "allow", {"term": 2}),  # per user
            Check(60_001, "alice", "allow", {}, tool="ls"),  # no rule matches
        ),
    ),
    Scenario(
        "token-bucket-burst-and-refill",
        """
version: 1
rules:
  - {name: burst, per: [user, tool], rate: 2/minute, algorithm: token_bucket, burst: 3}
""",
        (
            # Emission interval 30 s, burst 3: three at once, then one per 30 s.
            Check(0, "alice", "allow", {"burst": 2}),
            Check(0, "alice", "allow", {"burst": 1}),
            Check(0, "alice", "allow", {"burst": 0}),
            Check(0, "alice", "deny", {"burst": 0}, 30.0, rate_msg(2, "terminal", "minute", "30s")),
            Check(30_000, "alice", "allow", {"burst": 0}),
            Check(
                45_000,
                "alice",
                "deny",
                {"burst": 0},
                15.0,
                rate_msg(2, "terminal", "minute", "15s"),
            ),
            Check(45_000, "alice", "allow", {"burst": 2}, tool="browser_open"),  # per tool
            Check(150_000, "alice", "allow", {"burst": 2}),  # TAT 120 s has passed: full again
        ),
    ),
    Scenario(
        "fixed-window-edges",
        """
version: 1
rules:
  - {name: fw, rate: 2/minute, algorithm: fixed_window}
""",
        (
            Check(0, "alice", "allow", {"fw": 1}),
            Check(100, "alice", "allow", {"fw": 0}),
            Check(
                200, "alice", "deny", {"fw": 0}, 22.455, rate_msg(2, "terminal", "minute", "23s")
            ),
            Check(
                22_000, "alice", "deny", {"fw": 0}, 0.655, rate_msg(2, "terminal", "minute", "1s")
            ),
            Check(MINUTE_ENDS_AT, "alice", "allow", {"fw": 1}),  # the next aligned minute
            Check(MINUTE_ENDS_AT + 100, "alice", "allow", {"fw": 0}),
            Check(
                MINUTE_ENDS_AT + 200,
                "alice",
                "deny",
                {"fw": 0},
                59.8,
                rate_msg(2, "terminal", "minute", "1m"),
            ),
        ),
    ),
    Scenario(
        "global-and-user-tool-scopes",
        """
version: 1
rules:
  - {name: global, per: [], rate: 2/minute}
  - {name: pair, per: [user, tool], rate: 1/minute}
""",
        (
            Check(0, "alice", "allow", {"global": 1, "pair": 0}),
            Check(0, "bob", "allow", {"global": 0, "pair": 0}),  # another user, same global
            # The global counter refuses; carol's own pair counter admits but is not consumed.
            Check(
                1_000,
                "carol",
                "deny",
                {"global": 0, "pair": 1},
                59.0,
                rate_msg(2, "ls", "minute", "59s"),
                ("global",),
                tool="ls",
            ),
            # Both refuse with the same retry: the first rule in policy order words it.
            Check(
                1_000,
                "alice",
                "deny",
                {"global": 0, "pair": 0},
                59.0,
                rate_msg(2, "terminal", "minute", "59s"),
                ("global", "pair"),
            ),
            # Had carol's refused call consumed her pair counter, this would be refused.
            Check(60_500, "carol", "allow", {"global": 1, "pair": 0}, tool="ls"),
        ),
    ),
    Scenario(
        "session-scope",
        """
version: 1
rules:
  - {name: per-session, per: [session], rate: 1/minute}
""",
        (
            Check(0, "alice", "allow", {"per-session": 0}, session="s1"),
            Check(
                0,
                "bob",
                "deny",
                {"per-session": 0},
                60.0,
                rate_msg(1, "terminal", "minute", "1m"),
                session="s1",
            ),
            Check(0, "alice", "allow", {"per-session": 0}, session="s2"),
            # Calls without a session share one counter (the absent value; see store/keys.py).
            Check(0, "alice", "allow", {"per-session": 0}),
            Check(
                0, "bob", "deny", {"per-session": 0}, 60.0, rate_msg(1, "terminal", "minute", "1m")
            ),
        ),
    ),
    Scenario(
        "shadow-rule-reports-and-consumes-only-when-admitting",
        """
version: 1
rules:
  - {name: enforced, rate: 2/minute}
  - {name: watched, rate: 1/minute, mode: shadow}
""",
        (
            Check(0, "alice", "allow", {"enforced": 1, "watched": 0}),
            Check(
                1_000,
                "alice",
                "allow",
                {"enforced": 0, "watched": 0},
                shadow={"watched": rate_msg(1, "terminal", "minute", "59s")},
            ),
            Check(
                2_000,
                "alice",
                "deny",
                {"enforced": 0, "watched": 0},
                58.0,
                rate_msg(2, "terminal", "minute", "58s"),
                ("enforced",),
                shadow={"watched": rate_msg(1, "terminal", "minute", "58s")},
            ),
            # The shadow rule admitted only the call at 0: had it counted the one at 1 s,
            # it would still report a violation here.
            Check(60_000, "alice", "allow", {"enforced": 0, "watched": 0}),
        ),
    ),
    Scenario(
        "shadow-by-default-never-blocks",
        """
version: 1
defaults: {mode: shadow}
rules:
  - {name: r, rate: 1/minute}
""",
        (
            Check(0, "alice", "allow", {"r": 0}),
            Check(
                0, "alice", "allow", {"r": 0}, shadow={"r": rate_msg(1, "terminal", "minute", "1m")}
            ),
            Check(
                30_000,
                "alice",
                "allow",
                {"r": 0},
                shadow={"r": rate_msg(1, "terminal", "minute", "30s")},
            ),
        ),
    ),
    Scenario(
        "ask-then-approved",
        """
version: 1
rules:
  - {name: destructive, match: {destructive: true}, rate: 2/hour, on_exceed: ask}
  - {name: cap, rate: 3/hour}
""",
        (
            Check(0, "alice", "allow", {"destructive": 1, "cap": 2}),
            Check(1_000, "alice", "allow", {"destructive": 0, "cap": 1}),
            Check(
                2_000,
                "alice",
                "ask",
                {"destructive": 0, "cap": 1},
                3_598.0,
                rate_msg(2, "terminal", "hour", "59m58s"),
                ("destructive",),
            ),
            # Approved by a human: allowed, counted by both rules, flagged.
            Check(
                2_000,
                "alice",
                "allow",
                {"destructive": 0, "cap": 0},
                warnings=(
                    "approved past destructive: " + rate_msg(2, "terminal", "hour", "59m58s"),
                ),
                approved=True,
                ask_approved=True,
            ),
            # Approval does not lift a `deny` rule, and then nothing is consumed.
            Check(
                2_500,
                "alice",
                "deny",
                {"destructive": 0, "cap": 0},
                3_597.5,
                rate_msg(3, "terminal", "hour", "59m58s"),
                ("cap",),
                warnings=(
                    "approved past destructive: " + rate_msg(2, "terminal", "hour", "59m59s"),
                ),
                ask_approved=True,
            ),
            # Unapproved, both refuse: a `deny` rule outranks an `ask` rule that would
            # hold longer (destructive frees at 3_601 s, cap at 3_600 s).
            Check(
                2_600,
                "alice",
                "deny",
                {"destructive": 0, "cap": 0},
                3_597.4,
                rate_msg(3, "terminal", "hour", "59m58s"),
                ("destructive", "cap"),
            ),
            # The approved call at 2 s still counts: without it only one call would be live.
            Check(
                3_600_500,
                "alice",
                "ask",
                {"destructive": 0, "cap": 1},
                0.5,
                rate_msg(2, "terminal", "hour", "1s"),
                ("destructive",),
            ),
            Check(3_600_500, "alice", "allow", {"cap": 0}, facts=ToolFacts(read_only=True)),
        ),
    ),
    Scenario(
        "zero-rate-on-every-algorithm",
        """
version: 1
rules:
  - {name: sw, match: {tool: a}, rate: 0/minute}
  - {name: tb, match: {tool: b}, rate: 0/minute, algorithm: token_bucket}
  - {name: fw, match: {tool: c}, rate: 0/minute, algorithm: fixed_window}
""",
        tuple(
            Check(at, "alice", "deny", {rule: 0}, None, rate_msg(0, tool, "minute"), tool=tool)
            for at in (0, 120_000)
            for rule, tool in (("sw", "a"), ("tb", "b"), ("fw", "c"))
        ),
    ),
    Scenario(
        "override-precedence",
        """
version: 1
groups:
  pro: [alice, "ops-*"]
rules:
  - {name: r, rate: 2/minute}
overrides:
  - {users: ["*-bot"], rule: r, rate: 3/minute}
  - {groups: [pro], rule: r, rate: 4/minute}
  - {users: [alice], rule: r, rate: 5/minute}
  - {users: ["banned-*"], rule: r, rate: 0/minute}
  - {users: [root], rule: r, unlimited: true}
""",
        (
            Check(0, "alice", "allow", {"r": 4}),  # exact user (5) beats her group (4)
            Check(0, "ops-bot", "allow", {"r": 3}),  # group (4) beats the glob (3)
            Check(0, "x-bot", "allow", {"r": 2}),  # glob (3)
            Check(0, "carol", "allow", {"r": 1}),  # the rule (2)
            # Rate 0: always refused, waiting never helps, so no retry and no suffix.
            Check(0, "banned-1", "deny", {"r": 0}, None, rate_msg(0, "terminal", "minute")),
            *(Check(0, "root", "allow", {}) for _ in range(5)),  # unlimited
            Usage(0, "root", (("r", None, 0, None, 0.0),)),
            Usage(0, "banned-1", (("r", 0, 0, 0, 0.0),)),
            Usage(0, "alice", (("r", 5, 1, 4, 60.0),)),
            Check(60_000, "banned-1", "deny", {"r": 0}, None, rate_msg(0, "terminal", "minute")),
        ),
    ),
    Scenario(
        "metadata-mcp-defaults-and-tags",
        """
version: 1
rules:
  - {name: destructive, match: {destructive: true}, rate: 5/minute}
  - {name: read-only, match: {read_only: true}, rate: 5/minute}
  - {name: closed-world, match: {open_world: false}, rate: 5/minute}
  - {name: tagged, match: {tags: [net, fs]}, rate: 5/minute}
""",
        (
            # Unclassified: destructive and open-world, never read-only.
            Check(0, "u1", "allow", {"destructive": 4}),
            Check(0, "u2", "allow", {"read-only": 4}, facts=ToolFacts(read_only=True)),
            Check(
                0,
                "u3",
                "allow",
                {"destructive": 4, "read-only": 4},
                facts=ToolFacts(read_only=True, destructive=True),
            ),
            Check(0, "u4", "allow", {}, facts=ToolFacts(destructive=False)),
            Check(0, "u5", "allow", {"destructive": 4}, facts=ToolFacts(read_only=False)),
            Check(
                0,
                "u6",
                "allow",
                {"closed-world": 4},
                facts=ToolFacts(open_world=False, destructive=False),
            ),
            Check(
                0,
                "u7",
                "allow",
                {"tagged": 4},
                facts=ToolFacts(destructive=False, tags=frozenset({"fs", "x"})),
            ),
            Check(0, "u8", "allow", {}, facts=ToolFacts(destructive=False, tags=frozenset({"x"}))),
            Check(
                0,
                "u9",
                "allow",
                {"destructive": 4, "tagged": 4},
                facts=ToolFacts(tags=frozenset({"net"})),
            ),
        ),
    ),
    Scenario(
        "usage-reads-without-consuming",
        """
version: 1
rules:
  - {name: sw, rate: 2/minute}
  - {name: tb, rate: 2/minute, algorithm: token_bucket}
  - {name: fw, rate: 2/minute, algorithm: fixed_window}
  - {name: per-tool, per: [user, tool], rate: 2/minute}
""",
        (
            Check(0, "alice", "allow", {"sw": 1, "tb": 1, "fw": 1, "per-tool": 1}),
            # Without a tool, the per-tool counter is not identified.
            *(
                Usage(
                    1_000,
                    "alice",
                    (
                        ("sw", 2, 1, 1, 59.0),
                        ("tb", 2, 1, 1, 29.0),  # TAT 30 s
                        ("fw", 2, 1, 1, 21.655),  # the aligned minute ends
                    ),
                )
                for _ in range(3)
            ),
            Usage(
                1_000,
                "alice",
                (
                    ("sw", 2, 1, 1, 59.0),
                    ("tb", 2, 1, 1, 29.0),
                    ("fw", 2, 1, 1, 21.655),
                    ("per-tool", 2, 1, 1, 59.0),
                ),
                tool="terminal",
            ),
            Usage(
                1_000,
                "bob",
                (("sw", 2, 0, 2, 0.0), ("tb", 2, 0, 2, 0.0), ("fw", 2, 0, 2, 0.0)),
            ),
            # Three reads consumed nothing: one more call still fits everywhere.
            Check(2_000, "alice", "allow", {"sw": 0, "tb": 0, "fw": 0, "per-tool": 0}),
            Check(
                3_000,
                "alice",
                "deny",
                {"sw": 0, "tb": 0, "fw": 0, "per-tool": 0},
                57.0,  # the longest wait: sw and per-tool (tb 27 s, fw 19.655 s)
                rate_msg(2, "terminal", "minute", "57s"),
                ("sw", "tb", "fw", "per-tool"),
            ),
        ),
    ),
]


# Money at and beyond the ceiling (issue 15): spend saturates at 10^15 micro-units, the
# largest budget, and stays there, exact, however far approved calls push it (ten more
# billions take the true sum past 2^53, where a double stops counting exactly).
BILLION = 1_000_000_000.0
AT_CEILING = "Budget exceeded for t tools: spent 1000000000.00 of 1000000000.00 USD this day"
PAST_CEILING = (
    "approved past spend: Budget exceeded for t tools: 1000000000.00 spent and "
    "1000000000.00 held by calls in flight of 1000000000.00 USD this day (retry in 1h46m)"
)
DAY_LEFT = 6_382.655  # seconds from the clock's start to UTC midnight


def _approved_billion(at: int) -> tuple[Check, Settle]:
    """One approved call of a billion past a full budget (at step index `at`), settled."""
    check = Check(
        0, "alice", "allow", {"spend": 0}, tool="t", cost=BILLION, ask_approved=True,
        approved=True, warnings=(PAST_CEILING,),
    )  # fmt: skip
    return check, Settle(0, at, BILLION)


MONEY_SCENARIOS = [
    Scenario(
        "budget-at-and-beyond-the-money-ceiling",
        """
version: 1
rules:
  - {name: spend, budget: 1000000000/day, on_exceed: ask}
""",
        (
            Check(0, "alice", "allow", {"spend": 0}, tool="t", cost=BILLION),
            Settle(0, 0, BILLION),  # spent: exactly the ceiling
            Check(
                0,
                "alice",
                "ask",
                {"spend": 0},
                DAY_LEFT,
                AT_CEILING + " (retry in 1h46m)",
                tool="t",
                cost=0.01,
            ),
            *(step for i in range(10) for step in _approved_billion(3 + 2 * i)),
            Usage(0, "alice", (("spend", BILLION, BILLION, 0, DAY_LEFT),), tool="t"),
            Check(
                0,
                "alice",
                "ask",
                {"spend": 0},
                DAY_LEFT,
                AT_CEILING + " (retry in 1h46m)",
                tool="t",
                cost=0.0,
            ),
            Settle(0, 3, 1.0, "already_settled"),
        ),
    ),
]
SCENARIOS += MONEY_SCENARIOS

# Access rules and `unless:` (issue 17): an access rule has no counter, yet it is part of
# the one all-or-nothing decision, so these hold every store to the same counters after
# its refusals, asks and approvals (conditions on `args` and counters keyed on them:
# test_access_and_args.py, on every store too).
ACCESS_SCENARIOS = [
    Scenario(
        "access-deny-ask-and-approval",
        """
version: 1
tools: {terminal: {label: shell}}
rules:
  - name: no-terminal
    match: {tool: terminal}
    deny: "{label} is closed to {user} ({rule}, {tool})"
  - {name: confirm, match: {tool: deploy}, ask: "{tool} needs approval"}
  - {name: calls, rate: 2/minute}
""",
        (
            # No counter is asked, none is consumed.
            *(
                Check(
                    0,
                    "alice",
                    "deny",
                    {},
                    None,
                    "shell is closed to alice (no-terminal, terminal)",
                    ("no-terminal",),
                )
                for _ in range(3)
            ),
            # The counters are read for an ask (nothing taken), then counted once approved.
            Check(
                0,
                "alice",
                "ask",
                {"calls": 2},
                None,
                "deploy needs approval",
                ("confirm",),
                tool="deploy",
            ),
            Check(
                0,
                "alice",
                "allow",
                {"calls": 1},
                tool="deploy",
                ask_approved=True,
                approved=True,
                warnings=("approved past confirm: deploy needs approval",),
            ),
            Check(1_000, "alice", "allow", {"calls": 0}, tool="ls"),
            # A counter that refuses makes the ask a deny, approved or not.
            Check(
                2_000,
                "alice",
                "deny",
                {"calls": 0},
                58.0,
                rate_msg(2, "deploy", "minute", "58s"),
                ("confirm", "calls"),
                tool="deploy",
            ),
            Check(
                2_000,
                "alice",
                "deny",
                {"calls": 0},
                58.0,
                rate_msg(2, "deploy", "minute", "58s"),
                ("calls",),
                tool="deploy",
                ask_approved=True,
            ),
            Usage(
                2_000,
                "bob",
                (("no-terminal", 0, 0, 0, 0.0), ("confirm", 0, 0, 0, 0.0), ("calls", 2, 0, 2, 0.0)),
            ),
            # The first call has left the window; the refused ones never entered it.
            Check(
                60_000,
                "alice",
                "ask",
                {"calls": 1},
                None,
                "deploy needs approval",
                ("confirm",),
                tool="deploy",
            ),
        ),
    ),
    Scenario(
        "access-shadow-and-unlimited-overrides",
        """
version: 1
groups: {staff: [alice, "ops-*"]}
rules:
  - {name: closed, match: {tool: terminal}, deny: "terminal is closed"}
  - {name: watch, match: {tool: terminal}, deny: "terminal would be closed", mode: shadow}
  - {name: calls, rate: 2/minute}
overrides:
  - {users: [bob], rule: closed, unlimited: true}
  - {groups: [staff], rule: closed, unlimited: true}
""",
        (
            Check(
                0,
                "carol",
                "deny",
                {},
                None,
                "terminal is closed",
                ("closed",),
                shadow={"watch": "terminal would be closed"},
            ),
            Check(0, "bob", "allow", {"calls": 1}, shadow={"watch": "terminal would be closed"}),
            Check(0, "alice", "allow", {"calls": 1}, shadow={"watch": "terminal would be closed"}),
            Check(0, "ops-7", "allow", {"calls": 1}, shadow={"watch": "terminal would be closed"}),
            Check(0, "bob", "allow", {"calls": 0}, shadow={"watch": "terminal would be closed"}),
            Check(
                0,
                "bob",
                "deny",
                {"calls": 0},
                60.0,
                rate_msg(2, "terminal", "minute", "1m"),
                shadow={"watch": "terminal would be closed"},
            ),
            Check(0, "carol", "allow", {"calls": 1}, tool="ls"),  # her refusal took nothing
            Usage(
                0,
                "bob",
                (("closed", None, 0, None, 0.0), ("watch", 0, 0, 0, 0.0), ("calls", 2, 2, 0, 60.0)),
            ),
        ),
    ),
    Scenario(
        "unless-static-and-per-call",
        """
version: 1
groups: {staff: [alice]}
rules:
  - name: staff-only
    match: {tool: terminal}
    unless: {group: staff}
    deny: "terminal is for staff"
  - {name: ci-free, unless: {session: "ci-*"}, rate: 1/minute}
  - {name: writes, unless: {read_only: true}, rate: 1/minute}
""",
        (
            Check(0, "bob", "deny", {}, None, "terminal is for staff", ("staff-only",)),
            Check(0, "alice", "allow", {"ci-free": 0, "writes": 0}),
            # Both unless hold: no rule covers the call.
            Check(0, "alice", "allow", {}, session="ci-1", facts=ToolFacts(read_only=True)),
            Check(
                0,
                "alice",
                "deny",
                {"ci-free": 0, "writes": 0},
                60.0,
                rate_msg(1, "terminal", "minute", "1m"),
            ),
            Check(
                0,
                "alice",
                "deny",
                {"writes": 0},
                60.0,
                rate_msg(1, "terminal", "minute", "1m"),
                session="ci-2",
            ),
            Check(
                0,
                "alice",
                "deny",
                {"ci-free": 0},
                60.0,
                rate_msg(1, "terminal", "minute", "1m"),
                facts=ToolFacts(read_only=True),
            ),
            Check(0, "bob", "allow", {"ci-free": 0, "writes": 0}, tool="ls"),
        ),
    ),
]
SCENARIOS += ACCESS_SCENARIOS


def observed_check(decision: Decision) -> dict[str, object]:
    return {
        "decision": decision.decision,
        "retry_after": decision.retry_after,
        "message": decision.message,
        "remaining": {v.rule: v.remaining for v in decision.limits},
        "violations": tuple(v.rule for v in decision.violations),
        "shadow": {v.rule: v.message for v in decision.shadow},
        "warnings": decision.warnings,
        "approved": decision.approved,
        "degraded": decision.degraded,
    }


def expected_check(step: Check) -> dict[str, object]:
    violations = step.violations
    if violations is None:
        violations = tuple(step.remaining) if step.decision != "allow" else ()
    return {
        "decision": step.decision,
        "retry_after": step.retry_after,
        "message": step.message,
        "remaining": step.remaining,
        "violations": violations,
        "shadow": step.shadow,
        "warnings": step.warnings,
        "approved": step.approved,
        "degraded": False,
    }


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
async def test_scenario(scenario: Scenario, store: Store, clock: FakeClock) -> None:
    policy = parse_policy(scenario.policy.encode(), source=scenario.name)
    # The store's clock picks budget periods too. Every check goes to the store: the
    # table holds the stores to one answer (remembered refusals: test_refusal_cache.py).
    engine = Engine(policy, store, clock=clock, remember_refusals=False)
    start = clock.now_ms()
    for i, step in enumerate(scenario.steps):
        assert i == 0 or step.at >= scenario.steps[i - 1].at, "time only moves forward"
        clock.set(start + step.at)
        if isinstance(step, Usage):
            usage = await engine.usage(step.user, tool=step.tool)
            got = tuple((u.rule, u.limit, u.used, u.remaining, u.reset_after) for u in usage)
            assert got == step.expected, f"step {i}: usage of {step.user}"
            continue
        if isinstance(step, Settle):
            settled = await engine.settle(f"call-{step.of}", step.cost)
            assert settled.outcome == step.outcome, f"step {i}: settle of step {step.of}"
            continue
        call = Call(
            user=step.user,
            tool=step.tool,
            call_id=f"call-{i}",
            session=step.session,
            facts=step.facts,
            approved=step.ask_approved,
            cost=step.cost,
        )
        decision = await engine.check(call)
        assert decision.call_id == f"call-{i}"
        assert observed_check(decision) == expected_check(step), f"step {i} at +{step.at} ms"


def test_scenario_table_is_well_formed() -> None:
    """Every scenario parses, and the names are unique (pytest ids)."""
    assert len({s.name for s in SCENARIOS}) == len(SCENARIOS)
    for scenario in SCENARIOS:
        parse_policy(scenario.policy.encode(), source=scenario.name)


# ---------------------------------------------------------------------------- key expiry

EXPIRY_POLICY = b"""
version: 1
rules:
  - {name: sw, rate: 2/minute}
  - {name: tb, rate: 2/minute, algorithm: token_bucket}
  - {name: fw, rate: 2/minute, algorithm: fixed_window}
  - {name: never, match: {user: banned}, rate: 0/minute}
"""


@pytest.mark.redis
async def test_every_redis_key_has_a_ttl_bounded_by_its_algorithm(
    redis_server: RedisServer, redis_url: str, clock: FakeClock
) -> None:
    store = RedisStore(aioredis.Redis.from_url(redis_url), redis_url, clock)
    try:
        engine = Engine(parse_policy(EXPIRY_POLICY), store)
        for i in range(3):  # the third is refused and must not extend anything
            await engine.check(Call(user="alice", tool="terminal", call_id=str(i)))
        await engine.check(Call(user="banned", tool="terminal", call_id="b"))
        await engine.usage("carol")  # a read creates nothing
    finally:
        await store.close()
    sync = redis_server.client()
    keys = sorted(k.decode() for k in sync.scan_iter(match=all_keys_pattern()))
    assert keys == [
        "rw:{fw|user=alice}:fw",
        "rw:{sw|user=alice}:sw",
        "rw:{tb|user=alice}:tb",
    ]
    ttl = {key.split("|")[0][4:]: sync.pttl(key) for key in keys}
    # Only the two allowed calls (named by their caller) are recorded: not the refused
    # ones, and not the usage read.
    records = sorted(k.decode() for k in sync.scan_iter(match="rw:call:*"))
    assert records == [record_key("0"), record_key("1")]
    assert sorted(k.decode() for k in sync.scan_iter(match="*")) == sorted(keys + records)
    record_ttls = [sync.pttl(key) for key in records]
    sync.close()
    # Real time passes while the test runs (fake time does not): allow 5 s of slack.
    assert 55_000 < ttl["sw"] <= 60_000  # the window, from the last admission
    assert 55_000 < ttl["tb"] <= 60_000  # until TAT: two intervals of 30 s after time 0
    assert MINUTE_ENDS_AT - 5_000 < ttl["fw"] <= MINUTE_ENDS_AT  # until the aligned minute ends
    assert all(3_595_000 < t <= 3_600_000 for t in record_ttls)  # the policy's call_ttl: 1 h


@pytest.mark.redis
async def test_sliding_window_memory_is_bounded_by_the_limit(
    redis_server: RedisServer, redis_url: str, clock: FakeClock
) -> None:
    """The ring holds at most `limit` 6-byte timestamps after an 8-byte header."""
    store = RedisStore(aioredis.Redis.from_url(redis_url), redis_url, clock)
    sync = redis_server.client()
    try:
        engine = Engine(
            parse_policy(b"version: 1\nrules:\n  - {name: r, rate: 10/minute}\n"), store
        )
        sizes = []
        for i in range(40):  # 4 windows' worth, one call every 6 s: all admitted
            decision = await engine.check(Call(user="alice", tool="terminal", call_id=str(i)))
            assert decision.allowed
            sizes.append(sync.strlen("rw:{r|user=alice}:sw"))
            clock.advance(6_000)
    finally:
        await store.close()
        sync.close()
    assert sizes == [8 + 6 * min(n, 10) for n in range(1, 41)]


def live_keys(store: MemoryStore, pattern: str) -> int:
    now = store.clock.now_ms()
    return sum(
        1
        for key in list(store._cells.values)
        if fnmatch.fnmatchcase(key, pattern) and store._cells.get(key, now) is not None
    )


async def test_memory_store_forgets_idle_counters(clock: FakeClock) -> None:
    store = MemoryStore(clock)
    engine = Engine(parse_policy(EXPIRY_POLICY), store)
    for i in range(3):
        await engine.check(Call(user="alice", tool="terminal", call_id=str(i)))
    await engine.check(Call(user="banned", tool="terminal", call_id="b"))
    # Three counters, and the records of the two allowed calls (the refused ones: none).
    assert live_keys(store, all_keys_pattern()) == 3
    assert live_keys(store, "rw:call:*") == 2
    assert store.key_count() == 5
    clock.advance(MINUTE_ENDS_AT)  # the fixed window has ended
    assert live_keys(store, all_keys_pattern()) == 2
    clock.advance(60_000 - MINUTE_ENDS_AT - 1)
    assert live_keys(store, all_keys_pattern()) == 2  # 1 ms before the window passes: still needed
    clock.advance(1)
    assert live_keys(store, all_keys_pattern()) == 0
    assert store.key_count() == 2  # the records live for the policy's call_ttl (1 h)
    clock.advance(3_600_000 - 60_000 - 1)
    assert store.key_count() == 2
    clock.advance(1)
    assert store.key_count() == 0
    # And the counters really are empty again.
    decision = await engine.check(Call(user="alice", tool="terminal", call_id="again"))
    assert {v.rule: v.remaining for v in decision.limits} == {"sw": 1, "tb": 1, "fw": 1}


# ---------------------------------------------------------------------------- call records

LONG_LEASE_POLICY = b"""
version: 1
rules:
  - {name: gpu-slots, match: {tool: gpu}, concurrency: 1, lease_timeout: 2h}
"""


def long_lease_policy() -> Policy | None:
    """The policy, or None if it is refused for the right reason (a fix either way)."""
    try:
        return parse_policy(LONG_LEASE_POLICY)
    except PolicyError as exc:
        problem = str(exc)
    assert "lease_timeout" in problem, problem
    assert "call_ttl" in problem, problem
    return None


async def test_a_slot_can_be_released_by_its_settle_until_its_lease_ends(
    clock: FakeClock,
) -> None:
    """keys.py: a call record lives at least as long as the lease, so a late settle finds it."""
    policy = long_lease_policy()
    if policy is None:
        return
    engine = Engine(policy, MemoryStore(clock), clock=clock)
    assert (await engine.check(Call(user="u", tool="gpu", call_id="job-1"))).allowed
    clock.advance(90 * 60_000)  # the job ends after 90 minutes, within its 2 h lease
    assert (await engine.settle("job-1")).outcome == "settled"
    assert (await engine.check(Call(user="u", tool="gpu", call_id="job-2"))).allowed


@pytest.mark.redis
async def test_a_call_record_on_redis_outlives_its_lease(
    redis_server: RedisServer, redis_url: str, clock: FakeClock
) -> None:
    """Redis expires keys on its own clock: check the record's TTL against the lease."""
    policy = long_lease_policy()
    if policy is None:
        return
    store = RedisStore(aioredis.Redis.from_url(redis_url), redis_url, clock)
    try:
        engine = Engine(policy, store, clock=clock)
        assert (await engine.check(Call(user="u", tool="gpu", call_id="job-1"))).allowed
    finally:
        await store.close()
    sync = redis_server.client()
    lease_ttl = sync.pttl("rw:{gpu-slots|user=u}:cc")
    record_ttl = sync.pttl(record_key("job-1"))
    sync.close()
    assert 7_190_000 < lease_ttl <= 7_200_000
    # Both TTLs are set by one script; the two PTTL reads are a few ms apart, so allow that.
    assert record_ttl >= lease_ttl - 10, (record_ttl, lease_ttl)


# ------------------------------------------------------------ token rates, below the engine
#
# A token rate's counter (Kind.TOKENS) on every store, driven as the engine drives it: a
# check sends the op with its rule set (so the call's record lists it), and a settle
# reads the record's holds and fills each with the call's tokens and its rule's limit and
# window (zeros: the rule is gone). Every step states the store's full answer per op:
# (admitted, used, remaining, retry_after_ms, reset_after_ms). Windows are clock-aligned:
# the minute ends MINUTE_ENDS_AT after the start, the hour 2_782_655 ms after it.

HOUR_ENDS_AT = 2_782_655
ENFORCE, SHADOW, FORCED = Role.ENFORCE, Role.SHADOW, Role.FORCED

OpAnswer = tuple[bool, int, int, int | None, int]


@dataclass(frozen=True)
class TokenCall:
    at: int
    call: str
    ops: tuple[tuple[str, Role], ...]  # (counter, role), in op order
    expected: tuple[OpAnswer, ...]
    dry: bool = False  # a read (GET /v1/usage): nothing taken, nothing recorded


@dataclass(frozen=True)
class TokenSettle:
    at: int
    call: str
    tokens: int
    status: SettleStatus
    charged: tuple[int, ...] = ()
    rule_gone: bool = False


@dataclass(frozen=True)
class TokenScenario:
    name: str
    counters: dict[str, tuple[Kind, int, int]]  # name -> (kind, limit, window_ms)
    steps: tuple[TokenCall | TokenSettle, ...]


ONE = (("tk", ENFORCE),)

TOKEN_SCENARIOS = [
    TokenScenario(
        "token-window-check-settle-rollover",
        {"tk": (Kind.TOKENS, 1_000, 60_000)},
        (
            TokenCall(0, "a", ONE, ((True, 0, 1_000, 0, 0),)),
            TokenCall(0, "b", ONE, ((True, 0, 1_000, 0, 0),)),  # a check adds nothing
            TokenSettle(100, "a", 600, SettleStatus.SETTLED, (0,)),
            TokenCall(200, "c", ONE, ((True, 600, 400, 0, 22_455),)),
            # A call in flight when the window filled takes it past its limit.
            TokenSettle(300, "b", 500, SettleStatus.SETTLED, (0,)),
            TokenCall(400, "d", ONE, ((False, 1_100, 0, 22_255, 22_255),)),
            TokenSettle(500, "a", 999, SettleStatus.ALREADY_SETTLED),  # adds nothing
            TokenSettle(500, "d", 999, SettleStatus.UNKNOWN),  # refused: nothing recorded
            TokenCall(600, "read", ONE, ((False, 1_100, 0, 22_055, 22_055),), dry=True),
            TokenCall(22_600, "e", ONE, ((False, 1_100, 0, 55, 55),)),
            TokenCall(MINUTE_ENDS_AT, "f", ONE, ((True, 0, 1_000, 0, 0),)),  # turned over
            # Checked in the old window, settled in the new: its tokens land in the new.
            TokenSettle(MINUTE_ENDS_AT + 10, "c", 300, SettleStatus.SETTLED, (0,)),
            TokenCall(MINUTE_ENDS_AT + 20, "g", ONE, ((True, 300, 700, 0, 59_980),)),
            TokenSettle(MINUTE_ENDS_AT + 30, "f", 0, SettleStatus.SETTLED, (0,)),
            TokenCall(MINUTE_ENDS_AT + 40, "h", ONE, ((True, 300, 700, 0, 59_960),)),
            TokenSettle(MINUTE_ENDS_AT + 50, "g", 700, SettleStatus.SETTLED, (0,)),
            TokenCall(MINUTE_ENDS_AT + 60, "i", ONE, ((False, 1_000, 0, 59_940, 59_940),)),
        ),
    ),
    TokenScenario(
        "token-window-roles-beside-a-fixed-window",
        {"tk": (Kind.TOKENS, 100, 60_000), "fw": (Kind.FIXED_WINDOW, 2, 60_000)},
        (
            TokenCall(
                0,
                "a",
                (("tk", ENFORCE), ("fw", ENFORCE)),
                ((True, 0, 100, 0, 0), (True, 1, 1, 0, 22_655)),
            ),
            TokenSettle(10, "a", 150, SettleStatus.SETTLED, (0,)),  # only the token rate holds
            # A shadow token rate refuses, the call is allowed: its settle still adds.
            TokenCall(
                20,
                "b",
                (("tk", SHADOW), ("fw", ENFORCE)),
                ((False, 150, 0, 22_635, 22_635), (True, 2, 0, 0, 22_635)),
            ),
            TokenSettle(30, "b", 50, SettleStatus.SETTLED, (0,)),
            # An approved `ask` token rate: allowed past it, nothing taken, settled.
            TokenCall(
                40,
                "c",
                (("tk", FORCED), ("fw", SHADOW)),
                ((False, 200, 0, 22_615, 22_615), (False, 2, 0, 22_615, 22_615)),
            ),
            TokenSettle(50, "c", 25, SettleStatus.SETTLED, (0,)),
            # Blocked by another rule: not recorded, so its settle adds nothing.
            TokenCall(
                60,
                "d",
                (("tk", SHADOW), ("fw", ENFORCE)),
                ((False, 225, 0, 22_595, 22_595), (False, 2, 0, 22_595, 22_595)),
            ),
            TokenSettle(70, "d", 1_000, SettleStatus.UNKNOWN),
            TokenCall(80, "read", ONE, ((False, 225, 0, 22_575, 22_575),), dry=True),
        ),
    ),
    TokenScenario(
        "token-window-limit-zero-and-rule-gone",
        {"zero": (Kind.TOKENS, 0, 60_000), "tk": (Kind.TOKENS, 1_000, 3_600_000)},
        (
            TokenCall(
                0,
                "a",
                (("zero", SHADOW), ("tk", ENFORCE)),
                ((False, 0, 0, None, 0), (True, 0, 1_000, 0, 0)),
            ),
            TokenCall(0, "z", (("zero", ENFORCE),), ((False, 0, 0, None, 0),)),  # no retry
            TokenSettle(10, "a", 40, SettleStatus.SETTLED, (0, 0)),
            TokenCall(
                20,
                "b",
                (("zero", ENFORCE), ("tk", ENFORCE)),
                ((False, 40, 0, None, 22_635), (True, 40, 960, 0, HOUR_ENDS_AT - 20)),
            ),
            TokenCall(30, "c", ONE, ((True, 40, 960, 0, HOUR_ENDS_AT - 30),)),
            TokenSettle(40, "c", 500, SettleStatus.SETTLED, (0,), rule_gone=True),  # adds nothing
            TokenCall(50, "read", ONE, ((True, 40, 960, 0, HOUR_ENDS_AT - 50),), dry=True),
        ),
    ),
]


def token_key(scenario: TokenScenario, counter: str) -> str:
    """Each counter under a hash tag of its own: on a cluster, a call spans slots."""
    return f"rw:{{{scenario.name}-{counter}}}:{scenario.counters[counter][0].value}"


async def run_token_scenario(scenario: TokenScenario, store: Store, clock: FakeClock) -> None:
    start = clock.now_ms()
    by_key = {token_key(scenario, name): spec for name, spec in scenario.counters.items()}
    for i, step in enumerate(scenario.steps):
        assert i == 0 or step.at >= scenario.steps[i - 1].at, "time only moves forward"
        clock.set(start + step.at)
        where = f"step {i} ({step.call})"
        if isinstance(step, TokenCall):
            ops = []
            for name, role in step.ops:
                kind, limit, window = scenario.counters[name]
                rule = name if kind is Kind.TOKENS else ""  # as the engine sends it
                ops.append(
                    CounterOp(token_key(scenario, name), kind, role, limit, window, rule=rule)
                )
            record = CallRecord(
                record_key(step.call), step.call, f"fp-{step.call}", 3_600_000, False
            )
            found = await store.evaluate(ops, None if step.dry else record, dry_run=step.dry)
            got = tuple(
                (r.admitted, r.used, r.remaining, r.retry_after_ms, r.reset_after_ms)
                for r in found.results
            )
            assert got == step.expected, where
            continue
        recorded_call = await store.read_holds(record_key(step.call))
        holds = []
        for hold in recorded_call.holds if recorded_call else []:
            _, limit, window = by_key[hold.key]
            numbers = (0, 0, 0) if step.rule_gone else (limit, window, 0)
            holds.append(Hold(hold.kind, hold.key, step.tokens, hold.rule, numbers))
        fingerprint = recorded_call.fingerprint if recorded_call else f"fp-{step.call}"
        settled = await store.settle(record_key(step.call), step.call, None, holds, fingerprint)
        assert settled == (step.status, list(step.charged)), where


@pytest.mark.parametrize("scenario", TOKEN_SCENARIOS, ids=lambda s: s.name)
async def test_token_scenario(scenario: TokenScenario, store: Store, clock: FakeClock) -> None:
    await run_token_scenario(scenario, store, clock)
