"""`ratewarden mcp`: its command line, read before the optional `mcp` extra is imported.

Two modes:
- `ratewarden mcp [--user U] [flags] -- COMMAND ARGS…`: one client's server over stdio
  (proxy.py), configured in the client in place of the server's own command;
- `ratewarden mcp --listen HOST:PORT --server NAME=URL|COMMAND… --tokens FILE`: a shared
  gateway over streamable HTTP (gateway.py), each server at `/NAME/mcp`.

`--url`, `--token` and `--fail` default to RATEWARDEN_URL, RATEWARDEN_TOKEN and
RATEWARDEN_FAIL; the gateway takes `--url` several times (daemons on one store).
"""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ratewarden.hooks.command import add_client_flags
from ratewarden.mcp.upstream import Header, Upstream, with_headers

if TYPE_CHECKING:
    from ratewarden.mcp.identity import Identities

__all__ = ["cli"]
T = TypeVar("T")
STDIO_USAGE = (
    "ratewarden mcp [--user U] [--team T] [--url URL] [--token T] [--fail open|closed] "
    "-- COMMAND [ARG...]"
)
GATEWAY_USAGE = (
    "ratewarden mcp --listen HOST:PORT --server NAME=URL|COMMAND [--server ...] "
    "[--header NAME:HEADER=VALUE ...] "
    "(--tokens FILE | --user-header NAME) [--url URL ...] [--token T] [--fail open|closed]"
)
USER_TOKENS = "RATEWARDEN_USER_TOKENS"
# What the `mcp` extra brings: the SDK, and the gateway's server, settings and tokens file.
MCP_MODULES = ("mcp", "uvicorn", "pydantic_settings", "yaml")
MISSING_EXTRA = (
    "ratewarden mcp needs the mcp extra (no module {!r}): pip install 'ratewarden[mcp]' "
    "(from a clone: pip install '.[mcp]')"
)
# uvloop when installed (uvicorn[standard] brings it): pipes, sockets and timers cost
# less, which is most of what the proxy adds to a call.
LOOP = {"use_uvloop": importlib.util.find_spec("uvloop") is not None}
DEFAULT_MAX_SESSIONS = 200  # each may hold a server process
# A user's own: two windows of a client, each with five servers open. At the cap, their
# idle session unused longest is closed for the next: one user cannot fill the gateway.
DEFAULT_MAX_USER_SESSIONS = 10
# A body is read whole, and a call's is written again to its server: 4 MB of escapes (the
# SDK's default cap) cost the gateway 14-23 tool calls' CPU; 1 MiB, at most about 8
# (bench/mcp_worstbody.py). A server that takes larger arguments needs --max-body-bytes.
DEFAULT_MAX_BODY = 1024 * 1024
DEFAULT_IDLE_S = 30 * 60.0  # a session with no request in flight for this long is closed


def cli(argv: Sequence[str]) -> int:
    """Run `ratewarden mcp` with `argv` (what follows `mcp`); the exit status."""
    given = list(argv)
    split = given.index("--") if "--" in given else len(given)
    flags, command = given[:split], given[split + 1 :]
    gateway = any(flag == "--listen" or flag.startswith("--listen=") for flag in flags)
    parser = _gateway_parser() if gateway else _stdio_parser()
    options = parser.parse_args(flags)  # --help, or a bad flag, ends here (exit 2)
    if gateway and command:
        parser.error("the gateway starts its servers from --server NAME=COMMAND, not after --")
    if not gateway and not command:
        parser.error("give the server's command after -- (or --listen for the gateway)")
    missing = next((name for name in MCP_MODULES if importlib.util.find_spec(name) is None), None)
    if missing is not None:  # an optional extra: say how to get it
        print(MISSING_EXTRA.format(missing), file=sys.stderr)
        return 2
    identities = _gateway(parser, options) if gateway else None
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="ratewarden: %(message)s")
    import anyio

    if identities is not None:
        from ratewarden.mcp import gateway as http

        anyio.run(http.run, options, identities, backend_options=LOOP)
    else:
        from ratewarden.mcp import proxy as stdio

        anyio.run(stdio.run, options, command, backend_options=LOOP)
    return 0


def _stdio_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ratewarden mcp",
        usage=STDIO_USAGE,
        allow_abbrev=False,
        description="Start the MCP server COMMAND and relay a client's stdio to it, "
        "checking each tools/call with the ratewarden daemon.",
    )
    add_client_flags(
        parser,
        user_help="who calls (default $RATEWARDEN_USER, else the OS login name)",
        fail_default=None,
    )
    return parser


