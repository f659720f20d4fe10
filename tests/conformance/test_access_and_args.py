"""Issue 17 through the engine: access rules, `unless:`, conditions on arguments and
counters keyed on arguments, on memory, fakeredis and a real redis-server alike.

An access rule (`deny:` or `ask:`) has no counter, but it takes part in the one
all-or-nothing decision: the tests below read every counter after a refusal to show
that nothing was consumed. Counters keyed on `args` are shown to ignore key order, to
tell different arguments apart, and (on a real Redis, by SCAN) to hold only digests.
Policy files with a bad access rule, condition or path are refused at load with
`file:line: field: message`.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from ratewarden.calls import Call, ToolFacts
from ratewarden.clock import FakeClock
from ratewarden.engine import Decision, Engine
from ratewarden.policy import PolicyError, load_policy, parse_policy
from ratewarden.store import MemoryStore, Store
from ratewarden.store.redis_store import RedisStore
from tests.helpers.redis_server import RedisServer

_call_ids = itertools.count()

REPEATED_3_IN_10_MINUTES = (
    "Repeated call: terminal was called with the same arguments 3 times in the last "
    "10 minutes; change the arguments or the approach"
)


def engine_on(text: str, store: Store, clock: FakeClock) -> Engine:
    """Every check goes to the store (no remembered refusals), so counters can be read."""
    return Engine(parse_policy(text.encode()), store, clock=clock, remember_refusals=False)


def call(user: str = "u", tool: str = "terminal", **fields: Any) -> Call:
    return Call(user, tool, f"c-{next(_call_ids)}", **fields)


def remaining(decision: Decision) -> dict[str, object]:
    return {v.rule: v.remaining for v in decision.limits}


async def used(engine: Engine, user: str, tool: str = "terminal") -> dict[str, object]:
    """What each rule's counter for `user` holds, read without consuming."""
    return {u.rule: u.used for u in await engine.usage(user, tool=tool)}


def in_process() -> tuple[Store, FakeClock]:
    clock = FakeClock(1_700_000_000_000)
    return MemoryStore(clock), clock


# -- access rules -------------------------------------------------------------------------

ACCESS_POLICY = """
version: 1
tools:
  terminal: {label: shell}
rules:
  - name: no-terminal
    match: {tool: terminal}
    deny: "{tool} ({label}) is closed to {user} by {rule}"
  - name: confirm-deploy
    match: {tool: deploy}
    ask: "{tool} needs a human's approval"
  - name: calls
    rate: 2/minute
  - name: slots
    concurrency: 5
  - name: spend
    budget: 10/day
"""


async def test_a_deny_rule_refuses_with_its_text_rendered(store: Store, clock: FakeClock) -> None:
    engine = engine_on(ACCESS_POLICY, store, clock)
    refused = await engine.check(call("alice", "terminal", cost=1.0))
    assert refused.decision == "deny"
    assert refused.message == "terminal (shell) is closed to alice by no-terminal"
    assert [(v.rule, v.kind, v.on_exceed) for v in refused.violations] == [
        ("no-terminal", "access", "deny")
    ]
    assert refused.retry_after is None  # waiting never lifts it
    assert refused.limits == ()  # no counter was asked
    approved = await engine.check(call("alice", "terminal", approved=True))
    assert (approved.decision, approved.approved) == ("deny", False)  # only an ask is approved


async def test_a_deny_outranks_an_ask_whatever_their_order(store: Store, clock: FakeClock) -> None:
    policy = """
version: 1
rules:
  - {name: first-ask, match: {tool: terminal}, ask: "asks first"}
  - {name: then-deny, match: {tool: terminal}, deny: "denies second"}
  - {name: another-deny, deny: "denies everything"}
  - {name: calls, rate: 1/minute}
"""
    engine = engine_on(policy, store, clock)
    for approved in (False, True):
        refused = await engine.check(call(approved=approved))
        assert (refused.decision, refused.message) == ("deny", "denies second")
        expected = (
            ["then-deny", "another-deny"]
            if approved
            else ["first-ask", "then-deny", "another-deny"]
        )
        assert [v.rule for v in refused.violations] == expected
    assert (await used(engine, "u"))["calls"] == 0


