"""The policy file: every error names file, line and field; good files load; matching,
override precedence and `explain` reasons behave as documented in docs/policy.md."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import yaml

from ratewarden.calls import Call, ToolFacts
from ratewarden.policy import (
    Algorithm,
    Mode,
    OnExceed,
    Policy,
    PolicyError,
    RateLimit,
    load_example_policy,
    load_policy,
    parse_policy,
)
from ratewarden.policy.durations import Rate, parse_budget, parse_rate
from ratewarden.policy.model import BudgetLimit, ConcurrencyLimit, Unlimited

POLICIES = Path(__file__).resolve().parents[1] / "policies"
BAD = POLICIES / "bad"
GOOD = POLICIES / "good"

RATE_EXPECTED = 'expected "N/window" (e.g. "10/minute", "5/10 minutes"), got '
TOP = "(top level)"

# file -> every issue it must report, in order: (line, field path, message substring).
BAD_FILES: dict[str, list[tuple[int, str, str]]] = {
    "rate_in_words.yaml": [(4, "rules[0].rate", RATE_EXPECTED + "'ten per minute'")],
    "rate_not_a_string.yaml": [(4, "rules[0].rate", RATE_EXPECTED + "10")],
    "unknown_time_unit.yaml": [
        (
            4,
            "rules[0].rate",
            "unknown time unit 'fortnight' in '10/fortnight'; use second, minute, hour or day",
        )
    ],
    "zero_window.yaml": [
        (4, "rules[0].rate", "the window in '10/0 minutes' must be at least 1 minute")
    ],
    "window_too_long.yaml": [
        (4, "rules[0].rate", "the window in '1/32d' is longer than 31 days; use a budget instead")
    ],
    "sliding_limit_too_large.yaml": [
        (
            3,
            "rules[0]",
            "sliding_window limits are capped at 100000 calls per window; "
            "use token_bucket or fixed_window for larger limits",
        )
    ],
    "unknown_field.yaml": [(5, "rules[0].mach", "unknown field")],
    # issue 25, item 2: a program RE2's DFA cannot hold, refused at load
    "regex_too_costly.yaml": [
        (
            9,
            "rules[1].match.args.command",
            r"regex '\w{1,1000}Z' is too costly to match: it compiles to 4004 RE2 instructions",
        )
    ],
    "regex_exponential.yaml": [
        (
            6,
            "rules[0].match.args.command",
            "regex 'a[ab]{20}c' is too costly to match: a search for it can need more than "
            "1 MiB of automaton states",
        )
    ],
    "duplicate_rule_name.yaml": [(5, "rules[1].name", "duplicate rule name 'r'")],
    "bad_rule_name.yaml": [
        (3, "rules[0].name", "String should match pattern"),
    ],
    "unknown_group.yaml": [(6, "rules[0].match.group", "unknown group 'staff'")],
    "override_unknown_rule.yaml": [(7, "overrides[0].rule", "unknown rule 'nope'")],
    "override_unknown_group.yaml": [(8, "overrides[0].groups[1]", "unknown group 'vip'")],
    "override_without_users.yaml": [(6, "overrides[0]", "an override needs users or groups")],
    "override_without_limit.yaml": [
        (6, "overrides[0]", "an override needs one of rate, concurrency, budget, unlimited")
    ],
    "override_unlimited_and_rate.yaml": [
        (6, "overrides[0]", "unlimited: true cannot be combined with rate")
    ],
    "override_burst_on_sliding_rule.yaml": [
        (9, "overrides[0].burst", "burst only applies to token_bucket rules")
    ],
    "override_rate_above_sliding_cap.yaml": [
        (
            8,
            "overrides[0].rate",
            "sliding_window limits are capped at 100000 calls per window; "
            "use token_bucket or fixed_window for larger limits",
        )
    ],
    "override_budget_on_rate_rule.yaml": [
        (8, "overrides[0].budget", "rule 'r' is a rate rule, not budget")
    ],
    "override_users_not_a_list.yaml": [
        (6, "overrides[0].users", "Input should be a valid list, got 'alice'")
    ],
    "burst_without_token_bucket.yaml": [
        (3, "rules[0]", "burst only applies to algorithm: token_bucket")
    ],
    # issue 29: a loop rule keyed on results is a rate rule counted per identical call
    "same_result_on_budget.yaml": [(3, "rules[0]", "same_result only applies to rate rules")],
    "same_result_on_concurrency.yaml": [(3, "rules[0]", "same_result only applies to rate rules")],
    "same_result_on_access_rule.yaml": [
        (3, "rules[0]", "same_result does not apply to an access rule (deny/ask)")
    ],
    "same_result_without_args.yaml": [
        (3, "rules[0]", "same_result needs per to name args or args.PATH")
    ],
    "same_result_not_a_boolean.yaml": [
        (6, "rules[0].same_result", "Input should be a valid boolean")
    ],
    "two_limits_in_one_rule.yaml": [
        (
            3,
            "rules[0]",
            "a rule needs exactly one of rate, concurrency, budget, deny, ask "
            "(got rate, concurrency)",
        ),
    ],
    "no_limit.yaml": [
        (3, "rules[0]", "a rule needs exactly one of rate, concurrency, budget, deny, ask")
    ],
    "bad_timezone.yaml": [(3, "defaults.timezone", "unknown timezone 'Mars/Olympus'")],
    "bad_mode.yaml": [(3, "defaults.mode", "Input should be 'enforce' or 'shadow', got 'audit'")],
    "bad_algorithm.yaml": [
        (
            5,
            "rules[0].algorithm",
            "Input should be 'sliding_window', 'token_bucket' or 'fixed_window', "
            "got 'leaky_bucket'",
        )
    ],
    "bad_template_placeholder.yaml": [
        (
            5,
            "rules[0].message",
            "unknown placeholder {username} in 'Slow down, {username}'; known: label, limit, "
            "remaining, retry_after, rule, tool, user, window",
        )
    ],
    # Placeholders are checked against the rule's kind: budget fields only in budgets...
    "rate_template_uses_budget_fields.yaml": [
        (
            5,
            "rules[0].message",
            "unknown placeholder {spent} in 'Spent {spent} of {budget} already'; known: label, "
            "limit, remaining, retry_after, rule, tool, user, window",
        )
    ],
    # ... and {window} only in rate rules.
    "concurrency_template_uses_window.yaml": [
        (
            5,
            "rules[0].message",
            "unknown placeholder {window} in 'Max {limit} calls per {window}'; known: label, "
            "limit, remaining, retry_after, rule, tool, user",
        )
    ],
    "unbalanced_template.yaml": [
        (5, "rules[0].message", "invalid template 'Slow down {limit': expected '}'")
    ],
    "per_twice.yaml": [(4, "rules[0].per", "lists a dimension twice: ['user', 'user']")],
    "unknown_dimension.yaml": [
        (
            4,
            "rules[0].per[1]",
            "expected one of 'user', 'tool', 'session', 'team', 'args' or 'args.PATH', got 'host'",
        )
    ],
    "metadata_not_boolean.yaml": [
        (4, "rules[0].match.destructive", "Input should be a valid boolean, got 'yes'")
    ],
    "tags_not_a_list.yaml": [
        (4, "rules[0].match.tags", "Input should be a valid list, got 'dangerous'")
    ],
    "negative_tool_cost.yaml": [
        (3, "tools.terminal.cost", "Input should be greater than or equal to 0, got -1")
    ],
    "rules_not_a_list.yaml": [(2, "rules", "Input should be a valid list")],
    "duplicate_key.yaml": [(5, "rules[0].rate", "duplicate key")],
    "wrong_version.yaml": [(1, "version", "Input should be 1, got 2")],
    "missing_version.yaml": [(1, "version", "required field is missing")],
    "not_a_mapping.yaml": [(1, TOP, "expected a mapping with version: 1 and rules")],
    "empty.yaml": [(1, TOP, "expected a mapping with version: 1 and rules")],
    "invalid_yaml.yaml": [(4, TOP, "invalid YAML: mapping values are not allowed here")],
    "tab_indentation.yaml": [
        (3, TOP, "invalid YAML: found character '\\t' that cannot start any token")
    ],
    "several_schema_errors.yaml": [
        (3, "defaults.mode", "got 'audit'"),
        (6, "rules[0].rate", RATE_EXPECTED + "'ten per minute'"),
        (9, "rules[1].colour", "unknown field"),
        (11, "rules[2].per[1]", "got 'host'"),
        (14, "overrides[0].rule", "required field is missing"),
    ],
    "several_reference_errors.yaml": [
        (5, "rules[1].name", "duplicate rule name 'a'"),
        (7, "rules[1].match.group", "unknown group 'ghosts'"),
        (9, "rules[2].match.group", "unknown group 'staff'"),
        (13, "overrides[0].rule", "unknown rule 'missing'"),
    ],
    "empty_tool_name.yaml": [
        (4, "rules[0].match.tool[0]", "String should have at least 1 character"),
    ],
    "empty_name_in_tool_list.yaml": [
        (4, "rules[0].match.tool[1]", "String should have at least 1 character"),
    ],
    "version_true.yaml": [(1, "version", "Input should be 1")],
    "schema_and_reference_errors.yaml": [
        (4, "rules[0].rate", RATE_EXPECTED + "'ten per minute'"),
        (6, "rules[1].match.group", "unknown group 'ghosts'"),
        (8, "rules[2].name", "duplicate rule name 'b'"),
        (12, "overrides[0].rule", "unknown rule 'missing'"),
    ],
}

KNOWN_BUGS: dict[str, str] = {}


def bad_cases() -> list[Any]:
    return [
        pytest.param(
            name,
            expected,
            id=name,
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[name])]
            if name in KNOWN_BUGS
            else [],
        )
        for name, expected in BAD_FILES.items()
    ]


def test_the_table_covers_every_bad_file() -> None:
    assert sorted(p.name for p in BAD.glob("*.yaml")) == sorted(BAD_FILES)


@pytest.mark.parametrize(("name", "expected"), bad_cases())
def test_bad_policy_reports_file_line_field_and_problem(
    name: str, expected: list[tuple[int, str, str]]
) -> None:
    path = BAD / name
    with pytest.raises(PolicyError) as raised:
        load_policy(path)
    error = raised.value
    assert error.source == str(path)
    assert [(issue.line, issue.field) for issue in error.issues] == [
        (line, field) for line, field, _ in expected
    ]
    rendered = str(error).splitlines()
    assert len(rendered) == len(expected)
    for text, (line, field, message) in zip(rendered, expected, strict=True):
        prefix = f"{path}:{line}: {field}: "
        assert text.startswith(prefix), text
        assert message in text.removeprefix(prefix), text


def test_an_issue_inside_a_rule_names_the_rule() -> None:
    """Issue 25, item 2: the refusal names the rule and the pattern, not only its place."""
    with pytest.raises(PolicyError) as raised:
        load_policy(BAD / "regex_too_costly.yaml")
    [line] = str(raised.value).splitlines()
    assert r"regex '\w{1,1000}Z' is too costly" in line
    assert line.endswith("(rule 'long-words')")


def test_an_unreadable_file_is_a_policy_error_without_a_line(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(PolicyError) as raised:
        load_policy(missing)
    assert str(raised.value) == f"{missing}: (top level): cannot read: No such file or directory"


def test_non_utf8_bytes_do_not_crash_the_loader() -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy(b"version: 1\nrules:\n  - name: \xff\xfe\n    rate: ten\n", source="x.yaml")
    assert [(i.line, i.field) for i in raised.value.issues] == [
        (3, "rules[0].name"),
        (4, "rules[0].rate"),
    ]


# -- good files -------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(GOOD.glob("*.yaml")), ids=lambda p: p.name)
def test_good_policy_loads_and_its_version_is_the_hash_of_its_bytes(path: Path) -> None:
    policy = load_policy(path)
    assert policy.source == str(path)
    assert policy.version == hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def test_spec_example_compiles_to_the_documented_rules() -> None:
    policy = load_policy(GOOD / "spec_example.yaml")
    summary = [(r.name, r.kind, r.algorithm, r.per, r.mode, r.on_exceed) for r in policy.rules]
    assert summary == [
        ("terminal-per-minute", "rate", "sliding_window", ("user",), Mode.ENFORCE, OnExceed.DENY),
        ("browser-concurrency", "concurrency", "concurrency", ("user",), Mode.ENFORCE,
         OnExceed.DENY),
        ("destructive-per-hour", "rate", "sliding_window", ("user",), Mode.ENFORCE, OnExceed.ASK),
        ("daily-spend", "budget", "budget", ("user",), Mode.ENFORCE, OnExceed.DENY),
        ("all-tools-burst", "rate", "token_bucket", ("user", "tool"), Mode.ENFORCE,
         OnExceed.DENY),
    ]  # fmt: skip
    limits = {r.name: r.limit for r in policy.rules}
    assert limits == {
        "terminal-per-minute": RateLimit(parse_rate("10/minute"), Algorithm.SLIDING_WINDOW),
        # Leases of vanished callers are reclaimed after the default 10 minutes.
        "browser-concurrency": ConcurrencyLimit(2, 600_000),
        "destructive-per-hour": RateLimit(parse_rate("3/hour"), Algorithm.SLIDING_WINDOW),
        "daily-spend": BudgetLimit(parse_budget("5.00/day"), "USD", 0.8),
        "all-tools-burst": RateLimit(parse_rate("30/minute"), Algorithm.TOKEN_BUCKET, 10),
    }
    budget = limits["daily-spend"]
    assert isinstance(budget, BudgetLimit)
    assert (budget.limit, budget.budget.period, str(budget.budget)) == (
        5_000_000,
        "day",
        "5.00/day",
    )
    # Overrides: exact user > group > glob > rule default.
    alice = {
        e.rule.name: (e.limit, e.source) for e in policy.explain(Call("alice", "terminal", "c"))
    }
    assert alice["terminal-per-minute"] == (
        RateLimit(parse_rate("100/minute"), Algorithm.SLIDING_WINDOW),
        "overrides[0]",
    )
    assert alice["daily-spend"] == (
        BudgetLimit(parse_budget("50/day"), "USD", 0.8),  # pro's budget; currency, soft limit kept
        "overrides[1]",
    )
    banned = {
        e.rule.name: (e.limit, e.source) for e in policy.explain(Call("banned-7", "terminal", "c"))
    }
    assert banned["terminal-per-minute"] == (
        RateLimit(parse_rate("0/minute"), Algorithm.SLIDING_WINDOW),
        "overrides[2]",
    )
    assert banned["daily-spend"] == (limits["daily-spend"], "rule")
    browser = {e.rule.name: e.applies for e in policy.explain(Call("bob", "browser_open", "c"))}
    assert browser == {
        "terminal-per-minute": False,
        "browser-concurrency": True,
        "destructive-per-hour": True,  # unclassified tools count as destructive
        "daily-spend": True,
        "all-tools-burst": True,
    }
    assert {k: policy.defaults[k] for k in ("mode", "fail", "algorithm", "timezone")} == {
        "mode": "enforce",
        "fail": "open",
        "algorithm": "sliding_window",
        "timezone": "UTC",
    }
    # Not in the file: the defaults for leases, reservations, call records, model calls.
    assert set(policy.defaults) == {
        "mode", "fail", "algorithm", "timezone", "lease_timeout", "reservation_ttl", "call_ttl",
        "max_output_tokens", "model_price",
    }  # fmt: skip
    assert (policy.reservation_ttl_ms, policy.call_ttl_ms) == (3_600_000, 3_600_000)
    assert (policy.label_for("browser_open"), policy.cost_for("browser_open")) == ("browser", 0.05)
    assert (policy.label_for("web_search"), policy.cost_for("web_search")) == ("web_search", 0.01)
    assert (policy.label_for("terminal"), policy.cost_for("terminal")) == ("terminal", 0.0)
    assert policy.groups_of("ops-7") == frozenset({"pro"})
    assert policy.groups_of("bob") == frozenset()


EVERY_RATE = {
    "per-second": (1, 1_000, "second"),
    "per-minute": (2, 60_000, "minute"),
    "per-hour": (3, 3_600_000, "hour"),
    "per-day": (4, 86_400_000, "day"),
    "per-30s": (5, 30_000, "30 seconds"),
    "per-5m": (6, 300_000, "5 minutes"),
    "per-2h": (7, 7_200_000, "2 hours"),
    "per-7d": (8, 604_800_000, "7 days"),
    "per-10-minutes": (5, 600_000, "10 minutes"),
    "per-1-minute": (9, 60_000, "minute"),
    "per-90-seconds": (10, 90_000, "90 seconds"),
    "per-3-hours": (11, 10_800_000, "3 hours"),
    "per-2-days": (12, 172_800_000, "2 days"),
    "spaced": (13, 60_000, "minute"),
    "upper-case": (14, 60_000, "minute"),
    "short-words": (15, 60_000, "minute"),
    "longest-window": (16, 31 * 86_400_000, "31 days"),
    "zero": (0, 60_000, "minute"),
    "sliding-at-cap": (100_000, 60_000, "minute"),
    "big-bucket": (1_000_000, 86_400_000, "day"),
    "big-fixed": (1_000_000, 3_600_000, "hour"),
}


def test_every_rate_syntax_parses_to_its_window() -> None:
    policy = load_policy(GOOD / "every_rate_syntax.yaml")
    parsed = {
        r.name: (r.limit.rate.limit, r.limit.rate.window_ms, r.limit.rate.window)
        for r in policy.rules
        if isinstance(r.limit, RateLimit)  # all of them: EVERY_RATE names every rule
    }
    assert parsed == EVERY_RATE
    algorithms = {
        r.name: (r.limit.algorithm, r.limit.burst)
        for r in policy.rules
        if isinstance(r.limit, RateLimit)
    }
    assert algorithms["big-bucket"] == (Algorithm.TOKEN_BUCKET, 500)
    assert algorithms["big-fixed"] == (Algorithm.FIXED_WINDOW, None)
    assert algorithms["per-second"] == (Algorithm.SLIDING_WINDOW, None)
    assert policy.document["rules"][8]["rate"] == "5/10 minutes"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10/minute", Rate(10, 60_000, "minute")),
        ("5/10 minutes", Rate(5, 600_000, "10 minutes")),
        ("100/5m", Rate(100, 300_000, "5 minutes")),
        ("3/1h", Rate(3, 3_600_000, "hour")),
        ("7/ 2 secs", Rate(7, 2_000, "2 seconds")),
        ("  1/day  ", Rate(1, 86_400_000, "day")),
        ("1/31d", Rate(1, 2_678_400_000, "31 days")),
        ("1/744h", Rate(1, 2_678_400_000, "744 hours")),
    ],
)
def test_parse_rate(text: str, expected: Rate) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("ten per minute", 'expected "N/window"'),
        ("10 minute", 'expected "N/window"'),
        ("10/", 'expected "N/window"'),
        ("-1/minute", 'expected "N/window"'),
        ("1.5/minute", 'expected "N/window"'),
        (10, 'expected "N/window"'),
        (None, 'expected "N/window"'),
        ("10/week", "unknown time unit 'week'"),
        ("10/0s", "must be at least 1 second"),
        ("1/745h", "longer than 31 days"),
        ("1/32 days", "longer than 31 days"),
    ],
)
def test_parse_rate_refuses(text: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")) as raised:
        parse_rate(text)
    assert problem in str(raised.value)


def test_the_packaged_example_loads() -> None:
    policy = load_example_policy()
    assert policy.source == "<packaged example.yaml>"
    assert [r.name for r in policy.rules] == [
        "no-root-delete",
        "terminal-per-minute",
        "browser-per-minute",
        "destructive-per-hour",
        "all-tools-burst",
        "same-call-repeats",
        "browser-concurrency",
        "daily-spend",
    ]
    assert [r.kind for r in policy.rules][-2:] == ["concurrency", "budget"]
    assert policy.rules[0].kind == "access"
    assert policy.reads_args  # clients send args to a daemon running the example
    assert policy.cost_for("browser_open") == 0.05
    ops = explained(policy, call(user="ops-1", tool="terminal"))
    assert ops["terminal-per-minute"] == (True, 60, "overrides[0]")
    assert explained(policy, call(user="bob", tool="terminal"))["terminal-per-minute"] == (
        True,
        10,
        "rule",
    )


def test_the_packaged_examples_argument_rules_cover_what_its_comments_say() -> None:
    """`no-root-delete` refuses a root delete and nothing like it; `same-call-repeats`
    counts only calls that sent their arguments (else every call of a tool would share
    one counter of 5 a minute)."""
    policy = load_example_policy()

    def covering(command: str | None) -> set[str]:
        args = None if command is None else {"command": command}
        the_call = Call("bob", "terminal", "c1", session="s1", args=args)
        return {a.rule.name for a in policy.applicable(the_call)}

    for root_delete in ("rm -rf /", "sudo rm -rf /*", "rm -r -f --no-preserve-root / "):
        assert "no-root-delete" in covering(root_delete), root_delete
    for harmless in ("rm -rf /tmp/build", "rm -rf ./dist", "ls /", "echo rm -rf"):
        assert "no-root-delete" not in covering(harmless), harmless
    assert "same-call-repeats" in covering("make test")
    assert "same-call-repeats" not in covering(None)


# -- matching ---------------------------------------------------------------------------

GROUPS = """\
groups:
  pro: [alice, "ops-*"]
  staff: [bob]
