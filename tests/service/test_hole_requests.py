"""Requests no caller can make expensive, or answer with anything but the field at fault
(issue 15, items 6, 9 and 10).

- 6: a body within the caps is validated once, in a number of steps that does not grow
  with its size: each refusal is counted in Python calls (a profiler's events), never
  timed. The worst bodies the benchmark sends (bench/worstbody.py: wide, deep, many
  keys, long and short strings, unknown fields, too many calls) are refused naming
  their field, or accepted, in a short answer, alike with and without the hot path.
- 9: NaN and Infinity anywhere in a body are refused naming the field, on every route
  that takes JSON, and the audit log never holds a line a strict JSON parser refuses.
- 10: an integer too long for Python is refused naming its field (not `body: invalid
  JSON`), and a settle URL whose call_id holds a control character is a 422 naming
  call_id (not a bare 404).
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import math
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from types import FrameType
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from bench.worstbody import BODIES as ALL_BODIES
from bench.worstbody import NORMAL, largest_valid
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine.decision import Decision
from ratewarden.service.audit import AuditTrail
from ratewarden.store import MemoryStore
from ratewarden.wire import bodies, bounded
from ratewarden.wire.bodies import MAX_ARGS_DEPTH, MAX_BATCH, MAX_FIELDS, BatchRequest, CheckRequest
from ratewarden.wire.bounded import MAX_ITEMS, count_items, too_deep, too_many_items
from tests.helpers.app import assert_error_shape, serving
from tests.service.test_hotpath import make_app

JSON = {"content-type": "application/json"}
HUGE = "1" * 5000  # digits: past Python's 4300 (sys.get_int_max_str_digits)


@asynccontextmanager
async def clients(**settings: Any) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    """The daemon with its hot path, and FastAPI alone: both must answer alike."""
    async with (
        serving(make_app(hot=True, **settings)) as hot,
        serving(make_app(hot=False, **settings)) as plain,
    ):
        yield {"hot path": hot, "fastapi": plain}


def refused(answer: httpx.Response) -> list[str]:
    """The fields a 422 names."""
    assert answer.status_code == 422, answer.text[:300]
    assert_error_shape(answer.json())
    return [entry["field"] for entry in answer.json()["fields"]]


# -- counting work ------------------------------------------------------------------------


class Calls:
    """Every Python and built-in function call made inside `counting()`: a count of work
    that does not depend on the machine's speed."""

    def __init__(self) -> None:
        self.events = 0
        self.named: dict[str, int] = {}

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            self.events += 1
            if event == "call":
                name = frame.f_code.co_name
                self.named[name] = self.named.get(name, 0) + 1


@contextmanager
def counting() -> Iterator[Calls]:
    """Count the Python calls made in the block: its own work only. What earlier tests
    left for the garbage collector (finalizers, gc callbacks) would count too, so it is
    collected first and the collector is paused meanwhile."""
    calls = Calls()
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    previous = sys.getprofile()
    sys.setprofile(calls)
    try:
        yield calls
    finally:
        sys.setprofile(previous)
        if was_enabled:
            gc.enable()


async def post_counted(client: httpx.AsyncClient, path: str, body: bytes) -> Calls:
    with counting() as calls:
        answer = await client.post(path, content=body, headers=JSON)
    assert answer.status_code in (200, 422), answer.text[:300]
    return calls


# The API's bodies; a host's hook payloads (`hook: ...`) are held to their own bounds in
# tests/service/test_hook_routes.py and tests/service/test_hole_args.py.
BODIES = {name: make for name, make in ALL_BODIES.items() if not name.startswith("hook:")}


def body_of(name: str) -> bytes:
    return BODIES[name]().split(b"\n")[0]


def path_of(name: str) -> str:
    return "/v1/check/batch" if name.startswith("batch") else "/v1/check"


OVER = [name for name in BODIES if too_many_items(body_of(name))]  # refused unread
ACCEPTED = [
    name
    for name in BODIES
    if name.endswith("(accepted)") or name.startswith("64 KiB command")  # regex rows
]
ARGS_REFUSED = [  # read, then refused for their args
    f"{MAX_ITEMS} arrays 40 deep",
    f"{MAX_ITEMS} keys and 190 KiB of escaped commas",
    f"{MAX_ITEMS} keys, then a lone surrogate",
    f"{MAX_ITEMS} keys, then a 5 000-digit integer",
]
READERS = ("read_json", "model_validate", "model_validate_json")  # the body read, or validated


