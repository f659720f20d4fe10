"""How much automaton a pattern's search can need, counted at load (issue 25, item 2).

RE2 searches with a DFA it builds as it reads, one state per set of the pattern's
positions a match could be at, kept in a cache of fixed size (conditions.RE2_MAX_MEM).
A budget on the compiled program bounds each state's size but not their number: for
`a[ab]{20}c` ("an `a` 21 characters before a `c`", 26 instructions) a state is which of
the last 21 characters were `a`s, 2^21 of them, and on random `a`s and `b`s RE2 makes a
new one at nearly every byte, fills its cache, starts again and falls back to its NFA:
0.1-0.4 s per 64 KiB argument, on every check. So the states are counted here: the
pattern's position automaton (Glushkov's: one position per character or class a match
reads, counted repetitions spelled out as RE2 compiles them, `x{2,4}` as `xx(x(x)?)?`)
searched from every byte as RE2 searches, made deterministic state by state over the
classes of characters that the positions tell apart, each state counted at RE2's cost
for it (its positions, and a pointer per class). Over MAX_BYTES the pattern is refused;
under it, every state the search can need fits in RE2's cache with room to spare, each
is built once, and a check reads its argument at DFA speed once they are.

The count is over characters where RE2's DFA reads bytes (a state more per unfinished
UTF-8 sequence) and treats `^`, `$` and `\\b` as matching anywhere; both are within the
margin MAX_BYTES leaves. A pattern read with Python's own parser (`re._parser`, on the
syntax RE2 shares with it); one it cannot read (`\\p{...}`, `\\Q...\\E`, `(?U)`, a flag
in the middle) is not counted, only held to the program budget.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Iterable, Sequence
from re import _constants as sre  # type: ignore[attr-defined,unused-ignore]
from re import _parser as sre_parse  # type: ignore[attr-defined,unused-ignore]
from typing import Any, Final

__all__ = ["MAX_BYTES", "TooLarge", "automaton_bytes"]

# What the states a search can need may take, as counted here. RE2 gives a search 5.3 MiB
# of cache at RE2_MAX_MEM (16 MiB: two thirds to the forward program, half of that to the
# DFA a search uses), but needs more than this count for small states: `a[ab]{12}c`,
# counted 0.93 MB, settled to 1 ms a check from 8 MiB on and not at 6 (2.2-2.9 times the
# count), and `a[ab]{13}c`, counted 1.9 MB, kept rebuilding its states even at 32 MiB.
# For large states the count is RE2's (`(a|b|c|d){995}Z`: 2.06 MB counted, fell back with
# 1.7 MB of cache, not with 2.1). 1 MiB lets `a[ab]{12}c` through with twice the memory
# it was seen to need, and refuses `a[ab]{13}c`.
MAX_BYTES: Final = 1 << 20
_STATE_BYTES: Final = 48  # RE2's state, its hash set's entry: what a state costs besides
_POSITION_BYTES: Final = 4  # ... each of its positions
_POINTER_BYTES: Final = 8  # ... and a pointer to the next state per class (and one more)
_MAX_POSITIONS: Final = 5000  # more than the program budget lets through: not judged

_LAST: Final = 0x10FFFF
_Ranges = list[tuple[int, int]]
_DIGIT: Final[_Ranges] = [(0x30, 0x39)]  # RE2's \d, \w and \s are ASCII
_WORD: Final[_Ranges] = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE: Final[_Ranges] = [(0x09, 0x0A), (0x0C, 0x0D), (0x20, 0x20)]
_HEX_ESCAPE: Final = re.compile(r"\\x\{([0-9A-Fa-f]{1,6})\}")  # RE2's \x{...}, as Python's \U
_NOT_READ: Final = re.compile(r"\\[pPQEC]|\(\?[a-zA-Z]*U")


class TooLarge(ValueError):
    """The states a search can need come to more than MAX_BYTES."""


class _NotJudged(Exception):
    """The pattern holds what this count does not model."""


@functools.lru_cache(maxsize=1024)  # a policy's load compiles each pattern twice
def automaton_bytes(pattern: str, whole: bool = False, limit: int = MAX_BYTES) -> int | None:
    """What the states of a search for `pattern` (RE2 syntax) take, counted as RE2 counts
    them: a search anywhere in the text, or of the `whole` text (a glob). None when the
    pattern is not counted; TooLarge past `limit`."""
    try:
        return _count(pattern, whole, limit)
    except _NotJudged:
        return None


def _count(pattern: str, whole: bool, limit: int) -> int:
    if _NOT_READ.search(pattern):
        raise _NotJudged
    text = _HEX_ESCAPE.sub(lambda m: f"\\U{int(m.group(1), 16):08x}", pattern)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # `[[:alpha:]]`: a set of characters to it
            tree = sre_parse.parse(text.replace("\\z", "\\Z"))
    except (re.error, OverflowError, RecursionError, ValueError):
        raise _NotJudged from None
    positions = _Positions()
    items = list(tree)
    _, first, _ = positions.sequence(items, tree.state.flags)
    head = items[0] if items else None
    at_start = head == (sre.AT, sre.AT_BEGINNING_STRING) or (
        head == (sre.AT, sre.AT_BEGINNING) and not tree.state.flags & sre.SRE_FLAG_MULTILINE
    )
    anchored = whole or at_start
    classes = positions.classes()
    per_state = _STATE_BYTES + _POINTER_BYTES * (len(classes) + 1)
    follow = positions.follow
    seen = {0}
    todo = [0]  # a state: the positions just read, as bits; 0 is the start
    total = 0
    while todo:
        state = todo.pop()
        total += per_state + _POSITION_BYTES * state.bit_count()
        if total > limit:
            raise TooLarge(total)
        # A search starts a match at every byte (RE2's unanchored loop), unless `^`.
        reachable = first if state == 0 or not anchored else 0
        rest = state
        while rest:
            low = rest & -rest
            reachable |= follow[low.bit_length() - 1]
            rest ^= low
        for members in classes:
            after = reachable & members
            if after not in seen:
                seen.add(after)
                todo.append(after)
    return total


class _Positions:
    """Glushkov's construction: each node gives (empty allowed, first, last) as bits of
    positions, and `follow[p]` the positions that may come after position p."""

    def __init__(self) -> None:
        self.ranges: list[_Ranges] = []
        self.follow: list[int] = []

    def classes(self) -> list[int]:
        """For each set of characters no position tells apart, the positions that read
        it (distinct sets only)."""
        bounds = sorted({0} | {b for rs in self.ranges for lo, hi in rs for b in (lo, hi + 1)})
        found: set[int] = set()
        for char in (b for b in bounds if b <= _LAST):
            found.add(
                sum(
                    1 << i
                    for i, rs in enumerate(self.ranges)
                    if any(lo <= char <= hi for lo, hi in rs)
                )
            )
        return sorted(found)

    def _position(self, ranges: _Ranges) -> tuple[bool, int, int]:
        if len(self.ranges) >= _MAX_POSITIONS:
            raise _NotJudged
        self.ranges.append(ranges)
        self.follow.append(0)
        bit = 1 << (len(self.ranges) - 1)
        return False, bit, bit

    def _link(self, last: int, first: int) -> None:
        while last:
            low = last & -last
            self.follow[low.bit_length() - 1] |= first
            last ^= low

    def sequence(self, items: Iterable[Any], flags: int) -> tuple[bool, int, int]:
        empty, first, last = True, 0, 0
        for op, value in items:
            e, f, lst = self._node(op, value, flags)
            self._link(last, f)
            if empty:
                first |= f
            last = (lst | last) if e else lst
            empty = empty and e
        return empty, first, last

    def _node(self, op: Any, value: Any, flags: int) -> tuple[bool, int, int]:
        fold = bool(flags & sre.SRE_FLAG_IGNORECASE)
        if op is sre.LITERAL:
            return self._position(_folded([(value, value)], fold))
        if op is sre.NOT_LITERAL:
            return self._position(_negated(_folded([(value, value)], fold)))
        if op is sre.ANY:
            dot_all = flags & sre.SRE_FLAG_DOTALL
            return self._position([(0, _LAST)] if dot_all else _negated([(10, 10)]))
        if op is sre.IN:
            return self._position(_class(value, fold))
        if op is sre.CATEGORY:
            return self._position(_category(value))
        if op is sre.BRANCH:
            empty, first, last = False, 0, 0
            for branch in value[1]:
                e, f, lst = self.sequence(branch, flags)
                empty, first, last = empty or e, first | f, last | lst
            return empty, first, last
        if op is sre.SUBPATTERN:
            _, add, remove, items = value
            return self.sequence(items, (flags | add) & ~remove)
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            low, high, items = value
            return self._repeat(low, high, items, flags)
        if op is sre.AT:
            return True, 0, 0  # counted as if it held anywhere: more states, not fewer
        raise _NotJudged  # what RE2 refused already (backreferences, lookarounds)

    def _repeat(
        self, low: int, high: Any, items: Sequence[Any], flags: int
    ) -> tuple[bool, int, int]:
        # As RE2 compiles it: `x{2,4}` is `xx(x(x)?)?`, each optional copy reached only
        # from the one before it; `x{2,}` is `xx+`; `x*` and `x+` are one copy.
        unbounded = high is sre.MAXREPEAT
        copies = max(low, 1) if unbounded else high
        first, into, last, from_start = 0, 0, 0, True
        for i in range(copies):
            e, f, lst = self.sequence(items, flags)
            if unbounded and i == copies - 1:
                self._link(lst, f)
            self._link(into, f)
            if from_start:
                first |= f
            into = lst | (into if e else 0)
            from_start = from_start and e
            if i + 1 >= low:
                last |= into
        return low == 0 or from_start, first, last


def _class(items: Iterable[tuple[Any, Any]], fold: bool) -> _Ranges:
    ranges: _Ranges = []
    negate = False
    for kind, value in items:
        if kind is sre.NEGATE:
            negate = True
        elif kind is sre.LITERAL:
            ranges.append((value, value))
        elif kind is sre.RANGE:
            ranges.append(value)
        elif kind is sre.CATEGORY:
            ranges += _category(value)
        else:
            raise _NotJudged
    ranges = _folded(ranges, fold)
    return _negated(ranges) if negate else ranges


def _category(category: Any) -> _Ranges:
    name = str(category)
    ranges = _DIGIT if "DIGIT" in name else _WORD if "WORD" in name else _SPACE
    if "LINEBREAK" in name:
        raise _NotJudged
    return _negated(ranges) if "NOT" in name else ranges


def _folded(ranges: _Ranges, fold: bool) -> _Ranges:
    """With `(?i)`, ASCII letters in both cases (RE2 folds more; a few states more)."""
    if not fold:
        return ranges
    out = list(ranges)
    for lo, hi in ranges:
        for start, end, shift in ((0x41, 0x5A, 32), (0x61, 0x7A, -32)):
            if max(lo, start) <= min(hi, end):
                out.append((max(lo, start) + shift, min(hi, end) + shift))
    return out


def _negated(ranges: _Ranges) -> _Ranges:
    out: _Ranges = []
    at = 0
    for lo, hi in sorted(ranges):
        if lo > at:
            out.append((at, lo - 1))
        at = max(at, hi + 1)
    if at <= _LAST:
        out.append((at, _LAST))
    return out