"""


def call(
    user: str = "u",
    tool: str = "terminal",
    session: str | None = None,
    team: str | None = None,
    tags: frozenset[str] = frozenset(),
    **facts: bool,
) -> Call:
    return Call(user, tool, "c1", session, team, facts=ToolFacts(**facts, tags=tags))


def one_rule(match: str) -> Policy:
    return parse_policy(f"version: 1\n{GROUPS}rules:\n  - name: r\n    match: {match}\n"
                        "    rate: 1/minute\n".encode())  # fmt: skip


MATCHING = [
    ("{}", call(user="anyone", tool="anything"), True),
    ("{tool: terminal}", call(tool="terminal"), True),
    ("{tool: terminal}", call(tool="terminal2"), False),
    ("{tool: terminal}", call(tool="Terminal"), False),
    ("{tool: 'browser_*'}", call(tool="browser_open"), True),
    ("{tool: 'browser_*'}", call(tool="browser_"), True),
    ("{tool: 'browser_*'}", call(tool="web_browser_open"), False),
    ("{tool: 'file_?'}", call(tool="file_x"), True),
    ("{tool: 'file_?'}", call(tool="file_xy"), False),
    ("{tool: 'fs_[rw]*'}", call(tool="fs_write"), True),
    ("{tool: 'fs_[rw]*'}", call(tool="fs_delete"), False),
    ("{tool: [file_write, 'file_del*']}", call(tool="file_write"), True),
    ("{tool: [file_write, 'file_del*']}", call(tool="file_delete"), True),
    ("{tool: [file_write, 'file_del*']}", call(tool="file_read"), False),
    ("{user: alice}", call(user="alice"), True),
    ("{user: alice}", call(user="alice2"), False),
    ("{user: ['bot-*', carol]}", call(user="bot-1"), True),
    ("{user: ['bot-*', carol]}", call(user="carol"), True),
    ("{user: ['bot-*', carol]}", call(user="dave"), False),
    ("{group: pro}", call(user="alice"), True),
    ("{group: pro}", call(user="ops-7"), True),  # a glob member of the group
    ("{group: pro}", call(user="bob"), False),
    ("{group: [pro, staff]}", call(user="bob"), True),
    ("{group: [pro, staff]}", call(user="zed"), False),
    ("{session: 's-*'}", call(session="s-1"), True),
    ("{session: 's-*'}", call(session="t-1"), False),
    ("{session: 's-*'}", call(session=None), False),
    ("{team: research}", call(team="research"), True),
    ("{team: research}", call(team=None), False),
    ("{team: [research, ops]}", call(team="ops"), True),
    ("{destructive: true}", call(), True),  # unclassified: destructive
    ("{destructive: true}", call(destructive=False), False),
    ("{destructive: true}", call(read_only=True), False),
    ("{destructive: true}", call(read_only=True, destructive=True), True),
    ("{destructive: false}", call(), False),
    ("{destructive: false}", call(read_only=True), True),
    ("{read_only: false}", call(), True),
    ("{read_only: true}", call(), False),
    ("{read_only: true}", call(read_only=True), True),
    ("{open_world: true}", call(), True),
    ("{open_world: true}", call(open_world=False), False),
    ("{idempotent: false}", call(), True),
    ("{idempotent: true}", call(idempotent=True), True),
    ("{requires_confirmation: true}", call(), False),
    ("{requires_confirmation: true}", call(requires_confirmation=True), True),
    ("{tags: [fs, net]}", call(tags=frozenset({"net", "x"})), True),
    ("{tags: [fs, net]}", call(tags=frozenset({"x"})), False),
    ("{tags: [fs, net]}", call(), False),
    ("{tool: terminal, destructive: true}", call(tool="terminal"), True),
    ("{tool: terminal, destructive: true}", call(tool="terminal", destructive=False), False),
    ("{tool: terminal, destructive: true}", call(tool="shell"), False),
    ("{user: alice, group: staff}", call(user="alice"), False),
]


@pytest.mark.parametrize(
    ("match", "the_call", "applies"),
    MATCHING,
    ids=[f"{m}-{c.user}-{c.tool}-{i}" for i, (m, c, _) in enumerate(MATCHING)],
)
def test_matching(match: str, the_call: Call, applies: bool) -> None:
    policy = one_rule(match)
    assert [a.rule.name for a in policy.applicable(the_call)] == (["r"] if applies else [])
    (explanation,) = policy.explain(the_call)
    assert explanation.applies is applies
    assert (explanation.reason == "all match conditions hold") is applies


def explained(policy: Policy, the_call: Call) -> dict[str, tuple[bool, int | str | None, Any]]:
    """rule -> (applies, limit or "unlimited", where the limit came from)."""
    result: dict[str, tuple[bool, int | str | None, Any]] = {}
    for item in policy.explain(the_call):
        limit: int | str | None = None
        if isinstance(item.limit, RateLimit):
            limit = item.limit.limit
        elif isinstance(item.limit, Unlimited):
            limit = "unlimited"
        result[item.rule.name] = (item.applies, limit, item.source)
    return result


PRECEDENCE = b"""\
version: 1
groups:
  pro: [alice, ann, "ops-*"]
  vip: [ann]
