"""Arguments too large to send whole (`arguments.bounded_args`), against an oracle.

The promise: the bounded copy always fits the wire, and for every path a policy can
write, either the copy holds the caller's value there, or the path is covered by a cut
(so the daemon reads its conditions as unknown). The oracle walks every path of the
original arguments by brute force and checks both, on hostile shapes hypothesis makes:
huge strings, deep nesting, many items, numbers JSON cannot carry, lone surrogates and
keys no path can spell.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from ratewarden.arguments import (
    BOUNDED_DEPTH,
    MAX_TEXT,
    ArgPath,
    bounded_args,
    cut_overlaps,
)
from ratewarden.wire.bodies import MAX_ARGS_BYTES, Args
from ratewarden.wire.bounded import count_items
from ratewarden.wire.names import MAX_ARGS_ITEMS

WIRE: TypeAdapter[dict[str, Any]] = TypeAdapter(Args)

keys = st.one_of(
    st.sampled_from(["command", "path", "n", "a", "0", "1", "x.y", "has space", "*", ""]),
    st.text(max_size=4),
    st.just("k" * 300),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([10**1500, -(10**1200), math.inf, -math.inf, math.nan]),
    st.floats(),
    st.text(max_size=20),
    st.sampled_from(["\ud800", "\x00\x1b\u2028", "rm -rf /"]),
    st.integers(0, 3).map(lambda k: "\x01" * (MAX_TEXT + k * 3000)),
    st.integers(0, 3).map(lambda k: "y" * (MAX_TEXT - 1 + k * 20_000)),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=20,
)


def nested(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = {"a": leaf}
    return leaf


def paths(value: Any, steps: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every path a policy can write into `value`, with the value there (brute force)."""
    yield steps, value
    if isinstance(value, dict):
        for key, item in value.items():
            if (
                isinstance(key, str)
                and key
                and key.isprintable()
                and not any(c.isspace() or c in ".*" for c in key)
            ):
                yield from paths(item, (*steps, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from paths(item, (*steps, str(index)))


def same(a: Any, b: Any) -> bool:
    """Equal as JSON values (NaN is not equal to itself, and needs no special case: a
    NaN is never sent, so its path must be cut)."""
    return type(a) is type(b) and a == b


def check(args: dict[str, Any]) -> None:
    bounded = bounded_args(args)
    assert bounded is not None
    text = json.dumps(bounded.value, separators=(",", ":"), ensure_ascii=False).encode()
    WIRE.validate_python(bounded.value)  # the daemon takes it
    assert len(text) <= MAX_ARGS_BYTES
    assert count_items(text) <= MAX_ARGS_ITEMS
    cut = tuple(ArgPath.parse(path).steps for path in bounded.cut)
    for steps, value in paths(args):
        if len(steps) > 32:
            break
        if cut_overlaps(steps, cut):
            continue
        assert same(ArgPath("x", steps).resolve(bounded.value), value), steps


@settings(max_examples=120, deadline=None)
@given(st.dictionaries(keys, values, max_size=5))
def test_every_path_is_sent_whole_or_cut(args: dict[str, Any]) -> None:
    check(args)


@pytest.mark.parametrize(
    "args",
    [
        {"pad": "x" * 70_000, "command": "rm -rf /"},
        {"command": "rm -rf /", "n": math.inf},
        {"command": "rm -rf /", "n": 10**5000},
        {"command": "rm -rf /", "deep": nested(100, 1)},
        {"command": "rm -rf /", "many": list(range(5_000))},
        {"many": [[i] for i in range(5_000)], "command": "rm -rf /"},
        {"command": "rm -rf /", "escapes": ["\x01" * 100] * 3_900},
        {f"k{i}": "z" * 4_000 for i in range(20)} | {"command": "rm -rf /"},
        {"command": "rm -rf /", "x": "\ud800"},
    ],
    ids=["padded", "infinite", "long int", "deep", "many", "many first", "escapes",
         "budget spent first", "lone surrogate"],
)  # fmt: skip
def test_the_padding_shapes_of_the_attack(args: dict[str, Any]) -> None:
    """Each way of padding `rm -rf /` in issue 25: the command is sent, or is cut."""
    check(args)
    bounded = bounded_args(args)
    assert bounded is not None
    assert bounded.cut
    command = ArgPath.parse("command")
    assert command.resolve(bounded.value) == "rm -rf /" or cut_overlaps(
        command.steps, tuple(ArgPath.parse(p).steps for p in bounded.cut)
    )


def test_text_that_is_not_json_is_cut_as_a_whole_and_keyed_on_its_digest() -> None:
    one, other = bounded_args("rm -rf / {"), bounded_args("rm -rf ~ {")
    assert one is not None
    assert other is not None
    assert one.cut == other.cut == ("*",)
    assert one.value != other.value  # a loop rule tells them apart
    assert "rm" not in json.dumps(one.value)  # the raw text is never sent


def test_two_calls_padded_apart_count_apart_and_alike_alike() -> None:
    a = bounded_args({"command": "rm -rf /", "pad": "x" * 70_000})
    b = bounded_args({"command": "rm -rf /", "pad": "x" * 70_001})
    again = bounded_args({"command": "rm -rf /", "pad": "x" * 70_000})
    assert a is not None
    assert b is not None
    assert again is not None
    assert a.value != b.value
    assert a == again


def test_depth_is_cut_at_the_wires_level() -> None:
    bounded = bounded_args(nested(BOUNDED_DEPTH + 5, 1))
    assert bounded is not None
    assert len(bounded.cut) == 1
    assert bounded.cut[0].count("a") == BOUNDED_DEPTH  # the 33rd level


def test_a_payload_deeper_than_python_reads_is_read_with_its_deep_part_cut() -> None:
    """Padding a call with nesting deeper than the interpreter's reader must not make the
    payload unreadable (a hook would answer by its fail mode): the deep part is marked,
    then cut by the Bounder at its usual depth, and named; brackets and escaped quotes
    inside strings are text, not structure."""
    from ratewarden.arguments import read_json

    deep = "[" * 3_000 + "]" * 3_000
    text = '{"command": "rm -rf /", "s": "\\"[{[", "deep": ' + deep + ', "after": 1}'
    with pytest.raises(RecursionError):
        json.loads(text)
    value = read_json(text.encode())
    assert value["command"] == "rm -rf /"
    assert value["s"] == '"[{['
    assert value["after"] == 1
    bounded = bounded_args(value)
    assert bounded is not None
    assert bounded.value["command"] == "rm -rf /"
    assert bounded.cut == ("deep" + ".0" * 31,)
