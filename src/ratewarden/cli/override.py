"""`ratewarden override set|list|rm`: runtime overrides from the command line (an admin
token), through the daemon's `/v1/admin/overrides` (service/overrides.py).

    ratewarden override set --user alice --rule terminal-per-minute --rate 20/minute \\
        --ttl 10m --reason "support ticket 4411"
    ratewarden override list
    ratewarden override rm ovr_3f9a1c0e5b2d
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


def add_parser(commands: Any, add_client_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    override = commands.add_parser(
        "override", help="change one user's or group's limit now (set, list, rm; admin token)"
    )
    actions = override.add_subparsers(dest="action", required=True, metavar="ACTION")
    add_client_flags(_add_set(actions))
    listing = actions.add_parser("list", help="the runtime overrides in force")
    listing.set_defaults(run=_list)
    add_client_flags(listing)
    remove = actions.add_parser("rm", help="remove a runtime override")
    remove.add_argument("id", help="the override's id (from `override list`)")
    remove.set_defaults(run=_remove)
    add_client_flags(remove)


def _add_set(actions: Any) -> argparse.ArgumentParser:
    given: argparse.ArgumentParser = actions.add_parser("set", help="set a runtime override")
    who = given.add_argument_group("who (one or both, repeatable)")
    who.add_argument("--user", dest="users", action="append", help="a user (or a glob)")
    who.add_argument("--group", dest="groups", action="append", help="a group of the policy")
    given.add_argument("--rule", required=True, help="the rule whose limit changes")
    limit = given.add_mutually_exclusive_group(required=True)
    limit.add_argument("--rate", help="for a rate rule, e.g. 20/minute")
    limit.add_argument("--budget", help="for a budget rule, e.g. 5/day")
    limit.add_argument("--concurrency", type=int, help="for a concurrency rule: slots, e.g. 3")
    limit.add_argument("--unlimited", action="store_true", help="no limit from this rule")
    given.add_argument("--burst", type=int, help="a token bucket's burst")
    expiry = given.add_mutually_exclusive_group()
    expiry.add_argument(
        "--ttl", help="how long it lasts, e.g. 10m, 2h, 1d (default: until removed)"
    )
    expiry.add_argument("--until", help="when it ends: an ISO 8601 time with its zone")
    given.add_argument("--reason", required=True, help="why (kept with it, and audited)")
    given.set_defaults(run=_set)
    return given


def _client(args: argparse.Namespace) -> Any:
    from ratewarden.cli.common import client_target
    from ratewarden.client import Client

    settings = client_target(args)
    return Client(settings.url, settings.token, timeout=args.timeout)


def asking(run: Callable[[Any], int], args: argparse.Namespace) -> int:
    """Run `run(client)`, saying plainly why the daemon did not do it (also for `reset`)."""
    from ratewarden.cli.common import EXIT_UNREACHABLE, EXIT_USAGE
    from ratewarden.client import ClientError, DaemonUnavailable
    from ratewarden.vocabulary import shown

    try:
        with _client(args) as client:
            return run(client)
    except DaemonUnavailable as exc:
        print(f"ratewarden daemon unreachable: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ClientError as exc:
        print(f"ratewarden: the daemon refused the request: {shown(exc)}", file=sys.stderr)
        return EXIT_USAGE


def _set(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from ratewarden.cli.common import EXIT_USAGE
    from ratewarden.wire.bodies import OverrideRequest

    fields = ("users", "groups", "rule", "rate", "budget", "concurrency", "burst", "ttl", "until")
    body = {name: getattr(args, name) for name in fields if getattr(args, name) is not None}
    if args.unlimited:
        body["unlimited"] = True
    try:
        request = OverrideRequest.model_validate({**body, "reason": args.reason})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = (
            "--" + "-".join(str(part) for part in error["loc"][:1]) if error["loc"] else "override"
        )
        print(f"ratewarden: {where}: {error['msg']}", file=sys.stderr)
        return EXIT_USAGE

    def run(client: Any) -> int:
        made = client.set_override(request)
        if args.json:
            print(made.model_dump_json(indent=2))
        else:
            print(f"override {made.id} set: {_describe(made)}")
        return 0

    return asking(run, args)


def _list(args: argparse.Namespace) -> int:
    from ratewarden.vocabulary import shown

    def run(client: Any) -> int:
        found = client.overrides()
        if args.json:
            print(found.model_dump_json(indent=2))
            return 0
        if not found.overrides:
            print("(no runtime overrides)")
            return 0
        for override in found.overrides:
            print(f"{shown(override.id)}  {_describe(override)}")
        return 0

    return asking(run, args)


def _remove(args: argparse.Namespace) -> int:
    def run(client: Any) -> int:
        client.remove_override(args.id)
        print(f"override {args.id} removed")
        return 0

    return asking(run, args)


def _describe(override: Any) -> str:
    """`alice, group pro: terminal-per-minute rate 20/minute until …; by ops-ana (reason)`,
    each stored text escaped: an override stored before names were checked, or by anything
    else that can write the store, must not send an ANSI sequence to the terminal."""
    from ratewarden.vocabulary import shown

    return shown(_line(override))


def _line(override: Any) -> str:
    who = [*(override.users or []), *(f"group {g}" for g in override.groups or [])]
    limit = next(
        (f"{name} {value}" for name in ("rate", "budget", "concurrency")
         if (value := getattr(override, name)) is not None),
        "unlimited",
    )  # fmt: skip
    until = override.expires_at.isoformat(timespec="seconds") if override.expires_at else "removed"
    idle = "" if override.active else f" [idle: {override.idle}]"
    return (
        f"{', '.join(who)}: {override.rule} {limit} until {until}; "
        f"by {override.set_by} ({override.reason}){idle}"
    )