rules:
  - {name: r, rate: 10/minute}
  - {name: tb, rate: 10/minute, algorithm: token_bucket, burst: 4}
overrides:
  - {users: ["a*"], rule: r, rate: 1/minute}
  - {users: ["an*"], rule: r, rate: 7/minute}
  - {groups: [pro], rule: r, rate: 2/minute}
  - {groups: [vip], rule: r, rate: 6/minute}
  - {users: [alice], rule: r, rate: 3/minute}
  - {users: [alice], rule: r, rate: 5/minute}
  - {users: [root], rule: r, unlimited: true}
  - {users: ["banned-*"], rule: r, rate: 0/minute}
  - {users: [alice], rule: tb, burst: 9}
  - {users: [slow], rule: r, rate: 100/hour}
"""


@pytest.mark.parametrize(
    ("user", "limit", "source"),
    [
        ("alice", 3, "overrides[4]"),  # exact beats group and glob; the first exact wins
        ("ann", 2, "overrides[2]"),  # group beats glob; the first group wins
        ("andy", 1, "overrides[0]"),  # two globs: the first in the file wins
        ("ops-1", 2, "overrides[2]"),  # group membership through a glob
        ("bob", 10, "rule"),
        ("root", "unlimited", "overrides[6]"),
        ("banned-1", 0, "overrides[7]"),
        ("slow", 100, "overrides[9]"),
    ],
)
def test_override_precedence(user: str, limit: int | str, source: str) -> None:
    policy = parse_policy(PRECEDENCE)
    assert explained(policy, call(user=user))["r"] == (True, limit, source)


def test_override_keeps_the_rules_algorithm_and_may_replace_burst_or_window() -> None:
    policy = parse_policy(PRECEDENCE)
    by_user = {
        user: {a.rule.name: a.limit for a in policy.applicable(call(user=user))}
        for user in ("alice", "bob", "slow", "root")
    }
    assert by_user["alice"]["tb"] == RateLimit(
        Rate(10, 60_000, "minute"), Algorithm.TOKEN_BUCKET, 9
    )
    assert by_user["bob"]["tb"] == RateLimit(Rate(10, 60_000, "minute"), Algorithm.TOKEN_BUCKET, 4)
    assert by_user["slow"]["r"] == RateLimit(Rate(100, 3_600_000, "hour"), Algorithm.SLIDING_WINDOW)
    assert "r" not in by_user["root"]  # unlimited for root: the rule does not apply to them
    [explained] = [e for e in policy.explain(call(user="root")) if e.rule.name == "r"]
    assert explained.limit == Unlimited()


EXPLAIN_POLICY = b"""\
version: 1
groups:
  pro: [alice]