def _gateway_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ratewarden mcp",
        usage=GATEWAY_USAGE,
        allow_abbrev=False,  # --user is not --user-header
        description="Serve MCP servers over streamable HTTP, each at /NAME/mcp, checking "
        "each tools/call with the ratewarden daemon as the session's user.",
    )
    add_client_flags(parser, user_help=None, fail_default=None, several_daemons=True)
    parser.add_argument(
        "--listen", required=True, type=_flag(_address), metavar="HOST:PORT", help="where to serve"
    )
    parser.add_argument(
        "--server",
        dest="servers",
        action="append",
        required=True,
        type=_flag(Upstream.parse),
        metavar="NAME=URL|COMMAND",
        help="an upstream MCP server, served at /NAME/mcp (repeat for more)",
    )
    parser.add_argument(
        "--header",
        dest="headers",
        action="append",
        default=[],
        type=_flag(Header.parse),
        metavar="NAME:HEADER=VALUE",
        help="a header sent with every request to URL server NAME (repeat for more); "
        "VALUE as written, or @env:VAR or @file:PATH to keep a secret off the command line",
    )
    parser.add_argument(
        "--tokens",
        type=Path,
        metavar="FILE",
        help="YAML: each user's bearer token (or tokens); default $RATEWARDEN_USER_TOKENS, "
        "the daemon's own user tokens file",
    )
    parser.add_argument(
        "--user-header", metavar="NAME", help="take the user from this header (set by a proxy)"
    )
    parser.add_argument(
        "--trusted-proxy",
        dest="proxies",
        action="append",
        type=_flag(_network),
        metavar="CIDR",
        help="an address --user-header is believed from (repeat; default loopback)",
    )
    parser.add_argument(
        "--max-sessions",
        type=_flag(_positive),
        default=DEFAULT_MAX_SESSIONS,
        help=f"sessions open at once ({DEFAULT_MAX_SESSIONS})",
    )
    parser.add_argument(
        "--max-user-sessions",
        type=_flag(_positive),
        default=DEFAULT_MAX_USER_SESSIONS,
        help=f"sessions one user holds at once; their oldest idle one makes room for "
        f"the next ({DEFAULT_MAX_USER_SESSIONS})",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=_flag(_positive),
        default=DEFAULT_MAX_BODY,
        metavar="BYTES",
        help=f"the largest request (413 above it; {DEFAULT_MAX_BODY})",
    )
    parser.add_argument(
        "--idle-timeout",
        type=_flag(_idle),
        default=DEFAULT_IDLE_S,
        metavar="SECONDS",
        help=f"close a session idle this long ({DEFAULT_IDLE_S:g}; 0: never)",
    )
    return parser


def _gateway(parser: argparse.ArgumentParser, options: argparse.Namespace) -> Identities:
    """The gateway's upstreams given their headers (each --header a URL --server's), and
    its users."""
    try:
        options.servers = with_headers(options.servers, options.headers)
    except ValueError as exc:
        parser.error(f"argument --header: {exc}")
    return _identities(parser, options)


def _identities(parser: argparse.ArgumentParser, options: argparse.Namespace) -> Identities:
    from ratewarden.mcp.identity import LOOPBACK, Identities, read_tokens  # (YAML: the extra)

    if options.tokens is None and os.environ.get(USER_TOKENS):
        # The daemon's user tokens file: one file says who everyone is, on every path.
        options.tokens = Path(os.environ[USER_TOKENS])
    if options.tokens is None and options.user_header is None:
        parser.error(
            f"give --tokens FILE or --user-header NAME (--tokens defaults to ${USER_TOKENS}): "
            "every session must be someone's"
        )
    try:
        tokens = read_tokens(options.tokens) if options.tokens is not None else {}
    except ValueError as exc:
        parser.error(str(exc))
    return Identities(tokens, header=options.user_header, proxies=options.proxies or LOOPBACK)


def _flag(convert: Callable[[str], T]) -> Callable[[str], T]:
    """`convert` for argparse: its ValueError's message is shown (argparse shows only
    its own error type's)."""

    def parse(text: str) -> T:
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _network(text: str) -> str:
    ipaddress.ip_network(text, strict=False)  # its ValueError names the text
    return text


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"expected a whole number above 0, got {text!r}")
    return int(text)


def _idle(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"expected seconds, 0 or more, got {text!r}")
    return value or None
