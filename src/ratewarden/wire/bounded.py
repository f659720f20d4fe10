"""JSON read within bounds: a body's items and depth counted on its bytes, before a parse.

The daemon and the MCP gateway read untrusted JSON the same way (the standard library and
pydantic-core's parser). Reading JSON costs per item whatever is done with it next, so a
body is measured in a fixed number of passes in C and refused unread when it is too large
(docs/benchmarks.md, "Worst bodies").
"""

from __future__ import annotations

import codecs
import gc
import json
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import accumulate
from typing import Any

from pydantic_core import from_json


class _Marks:
    r"""Reads JSON text on its bytes, in C, without a parse: the characters it is asked
    for (`chars`), each as its letter (`letters`), quotes as `a`, escapes resolved.

    A letter is one after which Python's escape decoder reads an escape of its own (`b`,
    `f`, `r`, `t`, `v`: `\b` is a control character). Of the rest, only what can follow
    a backslash in JSON is kept, as `n` (so `\"`, `\u`, `\/` and the others are escapes
    the decoder reads as one character). Decoded, an escaped quote or mark is a control
    character, and what is left of the letters is the text's own: translate, decode,
    translate; without a backslash, one translate. (After an invalid escape, such as
    `\x`, the letters may mean anything, but a parser stops there.) Property-tested
    against json.loads (tests/service/test_hole_requests.py).
    """

    def __init__(self, chars: bytes, letters: bytes) -> None:
        table = bytearray(b"n" * 256)
        table[ord('"')], table[ord("\\")] = ord("a"), ord("\\")
        for char, letter in zip(chars, letters, strict=True):
            table[char] = letter
        self.table = bytes(table)
        self.unmarked = _all_but(chars + b'"')
        self.unescaped = _all_but(chars + b'"\\/bfnrtu')  # not after a backslash in JSON
        self.unlettered = _all_but(letters + b"a")

    def marks(self, text: bytes) -> bytes:
        """`text`'s quotes and marks, as letters."""
        if b"\\" not in text:
            return text.translate(self.table, self.unmarked)
        letters = text.translate(self.table, self.unescaped)
        try:
            decoded, _ = codecs.escape_decode(letters)
        except ValueError:  # a lone backslash at the very end (not JSON): it escapes nothing
            decoded, _ = codecs.escape_decode(letters[:-1])
        return decoded.translate(None, self.unlettered)


def _all_but(kept: bytes) -> bytes:
    """Every byte but those `kept`: for bytes.translate to delete."""
    return bytes(sorted(set(range(256)) - set(kept)))


def outside_strings(marks: bytes) -> bytes:
    """`marks` without its strings: every other piece between quotes."""
    return b"".join(marks.split(b"a")[::2])


# A body's items: commas and opening brackets. Args: brackets for their depth, and the
# capitals of NaN and Infinity.
_ITEM_MARKS = _Marks(b",[{", b"bff")
ARGS_MARKS = _Marks(b"[{]}NI", b"ffrrbb")
_STEPS = bytes.maketrans(b"fr", b"\x01\xff")  # as signed bytes: +1 and -1


def depth(structure: bytes) -> int:
    """How deep the arrays and objects of `structure` (args' marks outside strings) go:
    the most opening brackets not yet closed, summed in C over +1 and -1 bytes."""
    steps = array("b", structure.translate(_STEPS, b"b"))
    return max(accumulate(steps), default=0)


# Reading a body makes a list or dict for each of its arrays and objects, and every 700 of
# them set off a garbage collection that walks the young ones again: a 256 KiB body of
# nested arrays cost 2 to 8 times its parse. What a parse makes holds no cycle, so the
# collector waits while a body larger than this is read and validated. (Above it the hot
# path also reads the body before validating it, not in one step: as cheap from 1 KiB
# up, and up to half the cost for thousands of arrays.)
LARGE_BODY = 1024

# Reading JSON into Python costs per item, whatever is done with it next: 256 KiB of `[],`
# is 87 000 lists, 10-15 ms to make. So the items of a body are counted on its bytes
# before it is read, in a fixed number of passes in C, and a body with more is refused
# unread (docs/benchmarks.md, "Worst bodies"). The cap is what a body can hold and still
# cost at most about 10 normal checks, read and refused the costliest way (thousands of
# keys, read twice when pydantic-core cannot read it); 100 calls of realistic args hold
# 2 400 (tests/service/test_hostile_input.py), 100 calls of two dozen values each 3 800.
MAX_ITEMS = 4_000