def test_hole6_the_benchmark_has_bodies_on_both_sides_of_the_item_cap() -> None:
    assert NORMAL not in OVER
    assert len(OVER) >= 8, OVER
    within = [name for name in BODIES if name not in OVER]
    assert all(count_items(body_of(name)) <= MAX_ITEMS for name in within)
    assert set(ARGS_REFUSED) <= set(within)
    assert set(ACCEPTED) <= set(within)


async def test_hole6_a_body_over_the_item_cap_is_refused_unread_naming_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reading 256 KiB of `[],` into Python cost 10-15 ms whatever came next. A body of
    more than MAX_ITEMS items is now refused on its bytes: never parsed, never validated,
    alike with and without the hot path. On bd4a06f these bodies were read, then refused
    naming args or the unknown fields, or accepted."""
    read: list[str] = []
    monkeypatch.setattr(bounded, "_parse", lambda body: read.append("_parse"), raising=False)
    args = b'{"user":"u","tool":"t","args":{"k":['
    calls = b'{"user":"u","tool":"t","args":{"k":[' + b"0," * 2000 + b"0]}}"
    bodies = [
        ("/v1/check", args + b"[]," * 3000 + b"[]]}}"),  # 6 001 items, 9 KiB
        ("/v1/check", args + b"0," * 5000 + b"0]}}"),  # 5 004
        ("/v1/check", b'{"user":"u","tool":"t",' + b'"x":0,' * 5000 + b'"y":0}'),
        ("/v1/check/batch", b'{"calls":[' + b",".join([calls] * 3) + b"]}"),  # valid but 6 016
        ("/v1/check", args + b'"\\"\\\\",' * 6000 + b'""]}}'),  # escapes and strings
    ]
    async with clients() as both:
        for path, body in bodies:
            answers = [await c.post(path, content=body, headers=JSON) for c in both.values()]
            hot, plain = answers
            assert refused(hot) == ["body"], (body[:60], hot.text[:300])
            assert hot.json() == plain.json()
            assert f"more than {MAX_ITEMS} items" in hot.json()["message"]
    assert read == []


async def test_hole6_a_body_at_the_item_cap_is_read() -> None:
    """MAX_ITEMS items exactly are within: the count is exact, not a bound."""
    head = b'{"user":"u","tool":"t","args":{"k":['  # 3 members, 1 in args, the list's items
    at_cap = head + b"0," * (MAX_ITEMS - 5) + b"0]}}"
    assert count_items(at_cap) == MAX_ITEMS
    async with clients() as both:
        for client in both.values():
            answer = await client.post("/v1/check", content=at_cap, headers=JSON)
            assert answer.status_code == 200, answer.text[:300]
            over = at_cap.replace(b"[0,", b"[0,0,", 1)
            assert refused(await client.post("/v1/check", content=over, headers=JSON)) == ["body"]


async def test_hole6_an_invalid_body_is_validated_once() -> None:
    """Refused by the hot path, a body was validated again by FastAPI to word the
    refusal: the `args` check ran twice. Now the hot path answers it itself, and a body
    over the item cap is not read at all."""
    async with serving(make_app(hot=True)) as client:
        for name in ARGS_REFUSED:
            calls = await post_counted(client, path_of(name), body_of(name))
            assert calls.named.get("_bounded_args") == 1, (name, calls.named.get("_bounded_args"))
            assert calls.named.get("read_json") == 1, name
        deep: dict[str, Any] = {"k": [[[[]]]]}
        for _ in range(MAX_ARGS_DEPTH):
            deep = {"k": [deep]}
        batch = {"calls": [{"user": "u", "tool": "t", "args": deep}]}
        calls = await post_counted(client, "/v1/check/batch", json.dumps(batch).encode())
        assert calls.named.get("_bounded_args") == 1
        for name in OVER:
            calls = await post_counted(client, path_of(name), body_of(name))
            assert not set(READERS) & set(calls.named), (name, calls.named)


def test_hole6_checking_args_takes_steps_that_do_not_grow_with_them() -> None:
    """The `args` check walked every value in Python (100 000 steps for a 256 KiB body);
    now it is a fixed number of passes over their JSON."""
    small = b'{"user":"u","tool":"t","args":{"k":[' + b"[]," * 10 + b"[]]}}"
    with counting() as reference:
        CheckRequest.model_validate_json(small)
    for name in [*ARGS_REFUSED, *ACCEPTED]:
        body = body_of(name)
        refusal: AbstractContextManager[Any] = (
            pytest.raises(ValidationError, match="args") if name in ARGS_REFUSED else nullcontext()
        )
        value = bounded.read_json(body)
        with counting() as calls, refusal:
            CheckRequest.model_validate(value, from_attributes=True)
        assert calls.events <= reference.events + 30, (name, calls.events)


async def test_hole6_refusing_the_worst_bodies_takes_no_more_steps_than_a_small_one() -> None:
    """Through the whole daemon, a refusal costs the same Python calls whatever the body
    holds: 20 000 unknown fields made 20 000 errors and a 2 MB answer."""
    small_args = b'{"user":"u","tool":"t","args":{"k":"' + b"x" * 70_000 + b'"}}'
    async with serving(make_app(hot=True)) as client:
        for path in ("/v1/check", "/v1/check/batch"):  # first calls warm up
            await client.post(path, content=small_args, headers=JSON)
        reference = await post_counted(client, "/v1/check", small_args)
        for name in BODIES:
            if name == NORMAL or name in ACCEPTED:
                continue
            calls = await post_counted(client, path_of(name), body_of(name))
            # A batch's valid calls are each validated before its last: at most MAX_BATCH.
            per_call = 16 if name.startswith(f"batch: {MAX_BATCH} calls") else 0
            limit = reference.events + 200 + per_call * MAX_BATCH
            assert calls.events <= limit, (name, calls.events, reference.events)


EXPECTED = {
    # name -> what the answer names (None: accepted)
    NORMAL: None,
    **{name: ["body"] for name in OVER},
    **dict.fromkeys(ACCEPTED),
    **{name: ["args"] for name in ARGS_REFUSED},
    f"{MAX_ITEMS} unknown fields": ["body"],  # at most MAX_FIELDS fields
    f"metadata: {MAX_ITEMS} unknown fields": ["metadata"],
    f"batch: {MAX_BATCH} calls at the item cap, the last refused": [
        f"calls[{MAX_BATCH - 1}].user",
        f"calls[{MAX_BATCH - 1}].tool",
    ],
}


async def test_hole6_the_worst_bodies_are_refused_or_accepted_as_they_should() -> None:
    assert set(EXPECTED) == set(BODIES)
    async with clients() as both:
        for name, fields in EXPECTED.items():
            answers = [await c.post(path_of(name), content=body_of(name), headers=JSON)
                       for c in both.values()]  # fmt: skip
            hot, plain = answers
            assert hot.status_code == plain.status_code, name
            if fields is None:
                assert hot.status_code == 200, (name, hot.text[:300])
            else:
                assert hot.json() == plain.json(), name
                assert refused(hot) == fields, (name, hot.text[:300])
                assert len(hot.content) < 4096, (name, len(hot.content))  # was 2 MB


async def test_hole6_an_object_of_too_many_fields_is_refused_by_its_size() -> None:
    """Each unknown field cost pydantic an error (0.4 us): an object of more than
    MAX_FIELDS is refused naming the object; up to that, the unknown fields by name."""
    fields = {f"x{i}": 0 for i in range(MAX_FIELDS - 2)}  # with user and tool: at the cap
    async with clients() as both:
        for client in both.values():
            named = await client.post("/v1/check", json={"user": "u", "tool": "t", **fields})
            assert refused(named)[:2] == ["x0", "x1"]
            over = {"user": "u", "tool": "t", "metadata": {**fields, "y": 0, "z": 0, "w": 0}}
            answer = await client.post("/v1/check", json=over)
            assert refused(answer) == ["metadata"]
            assert f"at most {MAX_FIELDS} fields" in answer.json()["message"]


def test_the_benchmarks_largest_accepted_args_are_at_every_cap() -> None:
    """The benchmark's largest accepted body: one level, one item or one byte more is
    refused."""
    body = largest_valid()
    assert count_items(body) == MAX_ITEMS
    args = json.loads(body)["args"]
    CheckRequest(user="u", tool="t", args=args)
    with pytest.raises(ValueError, match="nested deeper than 32 levels"):
        CheckRequest(user="u", tool="t", args={**args, "k": [[args["k"][0]]]})
    with pytest.raises(ValueError, match="larger than 65536 bytes"):
        CheckRequest(user="u", tool="t", args={**args, "s": args["s"] + "x"})
    assert too_many_items(body.replace(b"[],", b"[],[],", 1))


def test_a_body_the_hot_path_hands_on_is_counted_again_at_no_cost() -> None:
    """The hot path hands FastAPI only bodies it reads in one step (at most LARGE_BODY
    bytes), and a body of fewer bytes than MAX_ITEMS is within without a count."""
    assert bounded.LARGE_BODY <= MAX_ITEMS
    body = b"[" + b"0," * (bounded.LARGE_BODY // 2 - 1) + b"0]"
    with counting() as nothing:
        pass
    with counting() as calls:
        too_many_items(body)
    assert calls.events <= nothing.events + 2  # the call and its len()


# -- 6: the item count, read on the bytes -------------------------------------------------


def items_of(value: Any) -> int:
    """The rule, on a parsed value: each array element and object member is an item, and
    so is each empty array or object."""
    if isinstance(value, list):
        return max(len(value), 1) + sum(map(items_of, value))
    if isinstance(value, dict):
        return max(len(value), 1) + sum(map(items_of, value.values()))
    return 0


def depth_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


def finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(map(finite, value))
    if isinstance(value, dict):
        return all(map(finite, value.values()))
    return True


def writable(value: Any) -> bool:
    """Whether `value` can be written as UTF-8 JSON (no lone surrogate in it)."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


