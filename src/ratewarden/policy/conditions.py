"""Conditions on a call's arguments (SPEC §2.1 `match.args`), compiled once at load.

Patterns are the operator's, texts the caller's. Every pattern, a regex or a glob once
translated, runs on RE2 (the `google-re2` binding), whose matching time is linear in the
text whatever the pattern (and about a nanosecond a byte while its DFA has the memory
the pattern needs: below, a budget on each pattern's program, checked at load); no
Python `re` ever reads caller text here. Values that are not strings are matched as
their compact JSON (`ratewarden.arguments.as_text`). Descriptions and failure reasons
quote the policy's text, never an argument's, since they reach logs, `explain` and
refusal messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, runtime_checkable

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information
from re2 import _re2

from ratewarden.arguments import MISSING, ArgPath, as_text, canonical_json
from ratewarden.policy.automaton import MAX_BYTES as AUTOMATON_MAX_BYTES
from ratewarden.policy.automaton import TooLarge, automaton_bytes

__all__ = ["ArgCondition", "Condition", "compile_condition"]

# What one pattern may cost (issue 25, item 2). RE2's time is linear in the text, but
# fast only while its DFA cache holds the states a search meets; when the cache fills
# twice in quick succession RE2 falls back to its NFA, whose time is the text's length
# times the live instructions: `\w{1,1000}Z`, 4 004 instructions, took 2.6 to 8 s
# against 64 KiB of word characters. Two limits keep the states in the cache. A
# pattern's compiled program, forward and reversed (RE2's ProgramSize: a counted
# repetition copies what it repeats, a Unicode class is many), is held to
# RE2_MAX_PROGRAM, which bounds a state's size; and the states a search can need are
# counted at load (policy/automaton.py: `a[ab]{20}c` is 26 instructions but 2^21
# states). RE2_MAX_MEM is what each pattern may use, its program and the DFA cache that
# matching fills on demand (a pattern that needs little costs little): two thirds to the
# forward program and its DFAs, half of what is left to the DFA a search uses. The
# hungriest program found within 1 000 instructions, `(a|b|c|d){995}Z` on a run of `a`s,
# fell back at 5 MiB and not at 6; tests/unit/test_conditions.py counts the fallbacks of
# the costliest patterns both limits let through (none).
RE2_MAX_PROGRAM: Final = 1000
RE2_MAX_MEM: Final = 16 << 20

# The same test as `policy.model.is_glob` for tool names (SPEC: "exact or glob, as for
# `tool`"); written here too so that this module, which the model imports, does not
# import the model.
_GLOB_CHARS: Final = "*?["


@runtime_checkable
class Condition(Protocol):
    """One condition on one argument's value (or MISSING, where the path did not reach)."""

    def holds(self, value: Any) -> bool: ...

    def describe(self) -> str:
        """What the condition asks, in the policy's words: `matches glob 'rm *'`."""
        ...

    def describe_failure(self) -> str:
        """The negation, for a present value that fails: `does not match glob 'rm *'`."""
        ...


@dataclass(frozen=True, slots=True)
class ArgCondition:
    """A condition on the value at one path of `args`: one entry of `match.args`."""

    path: ArgPath
    condition: Condition

    def holds(self, args: Mapping[str, Any] | None) -> bool:
        return self.condition.holds(self.path.resolve(args))

    def mismatch(self, args: Mapping[str, Any] | None) -> str | None:
        """Why the condition fails for these args (None when it holds), without their text."""
        value = self.path.resolve(args)
        if self.condition.holds(value):
            return None
        name = "args" if not self.path.steps else f"args.{self.path.text}"
        if value is MISSING:
            return f"{name} is absent"
        return f"{name} {self.condition.describe_failure()}"


