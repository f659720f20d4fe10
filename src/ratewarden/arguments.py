"""A tool call's `args`: paths into them, their canonical text and their fingerprint.

This is the one home of how an argument is named (`options.force`, `files.0`, `*`), how
a value is written as text (compact JSON, keys sorted: the order and whitespace the
caller used never matter) and how it is hashed for a counter key (a fixed-length digest,
so a key never holds the caller's text). The policy's conditions and the engine's
counter keys both read values through here. Standard library only: the engine imports
it on the hot path.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "MISSING",
    "ArgPath",
    "BoundedArgs",
    "as_text",
    "bounded_args",
    "canonical_json",
    "cut_overlaps",
    "digest",
    "read_json",
    "result_digest",
]

MAX_PATH_SEGMENTS: Final = 32
WHOLE_ARGS: Final = "*"
# Longer digit runs cannot be a list index that exists, and int() refuses very long ones.
_MAX_INDEX_DIGITS: Final = 18


class _Missing:
    """The value a path did not reach (no args, no such key, index out of range)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Final = _Missing()

# One encoder, built once: json.dumps would build a new one per call for these options.
_ENCODER: Final = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
)


def canonical_json(value: Any) -> str:
    """Compact JSON with keys sorted: equal for equal values, whatever their key order."""
    return _ENCODER.encode(value)


def as_text(value: Any) -> str:
    """A string as itself; any other value as its compact JSON (SPEC §2.1)."""
    return value if isinstance(value, str) else _ENCODER.encode(value)


def digest(value: Any) -> str:
    """A fixed-length hash (32 hex characters) of the value's canonical JSON.

    Counter keys hold this, never the value's text. A lone surrogate (which JSON can
    carry as an escape) is encoded as is, so it hashes rather than raising.
    """
    data = _ENCODER.encode(value).encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _result_part(value: Any) -> Any:
    """What the result encoder writes for a value JSON has no form for: a set as its
    members in canonical order (its own order is its process's string hashing, so the
    same set would be another result in another process); anything else as its text."""
    if isinstance(value, set | frozenset):
        return sorted(value, key=_RESULT_ENCODER.encode)
    return str(value)


# The canonical encoder, and a form for a tool's own values (sets, host objects) inside
# a result; for a JSON value it writes exactly what _ENCODER does.
_RESULT_ENCODER: Final = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"),
    default=_result_part,
)  # fmt: skip


def result_digest(result: Any) -> str:
    """The digest of a tool's result that a settle carries for loop rules keyed on
    results (docs/policy.md, "Loops"): `digest` of its canonical JSON, as an argument's.
    Inside it, a set is its members in canonical order and another value JSON cannot
    carry (a host's own object) its text; a result still not JSON (a NaN, keys of mixed
    types) is hashed by its text, and one not even that (an int past Python's digit
    limit, a nesting past its recursion limit, an object whose text raises) by its type
    alone, so it counts as the same result each time. Never raises: a settle, and the
    tool's answer to the host, never fail on a result. Computed where the result is
    seen, so the result itself never travels."""
    try:
        data = _RESULT_ENCODER.encode(result).encode("utf-8", "surrogatepass")
        return hashlib.blake2b(data, digest_size=16).hexdigest()
    except Exception:  # a NaN, keys of mixed types, a huge int, a deep nesting
        pass
    try:
        return digest(str(result))
    except Exception:  # nor text
        kind = type(result)
        return digest(f"<{kind.__module__}.{kind.__qualname__} that cannot be encoded>")