def quick_bound(body: bytes) -> int:
    """What too_many_items counts first: every comma and opening bracket, strings too."""
    marks = bounded._ITEM_MARKS.marks(bounded._utf8(body))
    return len(marks) - marks.count(b"a")


# Strings full of what the count must not be fooled by: quotes and backslashes to escape,
# brackets and commas, the letters the count uses as marks, and characters JSON escapes.
HOSTILE = st.sampled_from(list('"\\,[]{}:/abfrnNIu0\n\t\b\f\r\x00\x7f\u2028\ud800é'))
TEXT = st.text(alphabet=st.characters() | HOSTILE, max_size=12)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | TEXT
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=6) | st.dictionaries(TEXT, inner, max_size=6)
)
WRITTEN = st.fixed_dictionaries(
    {
        "ensure_ascii": st.booleans(),
        "indent": st.sampled_from([None, 0, 2]),
        "separators": st.sampled_from([(",", ":"), (", ", ": "), (" ,\t", " :\r\n")]),
    }
)
ENCODINGS = st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-be", "utf-32-le"])


@settings(max_examples=800, deadline=None)
@given(VALUES, WRITTEN, ENCODINGS, st.integers(0, 12))
@pytest.mark.slow
def test_hole6_items_are_counted_exactly_from_the_bytes(
    value: Any, written: dict[str, Any], encoding: str, cap: int
) -> None:
    """For any JSON however written, the count read on the bytes is the parsed value's,
    the first bound is never under it, and the cap is held exactly at every size."""
    body = json.dumps(value, **written).encode(encoding, "surrogatepass")
    assert json.loads(body) == value or not finite(value)  # the body is what was meant
    exact = items_of(value)
    assert count_items(body) == exact, body
    assert quick_bound(body) >= exact
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bounded, "MAX_ITEMS", cap)
        assert too_many_items(body) == (exact > cap), (body, cap)


