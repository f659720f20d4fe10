"""The `ratewarden` command (and `python -m ratewarden`).

`ratewarden hook HOST` runs once per tool call of a coding agent, so it goes straight to
hooks/command.py and imports nothing else; `ratewarden mcp` goes to mcp/cli.py (the
`mcp` extra); every other command is cli/'s.
"""

from __future__ import annotations

import sys


def main() -> int:
    if sys.argv[1:2] == ["hook"]:
        from ratewarden.hooks import command

        return command.cli(sys.argv[2:])
    if sys.argv[1:2] == ["mcp"]:  # the MCP proxy: needs the `mcp` extra, imported only here
        from ratewarden.mcp import cli as mcp_command

        return mcp_command.cli(sys.argv[2:])
    from ratewarden.cli import main as run_cli

    return run_cli()


if __name__ == "__main__":
    raise SystemExit(main())
