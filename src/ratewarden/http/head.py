"""A request's head, as the project's own clients write it: a few formatted lines, each
header value refused if it could split the head (a smuggled header).

Shared by the kept-alive async client (`keepalive`) and the command hook's one-shot
exchange (`exchange`), so both refuse the same values. Standard library only: the hook
imports it at every start (bench/hookstart.py re-checks that start).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

SPLITTERS = ("\r", "\n", "\0")  # what would end a header line early
# The most of an answer's head a client reads (status line, headers, any informational
# heads before it): a server that sends an endless head is refused at this many bytes
# rather than grown into memory until the timeout. nginx's default for a request's large
# headers is 4 x 8 KiB; the gRPC listener takes 64 KiB header blocks.
MAX_ANSWER_HEAD_BYTES = 64 * 1024


def checked(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """`headers` as sent; ValueError for a name or value that would end its line."""
    for name, value in headers.items():
        if any(splitter in name or splitter in value for splitter in SPLITTERS):
            raise ValueError(f"header {name!r}: a value holding CR, LF or NUL")
    return list(headers.items())


def encode(method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
    """The request's bytes: its head (latin-1, as HTTP/1.1 heads are) and its body."""
    lines = [f"{method} {target} HTTP/1.1", *(f"{name}: {value}" for name, value in headers)]
    return "\r\n".join([*lines, "", ""]).encode("latin-1") + body