def compile_condition(spec: str | bool | int | float | Mapping[str, Any]) -> Condition:
    """Compile one condition as written in a policy; ValueError names what is wrong."""
    if isinstance(spec, str):
        return _glob(spec) if any(c in spec for c in _GLOB_CHARS) else _Exact(spec, _quoted(spec))
    if isinstance(spec, bool | int | float):
        # YAML `force: true` is the JSON value true, matched as its compact JSON text.
        text = _json_operand("condition", spec)
        return _Exact(text, text)
    if isinstance(spec, Mapping):
        return _from_mapping(spec)
    hint = " (for a list of values, write {in: [...]})" if isinstance(spec, list) else ""
    raise ValueError(
        f"a condition is a string, a number, true/false or a mapping with one of "
        f"{_KIND_NAMES}; got {_type_name(spec)}{hint}"
    )


# --- the kinds ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Exact:
    text: str
    shown: str  # the policy's value as written: 'ls' for a string, true for a boolean

    def holds(self, value: Any) -> bool:
        return (
            value is not MISSING and (value if type(value) is str else as_text(value)) == self.text
        )

    def describe(self) -> str:
        return f"is {self.shown}"

    def describe_failure(self) -> str:
        return f"is not {self.shown}"


@dataclass(frozen=True, slots=True)
class _Glob:
    pattern: str
    compiled: Any = field(compare=False, repr=False)

    def holds(self, value: Any) -> bool:
        return value is not MISSING and _re2_matches(self.compiled, _WHOLE_TEXT, value)

    def describe(self) -> str:
        return f"matches glob {_quoted(self.pattern)}"

    def describe_failure(self) -> str:
        return f"does not match glob {_quoted(self.pattern)}"


@dataclass(frozen=True, slots=True)
class _Regex:
    pattern: str
    compiled: Any = field(compare=False, repr=False)

    def holds(self, value: Any) -> bool:
        # A search, not a full match: `\brm\s+-rf` is found inside `sudo rm -rf / now`.
        # Inline: a regex condition runs on every call its tool makes (0.1 us of calls).
        if value is MISSING:
            return False
        text = (value if type(value) is str else as_text(value)).encode("utf-8", "surrogatepass")
        return bool(self.compiled.Match(_ANYWHERE, text, 0, len(text))[0][0] >= 0)

    def describe(self) -> str:
        return f"matches regex {_quoted(self.pattern)}"

    def describe_failure(self) -> str:
        return f"does not match regex {_quoted(self.pattern)}"


@dataclass(frozen=True, slots=True)
class _Contains:
    needle: str

    def holds(self, value: Any) -> bool:
        return value is not MISSING and self.needle in (
            value if type(value) is str else as_text(value)
        )

    def describe(self) -> str:
        return f"contains {_quoted(self.needle)}"

    def describe_failure(self) -> str:
        return f"does not contain {_quoted(self.needle)}"


@dataclass(frozen=True, slots=True)
class _Prefix:
    prefix: str

    def holds(self, value: Any) -> bool:
        return value is not MISSING and _text(value).startswith(self.prefix)

    def describe(self) -> str:
        return f"starts with {_quoted(self.prefix)}"

    def describe_failure(self) -> str:
        return f"does not start with {_quoted(self.prefix)}"


@dataclass(frozen=True, slots=True)
class _OneOf:
    texts: frozenset[str]
    shown: str  # ['a', 'b', 3]: the items in the policy's order

    def holds(self, value: Any) -> bool:
        return value is not MISSING and _text(value) in self.texts

    def describe(self) -> str:
        return f"is one of {self.shown}"

    def describe_failure(self) -> str:
        return f"is not one of {self.shown}"


@dataclass(frozen=True, slots=True)
class _Exists:
    expected: bool

    def holds(self, value: Any) -> bool:
        return (value is not MISSING) is self.expected

    def describe(self) -> str:
        return "exists" if self.expected else "does not exist"

    def describe_failure(self) -> str:
        # Only reached for a present value (a MISSING one reads "is absent").
        return "is present"


# --- building them from the policy's YAML ---------------------------------------------


def _from_mapping(spec: Mapping[Any, Any]) -> Condition:
    unknown = [key for key in spec if key not in _BUILDERS]
    if unknown:
        raise ValueError(f"unknown condition key {unknown[0]!r}; expected one of {_KIND_NAMES}")
    if len(spec) != 1:
        found = ", ".join(spec) or "none"
        raise ValueError(f"a condition takes exactly one of {_KIND_NAMES}; got {found}")
    [(key, operand)] = spec.items()
    return _BUILDERS[key](operand)