rules:
  - {name: browser, match: {tool: "browser_*"}, rate: 1/minute}
  - {name: only-alice, match: {user: alice}, rate: 1/minute}
  - {name: pros, match: {group: pro}, rate: 1/minute}
  - {name: sessions, match: {session: s-1}, rate: 1/minute}
  - {name: research, match: {team: research}, rate: 1/minute}
  - {name: safe, match: {destructive: false}, rate: 1/minute}
  - {name: risky, match: {destructive: true}, rate: 1/minute}
  - {name: tagged, match: {tags: [fs, net]}, rate: 1/minute}
  - {name: everything, rate: 5/minute}
overrides:
  - {users: ["b*"], rule: everything, rate: 50/minute}
"""


def test_explain_states_a_rules_kinds_by_their_names() -> None:
    """`kind: any` reads `kind in ['model', 'tool']`, as the policy file says them, not
    the enum's repr (`<CallKind.MODEL: 'model'>`)."""
    from ratewarden.cli.policy import explain_text

    policy = parse_policy(
        b"version: 1\nrules:\n  - {name: spend, match: {kind: any}, budget: 5/day}\n"
        b"  - {name: tokens, match: {kind: model}, rate: 10 tokens/minute}\n"
    )
    assert policy.rules[0].match.stated_parts() == ["kind in ['model', 'tool']"]
    assert policy.rules[1].match.stated_parts() == ["kind in ['model']"]
    text = explain_text(policy, Call(user="u", tool="terminal", call_id="c"))
    assert "held   kind in ['model', 'tool']" in text
    assert "CallKind" not in text