@settings(max_examples=500, deadline=None)
@given(VALUES, WRITTEN, ENCODINGS, st.integers(0, 5))
def test_a_bodys_depth_is_read_exactly_from_its_bytes(
    value: Any, written: dict[str, Any], encoding: str, levels: int
) -> None:
    """What the MCP gateway holds a body to before it is read (issue 25, item 7): brackets
    in strings, escaped or not, and any encoding JSON allows never fool it."""
    body = json.dumps(value, **written).encode(encoding, "surrogatepass")
    assert too_deep(body, levels) == (depth_of(value) > levels), (body, levels)


@settings(max_examples=300, deadline=None)
@given(VALUES, st.binary(max_size=24) | st.sampled_from([b"\\", b'\\"', b"\\x4", b"\\N{", b'"']))
def test_hole6_what_precedes_an_error_is_counted_exactly(value: Any, junk: bytes) -> None:
    """A parser stops at the first error: whatever follows, the items before it are all
    counted (so an invalid body cannot hide items the parser would read)."""
    body = json.dumps([value, value]).encode()
    assert count_items(body + junk) >= items_of([value, value])


DEEP = st.integers(MAX_ARGS_DEPTH - 3, MAX_ARGS_DEPTH + 1).flatmap(
    lambda depth: VALUES.map(lambda v: functools.reduce(lambda inner, _: [inner], range(depth), v))
)


