"""`policy check` (validate files, for CI) and `policy explain` (which rules apply to a
call, and why), offline: no daemon is asked.

`policy check` exits 1 when a file cannot be used; its warnings (a rule naming a host's
own tool: docs/policy.md, "Canonical tool names") leave it 0. `policy explain` exits as
`ratewarden check` would for a first call with fresh counters: 0 allow, 1 deny, 3 ask,
and 2 for a bad flag or a policy that cannot be used.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ratewarden.cli.common import (
    EXIT_ALLOW,
    EXIT_ASK,
    EXIT_DENY,
    EXIT_USAGE,
    add_metadata_flags,
    args_json,
)
from ratewarden.vocabulary import METADATA_FLAGS
from ratewarden.wire.tools import HOST_TOOLS


def add_parser(commands: Any) -> None:
    policy = commands.add_parser("policy", help="validate or explain a policy file")
    actions = policy.add_subparsers(title="actions", metavar="ACTION", required=True)
    check = actions.add_parser("check", help="validate policy files (for CI); lists every error")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.set_defaults(run=_policy_check, daemon_command="policy check")
    explain = actions.add_parser("explain", help="which rules apply to a call, and why")
    explain.add_argument("file", metavar="FILE")
    explain.add_argument("--user", required=True)
    explain.add_argument("--tool", required=True)
    explain.add_argument(
        "--host",
        choices=list(HOST_TOOLS),
        help="whose name --tool is (as `ratewarden hook HOST` says): it is checked as the "
        "canonical tool it stands for",
    )
    explain.add_argument("--session")
    explain.add_argument("--team")
    explain.add_argument("--approved", action="store_true")
    explain.add_argument(
        "--args", type=args_json, help="the call's arguments as a JSON object (args rules)"
    )
    add_metadata_flags(explain)
    explain.set_defaults(run=_policy_explain, daemon_command="policy explain")


def _policy_check(args: argparse.Namespace) -> int:
    from ratewarden.policy import PolicyError, load_policy

    failed = False
    for path in args.files:
        try:
            policy = load_policy(path)
        except PolicyError as exc:
            failed = True
            print(exc, file=sys.stderr)
            continue
        for warning in policy.warnings:
            print(f"{path}: warning: {warning.message}", file=sys.stderr)
        print(f"{path}: ok (version {policy.version}, {len(policy.rules)} rules)")
    return 1 if failed else 0


def _policy_explain(args: argparse.Namespace) -> int:
    from ratewarden.calls import Call, ToolFacts
    from ratewarden.policy import PolicyError, load_policy

    try:
        policy = load_policy(args.file)
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    facts = ToolFacts(
        **{name: getattr(args, name) for name in METADATA_FLAGS}, tags=frozenset(args.tags)
    )
    named = policy.canonical(args.host, args.tool, args.args)  # as the daemon would
    call = Call(
        args.user,
        named.tool,
        "explain",
        args.session,
        args.team,
        facts=facts,
        approved=args.approved,
        args=named.args,
        host_tool=named.host_tool,
    )
    print(explain_text(policy, call, _mapping(policy, args.host, args.tool, named.tool)))
    decided = _first_decision(policy, call)
    said = f": {decided.message}" if decided.message else ""
    print(f"\ndecision: {decided.decision}{said} (a first call: fresh counters, nothing kept)")
    return {"allow": EXIT_ALLOW, "deny": EXIT_DENY, "ask": EXIT_ASK}[decided.decision]


def _mapping(policy: Any, host: str | None, tool: str, canonical: str) -> str | None:
    """What the tool is checked as, when a host or the policy names it otherwise."""
    from ratewarden.wire import tools

    on = f" on {host}" if host else ""
    if canonical == tool:
        return f"tool {tool!r}{on} keeps its name (no other name for it)" if host else None
    built_in = tools.canonical(host, tool).tool == canonical
    source = "the built-in table" if built_in else "this policy's tools: same_as"
    return (
        f"tool {tool!r}{on} is {canonical!r} ({source}); rules naming either match, "
        f"counters and messages say {canonical!r}"
    )


def _first_decision(policy: Any, call: Any) -> Any:
    """The daemon's decision on `call` as a first call: an engine on empty counters of
    its own (a rate rule refuses only at a limit of 0; an access rule as it would)."""
    import asyncio

    from ratewarden.engine import Engine
    from ratewarden.store import MemoryStore

    return asyncio.run(Engine(policy, MemoryStore()).check(call))


def _call_lines(policy: Any, call: Any, mapping: str | None) -> list[str]:
    """The policy, the call (and what its tool is checked as), then a blank line."""
    groups = sorted(policy.groups_of(call.user))
    lines = [
        f"policy {policy.source} (version {policy.version}, {len(policy.rules)} rules)",
        f"call: user={call.user!r} tool={call.tool!r}"
        + (f" host_tool={call.host_tool!r}" if call.host_tool else "")
        + f" session={call.session!r} team={call.team!r}",
        f"user's groups: {', '.join(groups) if groups else '(none)'}",
        "tool metadata: "
        + ", ".join(f"{name}={call.facts.effective(name)}" for name in METADATA_FLAGS)
        + " (unset fields take the MCP defaults)",
        "",
    ]
    if mapping is not None:
        lines.insert(2, mapping)
    if call.args is not None:
        lines.insert(-1, "args: given (counter keys hold a digest of them, never their text)")
    return lines


def explain_text(policy: Any, call: Any, mapping: str | None = None) -> str:
    from ratewarden.policy.model import (
        AccessLimit,
        BudgetLimit,
        ConcurrencyLimit,
        RateLimit,
        Unlimited,
    )

    lines = _call_lines(policy, call, mapping)
    for item in policy.explain(call):
        rule = item.rule
        if not item.applies:
            lines.append(f"  skip     {rule.name}: {item.reason}")
            lines += _condition_lines(item.conditions)
            continue
        limit = item.limit
        if isinstance(limit, RateLimit):
            what = f"rate {limit.rate}" + (", same_result" if limit.same_result else "")
        elif isinstance(limit, BudgetLimit):
            what = f"budget {limit.budget} {limit.currency}"
        elif isinstance(limit, ConcurrencyLimit):
            what = f"concurrency {limit.slots} (lease {limit.lease_ms // 1000}s)"
        elif isinstance(limit, AccessLimit):
            what = f"access: {rule.on_exceed} {rule.template.text!r}"
        else:
            what = "unlimited"
        origin = "rule default" if item.source == "rule" else item.source
        if isinstance(rule.limit, AccessLimit):  # no counter, whatever the override
            lines.append(f"  APPLIES  {rule.name}: {what} ({origin}); {rule.mode}")
        else:
            per = ", ".join(rule.per) if rule.per else "everyone (one global counter)"
            lines.append(
                f"  APPLIES  {rule.name}: {what} ({origin}) per {per}; "
                f"{rule.algorithm}, {rule.mode}, on_exceed {rule.on_exceed}"
            )
        if not isinstance(limit, AccessLimit | Unlimited):
            lines.append(f"           counter key: {_counter_key(rule, call)}")
        lines += _condition_lines(item.conditions)
    return "\n".join(lines)


def _condition_lines(conditions: Any) -> list[str]:
    return [f"           {'held  ' if held else 'failed'} {text}" for text, held in conditions]


def _counter_key(rule: Any, call: Any) -> str:
    """The rule's counter key for `call`; an `args` part is a digest, and says so."""
    from ratewarden.engine.engine import KIND_OF
    from ratewarden.limiter.ops import Kind
    from ratewarden.policy.model import BudgetLimit, RateLimit
    from ratewarden.store.keys import CounterKeys

    limit = rule.limit
    if isinstance(limit, RateLimit):
        kind = KIND_OF[limit.algorithm]
    else:
        kind = Kind.BUDGET if isinstance(limit, BudgetLimit) else Kind.CONCURRENCY
    keys = CounterKeys.of(rule.name, kind, rule.per)
    key = keys.for_call(call)
    return key + ("  (args parts are digests of the arguments)" if keys.hashed else "")