async def test_an_enforcing_deny_consumes_nothing_in_any_other_rule(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(ACCESS_POLICY, store, clock)
    for _ in range(5):
        assert (await engine.check(call("alice", "terminal", cost=1.0))).decision == "deny"
    assert await used(engine, "alice") == {"no-terminal": 0, "calls": 0, "slots": 0, "spend": 0}
    # Every counter still has all of its room: two calls fit, the third is refused.
    first = await engine.check(call("alice", "ls", cost=1.0))
    assert remaining(first) == {"calls": 1, "slots": 4, "spend": 9.0}
    assert (await engine.check(call("alice", "ls"))).allowed
    third = await engine.check(call("alice", "ls"))
    assert [v.rule for v in third.violations] == ["calls"]


async def test_an_ask_rule_asks_and_an_approval_passes_it_and_is_counted(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(ACCESS_POLICY, store, clock)
    asked = await engine.check(call("bob", "deploy"))
    assert (asked.decision, asked.message) == ("ask", "deploy needs a human's approval")
    assert [v.rule for v in asked.violations] == ["confirm-deploy"]
    assert remaining(asked) == {"calls": 2, "slots": 5, "spend": 10.0}  # read, not taken
    assert (await used(engine, "bob", "deploy"))["calls"] == 0
    approved = await engine.check(call("bob", "deploy", approved=True))
    assert approved.decision == "allow"
    assert approved.approved
    assert approved.warnings == ("approved past confirm-deploy: deploy needs a human's approval",)
    assert remaining(approved) == {"calls": 1, "slots": 4, "spend": 10.0}
    assert await used(engine, "bob", "deploy") == {
        "confirm-deploy": 0,
        "calls": 1,
        "slots": 1,
        "spend": 0,
    }


async def test_an_ask_rule_with_a_counter_that_refuses_is_a_deny(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(ACCESS_POLICY, store, clock)
    for _ in range(2):
        assert (await engine.check(call("bob", "deploy", approved=True))).allowed
    for approved in (False, True):  # approval lifts the question, not the counter
        refused = await engine.check(call("bob", "deploy", approved=approved))
        assert refused.decision == "deny"
        assert refused.message == "Rate limit: max 2 deploy calls per minute (retry in 1m)"
        assert refused.retry_after == 60.0
        assert "calls" in [v.rule for v in refused.violations]
    # The asks and the refusals took nothing: once the window passes, two fit again.
    clock.advance(60_000)
    assert (await engine.check(call("bob", "deploy"))).decision == "ask"
    assert (await used(engine, "bob", "deploy"))["calls"] == 0


SHADOW_ACCESS_POLICY = """
version: 1
rules:
  - name: would-deny
    match: {tool: terminal}
    deny: "terminal would be closed"
    mode: shadow
  - name: would-ask
    match: {tool: terminal}
    ask: "terminal would need approval"
    mode: shadow
  - name: calls
    rate: 1/minute
"""


async def test_a_shadow_access_rule_allows_and_reports(store: Store, clock: FakeClock) -> None:
    engine = engine_on(SHADOW_ACCESS_POLICY, store, clock)
    allowed = await engine.check(call("alice"))
    assert allowed.decision == "allow"
    assert {v.rule: v.message for v in allowed.shadow} == {
        "would-deny": "terminal would be closed",
        "would-ask": "terminal would need approval",
    }
    assert remaining(allowed) == {"calls": 0}  # counted as usual
    refused = await engine.check(call("alice"))  # the enforcing counter still refuses
    assert [v.rule for v in refused.violations] == ["calls"]
    assert {v.rule for v in refused.shadow} == {"would-deny", "would-ask"}


OVERRIDE_POLICY = """
version: 1
groups:
  staff: [alice, "ops-*"]
rules:
  - name: no-terminal
    match: {tool: terminal}
    deny: "terminal is closed"
  - name: calls
    rate: 5/minute
overrides:
  - {users: [bob], rule: no-terminal, unlimited: true}
  - {users: ["bot-*"], rule: no-terminal, unlimited: true}
  - {groups: [staff], rule: no-terminal, unlimited: true}
"""


@pytest.mark.parametrize("user", ["bob", "bot-7", "alice", "ops-1"])
async def test_an_unlimited_override_lifts_an_access_rule(
    user: str, store: Store, clock: FakeClock
) -> None:
    engine = engine_on(OVERRIDE_POLICY, store, clock)
    lifted = await engine.check(call(user))
    assert lifted.allowed
    assert remaining(lifted) == {"calls": 4}  # and counted like any allowed call
    refused = await engine.check(call("carol"))
    assert (refused.decision, refused.message) == ("deny", "terminal is closed")
    usage = {u.rule: (u.kind, u.limit, u.remaining) for u in await engine.usage(user)}
    assert usage["no-terminal"] == ("access", None, None)  # unlimited for this user


async def test_usage_lists_access_rules(store: Store, clock: FakeClock) -> None:
    engine = engine_on(ACCESS_POLICY, store, clock)
    usage = await engine.usage("alice", tool="terminal")
    assert [(u.rule, u.kind, u.mode, u.limit, u.used, u.remaining) for u in usage] == [
        ("no-terminal", "access", "enforce", 0, 0, 0),
        ("calls", "rate", "enforce", 2, 0, 2),
        ("slots", "concurrency", "enforce", 5, 0, 5),
        ("spend", "budget", "enforce", 10.0, 0.0, 10.0),
    ]
    anywhere = [u.rule for u in await engine.usage("alice")]  # no tool: both could apply
    assert anywhere == ["no-terminal", "confirm-deploy", "calls", "slots", "spend"]
    assert [u.rule for u in await engine.usage("alice", tool="ls")] == ["calls", "slots", "spend"]


UNLESS_STAFF_POLICY = """
version: 1
groups:
  staff: [alice]
rules:
  - name: terminal-for-staff
    match: {tool: terminal}
    unless: {group: staff}
    deny: "terminal is available to staff accounts only"
"""


def test_usage_leaves_out_a_rule_whose_unless_excludes_the_user() -> None:
    policy = parse_policy(UNLESS_STAFF_POLICY.encode())
    listed = [a.rule.name for a in policy.for_usage("alice", "terminal", None, None)]
    assert listed == []
    assert [a.rule.name for a in policy.for_usage("bob", "terminal", None, None)] == [
        "terminal-for-staff"
    ]


# -- unless: -------------------------------------------------------------------------------

# (unless, a call it excludes, a call it does not): the rule matches every call.
UNLESS_CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("{tool: ls}", {"tool": "ls"}, {"tool": "terminal"}),
    ("{tool: 'read_*'}", {"tool": "read_file"}, {"tool": "write_file"}),
    ("{user: [alice, 'svc-*']}", {"user": "svc-1"}, {"user": "bob"}),
    ("{group: staff}", {"user": "alice"}, {"user": "bob"}),
    ("{session: 'ci-*'}", {"session": "ci-9"}, {"session": "dev-1"}),
    ("{session: 'ci-*'}", {"session": "ci-9"}, {}),  # no session: not excluded
    ("{team: research}", {"team": "research"}, {"team": "ops"}),
    ("{read_only: true}", {"facts": ToolFacts(read_only=True)}, {}),  # unclassified: not
    ("{destructive: false}", {"facts": ToolFacts(destructive=False)}, {}),
    ("{open_world: false}", {"facts": ToolFacts(open_world=False)}, {}),
    ("{idempotent: true}", {"facts": ToolFacts(idempotent=True)}, {}),
    (
        "{requires_confirmation: false}",
        {"facts": ToolFacts(requires_confirmation=False)},
        {"facts": ToolFacts(requires_confirmation=True)},
    ),
    (
        "{tags: [safe, docs]}",
        {"facts": ToolFacts(tags=frozenset({"docs"}))},
        {"facts": ToolFacts(tags=frozenset({"net"}))},
    ),
    ("{args: {command: 'ls *'}}", {"args": {"command": "ls -la"}}, {"args": {"command": "rm"}}),
    ("{args: {command: 'ls *'}}", {"args": {"command": "ls -la"}}, {}),  # no args: not
    # All of unless must hold: static and per-call parts together.
    ("{group: staff, session: 'ci-*'}", {"user": "alice", "session": "ci-1"}, {"user": "alice"}),
    (
        "{group: staff, session: 'ci-*'}",
        {"user": "alice", "session": "ci-1"},
        {"user": "bob", "session": "ci-1"},
    ),
]


@pytest.mark.parametrize(("unless", "excluded", "covered"), UNLESS_CASES)
async def test_unless_takes_every_match_key(
    unless: str, excluded: dict[str, Any], covered: dict[str, Any]
) -> None:
    policy = f"""
version: 1
groups: {{staff: [alice]}}
rules:
  - name: closed
    unless: {unless}
    deny: "closed"
"""
    engine = engine_on(policy, *in_process())
    assert (await engine.check(call(**excluded))).allowed, "unless holds: not covered"
    assert (await engine.check(call(**covered))).decision == "deny", "unless fails: covered"


UNLESS_COUNTED_POLICY = """
version: 1
groups: {staff: [alice]}
rules:
  - name: terminal-calls
    match: {tool: terminal}
    unless: {group: staff}
    rate: 1/minute
  - name: session-calls
    unless: {session: 'ci-*'}
    rate: 1/minute
  - name: command-calls
    unless: {args: {command: {prefix: 'git '}}}
    rate: 1/minute
"""


async def test_a_call_unless_excludes_is_not_counted(store: Store, clock: FakeClock) -> None:
    engine = engine_on(UNLESS_COUNTED_POLICY, store, clock)
    staff = await engine.check(call("alice", session="ci-1", args={"command": "git log"}))
    assert staff.allowed
    assert remaining(staff) == {}  # every rule's unless holds: no counter at all
    # Each unless excludes its own rule only: one call each, then refused.
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("bob", {"session": "ci-1", "args": {"command": "git status"}}, "terminal-calls"),
        ("alice", {"args": {"command": "git status"}}, "session-calls"),
        ("alice", {"session": "ci-1", "args": {"command": "ls"}}, "command-calls"),
    ]
    for user, fields, counted in cases:
        first = await engine.check(call(user, "terminal", **fields))
        assert remaining(first) == {counted: 0}, user
        second = await engine.check(call(user, "terminal", **fields))
        assert [v.rule for v in second.violations] == [counted], user


# -- match.args ----------------------------------------------------------------------------

ROOT_DELETE = r"\brm\s+-rf\s+/(\s|$)"

# (path, condition as YAML, args, whether the condition holds)
ARG_CASES: list[tuple[str, str, dict[str, Any] | None, bool]] = [
    ("command", "ls", {"command": "ls"}, True),
    ("command", "ls", {"command": "ls -la"}, False),
    ("command", "'rm *'", {"command": "rm -rf /tmp"}, True),
    ("command", "'rm *'", {"command": "sudo rm -rf /tmp"}, False),  # a glob: the whole text
    ("command", f"{{regex: '{ROOT_DELETE}'}}", {"command": "sudo rm -rf / now"}, True),
    ("command", f"{{regex: '{ROOT_DELETE}'}}", {"command": "rm -rf /tmp"}, False),
    ("command", "{regex: '^ls$'}", {"command": "ls -la"}, False),
    ("command", "{contains: sudo}", {"command": "echo && sudo reboot"}, True),
    ("command", "{contains: sudo}", {"command": "ls"}, False),
    ("url", "{prefix: 'https://intra.'}", {"url": "https://intra.example/x"}, True),
    ("url", "{prefix: 'https://intra.'}", {"url": "http://intra.example/x"}, False),
    ("env", "{in: [prod, staging]}", {"env": "prod"}, True),
    ("env", "{in: [prod, staging]}", {"env": "dev"}, False),
    ("env", "{in: [1, true]}", {"env": True}, True),
    ("env", "{in: [1, true]}", {"env": "1"}, True),  # `1` the text, as its JSON is `1`
    ("force", "{exists: true}", {"force": False}, True),
    ("force", "{exists: true}", {"other": 1}, False),
    ("force", "{exists: false}", {"other": 1}, True),
    ("force", "{exists: false}", {"force": None}, False),  # null is a value
    # Non-string values as compact JSON.
    ("force", "true", {"force": True}, True),
    ("force", "true", {"force": "true"}, True),
    ("force", "true", {"force": 1}, False),
    ("count", "3", {"count": 3}, True),
    ("count", "3", {"count": 3.0}, False),  # 3.0 is written `3.0`
    ("opts", """'{"a":1,"b":{"c":null}}'""", {"opts": {"b": {"c": None}, "a": 1}}, True),
    ("opts", """'{"a":1,"b":{"c":null}}'""", {"opts": {"a": 1, "b": {"c": 0}}}, False),
    ("opts", "{contains: '\"force\":true'}", {"opts": {"path": "/", "force": True}}, True),
    ("files", "{regex: '^\\[\"a\",'}", {"files": ["a", "b"]}, True),
    # Paths: into objects, into lists, and the whole of args.
    ("options.force", "true", {"options": {"force": True}}, True),
    ("options.force", "true", {"options": {"recurse": True}}, False),
    ("options.force", "{exists: false}", {"options": "force"}, True),  # not an object
    ("files.0", "'/etc/*'", {"files": ["/etc/passwd", "/tmp/x"]}, True),
    ("files.1", "'/etc/*'", {"files": ["/etc/passwd", "/tmp/x"]}, False),
    ("files.2", "{exists: false}", {"files": ["/etc/passwd", "/tmp/x"]}, True),
    ("files.0", "{exists: false}", {"files": "abc"}, True),  # a string is not a list
    ("a.b.0.c", "x", {"a": {"b": [{"c": "x"}]}}, True),
    ("*", """'{"a":1,"b":2}'""", {"b": 2, "a": 1}, True),  # the whole args, canonical
    ("*", "{contains: 'rm -rf'}", {"deep": {"list": ["rm -rf /"]}}, True),
    ("*", "'{}'", {}, True),
    ("*", "{exists: true}", {}, True),
    ("*", "{exists: false}", {}, False),
]


def arg_rule_policy(path: str, condition: str) -> str:
    return f"""
version: 1
rules:
  - name: guarded
    match:
      tool: terminal
      args: {{"{path}": {condition}}}
    deny: "refused by its arguments"
"""


@pytest.mark.parametrize(("path", "condition", "args", "holds"), ARG_CASES)
async def test_each_argument_condition_through_the_engine(
    path: str, condition: str, args: dict[str, Any], holds: bool
) -> None:
    engine = engine_on(arg_rule_policy(path, condition), *in_process())
    decided = await engine.check(call(args=args))
    assert decided.decision == ("deny" if holds else "allow")
    other_tool = await engine.check(call(tool="ls", args=args))
    assert other_tool.allowed  # every condition of the match must hold


NO_ARGS_CASES = sorted({(path, condition) for path, condition, _, _ in ARG_CASES})


@pytest.mark.parametrize(("path", "condition"), NO_ARGS_CASES)
async def test_a_call_without_args_matches_only_exists_false(path: str, condition: str) -> None:
    engine = engine_on(arg_rule_policy(path, condition), *in_process())
    decided = await engine.check(call(args=None))
    expected = "deny" if condition == "{exists: false}" else "allow"
    assert decided.decision == expected


async def test_all_argument_conditions_of_a_match_must_hold(store: Store, clock: FakeClock) -> None:
    policy = """
version: 1
rules:
  - name: force-push
    match:
      tool: terminal
      args:
        command: {prefix: 'git push'}
        options.force: true
    rate: 0/minute
"""
    engine = engine_on(policy, store, clock)
    both = {"command": "git push origin", "options": {"force": True}}
    assert (await engine.check(call(args=both))).decision == "deny"
    assert (await engine.check(call(args={**both, "options": {}}))).allowed
    assert (await engine.check(call(args={**both, "command": "git pull"}))).allowed


# -- counters keyed on arguments ------------------------------------------------------------

LOOP_POLICY = """
version: 1
rules:
  - name: same-call-repeats
    per: [session, tool, args]
    rate: 3/10 minutes
  - name: per-site
    match: {tool: browser_navigate}
    per: [user, args.url]
    rate: 2/minute
  - name: per-first-file
    match: {tool: read}
    per: [user, args.files.0]
    rate: 1/minute
"""

SAME_ARGS_IN_FOUR_ORDERS = [
    {"command": "ls", "options": {"all": True, "long": [1, {"x": 1, "y": 2}]}},
    {"options": {"long": [1, {"y": 2, "x": 1}], "all": True}, "command": "ls"},
    {"options": {"all": True, "long": [1, {"y": 2, "x": 1}]}, "command": "ls"},
    {"command": "ls", "options": {"long": [1, {"x": 1, "y": 2}], "all": True}},
]


@pytest.mark.parametrize("remember_refusals", [False, True])
async def test_the_same_args_in_any_key_order_share_one_counter(
    remember_refusals: bool, store: Store, clock: FakeClock
) -> None:
    engine = Engine(
        parse_policy(LOOP_POLICY.encode()), store, clock=clock, remember_refusals=remember_refusals
    )
    decided = [await engine.check(call(session="s", args=a)) for a in SAME_ARGS_IN_FOUR_ORDERS]
    assert [d.decision for d in decided] == ["allow", "allow", "allow", "deny"]
    assert [remaining(d) for d in decided[:3]] == [{"same-call-repeats": n} for n in (2, 1, 0)]
    fourth = decided[3]
    assert fourth.message == REPEATED_3_IN_10_MINUTES  # golden, with no "(retry in ...)"
    assert fourth.retry_after == 600.0
    # A different command, the same command on another tool or session: counters of their own.
    for other in [
        call(session="s", args={"command": "ls -la"}),
        call(session="s", args={"command": "ls", "options": {"all": False}}),
        call(session="s", tool="bash", args=SAME_ARGS_IN_FOUR_ORDERS[0]),
        call(session="t", args=SAME_ARGS_IN_FOUR_ORDERS[0]),
        call(session="s", args=None),
        call(session="s", args={}),
    ]:
        assert remaining(await engine.check(other)) == {"same-call-repeats": 2}


async def test_a_counter_per_value_of_one_argument(store: Store, clock: FakeClock) -> None:
    engine = engine_on(LOOP_POLICY, store, clock)

    async def site(url: str | None, **rest: Any) -> Decision:
        args = rest if url is None else {"url": url, **rest}
        return await engine.check(call("alice", "browser_navigate", session="s", args=args))

    assert remaining(await site("https://a.example", tab=1))["per-site"] == 1
    assert remaining(await site("https://a.example", tab=2))["per-site"] == 0  # other args
    refused = await site("https://a.example", tab=3)
    assert [v.rule for v in refused.violations] == ["per-site"]
    assert refused.message == "Rate limit: max 2 browser_navigate calls per minute (retry in 1m)"
    assert remaining(await site("https://b.example"))["per-site"] == 1
    assert remaining(await site(None, tab=1))["per-site"] == 1  # no url: a counter of its own
    other_user = await engine.check(
        call("bob", "browser_navigate", args={"url": "https://a.example"})
    )
    assert remaining(other_user)["per-site"] == 1
    # A list index in the path: only the first file decides.
    read = [["/a", "/b"], ["/a", "/c"], ["/b", "/a"]]
    decided = [await engine.check(call("alice", "read", args={"files": f})) for f in read]
    assert [d.decision for d in decided] == ["allow", "deny", "allow"]


CUSTOM_REPEAT_POLICY = """
version: 1
rules:
  - name: loops
    per: [session, tool, args]
    rate: 1/10 minutes
    message: "Stop repeating {label} ({limit} per {window}); retry in {retry_after}"
"""


async def test_a_custom_message_wins_over_the_repeated_call_sentence(
    store: Store, clock: FakeClock
) -> None:
    engine = engine_on(CUSTOM_REPEAT_POLICY, store, clock)
    args = {"command": "make"}
    assert (await engine.check(call(session="s", args=args))).allowed
    refused = await engine.check(call(session="s", args=args))
    assert refused.message == "Stop repeating terminal (1 per 10 minutes); retry in 10m"


SECRET = "sk-live-DO-NOT-STORE-4242"


@pytest.mark.redis
async def test_redis_keys_hold_digests_never_argument_text(
    redis_server: RedisServer, redis_url: str, clock: FakeClock
) -> None:
    store = RedisStore(aioredis.Redis.from_url(redis_url), redis_url, clock)
    try:
        engine = engine_on(LOOP_POLICY, store, clock)
        for args in SAME_ARGS_IN_FOUR_ORDERS[:2]:  # one counter
            await engine.check(call("alice", session="s", args=args, named=False))
        await engine.check(call("alice", session="s", args={"token": SECRET}, named=False))
        await engine.check(
            call("alice", "browser_navigate", args={"url": f"https://x/?key={SECRET}"}, named=False)
        )
        await engine.check(call("alice", "read", args={"files": [SECRET]}, named=False))
    finally:
        await store.close()
    sync = redis_server.client()
    try:
        keys = sorted(k.decode() for k in sync.scan_iter(match="*"))
    finally:
        sync.close()
    digest = "[0-9a-f]{32}"
    shapes = [
        rf"rw:\{{same-call-repeats\|session=s\|tool=terminal\|args={digest}\}}:sw",
        rf"rw:\{{same-call-repeats\|session=\|tool=browser_navigate\|args={digest}\}}:sw",
        rf"rw:\{{same-call-repeats\|session=\|tool=read\|args={digest}\}}:sw",
        rf"rw:\{{per-site\|user=alice\|args\[url\]={digest}\}}:sw",
        rf"rw:\{{per-first-file\|user=alice\|args\[files.0\]={digest}\}}:sw",
    ]
    unmatched = [k for k in keys if not any(re.fullmatch(s, k) for s in shapes)]
    assert unmatched == []
    assert len(keys) == 6  # two terminal counters (one for the reordered copies), four others
    assert not [k for k in keys for text in (SECRET, "sk-live", "token", "https") if text in k]


# -- load errors ------------------------------------------------------------------------------

# (rule lines under `rules:`, the field, the message). Each file holds one bad rule, named at
# line 3 and with its fields from line 4: a problem of the whole rule is reported at line 3,
# a problem of one field at that field's line.
BAD_RULES: list[tuple[str, str, str]] = [
    ("deny: x\n    per: [user]", "rules[0]", "per does not apply to an access rule"),
    ("ask: x\n    algorithm: token_bucket", "rules[0]", "algorithm does not apply"),
    ("deny: x\n    burst: 3", "rules[0]", "burst does not apply"),
    ("deny: x\n    message: y", "rules[0]", "message does not apply"),
    ("deny: x\n    on_exceed: ask", "rules[0]", "on_exceed does not apply"),
    ("deny: x\n    fail: closed", "rules[0]", "fail does not apply"),
    ("deny: x\n    currency: EUR", "rules[0]", "currency does not apply"),
    ("deny: x\n    soft_limit: 50%", "rules[0]", "soft_limit does not apply"),
    ("deny: x\n    lease_timeout: 10s", "rules[0]", "lease_timeout does not apply"),
    (
        "deny: x\n    rate: 3/minute",
        "rules[0]",
        "a rule needs exactly one of rate, concurrency, budget, deny, ask (got rate, deny)",
    ),
    ("deny: x\n    ask: y", "rules[0]", "(got deny, ask)"),
    ("deny: ''", "rules[0].deny", "at least 1 character"),
    ("deny: 'wait {retry_after}'", "rules[0].deny", "unknown placeholder {retry_after}"),
    ("ask: 'only {limit}'", "rules[0].ask", "unknown placeholder {limit}"),
    (
        "match: {args: {command: {regex: '(unclosed'}}}\n    deny: x",
        "rules[0].match.args.command",
        "invalid regex '(unclosed': missing )",
    ),
    (
        "match: {args: {command: {regex: '(a)\\1'}}}\n    deny: x",
        "rules[0].match.args.command",
        "invalid regex",
    ),
    (
        "match: {args: {'files..0': {exists: true}}}\n    deny: x",
        "rules[0].match.args.files..0",
        "empty segment",
    ),
    ("match: {args: {'': x}}\n    deny: x", "rules[0].match.args.", "empty argument path"),
    ("match: {args: {'a.*': x}}\n    deny: x", "rules[0].match.args.a.*", "'*' stands alone"),
    ("match: {args: {p: '[z-a]'}}\n    deny: x", "rules[0].match.args.p", "reversed range"),
    ("match: {args: {p: {in: []}}}\n    deny: x", "rules[0].match.args.p", "non-empty list"),
    ("match: {args: {p: {exists: 1}}}\n    deny: x", "rules[0].match.args.p", "true or false"),
    ("match: {args: {p: {glob: x}}}\n    deny: x", "rules[0].match.args.p", "unknown condition"),
    (
        "match: {args: {p: {regex: a, contains: b}}}\n    deny: x",
        "rules[0].match.args.p",
        "exactly one of",
    ),
    (
        "unless: {args: {x: {regex: 'a{1001}'}}}\n    rate: 1/minute",
        "rules[0].unless.args.x",
        "invalid regex 'a{1001}'",
    ),
    ("unless: {colour: blue}\n    rate: 1/minute", "rules[0].unless.colour", "unknown field"),
    ("per: [user, 'args.a..b']\n    rate: 1/minute", "rules[0].per[1]", "empty segment"),
    ("per: [user, 'args.']\n    rate: 1/minute", "rules[0].per[1]", "empty argument path"),
    ("per: [user, arguments]\n    rate: 1/minute", "rules[0].per[1]", "'args.PATH'"),
    ("per: [args, args]\n    rate: 1/minute", "rules[0].per", "lists a dimension twice"),
]


@pytest.mark.parametrize(("rule", "field", "message"), BAD_RULES)
def test_a_bad_access_rule_condition_or_path_is_a_load_error_naming_file_line_and_field(
    rule: str, field: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(f"version: 1\nrules:\n  - name: bad\n    {rule}\n")
    with pytest.raises(PolicyError) as raised:
        load_policy(path)
    lines = raised.value.lines()
    assert len(lines) == 1, lines
    line = 3 if field == "rules[0]" else 4
    prefix = f"{path}:{line}: {field}: "
    assert lines[0].startswith(prefix), lines[0]
    assert message in lines[0].removeprefix(prefix), lines[0]


def test_a_list_as_a_condition_is_one_error_that_says_to_write_in(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "version: 1\nrules:\n  - name: bad\n    match: {args: {p: [a, b]}}\n    deny: x\n"
    )
    with pytest.raises(PolicyError) as raised:
        load_policy(path)
    [line] = raised.value.lines()
    assert line.startswith(f"{path}:4: rules[0].match.args.p: ")
    assert "write {in: [...]}" in line


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("{users: [bob], rule: closed, rate: 3/minute}", "rate"),
        ("{groups: [staff], rule: closed, concurrency: 2}", "concurrency"),
        ("{users: ['bot-*'], rule: closed, burst: 2}", "burst"),
        ("{users: [bob], rule: closed, budget: 5/day}", "budget"),
    ],
)
def test_an_override_on_an_access_rule_can_only_lift_it(
    override: str, field: str, tmp_path: Path
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "version: 1\ngroups: {staff: [alice]}\nrules:\n  - name: closed\n    deny: x\n"
        f"overrides:\n  - {override}\n"
    )
    with pytest.raises(PolicyError) as raised:
        load_policy(path)
    assert raised.value.lines() == [
        f"{path}:7: overrides[0].{field}: rule 'closed' is an access rule: an override "
        "can only lift it (unlimited: true)"
    ]