@settings(max_examples=300, deadline=None)
@given(VALUES | DEEP)
def test_hole6_args_are_held_to_their_depth_and_to_finite_numbers_from_their_json(
    value: Any,
) -> None:
    """The args check reads their compact JSON the same way: strings never fool it."""
    args = {"v": value}
    written = json.dumps(args, ensure_ascii=False).encode("utf-8", "surrogatepass")
    assume(len(written) <= bodies.MAX_ARGS_BYTES)
    valid = depth_of(args) <= MAX_ARGS_DEPTH and finite(value) and writable(args)
    refusal = nullcontext() if valid else pytest.raises(ValidationError, match="args")
    with refusal:
        CheckRequest(user="u", tool="t", args=args)


ATTACKS = [
    # valid JSON built to fool a count that does not read strings as the parser does
    b'["\\\\", "\\\\\\\\", "\\\\\\"", "\\"\\\\", ",[{"]',
    b'["\\u0022,[{", "\\u005c", "\\u005C\\"", "\\/\\b\\f\\n\\r\\t"]',
    b'{"\\"":[{"\\\\":"]"}], "a\\"b": "{\\\\\\"[,"}',
    b'["' + b"\\\\" * 999 + b'", "' + b"\\\\" * 1000 + b'\\""]',
    b'["abfrn", "NaN", "Infinity", "\\a"]'.replace(b"\\a", b"\\u0061"),
    '["é", "\u2028", "😀", "\\ud83d\\ude00", "\\ud800"]'.encode(),
    b"\xef\xbb\xbf[[], {}, [[]], [{}]]",
    '[",", [",", {",": ","}]]'.encode("utf-16"),
    '[",", [",", {",": ","}]]'.encode("utf-32-be"),
]


@pytest.mark.parametrize("body", ATTACKS, ids=range(len(ATTACKS)))
def test_hole6_crafted_strings_do_not_fool_the_count(body: bytes) -> None:
    value = json.loads(body)
    assert count_items(body) == items_of(value)
    assert quick_bound(body) >= items_of(value)


NOT_JSON = [
    b"[" + b"0," * 6000 + b'"\\x41"]',  # invalid escapes after the items: all counted
    b"[" + b"0," * 6000 + b'"\\',  # a lone backslash at the end
    b"[" + b"0," * 6000 + b'"\\N{QUOTATION MARK}"]',
    b"[" + b"0," * 6000 + b'"\\0\\1\\7\\\'"]',
    b"[" + b"0," * 6000 + b'"\xff\xfe"]',
]


@pytest.mark.parametrize("body", NOT_JSON, ids=range(len(NOT_JSON)))
def test_hole6_invalid_json_after_the_items_still_counts_them(body: bytes) -> None:
    assert count_items(body) >= 6001
    assert too_many_items(body)


@pytest.mark.slow
def test_hole6_counting_takes_a_fixed_number_of_passes_and_bounded_pieces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """However a body is built, its count is a few calls in C, and the strings are only
    taken out (one piece each) when there are at most 2 * MAX_ITEMS + 1 of them."""
    pieces: list[int] = []
    outside = bounded.outside_strings

    def spy(marks: bytes) -> bytes:
        pieces.append(marks.count(b"a") + 1)
        return outside(marks)

    monkeypatch.setattr(bounded, "outside_strings", spy)
    # Every step: escapes to resolve, more commas than items (in a string), one string.
    small = b'["' + b"," * MAX_ITEMS + b'\\\\", 0]'
    assert too_many_items(small) is False
    with counting() as reference:
        too_many_items(small)
    for name in BODIES:
        body = body_of(name)
        with counting() as calls:
            too_many_items(body)
        assert calls.events <= reference.events, (name, calls.events)
    assert pieces
    assert max(pieces) <= 2 * (2 * MAX_ITEMS + 1) + 1


