"""`check`, `settle` and `usage`: a running daemon's client on the command line.

`check` prints what it decided on stdout, whatever the decision (`allow call_id=ID`, then
a `warning:` line each), so that `settle ID` can follow it from a shell; a refusal's reason
goes to stderr. Exit codes: common.EXIT_CODES, shown in each command's --help.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from ratewarden.cli.common import (
    EXIT_ALLOW,
    EXIT_ASK,
    EXIT_DENY,
    EXIT_UNREACHABLE,
    add_client_flags,
    add_metadata_flags,
    args_json,
    client_target,
    exit_codes,
    flags_given,
    refused,
    table,
)
from ratewarden.vocabulary import METADATA_FLAGS, shown

if TYPE_CHECKING:
    from ratewarden.wire.bodies import CheckResponse, UsageResponse


def add_parsers(commands: Any) -> None:
    _add_check(commands)
    _add_settle(commands)
    _add_usage(commands)


def _add_check(commands: Any) -> None:
    check = commands.add_parser(
        "check",
        help="ask a running daemon whether a call may run",
        epilog=exit_codes("check"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check.add_argument("--user", required=True)
    what = check.add_mutually_exclusive_group(required=True)
    what.add_argument("--tool")
    what.add_argument("--model", help="a model call's model (docs/budgets.md), not a tool")
    check.add_argument("--input-tokens", type=int, help="a model call's input tokens")
    check.add_argument("--max-output-tokens", type=int, help="a model call's most output")
    check.add_argument("--session")
    check.add_argument("--team")
    check.add_argument("--cost", type=float)
    check.add_argument("--call-id")
    check.add_argument("--approved", action="store_true", help="a human approved this call")
    check.add_argument(
        "--args",
        type=args_json,
        help="the call's arguments as a JSON object; sent only if the policy reads them",
    )
    add_metadata_flags(check)
    add_client_flags(check)
    check.set_defaults(run=_check)


def _check(args: argparse.Namespace) -> int:
    from ratewarden.client import Client, ClientError, DaemonUnavailable
    from ratewarden.wire.bodies import CheckRequest

    given = flags_given(
        args, "user", "tool", "session", "team", "cost", "call_id", "approved", "args",
        "model", "input_tokens", "max_output_tokens",
    )  # fmt: skip
    if "model" in given:
        given["kind"] = "model"
    request = CheckRequest.model_validate({**given, "metadata": _metadata(args)})
    settings = client_target(args)
    try:
        with Client(settings.url, settings.token, timeout=args.timeout) as client:
            answer = client.check(request)
    except DaemonUnavailable as exc:
        print(f"ratewarden daemon unreachable at {settings.url}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ClientError as exc:
        return refused(exc, args)
    print(answer.model_dump_json(indent=2) if args.json else _decided(answer))
    if answer.decision != "allow":
        print(shown(answer.message), file=sys.stderr)
    return {"allow": EXIT_ALLOW, "deny": EXIT_DENY, "ask": EXIT_ASK}[answer.decision]


def _decided(answer: CheckResponse) -> str:
    """`allow call_id=ID` (and what else the answer says about the call), then a line per
    warning: what a shell needs to settle the call, and what it should know."""
    said = [answer.decision, f"call_id={answer.call_id}"]
    if answer.retry_after is not None:
        said.append(f"retry_after={answer.retry_after:g}")
    said += [name for name in ("approved", "degraded", "replayed") if getattr(answer, name)]
    return "\n".join([" ".join(said), *(f"warning: {shown(w)}" for w in answer.warnings)])


def _metadata(args: argparse.Namespace) -> dict[str, Any] | None:
    given = {
        name: getattr(args, name) for name in METADATA_FLAGS if getattr(args, name) is not None
    }
    if args.tags:
        given["tags"] = args.tags
    return given or None


_USAGE = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def _add_settle(commands: Any) -> None:
    settle = commands.add_parser(
        "settle",
        help="report a finished call: its actual cost",
        epilog=exit_codes("settle"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    settle.add_argument("call_id", metavar="CALL_ID")
    settle.add_argument("--cost", type=float, help="actual cost (default: the estimate)")
    settle.add_argument("--status", help="how the call ended (ok, error...)")
    for name in _USAGE:  # a model call's usage, priced by the daemon (docs/budgets.md)
        settle.add_argument(f"--{name.replace('_', '-')}", type=int, dest=name)
    add_client_flags(settle)
    settle.set_defaults(run=_settle)


def _settle(args: argparse.Namespace) -> int:
    from ratewarden.client import Client, ClientError, DaemonUnavailable
    from ratewarden.wire.bodies import SettleRequest

    usage = flags_given(args, *_USAGE)
    request = SettleRequest.model_validate(
        {**flags_given(args, "cost", "status"), **({"usage": usage} if usage else {})}
    )
    settings = client_target(args)
    try:
        with Client(settings.url, settings.token, timeout=args.timeout) as client:
            answer = client.settle(args.call_id, request)
    except DaemonUnavailable as exc:
        print(f"ratewarden daemon unreachable at {settings.url}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ClientError as exc:
        if exc.status != 404:
            return refused(exc, args)
        print(f"ratewarden: {shown(exc)}", file=sys.stderr)
        return EXIT_DENY
    if args.json:
        print(answer.model_dump_json(indent=2, exclude_none=True))  # `tokens`: model calls'
    else:
        charged = ", ".join(f"{rule} {amount:.2f}" for rule, amount in answer.charged.items())
        print(
            f"{answer.call_id}: {answer.outcome.replace('_', ' ')}"
            + (f" ({charged})" if charged else "")
        )
    return 0


def _add_usage(commands: Any) -> None:
    usage = commands.add_parser(
        "usage",
        help="a user's limits, used and remaining",
        epilog=exit_codes("usage"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    usage.add_argument("--user", required=True)
    usage.add_argument("--tool")
    usage.add_argument("--session")
    usage.add_argument("--team")
    add_client_flags(usage)
    usage.set_defaults(run=_usage)


def _usage(args: argparse.Namespace) -> int:
    from ratewarden.client import Client, ClientError, DaemonUnavailable

    settings = client_target(args)
    try:
        with Client(settings.url, settings.token, timeout=args.timeout) as client:
            answer = client.usage(args.user, tool=args.tool, session=args.session, team=args.team)
    except DaemonUnavailable as exc:
        print(f"ratewarden daemon unreachable at {settings.url}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ClientError as exc:
        return refused(exc, args)
    if args.json:
        print(answer.model_dump_json(indent=2))
        return 0
    rows = [_usage_row(item) for item in answer.limits]
    print(f"usage for {answer.user}" + (f", tool {answer.tool}" if answer.tool else ""))
    print(table(["RULE", "KIND", "LIMIT", "USED", "REMAINING", "RESETS IN", "MODE"], rows))
    for line in _unshown(answer):
        print(line)
    return 0


# The flag that gives each part a rule's counter may need.
_PART_FLAGS = {"tool": "--tool NAME", "session": "--session ID", "team": "--team NAME"}


def _unshown(answer: UsageResponse) -> list[str]:
    """A line per kind of rule left out of the table, and the flags that show it:
    `rules per tool, not shown: all-tools-burst (add --tool NAME)`."""
    by_needs: dict[tuple[str, ...], list[str]] = {}
    for item in answer.unshown:
        by_needs.setdefault(tuple(item.needs), []).append(shown(item.rule))
    return [
        f"rules per {' and '.join(needs)}, not shown: {', '.join(rules)} "
        f"(add {' '.join(_PART_FLAGS.get(part, '--' + part) for part in needs)})"
        for needs, rules in by_needs.items()
    ]


def _usage_row(item: Any) -> list[str]:
    """One table row; money with two decimals and its currency, reservations shown apart."""
    if item.limit is None:
        return [item.rule, item.kind, "unlimited", "-", "-", "-", item.mode]
    if item.kind == "access":  # no counter: it refuses (or asks about) what it matches
        return [item.rule, item.kind, "refuses what it matches", "-", "-", "-", item.mode]
    resets = f"{item.reset_after:.0f}s" if item.used or item.reserved else "-"
    if item.kind == "budget":
        limit = f"{item.limit:.2f} {item.currency}/{item.period}"
        used = f"{item.used:.2f}" + (f" (+{item.reserved:.2f} reserved)" if item.reserved else "")
        return [item.rule, item.kind, limit, used, f"{item.remaining:.2f}", resets, item.mode]
    if item.kind == "concurrency":  # slots free on settle or lease expiry, not at a time
        limit, resets = f"{item.limit} at once", "-"
    else:
        limit = f"{item.limit}/{item.window}"
    return [item.rule, item.kind, limit, str(item.used), str(item.remaining), resets, item.mode]