@dataclass(frozen=True, slots=True)
class ArgPath:
    """A path into a call's `args`: `command`, `options.force`, `files.0`, or `*` (all)."""

    text: str
    steps: tuple[str, ...]
    # Each step with the list index it names (ASCII digits) or None: worked out once, here.
    _walk: tuple[tuple[str, int | None], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        walk = tuple((step, _list_index(step)) for step in self.steps)
        object.__setattr__(self, "_walk", walk)

    @classmethod
    def parse(cls, text: str) -> ArgPath:
        """Read a path as written in a policy; ValueError names what is wrong with it."""
        if not isinstance(text, str):
            raise ValueError(f"an argument path must be a string, got {type(text).__name__}")
        if text == WHOLE_ARGS:
            return cls(text, ())
        _check_path_text(text)
        steps = tuple(text.split("."))
        if len(steps) > MAX_PATH_SEGMENTS:
            raise ValueError(
                f"argument path {text!r} has {len(steps)} segments; "
                f"at most {MAX_PATH_SEGMENTS} are allowed"
            )
        return cls(text, steps)

    def resolver(self) -> Callable[[Mapping[str, Any] | None], Any]:
        """`resolve`, as the quickest callable for this path: a top-level argument (most
        paths) is one dict lookup, the whole `args` none at all."""
        if not self.steps:
            return lambda args: MISSING if args is None else args
        if len(self.steps) == 1:  # `args` is a JSON object: a step into it names a key
            [step] = self.steps
            return lambda args: MISSING if args is None else args.get(step, MISSING)
        return self.resolve

    def resolve(self, args: Mapping[str, Any] | None) -> Any:
        """The value this path names in `args`, or MISSING where it does not reach."""
        if args is None:
            return MISSING
        value: Any = args
        for step, index in self._walk:
            value = _step_into(value, step, index)
            if value is MISSING:
                break
        return value


def _check_path_text(text: str) -> None:
    if not text:
        raise ValueError("empty argument path: name an argument (like 'command') or '*' for all")
    for position, char in enumerate(text):
        if char.isspace() or not char.isprintable():
            raise ValueError(
                f"argument path {text!r} contains whitespace or a control character "
                f"({char!r} at position {position})"
            )
    if WHOLE_ARGS in text:
        raise ValueError(f"argument path {text!r}: '*' stands alone, for the whole args")
    if text.startswith("."):
        raise ValueError(f"argument path {text!r} starts with a dot")
    if text.endswith("."):
        raise ValueError(f"argument path {text!r} ends with a dot")
    if ".." in text:
        raise ValueError(f"argument path {text!r} has an empty segment (two dots in a row)")


def _list_index(step: str) -> int | None:
    if step.isascii() and step.isdigit() and len(step) <= _MAX_INDEX_DIGITS:
        return int(step)
    return None


def _step_into(value: Any, step: str, index: int | None) -> Any:
    """One step down: a key of a mapping, an index of a list; anything else is MISSING.

    Strings are not lists here (`command.0` is not the first letter), nor are bools ints.
    """
    if isinstance(value, dict):  # what JSON gives; checked first as it is the cheap test
        return value.get(step, MISSING)
    if isinstance(value, list | tuple):
        return value[index] if index is not None and index < len(value) else MISSING
    return value.get(step, MISSING) if isinstance(value, Mapping) else MISSING


# --- arguments too large to send whole ------------------------------------------------
#
# A host hands over whatever its model wrote. Arguments the wire would refuse (wire.bodies.Args:
# over 64 KiB as JSON, deeper than 32 levels, a number JSON cannot carry) must not leave
# the call without arguments, which would match no `args` condition: `"n": 1e400` beside
# `"command": "rm -rf /"` would pass a rule refusing the command. So every client sends a
# bounded copy instead (`bounded_args`), and names the paths whose values it could not
# send whole (`cut`). The daemon reads a condition on such a path as holding in a rule's
# `match` and as failing in its `unless` (policy/model.py): what could not be read is
# never a reason to let a call through. The caps below leave room under the wire's.

BOUNDED_BYTES: Final = 48 * 1024  # the copy's budget as compact JSON (the wire's: 64 KiB)
# Array elements and object members: each may open a bracket too, and the wire counts
# commas and brackets (at most about 3 900 for args).
BOUNDED_ITEMS: Final = 1_500
BOUNDED_DEPTH: Final = 32  # levels, as wire.bodies.MAX_ARGS_DEPTH: {"a": 1} is 1 level
MAX_TEXT: Final = 4_096  # characters a string keeps; the rest is cut
MAX_CUT: Final = 16  # paths named; a call with more is cut as a whole (`*`)
MAX_CUT_PATH: Final = 512  # characters of a cut path's text; longer: its parent is cut
_MAX_KEY: Final = 256  # a longer key is no name a policy path would spell
_MAX_INT_BITS: Final = 3_300  # about 1 000 digits: JSON readers take these, not 4 300
_MAX_INT_DIGITS: Final = 4_000
_SAMPLE: Final = 32 * 1024  # characters of each end of a long text its digest reads
_CUT_MARK: Final = "\u2026~"  # then 16 hex digits of the whole value's digest, if known
_WHOLE: Final = (WHOLE_ARGS,)


@dataclass(frozen=True, slots=True)
class BoundedArgs:
    """A call's arguments as they can be sent: `value` within the wire's caps, and `cut`,
    the paths whose values are not whole in it (`*`: the arguments as a whole)."""

    value: dict[str, Any]
    cut: tuple[str, ...] = ()


def bounded_args(args: object) -> BoundedArgs | None:
    """`args` made to fit the wire, or None for a call that has none (None, or "").

    A JSON object (or its text) within the caps comes back as it is, with nothing cut.
    Otherwise each string keeps its first MAX_TEXT characters and a mark with the digest
    of the whole (so two calls padded differently still count apart), a container past the
    depth or the budget is cut, and a number JSON cannot carry becomes a mark; each such
    path is named in `cut`. Arguments that are not a JSON object, or cannot be read at
    all, are one mark under the key `*` (which no policy path reaches) with `*` cut.
    Cost is linear in what is read, and nothing past the budget is read.
    """
    if args is None or args in ("", b""):
        return None
    if isinstance(args, bytes | bytearray | str):
        return _from_text(args)
    if not isinstance(args, Mapping):
        return _unreadable(None)
    return _Bounder().bound(args)


def _from_text(text: str | bytes | bytearray) -> BoundedArgs:
    try:
        parsed = read_json(text)
    except (ValueError, RecursionError):  # not JSON (or not UTF-8), or too deep to parse
        return _unreadable(text)
    return _Bounder().bound(parsed) if isinstance(parsed, dict) else _unreadable(text)


def _unreadable(text: str | bytes | bytearray | None) -> BoundedArgs:
    """A call whose arguments could not be read: every condition on them is unknown, and
    its counter per identical call is keyed on the digest of their raw text."""
    mark = _CUT_MARK + (_text_digest(text) if text is not None else "")
    return BoundedArgs({WHOLE_ARGS: mark}, _WHOLE)


def _text_digest(text: str | bytes | bytearray) -> str:
    """16 hex digits of `text`'s digest. Past 64 KiB, of its length, its first 32 KiB and
    its last 32 KiB: hashing megabytes a call would cost the daemon more than deciding it
    (an HTTP hook's body), and two long texts alike at both ends then count as one call
    in a counter per call, which only counts more."""
    if len(text) > 2 * _SAMPLE:
        text = f"{len(text)}:".encode() + _raw(text[:_SAMPLE]) + _raw(text[-_SAMPLE:])
    return hashlib.blake2b(_raw(text), digest_size=8).hexdigest()


def _raw(text: str | bytes | bytearray) -> bytes:
    return text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)