def test_explain_gives_a_reason_for_every_rule() -> None:
    policy = parse_policy(EXPLAIN_POLICY)
    reasons = {
        e.rule.name: (e.applies, e.reason, e.source)
        for e in policy.explain(call(user="bob", tool="terminal", team="ops"))
    }
    assert reasons == {
        "browser": (False, "tool 'terminal' is not in ['browser_*']", None),
        "only-alice": (False, "user 'bob' is not in ['alice']", None),
        "pros": (False, "user is in none of the groups ['pro']", None),
        "sessions": (False, "session None is not in ['s-1']", None),
        "research": (False, "team 'ops' is not in ['research']", None),
        "safe": (False, "destructive is True (unclassified default), rule wants False", None),
        "risky": (True, "all match conditions hold", "rule"),
        "tagged": (False, "call has none of the tags ['fs', 'net']", None),
        "everything": (True, "all match conditions hold", "overrides[0]"),
    }
    given = {
        e.rule.name: e.reason
        for e in policy.explain(call(user="alice", tool="browser_x", destructive=False))
        if not e.applies
    }
    assert given["risky"] == "destructive is False (given), rule wants True"
    assert "pros" not in given
    assert "browser" not in given


def test_an_exact_tool_entry_beats_a_glob_listed_before_it() -> None:
    policy = parse_policy(b"""\
version: 1
tools:
  "browser_*": {label: browser, cost: 0.05}
  browser_special: {label: special browser, cost: 1}
""")
    assert policy.label_for("browser_special") == "special browser"
    assert policy.cost_for("browser_special") == 1


