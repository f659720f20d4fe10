"""An upstream MCP server of the gateway: a URL, or a command started per session.

Parsed from `--server NAME=TARGET` without the SDK (the command line is read before the
optional `mcp` extra is known to be there); `connect` imports it.
"""

from __future__ import annotations

import os
import re
import shlex
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ratewarden.mcp.relay import Incoming, Outgoing

__all__ = ["SERVER_NAME", "Upstream"]

# A server's name leads its tools' names to the daemon (`files.delete_file`) and its
# path on the gateway (`/files/mcp`): no dot, slash or space.
SERVER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class Upstream:
    """One server the gateway fronts: an MCP URL, or a command it starts per session."""

    name: str
    url: str | None = None
    command: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Upstream:
        """`NAME=http(s)://…` or `NAME=COMMAND ARGS…` (split as a shell would)."""
        name, sep, target = text.partition("=")
        if not sep or not SERVER_NAME.fullmatch(name):
            raise ValueError(
                f"expected NAME=URL or NAME=COMMAND, NAME of 1-64 letters, digits, _ or -; "
                f"got {text!r}"
            )
        target = target.strip()
        if target.startswith(("http://", "https://")):
            return cls(name, url=target)
        try:
            command = tuple(shlex.split(target))
        except ValueError as exc:
            raise ValueError(f"server {name!r}: {exc} in {target!r}") from None
        if not command:
            raise ValueError(f"server {name!r}: give a URL or a command after '='")
        return cls(name, command=command)

    def connect(self) -> AbstractAsyncContextManager[tuple[Incoming, Outgoing]]:
        """A new session with this server: its message streams."""
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        from ratewarden.mcp.http_upstream import streamable_http

        session: AbstractAsyncContextManager[tuple[Incoming, Outgoing]]
        if self.url is not None and self.url.startswith("http://"):
            session = streamable_http(self.url)  # the SDK's client costs a call 1.5 ms
        elif self.url is not None:
            session = streamable_http_client(self.url)
        else:
            # The whole environment, as for the stdio proxy (the SDK's default passes few).
            params = StdioServerParameters(
                command=self.command[0], args=list(self.command[1:]), env=dict(os.environ)
            )
            session = stdio_client(params)
        return session