class TooManyItems(ValueError):
    """A body holding more than MAX_ITEMS items: refused before it is read."""

    def __init__(self) -> None:
        super().__init__(
            f"more than {MAX_ITEMS} items (array elements and object members, "
            "an empty array or object counting as one)"
        )


def too_many_items(body: bytes) -> bool:
    """Whether the JSON `body` holds more than MAX_ITEMS items, read on its bytes.

    Each item is a comma or an opening bracket outside strings (`[1, [], {"a": 0}]`:
    the list's `[` and two commas, the empty list's `[`, the object's `{`: 5). Counted
    first with those inside strings too, which is most often enough to say a body is
    within; then, with escapes resolved, every string is an item, a key or the body
    itself, so more than 2 * MAX_ITEMS + 1 strings are too many; only then are the
    strings taken out, at most 4 * MAX_ITEMS + 3 pieces. For JSON that is not valid the
    count of what precedes the first error is still exact: a parser stops there.
    """
    if len(body) <= MAX_ITEMS:  # every item takes a byte of its own
        return False
    marks = _ITEM_MARKS.marks(_utf8(body))
    quotes = marks.count(b"a")
    if len(marks) - quotes <= MAX_ITEMS:
        return False
    if quotes > 2 * (2 * MAX_ITEMS + 1):
        return True
    return len(outside_strings(marks)) > MAX_ITEMS


def count_items(body: bytes) -> int:
    """The items of the JSON `body`, exactly (`too_many_items` says why they are what is
    counted and how)."""
    return len(outside_strings(_ITEM_MARKS.marks(_utf8(body))))


def too_deep(body: bytes, levels: int) -> bool:
    """Whether the JSON `body` nests arrays and objects more than `levels` deep, read on
    its bytes as `args` are (brackets outside strings, escapes resolved), before a parse."""
    if body.count(b"[") + body.count(b"{") <= levels:  # too few brackets to go deeper
        return False  # (a bracket's byte is in it in UTF-16 and UTF-32 too)
    return depth(outside_strings(ARGS_MARKS.marks(_utf8(body)))) > levels


def _utf8(body: bytes) -> bytes:
    """`body` as UTF-8, as `json.loads` reads it (UTF-16 and UTF-32 too); empty if it
    cannot be decoded (then nothing of it is read)."""
    encoding = json.detect_encoding(body)
    if encoding in ("utf-8", "utf-8-sig"):
        return body
    try:
        return body.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
    except UnicodeError:
        return b""


@contextmanager
def collector_paused() -> Iterator[None]:
    """No garbage collection inside (the collector's counts carry on afterwards)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_json(body: bytes, *, counted: bool = False) -> Any:
    """A request body's JSON, as the routes and the hot path read it. A body of more than
    MAX_ITEMS items is refused unread (TooManyItems; `counted`: the caller has held it to
    that already). Invalid JSON raises json.JSONDecodeError, a body that is not text
    UnicodeDecodeError (json.loads's errors).

    Read by pydantic-core (in Rust: twice as fast as json.loads on keys, numbers and
    escapes), and by json.loads what it does not read (a lone surrogate, a byte-order
    mark, UTF-16 or UTF-32, and invalid JSON, for json.loads's words). A value no field
    can take is read as one its field refuses by name instead of failing the body: NaN
    and Infinity are read as floats (a number field says it must be finite, `args` that
    they are refused), and an integer longer than Python converts (4300 digits), which
    would fail the whole body, is read with every integer as a float. That loses nothing:
    such a body is refused whatever else it holds, the huge integer as infinite, and every
    other field is refused or taken as its integer would be (no request field is an
    integer). Nesting too deep for the parser is invalid JSON, not a crash.
    """
    if not counted and too_many_items(body):
        raise TooManyItems
    if len(body) <= LARGE_BODY:
        return _parse(body)
    with collector_paused():
        return _parse(body)


def _parse(body: bytes) -> Any:
    try:
        return from_json(body, allow_inf_nan=True)
    except ValueError as exc:
        # Read again, whole, by json.loads: an integer too long is the only "number out
        # of range" (as for Python, past 4300 digits), and json.loads would fail on it too.
        huge_integer = "number out of range" in str(exc)
    try:
        try:
            if not huge_integer:
                return json.loads(body)
        except ValueError as exc:
            if isinstance(exc, json.JSONDecodeError) or "integer string conversion" not in str(exc):
                raise  # a UnicodeDecodeError: the body is not text
        return json.loads(body, parse_int=float)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", "", 0) from None