def test_tool_catalogue_labels_and_default() -> None:
    policy = parse_policy(b"""\
version: 1
tools:
  terminal: {label: shell}
  "browser_*": {label: browser, cost: 0.05}
  "browser_x*": {label: never, cost: 9}
  default: {cost: 0.5}
""")
    assert (policy.label_for("terminal"), policy.cost_for("terminal")) == ("shell", 0.0)
    assert (policy.label_for("browser_xy"), policy.cost_for("browser_xy")) == ("browser", 0.05)
    assert (policy.label_for("other"), policy.cost_for("other")) == ("other", 0.5)


def test_document_is_the_normalised_file() -> None:
    policy = load_policy(GOOD / "readme_example.yaml")
    assert policy.document["rules"][1] == {
        "name": "destructive-per-hour",
        "match": {"destructive": True},
        "per": ["user"],  # the default scope, written out
        "rate": "3/hour",
        "on_exceed": "ask",
    }
    assert policy.document["overrides"][1] == {
        "users": ["banned-*"],
        "rule": "terminal-per-minute",
        "rate": "0/minute",
        "unlimited": False,
    }


SHARING_POLICY = b"""
version: 1
rules:
  - {name: per-user, per: [user], rate: 10/minute}
  - {name: browser, match: {tool: browser}, rate: 5/minute}
overrides:
  - {users: [vip], rule: per-user, rate: 100/minute}
"""