def test_hole6_a_100_call_batch_of_a_few_dozen_values_each_fits() -> None:
    """The cap's headroom: 100 calls, each with every field and two dozen values in its
    args."""
    args = {"command": "ls", "n": list(range(12)), "env": {f"K{i}": "v" for i in range(9)}}
    call = {
        "user": "u",
        "tool": "t",
        "session": "s",
        "team": "t",
        "call_id": "c",
        "cost": 0.1,
        "metadata": {"readOnlyHint": True, "tags": ["a", "b", "c"]},
        "args": args,
    }
    assert items_of(args) == 24
    body = json.dumps({"calls": [call] * MAX_BATCH}).encode()
    assert MAX_ITEMS * 0.8 < count_items(body) <= MAX_ITEMS
    BatchRequest.model_validate(bounded.read_json(body), from_attributes=True)


@pytest.mark.parametrize("size", [20_000, 200_000])
async def test_large_bodies_get_fastapis_answers_on_the_hot_path(size: int) -> None:
    """A large body is read before it is validated (not in one step, like a small one):
    its answers, valid or not, are still FastAPI's, word for word."""
    bodies: list[tuple[str, dict[str, Any] | list[Any]]] = [
        ("/v1/check", {"user": "u", "tool": "t", "args": {"k": "v"}}),
        ("/v1/check", {"user": 1, "tool": "t", "metadata": [], "args": []}),
        ("/v1/check", {"user": "u", "tool": "t", "metadata": {"readOnlyHint": "yes", "x": 1}}),
        ("/v1/check", {"tool": "t", "cost": "0.5", "approved": 1, "extra": None}),
        ("/v1/check", []),
        ("/v1/check/batch", {"calls": [{"user": "u", "tool": "t"}, {"user": "u"}]}),
        ("/v1/check/batch", {"calls": "x"}),
    ]
    async with clients() as both:
        for path, value in bodies:
            text = json.dumps(value).encode()
            body = text + b" " * (size - len(text))  # JSON allows any whitespace
            hot, plain = [await c.post(path, content=body, headers=JSON) for c in both.values()]
            assert hot.status_code == plain.status_code, (value, hot.text, plain.text)
            if hot.status_code == 422:
                assert hot.json() == plain.json(), value


# -- 9: strict JSON ------------------------------------------------------------------------

NOT_FINITE = ["NaN", "Infinity", "-Infinity", "1e999"]


@pytest.mark.parametrize("number", NOT_FINITE)
async def test_hole9_nan_and_infinity_are_refused_naming_the_field(number: str) -> None:
    cases = [
        ("/v1/check", '{"user": "u", "tool": "t", "args": {"a": [1, %s]}}', ["args"]),
        ("/v1/check", '{"user": "u", "tool": "t", "args": {"a": {"b": %s}}}', ["args"]),
        ("/v1/check", '{"user": "u", "tool": "t", "cost": %s}', ["cost"]),
        ("/v1/check", '{"user": %s, "tool": "t"}', ["user"]),
        ("/v1/check", '{"user": "u", "tool": "t", "approved": %s}', ["approved"]),
        ("/v1/check/batch", '{"calls": [{"user": "u", "tool": "t", "args": {"a": %s}}]}',
         ["calls[0].args"]),
        ("/v1/calls/c1/settle", '{"cost": %s}', ["cost"]),
        ("/v1/calls/c1/settle", '{"duration_ms": %s}', ["duration_ms"]),
        ("/v1/admin/reset", '{"user": "u", "rule": %s}', ["rule"]),
    ]  # fmt: skip
    async with clients() as both:
        for name, client in both.items():
            for path, template, fields in cases:
                answer = await client.post(path, content=template % number, headers=JSON)
                assert refused(answer) == fields, (name, template)