def read_json(text: str | bytes | bytearray) -> Any:
    """`json.loads`, with an integer too long for any JSON reader (Python refuses 4 300
    digits) read as an infinity: a number JSON cannot carry, cut like `1e400`, rather
    than a payload that cannot be read at all. Hooks read their host's payload with it.

    A payload nested deeper than Python's reader goes (about 1 000 levels; a host's own
    reader may go deeper) is read again with every array and object below SHALLOW_DEPTH
    levels replaced by a mark: the call is still read, and `bounded_args` cuts the
    arguments' deep part (and names its path) as it cuts any past BOUNDED_DEPTH, so
    padding a call with deep nesting cannot make it unreadable, and so allowed by a
    hook's fail mode."""
    try:
        return json.loads(text, parse_int=_int_or_infinity)
    except RecursionError:
        return json.loads(_shallow(text), parse_int=_int_or_infinity)


# Levels kept by the re-read of a payload too deep to parse: past BOUNDED_DEPTH (so the cut
# is the Bounder's, which names its path) and far within the interpreter's recursion limit.
SHALLOW_DEPTH: Final = 2 * BOUNDED_DEPTH
# A string (escapes skipped whole), or a bracket outside strings.
_TOKENS: Final = r'"(?:[^"\\]++|\\.)*+"|[\[\]{}]'


def _shallow(text: str | bytes | bytearray) -> str:
    """`text` with each array or object opening below SHALLOW_DEPTH levels replaced by a
    string mark. Linear: one C scan of strings and brackets, a step per bracket. Text that
    is not UTF-8 raises ValueError, as json.loads does."""
    import re  # seldom needed: not at a hook's start

    if not isinstance(text, str):
        text = bytes(text).decode(json.detect_encoding(bytes(text)))
    pieces, kept_to, depth, cut_from = [], 0, 0, -1
    for token in re.finditer(_TOKENS, text, re.DOTALL):
        mark = token.group()
        if mark[0] == '"':
            continue
        if mark in "[{":
            depth += 1
            if depth == SHALLOW_DEPTH + 1:
                cut_from = token.start()
        else:
            if depth == SHALLOW_DEPTH + 1 and cut_from >= 0:
                pieces += [text[kept_to:cut_from], json.dumps(_CUT_MARK)]
                kept_to, cut_from = token.end(), -1
            depth -= 1
    return "".join([*pieces, text[kept_to:]])


def _int_or_infinity(text: str) -> int | float:
    if len(text) <= _MAX_INT_DIGITS:
        return int(text)
    return -math.inf if text.startswith("-") else math.inf


