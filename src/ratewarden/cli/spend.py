"""`ratewarden spend`: what each budget rule charged per UTC day, for a user, a team or
everyone, through the daemon's `GET /v1/admin/spend` (a viewer or admin token).

One line per day, rule and scope (its amount, and the part of it model calls spent), then
the total per currency; `--csv` prints the
daemon's CSV (for chargeback), `--json` its JSON. Exit codes in `--help`
(common.EXIT_CODES["spend"]).

    ratewarden spend --user alice --since 7d
    ratewarden spend --team red --since 2026-11-01 --until 2026-11-30 --csv > red.csv
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ratewarden.cli.common import (
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    add_client_flags,
    client_target,
    exit_codes,
    refused,
    table,
)
from ratewarden.vocabulary import shown

_FILTERS = ("user", "team", "rule", "since", "until")


def add_parser(commands: Any) -> None:
    spend = commands.add_parser(
        "spend",
        help="what each budget rule charged per day, for a user, a team or everyone",
        epilog=exit_codes("spend"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    spend.add_argument("--user", help="only this user's budgets")
    spend.add_argument("--team", help="only this team's budgets")
    spend.add_argument("--rule", help="only this budget rule")
    spend.add_argument(
        "--since", default="7d", help="Nd (the last N days, today included) or YYYY-MM-DD "
        "(default 7d)",
    )  # fmt: skip
    spend.add_argument("--until", help="the last day, YYYY-MM-DD or Nd (default today)")
    spend.add_argument("--csv", action="store_true", help="print CSV, for chargeback")
    add_client_flags(spend)
    spend.set_defaults(run=_spend)


def _spend(args: argparse.Namespace) -> int:
    from ratewarden.client import Client, ClientError, DaemonUnavailable

    if args.csv and args.json:
        print("ratewarden: --csv and --json: choose one", file=sys.stderr)
        return EXIT_USAGE
    filters = {name: getattr(args, name) for name in _FILTERS}
    settings = client_target(args)
    try:
        with Client(settings.url, settings.token, timeout=args.timeout) as client:
            if args.csv:
                sys.stdout.write(client.spend_csv(**filters))
                return 0
            answer = client.spend(**filters)
    except DaemonUnavailable as exc:
        print(f"ratewarden daemon unreachable at {settings.url}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ClientError as exc:
        field, _, problem = str(exc).partition(": ")
        if exc.status == 422 and field in _FILTERS:
            print(f"ratewarden: --{field}: {problem}", file=sys.stderr)
            return EXIT_USAGE
        return refused(exc, args)
    print(answer.model_dump_json(indent=2) if args.json else _report(answer))
    return 0


def _report(answer: Any) -> str:
    """`spend 2026-11-23 to 2026-11-29`, the table (each amount, and the part of it model
    calls spent), and `total: 1.25 USD`."""
    rows = [
        [row.day, shown(row.rule), _scope(row.scope), _money(row.amount, row.currency),
         _money(row.model, row.currency)]
        for row in answer.rows
    ]  # fmt: skip
    lines = [f"spend {answer.since} to {answer.until} (UTC days)"]
    header = ["DAY", "RULE", "SCOPE", "AMOUNT", "MODELS"]
    lines.append(table(header, rows) if rows else "(nothing spent)")
    totals = "; ".join(_money(t.amount, t.currency) for t in answer.totals) or "0"
    lines.append(f"total: {totals}")
    if answer.truncated:
        lines.append("truncated: narrow by --user, --team, --rule or the dates")
    return "\n".join(lines)


def _scope(scope: dict[str, str]) -> str:
    return " ".join(f"{name}={shown(value)}" for name, value in scope.items()) or "(everyone)"


def _money(amount: float, currency: str | None) -> str:
    return f"{amount:.2f} {currency}" if currency else f"{amount:.2f}"
