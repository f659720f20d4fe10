"""What the commands share: exit codes, the client flags, settings from flags over the
environment, and how a usage error is said."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

from ratewarden.vocabulary import DEFAULT_URL, METADATA_FLAGS, ClientSettings, shown

if TYPE_CHECKING:
    from pydantic import ValidationError

    from ratewarden.client import ClientError


EXIT_ALLOW, EXIT_DENY, EXIT_USAGE, EXIT_ASK, EXIT_UNREACHABLE = 0, 1, 2, 3, 4
# What each client command's exit status means: its --help epilog (README and docs/api.md
# say the same; tests/service/test_cli.py holds them together).
_EXIT_SHARED = {
    EXIT_USAGE: "bad usage: a flag, a request the daemon refused, or auth (no token, or a\n"
    "token the daemon does not accept: set RATEWARDEN_TOKEN or pass --token)",
    EXIT_UNREACHABLE: "the daemon is unreachable (RATEWARDEN_URL or --url says where it is)",
}
EXIT_CODES: dict[str, dict[int, str]] = {
    "check": {
        EXIT_ALLOW: "allow (prints `allow call_id=ID`, then a `warning:` line each)",
        EXIT_DENY: "deny (prints `deny call_id=ID`; the reason on stderr)",
        EXIT_ASK: "ask: a human must approve (prints `ask call_id=ID`; the reason on stderr)",
    }
    | _EXIT_SHARED,
    "settle": {
        0: "settled, or already settled (it says which)",
        1: "no call to settle by that id (never checked, refused, holding nothing,\n"
        "or its record expired)",
    }
    | _EXIT_SHARED,
    "usage": {0: "the table (or --json) was printed"} | _EXIT_SHARED,
    "spend": {0: "the table (or --csv, --json) was printed"} | _EXIT_SHARED,
}
# What the `daemon` extra brings, imported by `serve` and `policy` (a host installs only the
# client: there, these commands say what to install instead of failing on an import).
DAEMON_MODULES = ("fastapi", "uvicorn", "redis", "pydantic_settings", "prometheus_client",
                  "yaml", "re2", "fastapi_offline")  # fmt: skip


def client_target(args: argparse.Namespace) -> ClientSettings:
    """The daemon's URL and token: the flags over RATEWARDEN_URL and RATEWARDEN_TOKEN, read
    as the client reads them (no pydantic-settings: a host may run `check`)."""
    return ClientSettings.read()._replace(**flags_given(args, "url", "token"))


def exit_codes(command: str) -> str:
    """The --help epilog of a client command: every exit status it can end with."""
    lines = [
        f"  {code}  " + text.replace("\n", "\n     ")
        for code, text in sorted(EXIT_CODES[command].items())
    ]
    return "exit status:\n" + "\n".join(lines)


def refused(exc: ClientError, args: argparse.Namespace) -> int:
    """The daemon refused the request (a 4xx): said for someone at a shell. An auth
    refusal names the variable or flag that sets the token, not the HTTP header."""
    target = client_target(args)
    source = "--token" if getattr(args, "token", None) else "$RATEWARDEN_TOKEN"
    if exc.status == 401 and target.token is None:
        return usage_error(
            f"the daemon at {target.url} needs a token: set RATEWARDEN_TOKEN "
            "(or pass --token TOKEN)"
        )
    if exc.status in (401, 403):
        return usage_error(
            f"the daemon at {target.url} refused the token from {source} ({shown(exc)}): "
            "set RATEWARDEN_TOKEN (or pass --token TOKEN) to a token it accepts"
        )
    return usage_error(f"the daemon refused the request: {shown(exc)}")


def missing_daemon_module() -> str | None:
    """The first of the daemon extra's modules not installed here, if any."""
    return next((name for name in DAEMON_MODULES if importlib.util.find_spec(name) is None), None)


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help=f"daemon URL (default $RATEWARDEN_URL or {DEFAULT_URL})")
    parser.add_argument("--token", help="API token (default $RATEWARDEN_TOKEN)")
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds to wait (default 2)")
    parser.add_argument("--json", action="store_true", help="print the daemon's JSON answer")


def add_metadata_flags(parser: argparse.ArgumentParser) -> None:
    for name in METADATA_FLAGS:
        flag = name.replace("_", "-")
        parser.add_argument(f"--{flag}", dest=name, action=argparse.BooleanOptionalAction)
    parser.add_argument("--tag", dest="tags", action="append", default=[], help="tool tag (repeat)")


def args_json(text: str) -> dict[str, Any]:
    """`--args`: a JSON object within the API's caps (wire.bodies.Args), or a usage error."""
    from pydantic import TypeAdapter, ValidationError

    from ratewarden.wire.bodies import Args

    try:
        value: dict[str, Any] = TypeAdapter(Args).validate_json(text)
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"]
        raise argparse.ArgumentTypeError(f"not a JSON object of arguments: {problem}") from None
    return value


def flags_given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The flags the user actually gave, so unset ones fall back to the environment."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def settings_problem(exc: ValidationError) -> str:
    """Each error, named as the user set it: its flag, or for a daemon setting that has
    none (`RATEWARDEN_WEBHOOK_URL`) its environment variable."""
    return "; ".join(
        _setting_name(exc.title, e["loc"]) + str(e["msg"]).removeprefix("Value error, ")
        for e in exc.errors()
    )


def _setting_name(title: str, loc: tuple[int | str, ...]) -> str:
    """`--flag: `, `RATEWARDEN_NAME: `, or nothing for an error of several settings."""
    name = ".".join(str(part) for part in loc)
    if not name:
        return ""  # a check across settings: its message names them
    if title == "Settings" and not _is_flag(name):
        return f"RATEWARDEN_{name.upper()}: "
    return f"--{name.replace('_', '-')}: "


def _is_flag(name: str) -> bool:
    from ratewarden.cli.serve import FLAGS, TOKEN_FLAGS

    return name in FLAGS or name in TOKEN_FLAGS or name == "insecure_no_auth"


def usage_error(message: str) -> int:
    print(f"ratewarden: {message}", file=sys.stderr)
    return EXIT_USAGE


def table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns, two spaces apart."""
    if not rows:
        return "(no rules apply)"
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]  # fmt: skip
    return "\n".join(lines)