def test_users_with_the_same_rules_and_limits_share_one_cached_answer() -> None:
    """The (user, tool) cache must not hold a copy per pair: a full garbage collection
    walked every copy, a stall of every request that grew with the number of users."""
    policy = parse_policy(SHARING_POLICY)
    applied = [
        policy.applicable(Call(user=f"u{i}", tool="terminal", call_id="c")) for i in range(500)
    ]
    assert [a.rule.name for a in applied[0]] == ["per-user"]
    assert all(a[0] is applied[0][0] for a in applied)  # one Applied for all 500 pairs
    browser = policy.applicable(Call(user="u1", tool="browser", call_id="c"))
    vip = policy.applicable(Call(user="vip", tool="terminal", call_id="c"))
    assert [a.rule.name for a in browser] == ["per-user", "browser"]
    assert vip[0] is not applied[0][0]
    assert vip[0].source == "overrides[0]"
    assert vip[0].limit != applied[0][0].limit
    other = policy.applicable(Call(user="u7", tool="browser", call_id="c"))
    assert all(a is b for a, b in zip(other, browser, strict=True))


USERLESS = b"""
version: 1
rules:
  - {name: per-user, per: [user], rate: 10/minute}
  - {name: browser, match: {tool: browser}, per: [user, tool], rate: 5/minute}
  - {name: tokens, match: {model: "gpt-*"}, per: [user], rate: 1000 tokens/minute}
"""
# Each asks something of the user: the per-tool cache must not serve it.
ASKING = {
    "match users": b"{name: r, match: {user: vip}, rate: 1/minute}",
    "match groups": b"{name: r, match: {group: pro}, rate: 1/minute}",
    "unless users": b"{name: r, unless: {user: vip}, rate: 1/minute}",
    "unless groups": b"{name: r, unless: {group: pro}, rate: 1/minute}",
}
OVERRIDES = {
    "exact": b"{users: [vip], rule: r, rate: 7/minute}",
    "glob": b"{users: ['v*'], rule: r, rate: 7/minute}",
    "group": b"{groups: [pro], rule: r, unlimited: true}",
}
ASKED_BY = ["vip", "vim", "carol", "anyone"]  # carol is in group pro