class _Bounder:
    """One walk over one call's arguments, with what is left of the budget."""

    def __init__(self) -> None:
        self.room = BOUNDED_BYTES
        self.items = BOUNDED_ITEMS
        self.cut: list[tuple[str, ...]] = []

    def bound(self, args: Mapping[Any, Any]) -> BoundedArgs:
        value = self.mapping(args, ())
        if not self.cut:
            return BoundedArgs(value)
        cut = tuple(dict.fromkeys(_path_text(path) for path in self.cut))
        return BoundedArgs(value, _WHOLE if len(cut) > MAX_CUT or WHOLE_ARGS in cut else cut)

    def mark(self, path: tuple[str, ...], whole: str | None = None) -> str:
        """A value that could not be sent: its path is cut, the mark stands in for it."""
        self.cut.append(path)
        mark = _CUT_MARK + (_text_digest(whole) if whole is not None else "")
        self.room -= len(mark) + 2
        return mark

    def any(self, value: Any, path: tuple[str, ...], depth: int) -> Any:
        if value is None or value is True or value is False:
            self.room -= 5
            return value
        if isinstance(value, str):
            return self.text(value, path)
        if isinstance(value, int):
            if value.bit_length() > _MAX_INT_BITS:
                return self.mark(path, format(value, "x"))  # hex: no digit cap for it
            self.room -= 21 if value.bit_length() < 64 else len(str(value))
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                return self.mark(path, repr(value))
            self.room -= 24
            return value
        if depth >= BOUNDED_DEPTH or not isinstance(value, Mapping | list | tuple):
            return self.mark(path)  # too deep, or no JSON value at all
        if isinstance(value, Mapping):
            return self.mapping(value, path, depth + 1)
        return self.sequence(value, path, depth + 1)

    def text(self, value: str, path: tuple[str, ...]) -> str:
        kept = value if len(value) <= MAX_TEXT else value[:MAX_TEXT]
        if not kept.isascii():
            kept = _without_surrogates(kept)
        size = _json_size(kept)
        if kept is value and size <= self.room:
            self.room -= size
            return value
        if size > self.room:  # a character takes at most 6 bytes (`\u001b`): keep what fits
            kept = kept[: max(self.room // 6, 0)]
            size = _json_size(kept)
        self.room -= size
        return kept + self.mark(path, value)

    def mapping(self, value: Mapping[Any, Any], path: tuple[str, ...], depth: int = 1) -> Any:
        out: dict[str, Any] = {}
        for key, item in value.items():
            if self.room <= 0 or self.items <= 0:
                self.cut.append(path)  # the rest of this object is not sent
                break
            self.items -= 1
            name = _key(key)
            self.room -= _json_size(name) + 1
            if name is key and _plain(name):
                out[name] = self.any(item, (*path, name), depth)
            else:  # no policy path names this key: cutting it cuts the object around it
                out[name] = self.any(item, (*path, name), depth)
                self.cut.append(path)
        return out

    def sequence(
        self, value: list[Any] | tuple[Any, ...], path: tuple[str, ...], depth: int
    ) -> Any:
        out: list[Any] = []
        for index, item in enumerate(value):
            if self.room <= 0 or self.items <= 0:
                self.cut.append(path)
                break
            self.items -= 1
            self.room -= 1
            out.append(self.any(item, (*path, str(index)), depth))
        return out


def _key(key: object) -> str:
    """A key as JSON writes it (`str` for numbers, as json.dumps does), at most _MAX_KEY
    characters of it, and no lone surrogate."""
    if isinstance(key, str):
        name = key
    elif key is None or isinstance(key, bool | int | float):
        name = _ENCODER.encode(key) if not isinstance(key, float) or math.isfinite(key) else "~"
    else:
        name = "~"
    if len(name) > _MAX_KEY:
        name = name[:_MAX_KEY]
    return name if name.isascii() else _without_surrogates(name)


def _plain(key: str) -> bool:
    """Whether a policy path can name this key: printable, no space, dot or `*`."""
    return key.isprintable() and not any(c.isspace() or c in ".*" for c in key) and key != ""


def _without_surrogates(text: str) -> str:
    """`text` with each lone surrogate replaced (no JSON reader takes one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def _json_size(text: str) -> int:
    """Bytes of `text` as a JSON string (no lone surrogate: `_without_surrogates` first)."""
    return len(_ENCODER.encode(text).encode())


def _path_text(steps: tuple[str, ...]) -> str:
    """A cut path as the policy writes paths; a key no path can name cuts its parent."""
    while steps and not all(_plain(step) for step in steps):
        steps = steps[:-1]
    text = ".".join(steps) if steps else WHOLE_ARGS
    return text if len(text) <= MAX_CUT_PATH else WHOLE_ARGS


def cut_overlaps(path: tuple[str, ...], cut: tuple[tuple[str, ...], ...]) -> bool:
    """Whether a condition on `path` reads a value that was cut: a cut path at, above or
    below it (the whole args, `*`, is above every path)."""
    for steps in cut:
        shorter = min(len(steps), len(path))
        if steps[:shorter] == path[:shorter]:
            return True
    return False