def _regex(operand: object) -> Condition:
    pattern = _text_operand("regex", operand)
    return _Regex(pattern, _compile_re2(pattern, f"regex {_quoted(pattern)}"))


def _glob(pattern: str) -> Condition:
    compiled = _compile_re2(_glob_to_re2(pattern), f"glob {_quoted(pattern)}", whole=True)
    return _Glob(pattern, compiled)


def _contains(operand: object) -> Condition:
    return _Contains(_text_operand("contains", operand))


def _prefix(operand: object) -> Condition:
    return _Prefix(_text_operand("prefix", operand))


def _one_of(operand: object) -> Condition:
    if not isinstance(operand, list) or not operand:
        got = "an empty list" if operand == [] else _type_name(operand)
        raise ValueError(f"in: expected a non-empty list, got {got}")
    texts = [
        item if isinstance(item, str) else _json_operand(f"in[{i}]", item)
        for i, item in enumerate(operand)
    ]
    shown = ", ".join(
        _quoted(text) if isinstance(item, str) else text
        for item, text in zip(operand, texts, strict=True)
    )
    return _OneOf(frozenset(texts), f"[{shown}]")


def _exists(operand: object) -> Condition:
    if not isinstance(operand, bool):
        raise ValueError(f"exists: expected true or false, got {_type_name(operand)}")
    return _Exists(operand)


_BUILDERS: Final[dict[str, Callable[[object], Condition]]] = {
    "regex": _regex,
    "contains": _contains,
    "prefix": _prefix,
    "in": _one_of,
    "exists": _exists,
}
_KIND_NAMES: Final = ", ".join(_BUILDERS)


def _text_operand(kind: str, operand: object) -> str:
    if not isinstance(operand, str) or not operand:
        got = "an empty string" if operand == "" else _type_name(operand)
        raise ValueError(f"{kind}: expected a non-empty string, got {got}")
    return operand


def _json_operand(where: str, operand: object) -> str:
    """A non-string policy value as its compact JSON (NaN, dates and the like refused)."""
    try:
        return canonical_json(operand)
    except (ValueError, TypeError):
        raise ValueError(f"{where}: {operand!r} is not a JSON value") from None


def _type_name(value: object) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return names.get(type(value), type(value).__name__)


def _quoted(text: str) -> str:
    return f"'{text}'"


# --- RE2 ------------------------------------------------------------------------------
#
# The compiled object is the binding's own RE2 (`re2._re2.RE2`), called directly: its
# `re`-like wrapper (`re2.compile(...).search`) builds a generator and decodes offsets on
# every call, about 1.1 us of the 1.6 us a search costs, which a yes-or-no question on the
# hot path does not need. The pattern and the text go in as UTF-8, as the wrapper does.

_ANYWHERE: Final = _re2.RE2.Anchor.UNANCHORED
_WHOLE_TEXT: Final = _re2.RE2.Anchor.ANCHOR_BOTH


def _compile_re2(pattern: str, what: str, whole: bool = False) -> Any:
    options = re2.Options()
    options.max_mem = RE2_MAX_MEM
    options.log_errors = False  # a bad pattern is a load error we report, not a stderr line
    options.never_capture = True  # only "does it match" is asked: no submatch bookkeeping
    try:
        compiled = _re2.RE2(pattern.encode("utf-8"), options)
    except UnicodeEncodeError:
        raise ValueError(f"invalid {what}: it contains a lone surrogate") from None
    if not compiled.ok():
        raise ValueError(f"invalid {what}: {_re2_message(compiled.error())}")
    # The reverse program, which finds where a match starts, is otherwise compiled at the
    # first match; compiled here, it is held to the budget too. (Within the forward
    # budget it always fits in memory: -1, its failure, is refused all the same.)
    size = compiled.ProgramSize()
    if size <= RE2_MAX_PROGRAM:
        reverse = compiled.ReverseProgramSize()
        if reverse < 0:
            raise ValueError(f"{what} is too costly to match: RE2 cannot reverse it")
        size = max(size, reverse)
    if size > RE2_MAX_PROGRAM:
        raise ValueError(
            f"{what} is too costly to match: it compiles to {size} RE2 instructions, more "
            f"than {RE2_MAX_PROGRAM} (each count of a repetition such as {{1,100}} copies "
            "what it repeats, and a Unicode class or `.` is many: use a smaller count, or + "
            "or *)"
        )
    # ... and the number of states its search can need (policy/automaton.py).
    try:
        automaton_bytes(pattern, whole)
    except TooLarge:
        raise ValueError(
            f"{what} is too costly to match: a search for it can need more than "
            f"{AUTOMATON_MAX_BYTES >> 20} MiB of automaton states (a counted repetition of "
            "a class that also holds what comes before it, as in 'a[ab]{20}c', needs a "
            "state for each mix of the two: count less)"
        ) from None
    return compiled