async def test_hole9_args_in_the_audit_log_are_always_standard_json(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With AUDIT_ARGS on, a denied call's args are written to the audit log: NaN there
    made a line that strict JSON parsers refuse."""
    caplog.set_level(logging.INFO, logger="ratewarden.audit")
    async with clients(audit_args=True) as both:
        for client in both.values():
            for i in range(6):  # past the policy's limits: denied, so audited
                body = '{"user": "u", "tool": "t", "args": {"n": %s}}' % ("NaN" if i % 2 else i)
                answer = await client.post("/v1/check", content=body, headers=JSON)
                assert answer.status_code == (422 if i % 2 else 200)
    lines = [r.getMessage() for r in caplog.records if r.name == "ratewarden.audit"]
    assert lines
    assert {strict_json(line)["args"]["n"] for line in lines} <= {0, 2, 4}


def strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_hole9_the_audit_trail_never_writes_a_non_standard_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Whatever reaches it (a figure gone wrong, args from code that skipped the wire
    model), each line is standard JSON."""
    caplog.set_level(logging.INFO, logger="ratewarden.audit")
    trail = AuditTrail(MemoryStore(FakeClock()), include_args=True)
    decision = Decision(decision="deny", call_id="c1", message="no", retry_after=float("nan"))
    call = Call(user="u", tool="t", call_id="c1")
    trail.record(decision, call, {"a": [float("inf"), -float("inf"), 1.5], "b": "NaN"})
    [line] = [r.getMessage() for r in caplog.records if r.name == "ratewarden.audit"]
    entry = strict_json(line)
    assert entry["retry_after"] == "nan"
    assert entry["args"] == {"a": ["inf", "-inf", 1.5], "b": "NaN"}


# -- 10: every 4xx names its field --------------------------------------------------------


async def test_hole10_an_integer_too_long_for_python_is_refused_naming_its_field() -> None:
    cases = [
        ("/v1/check", {"user": "u", "tool": "t", "cost": HUGE}, ["cost"]),
        ("/v1/check", {"user": "u", "tool": "t", "cost": "-" + HUGE}, ["cost"]),
        ("/v1/check", {"user": "u", "tool": "t", "args": {"n": [1, HUGE]}}, ["args"]),
        ("/v1/check", {"user": HUGE, "tool": "t"}, ["user"]),
        ("/v1/check", {"user": "u", "tool": "t", "approved": HUGE}, ["approved"]),
        ("/v1/check/batch", {"calls": [{"user": "u", "tool": "t", "cost": HUGE}]},
         ["calls[0].cost"]),
        ("/v1/calls/c1/settle", {"cost": HUGE}, ["cost"]),
        ("/v1/calls/c1/settle", {"duration_ms": HUGE}, ["duration_ms"]),
        ("/v1/admin/reset", {"user": "u", "rule": HUGE}, ["rule"]),
    ]  # fmt: skip
    async with clients() as both:
        for name, client in both.items():
            for path, value, fields in cases:
                raw = json.dumps(value).replace(f'"{HUGE}"', HUGE)  # the number, unquoted
                answer = await client.post(path, content=raw, headers=JSON)
                assert refused(answer) == fields, (name, path, fields)
            # The same digits in a string are only a string.
            text = {"user": "u", "tool": "t", "args": {"n": HUGE}}
            assert (await client.post("/v1/check", json=text)).status_code == 200


CONTROL = ["\n", "\r", "\x00", "\x1f", "\x7f", "\x85", "a\nb", "\n\n", "x\ty"]


@pytest.mark.parametrize("call_id", CONTROL, ids=[repr(c) for c in CONTROL])
async def test_hole10_a_settle_url_with_a_control_character_is_a_422_naming_call_id(
    call_id: str,
) -> None:
    async with clients() as both:
        for name, client in both.items():
            for body in (b"", b'{"cost": 0.5}'):
                path = f"/v1/calls/{quote(call_id, safe='')}/settle"
                answer = await client.post(path, content=body, headers=JSON)
                assert refused(answer) == ["call_id"], (name, body, answer.text)
                assert "control characters" in answer.json()["message"]


async def test_hole10_an_over_long_call_id_in_the_url_is_a_422_naming_call_id() -> None:
    async with clients() as both:
        for client in both.values():
            for call_id in ("x" * 129, "\n" * 129, "é" * 200):
                path = f"/v1/calls/{quote(call_id, safe='')}/settle"
                assert refused(await client.post(path)) == ["call_id"]
            ok = await client.post(f"/v1/calls/{'x' * 128}/settle")
            assert ok.status_code == 404  # a usable id: just no such call
