"""`ratewarden reset`: forget a user's counters (every rule, or one), or one rule's for
everyone, through the daemon's `/v1/admin/reset` (an admin token). The daemon audits and
counts it (service/resets.py).

At a terminal it first says what will be forgotten and asks; `--yes` does not ask, and
neither does a script (stdin not a terminal). Exit codes as `override`'s: 0 done, 1 not
confirmed (nothing reset), 2 a bad flag or a request the daemon refused, 4 unreachable.

    ratewarden reset --user alice --rule daily-spend
    ratewarden reset --rule terminal-per-minute --yes
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ratewarden.cli.override import asking

EXIT_NOT_CONFIRMED = 1


def add_parser(commands: Any, add_client_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    reset = commands.add_parser(
        "reset",
        help="forget a user's counters, or one rule's (admin token; asks first at a terminal)",
    )
    reset.add_argument("--user", help="whose counters: every rule's, or only --rule's")
    reset.add_argument("--rule", help="one rule's counters: --user's, or everyone's")
    reset.add_argument("--yes", action="store_true", help="do not ask first")
    reset.set_defaults(run=_reset)
    add_client_flags(reset)


def _reset(args: argparse.Namespace) -> int:
    from ratewarden.cli.common import EXIT_USAGE

    request = _request(args.user, args.rule)
    if isinstance(request, str):
        print(f"ratewarden: {request}", file=sys.stderr)
        return EXIT_USAGE

    def run(client: Any) -> int:
        if not args.yes and sys.stdin.isatty() and not _confirmed(client, request):
            print("not reset", file=sys.stderr)
            return EXIT_NOT_CONFIRMED
        done = _sent(client, request)
        if isinstance(done, str):
            print(f"ratewarden: {done}", file=sys.stderr)
            return EXIT_USAGE
        print(done.model_dump_json(indent=2) if args.json else _done_line(request, done))
        return 0

    return asking(run, args)


def _request(user: str | None, rule: str | None) -> Any:
    """The request to send, or what is wrong with the flags (naming the flag)."""
    from pydantic import ValidationError

    from ratewarden.wire.bodies import ResetRequest

    if user is None and rule is None:
        return "--user or --rule: name a user, a rule, or both"
    try:
        return ResetRequest(user=user, rule=rule)
    except ValidationError as exc:
        error = exc.errors()[0]
        return f"--{error['loc'][0]}: {error['msg'].removeprefix('Value error, ')}"


def _sent(client: Any, request: Any) -> Any:
    """The daemon's answer, or its refusal of a flag's value, naming the flag."""
    from ratewarden.client import ClientError

    try:
        return client.reset(request)
    except ClientError as exc:
        field, _, problem = str(exc).partition(": ")
        if exc.status != 422 or field not in ("user", "rule"):
            raise  # auth and the like: `asking` words them
        return f"--{field}: {problem}"


def _confirmed(client: Any, request: Any) -> bool:
    print(f"{_question(client, request)} [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _question(client: Any, request: Any) -> str:
    """What will be forgotten, read from the user's usage just before asking."""
    from ratewarden.vocabulary import shown
    from ratewarden.wire.bodies import held_by_user

    if request.user is None:
        return f"Forget {shown(request.rule)} for every user?"
    held = [
        item
        for item in client.usage(request.user).limits
        if (request.rule is None or item.rule == request.rule) and held_by_user(item)
    ]
    who = shown(request.user)
    if request.rule is not None:
        amount = _amount(held[0]) if held else "nothing counted"
        return f"Forget {amount} by {who} on {shown(request.rule)}?"
    return f"Forget every counter of {who} ({_listed(held) or 'nothing counted'})?"


def _amount(item: Any) -> str:
    """`1.20 USD spent (+0.50 reserved)`, `2 calls` or `1 slots in use`."""
    if item.kind == "budget":
        reserved = f" (+{item.reserved:.2f} reserved)" if item.reserved else ""
        return f"{item.used:.2f} {item.currency} spent{reserved}"
    return f"{item.used} slots in use" if item.kind == "concurrency" else f"{item.used} calls"


def _listed(items: Sequence[Any]) -> str:
    from ratewarden.vocabulary import shown

    return "; ".join(f"{_amount(item)} on {shown(item.rule)}" for item in items)


def _done_line(request: Any, done: Any) -> str:
    """`reset alice on daily-spend: 1 counter(s) deleted; forgot 1.20 USD spent on …`."""
    from ratewarden.vocabulary import shown

    who = "every user" if request.user is None else shown(request.user)
    what = "every rule" if request.rule is None else shown(request.rule)
    if done.forgotten is None:
        forgot = "values not read (a rule reset for every user)"
    else:
        forgot = f"forgot {_listed(done.forgotten) or 'nothing counted'}"
    return f"reset {who} on {what}: {done.deleted} counter(s) deleted; {forgot}"
