"""Paths into a call's `args`, their canonical JSON and the fingerprint counter keys hold."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratewarden.arguments import MISSING, ArgPath, as_text, canonical_json, digest

ARGS = {
    "command": "ls -la",
    "options": {"force": True, "0": "a key that is digits"},
    "files": ["a.txt", {"name": "b.txt"}],
    "count": 3,
    "nothing": None,
}


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        ("command", ("command",)),
        ("options.force", ("options", "force")),
        ("files.0", ("files", "0")),
        ("files.1.name", ("files", "1", "name")),
        ("dash-and_underscore", ("dash-and_underscore",)),
        ("ключ.名前", ("ключ", "名前")),
        ("*", ()),
        (".".join(["k"] * 32), ("k",) * 32),
    ],
)
def test_a_valid_path_parses_into_its_steps(text: str, steps: tuple[str, ...]) -> None:
    path = ArgPath.parse(text)
    assert path == ArgPath(text, steps)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "empty argument path"),
        ("a..b", "empty segment (two dots in a row)"),
        (".a", "starts with a dot"),
        (".", "starts with a dot"),
        ("a.", "ends with a dot"),
        (".".join(["k"] * 33), "has 33 segments; at most 32 are allowed"),
        ("a b", "whitespace or a control character (' ' at position 1)"),
        ("a\tb", "whitespace or a control character ('\\t' at position 1)"),
        ("a\x00", "whitespace or a control character ('\\x00' at position 1)"),
        ("a.*", "'*' stands alone, for the whole args"),
        ("*.a", "'*' stands alone"),
        ("**", "'*' stands alone"),
        ("file*", "'*' stands alone"),
        (3, "must be a string, got int"),
    ],
)
def test_an_invalid_path_is_refused_with_its_problem_named(text: Any, problem: str) -> None:
    with pytest.raises(ValueError, match="argument path") as raised:
        ArgPath.parse(text)
    assert problem in str(raised.value)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("command", "ls -la"),
        ("options.force", True),
        ("options.0", "a key that is digits"),  # digits on a mapping are a key
        ("files.0", "a.txt"),
        ("files.1.name", "b.txt"),
        ("files.1", {"name": "b.txt"}),
        ("nothing", None),  # present, and null: not MISSING
        ("*", ARGS),
        ("absent", MISSING),
        ("options.absent", MISSING),
        ("files.2", MISSING),  # out of range
        ("files.-1", MISSING),  # not an index; lists have no negative steps
        ("files.first", MISSING),
        ("files.99999999999999999999999999", MISSING),
        ("command.0", MISSING),  # a string is a scalar, not a list of letters
        ("count.0", MISSING),
        ("options.force.0", MISSING),  # nor is a bool
        ("nothing.x", MISSING),
    ],
)
def test_a_path_resolves_to_its_value_or_missing(text: str, value: Any) -> None:
    assert ArgPath.parse(text).resolve(ARGS) == value


@pytest.mark.parametrize("text", ["*", "command", "files.0"])
def test_a_call_without_args_reaches_nothing(text: str) -> None:
    assert ArgPath.parse(text).resolve(None) is MISSING


def test_the_whole_of_empty_args_is_present() -> None:
    assert ArgPath.parse("*").resolve({}) == {}


def test_missing_is_a_value_of_its_own() -> None:
    assert repr(MISSING) == "MISSING"
    assert MISSING is not None
    assert ArgPath.parse("absent").resolve(ARGS) is MISSING


def test_canonical_json_is_compact_with_keys_sorted() -> None:
    assert canonical_json({"b": 1, "a": [1, 2.5, "é", None, True]}) == (
        '{"a":[1,2.5,"é",null,true],"b":1}'
    )


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_canonical_json_refuses_what_json_cannot_carry(value: float) -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        canonical_json(value)


@pytest.mark.parametrize(
    ("value", "text"),
    [("ls", "ls"), ("", ""), ('"quoted"', '"quoted"'), (3, "3"), (2.5, "2.5"), (True, "true"),
     (None, "null"), (["a", 1], '["a",1]'), ({"y": 1, "x": "é"}, '{"x":"é","y":1}')],
)  # fmt: skip
def test_as_text_keeps_a_string_and_writes_anything_else_as_json(value: Any, text: str) -> None:
    assert as_text(value) == text


# --- the fingerprint -------------------------------------------------------------------

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
JSON_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=24,
)
# Few distinct leaves and keys, so that two independent draws are often equal.
_SMALL_SCALARS = st.sampled_from([None, True, False, 0, 1, 1.5, "", "a", "b"])
SMALL_JSON_VALUES = st.recursive(
    _SMALL_SCALARS,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.sampled_from("ab"), inner),
    max_leaves=4,
)


def reordered(value: Any, rng: random.Random) -> Any:
    """The same value with every mapping rebuilt in a shuffled insertion order."""
    if isinstance(value, dict):
        items = [(key, reordered(item, rng)) for key, item in value.items()]
        rng.shuffle(items)
        return dict(items)
    if isinstance(value, list):
        return [reordered(item, rng) for item in value]
    return value


@given(args=st.dictionaries(st.text(max_size=4), JSON_VALUES), rng=st.randoms())
@pytest.mark.slow
def test_a_reordered_copy_has_the_same_fingerprint(args: dict[str, Any], rng: Any) -> None:
    copy = reordered(args, rng)
    assert digest(copy) == digest(args)
    assert canonical_json(copy) == canonical_json(args)


@given(
    a=st.dictionaries(st.sampled_from("abc"), SMALL_JSON_VALUES),
    b=st.dictionaries(st.sampled_from("abc"), SMALL_JSON_VALUES),
    rng=st.randoms(),
)
def test_fingerprints_are_equal_exactly_when_the_canonical_json_is(
    a: dict[str, Any], b: dict[str, Any], rng: Any
) -> None:
    b = reordered(b, rng)
    assert (digest(a) == digest(b)) == (canonical_json(a) == canonical_json(b))


@given(JSON_VALUES)
def test_a_fingerprint_is_32_hex_characters(value: Any) -> None:
    fingerprint = digest(value)
    assert len(fingerprint) == 32
    assert set(fingerprint) <= set("0123456789abcdef")


def test_a_fingerprint_never_holds_the_text() -> None:
    secret = {"command": "curl -H 'Authorization: Bearer sk-live-4242'", "pad": "x" * 65536}
    fingerprint = digest(secret)
    assert "sk-live" not in fingerprint
    assert len(fingerprint) == 32
    assert fingerprint != digest({**secret, "pad": "y" * 65536})


def test_a_lone_surrogate_is_fingerprinted_not_refused() -> None:
    # JSON can carry "\ud800"; Python's json module reads it into a str UTF-8 cannot encode.
    assert digest("\ud800") != digest("\ud801")
    assert len(digest({"text": "\ud800"})) == 32