def _oracle(policy: Any, user: str, tool: str, kind: str = "tool") -> list[tuple[str, Any, str]]:
    """What the rules say for this user, found afresh (no cache)."""
    if kind == "model":
        found = policy._find_for_model(user, tool)
    else:
        found = policy._find_candidates(user, tool)
    return [(a.rule.name, a.limit, a.source) for a in found]


def _answers(policy: Any, user: str, tool: str, kind: str = "tool") -> list[tuple[str, Any, str]]:
    call = Call(user=user, tool=tool, call_id="c", kind=kind)
    return [(a.rule.name, a.limit, a.source) for a in policy.applicable(call)]


def test_rules_that_ask_nothing_of_the_user_are_found_once_per_tool(monkeypatch: Any) -> None:
    """A policy counting per user without matching on one resolves its rules once per tool,
    not once per (user, tool) pair (every new user's first call missed that cache)."""
    from ratewarden.policy.model import Policy

    found: list[tuple[str, str]] = []
    real = Policy._find_candidates

    def counted(self: Any, user: str, tool: str, *rest: Any) -> Any:
        found.append((user, tool))
        return real(self, user, tool, *rest)

    monkeypatch.setattr(Policy, "_find_candidates", counted)
    policy = parse_policy(USERLESS)
    for i in range(300):
        for tool in ("terminal", "browser"):
            assert _answers(policy, f"u{i}", tool) == _oracle(policy, f"u{i}", tool)
        assert _answers(policy, f"u{i}", "gpt-4o", "model") == _oracle(
            policy, f"u{i}", "gpt-4o", "model"
        )
    cached = [pair for pair in found if pair[0] == ""]
    assert sorted(set(cached)) == [("", "browser"), ("", "gpt-4o"), ("", "terminal")]
    assert len(cached) == 3  # once each, for 300 users


@pytest.mark.parametrize("rule", sorted(ASKING), ids=str)
def test_a_rule_that_asks_the_user_is_found_per_user(rule: str) -> None:
    policy = parse_policy(
        b"version: 1\ngroups: {pro: [carol]}\nrules:\n  - " + ASKING[rule] + b"\n"
    )
    assert policy.rules[0].asks_user
    for user in ASKED_BY:
        assert _answers(policy, user, "terminal") == _oracle(policy, user, "terminal"), user
    assert {len(_answers(policy, user, "terminal")) for user in ASKED_BY} == {0, 1}


@pytest.mark.parametrize("override", sorted(OVERRIDES), ids=str)
def test_an_override_in_the_file_or_at_runtime_makes_the_rules_per_user(override: str) -> None:
    from ratewarden.policy.compile import with_runtime
    from ratewarden.policy.schema import OverrideSpec

    head = b"version: 1\ngroups: {pro: [carol]}\nrules:\n  - {name: r, rate: 1/minute}\n"
    in_file = parse_policy(head + b"overrides:\n  - " + OVERRIDES[override] + b"\n")
    plain = parse_policy(head)
    assert not plain.rules[0].asks_user
    before = [_answers(plain, user, "terminal") for user in ASKED_BY]  # cached per tool
    spec = OverrideSpec.model_validate(yaml.safe_load(OVERRIDES[override]))
    at_runtime = with_runtime(plain, [("ovr_1", spec)])
    for policy in (in_file, at_runtime):
        answers = [_answers(policy, user, "terminal") for user in ASKED_BY]
        assert answers == [_oracle(policy, user, "terminal") for user in ASKED_BY]
        assert answers != before  # someone's limit or source is the override's
    assert [_answers(plain, user, "terminal") for user in ASKED_BY] == before


def test_same_result_keys_a_loop_rule_on_results_and_overrides_keep_it() -> None:
    """issue 29: `same_result: true` on a rate rule per `args` or `args.PATH`; an override
    of its rate keeps it, and explain shows it."""
    from ratewarden.cli.policy import explain_text
    from ratewarden.vocabulary import SAME_RESULT, TEMPLATES

    policy = parse_policy(
        b"""
version: 1
rules:
  - {name: poll, per: [user, args.run], rate: 3/10min, same_result: true}
  - {name: plain, per: [user, args], rate: 3/10min}
overrides:
  - {users: [alice], rule: poll, rate: 5/10min}
"""
    )
    poll, plain = policy.rules
    assert isinstance(poll.limit, RateLimit)
    assert poll.limit.same_result
    assert isinstance(plain.limit, RateLimit)
    assert not plain.limit.same_result
    assert poll.template.text == TEMPLATES[SAME_RESULT]
    call = Call("alice", "terminal", "c", args={"run": 1})
    applied = {a.rule.name: a.limit for a in policy.applicable(call)}
    overridden = applied["poll"]
    assert isinstance(overridden, RateLimit)
    assert (overridden.limit, overridden.same_result) == (5, True)
    text = explain_text(policy, call)
    assert "poll: rate 5/10 minutes, same_result (overrides[0])" in text