def _text(value: Any) -> str:
    """`as_text`, with a string (the usual argument) passed through without a call."""
    return value if type(value) is str else as_text(value)


def _re2_matches(compiled: Any, anchor: Any, value: Any) -> bool:
    # A lone surrogate (JSON can carry one) passes as one character, as fnmatch counts it.
    text = _text(value).encode("utf-8", "surrogatepass")
    return bool(compiled.Match(anchor, text, 0, len(text))[0][0] >= 0)  # group 0's start


def _re2_message(error: bytes | str) -> str:
    text = error.decode("utf-8", "replace") if isinstance(error, bytes) else error
    if "pattern too large" in text:
        text += f" (a pattern may compile to at most {RE2_MAX_PROGRAM} RE2 instructions)"
    return text


# --- globs, translated to RE2 -------------------------------------------------------

_GLOB_WILDCARDS: Final = {"*": ".*", "?": "."}


def _glob_to_re2(glob: str) -> str:
    """The RE2 pattern (for a full match) of a shell glob, read as `fnmatch` reads it.

    `*` any run, `?` one character (newlines included), `[...]` and `[!...]` classes with
    ranges; a `[` with no closing `]` is a literal, and every other character is literal.
    One difference from fnmatch, on purpose: a reversed range like `[z-a]`, which fnmatch
    quietly reads as nothing, is an error here, since it cannot be what was meant.
    """
    parts: list[str] = []
    at = 0
    while at < len(glob):
        char = glob[at]
        if char == "[":
            part, at = _glob_class(glob, at)
        else:
            part, at = _GLOB_WILDCARDS.get(char) or _re2_char(char), at + 1
        parts.append(part)
    return "(?s:" + "".join(parts) + ")"


def _glob_class(glob: str, start: int) -> tuple[str, int]:
    """The class opening at `start`, as RE2, and where the glob continues after it."""
    at = start + 1
    negated = glob.startswith("!", at)
    if negated:
        at += 1
    body_start = at
    if glob.startswith("]", at):  # a `]` first in the class is a member, not its end
        at += 1
    end = glob.find("]", at)
    if end < 0:
        return _re2_char("["), start + 1
    members = "".join(_class_members(glob, glob[body_start:end]))
    return f"[{'^' if negated else ''}{members}]", end + 1


def _class_members(glob: str, body: str) -> list[str]:
    """A class's members as RE2, left to right: `a-c` is a range, a `-` at an edge a member."""
    members = []
    at = 0
    while at < len(body):
        if at + 2 < len(body) and body[at + 1] == "-":
            low, high = body[at], body[at + 2]
            if low > high:
                raise ValueError(f"glob {_quoted(glob)} has a reversed range {low}-{high}")
            members.append(f"{_re2_char(low)}-{_re2_char(high)}")
            at += 3
        else:
            members.append(_re2_char(body[at]))
            at += 1
    return members


def _re2_char(char: str) -> str:
    """One literal character in RE2 syntax, in or out of a class."""
    if char.isascii() and (char.isalnum() or char == "_"):
        return char
    return f"\\x{{{ord(char):x}}}"
