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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["MISSING", "ArgPath", "as_text", "canonical_json", "digest"]

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
