"""The `ratewarden` command: serve, check, settle, usage, hook, policy check, policy explain,
override, reset, spend (one module each: serve.py, check.py for check/settle/usage,
policy.py, override.py, reset.py, spend.py; what they share is common.py).

Exit codes of `check`: 0 allow, 1 deny (reason on stderr), 3 ask, 4 daemon unreachable,
2 bad usage (a flag, a request the daemon refused, or auth); those of `settle` and `usage`
likewise, each listed in its --help (common.EXIT_CODES). `hook HOST` answers in the host's
own terms instead (see `ratewarden.hooks`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from ratewarden import __version__
from ratewarden.cli import check, policy, serve
from ratewarden.cli import override as cli_override
from ratewarden.cli import reset as cli_reset
from ratewarden.cli import spend as cli_spend
from ratewarden.cli.common import (
    EXIT_USAGE,
    add_client_flags,
    missing_daemon_module,
    settings_problem,
    usage_error,
)
from ratewarden.hooks import command as hook_command


def main(argv: Sequence[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    if given[:1] == ["hook"]:
        # A process per tool call: only what a hook needs is imported (hooks/command.py).
        from ratewarden.hooks import command

        return command.cli(given[1:])
    from pydantic import ValidationError

    parser = build_parser()
    args = parser.parse_args(given)
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if getattr(args, "daemon_command", None) and (missing := missing_daemon_module()):
        return usage_error(
            f"{args.daemon_command} needs the daemon's dependencies (no module {missing!r}): "
            "pip install 'ratewarden[daemon]' (from a clone: pip install '.[daemon]')"
        )
    try:
        code: int = args.run(args)
    except ValidationError as exc:
        return usage_error(settings_problem(exc))
    except BrokenPipeError:  # `ratewarden usage ... | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error
        return 0
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ratewarden", description="Guard AI-agent tool calls.")
    parser.add_argument("--version", action="version", version=f"ratewarden {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    serve.add_parser(commands)
    check.add_parsers(commands)
    hook_command.add_parser(commands)
    _add_mcp_help(commands)
    policy.add_parser(commands)
    cli_override.add_parser(commands, add_client_flags)
    cli_reset.add_parser(commands, add_client_flags)
    cli_spend.add_parser(commands)
    return parser


def _add_mcp_help(commands: Any) -> None:
    """`mcp`, for --help only: `ratewarden mcp` runs from __main__ (ratewarden.mcp.proxy)."""
    commands.add_parser(
        "mcp",
        help="MCP servers, their tool calls checked (the mcp extra): over stdio, "
        "mcp [--user U] -- COMMAND ARGS; as a shared gateway, mcp --listen HOST:PORT "
        "--server NAME=URL|COMMAND --tokens FILE (see ratewarden mcp --listen x:1 --help)",
    )


if __name__ == "__main__":
    raise SystemExit(main())
