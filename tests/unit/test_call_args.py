"""What every adapter and hook sends as a call's `args` (names.call_args, check_request).

Hosts hand the arguments over as a dict or as JSON text; what the daemon would refuse
(not an object, past a wire cap) is left out, so the call is still checked. Each refused
case is checked against the wire itself: the daemon's own request model must refuse the
same arguments, or leaving them out would be a loss for nothing.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any

import pytest
from pydantic_core import to_json

from ratewarden.hooks.contract import PreCall
from ratewarden.wire.bodies import MAX_ARGS_BYTES, MAX_ARGS_DEPTH, CheckRequest
from ratewarden.wire.bounded import count_items, too_many_items
from ratewarden.wire.names import MAX_ARGS_ITEMS, call_args, check_request


def nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def sent(value: object) -> dict[str, Any] | None:
    """What `call_args` sends whole (asserting that nothing was cut)."""
    found = call_args(value)
    if found is None:
        return None
    assert found.cut == ()
    return found.value


def test_a_dict_or_json_text_of_an_object_is_sent() -> None:
    assert sent({"command": "ls", "n": 1}) == {"command": "ls", "n": 1}
    assert sent('{"command": "ls", "n": 1}') == {"command": "ls", "n": 1}
    assert sent(b'{"command": "ls"}\n') == {"command": "ls"}  # agent-code's stdin
    assert sent({}) == {}
    assert call_args(None) is None  # a call with no arguments has none


def test_python_values_become_what_json_makes_of_them() -> None:
    """pydantic-ai validates arguments into Python objects; the client sends JSON."""
    args = sent({"when": datetime.date(2026, 1, 2), "pair": (1, 2), 3: "x"})
    assert args == {"when": "2026-01-02", "pair": [1, 2], "3": "x"}
    assert json.loads(json.dumps(args)) == args


@pytest.mark.parametrize(
    "given",
    ["rm -rf /", "[1, 2]", "not json", b"\xff", ["a"], 3, '"text"', "[" * 100_000],
    ids=["plain text", "json list", "not json", "not utf-8", "list", "int",
         "json string", "too deep to parse"],
)  # fmt: skip
def test_what_is_not_a_json_object_is_sent_as_unreadable(given: object) -> None:
    """Never as no arguments: every condition on them is unknown (`*` cut)."""
    found = call_args(given)
    assert found is not None
    assert found.cut == ("*",)
    assert the_daemon_takes(found.value)


def past_the_caps() -> dict[str, dict[str, Any]]:
    return {
        "larger than MAX_ARGS_BYTES": {"text": "x" * MAX_ARGS_BYTES},
        "deeper than MAX_ARGS_DEPTH": nested(MAX_ARGS_DEPTH + 1),
        "not finite": {"n": float("nan")},
        "a lone surrogate": {"text": "\ud800"},
        "an integer no JSON reader takes": {"n": 10**5000},
    }


@pytest.mark.parametrize("name", sorted(past_the_caps()))
def test_arguments_past_a_wire_cap_are_bounded_with_their_cut_named(name: str) -> None:
    args = past_the_caps()[name]
    assert not the_daemon_takes(args)
    found = call_args(args)
    assert found is not None
    assert found.cut
    assert the_daemon_takes(found.value)


def the_daemon_takes(args: dict[str, Any]) -> bool:
    """Whether a check with `args` is built, written and read by the wire's own model."""
    try:
        text = CheckRequest(user="u", tool="t", args=args).model_dump_json()
        CheckRequest.model_validate_json(text)
    except ValueError:  # a ValidationError, or a PydanticSerializationError
        return False
    return True


def test_right_at_the_caps_they_are_sent() -> None:
    deep = nested(MAX_ARGS_DEPTH)
    large = {"text": "x" * (MAX_ARGS_BYTES - len('{"text":""}'))}
    for args in (deep, large):
        assert the_daemon_takes(args)
        assert sent(args) == args


def test_more_items_than_a_check_body_may_hold_are_bounded() -> None:
    """Small in bytes, but the daemon refuses a body of more than MAX_ITEMS items unread."""
    many = {"files": list(range(5000))}
    body = CheckRequest(user="u", tool="t", args=many).model_dump_json().encode()
    assert too_many_items(body)  # what the daemon would answer: a 422, then the fail mode
    found = call_args(many)
    assert found is not None
    assert found.cut == ("files",)
    request = check_request(user="u", tool="t", args=many)
    assert not too_many_items(request.model_dump_json().encode())
    # The most a call may carry (the object, the list, its commas) fits the fullest body:
    # every field, 32 tags.
    fits = {"files": list(range(MAX_ARGS_ITEMS - 1))}
    assert count_items(to_json(fits)) == MAX_ARGS_ITEMS
    assert sent(fits) == fits
    assert call_args({"files": list(range(MAX_ARGS_ITEMS))}).cut == ("files",)  # type: ignore[union-attr]
    fullest = CheckRequest.model_validate(
        {
            "user": "u", "tool": "t", "session": "s", "team": "t", "call_id": "c",
            "cost": 1.0, "approved": True, "args": fits,
            "metadata": {"read_only": True, "destructive": True, "idempotent": True,
                         "open_world": True, "requires_confirmation": True, "title": "x",
                         "tags": [f"tag{i}" for i in range(32)]},
        }
    )  # fmt: skip
    assert not too_many_items(fullest.model_dump_json().encode())


def test_check_request_carries_them_and_says_nothing_of_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    secret = {"command": "deploy", "token": "s3cr3t-value"}
    request = check_request(user="u", tool="terminal", args=json.dumps(secret))
    assert request.args == secret
    assert request.args_cut is None
    assert check_request(user="u", tool="terminal", args="[1]").args_cut == ["*"]
    assert check_request(user="u", tool="terminal", args={"text": "\ud800"}).args_cut == ["text"]
    padded = check_request(user="u", tool="terminal", args={"t": "s3cr3t-value" * 9000})
    assert padded.args_cut == ["t"]
    assert "s3cr3t-value" not in caplog.text  # neither sent nor cut is logged
    assert "s3cr3t-value" not in repr(PreCall(tool="Bash", args=json.dumps(secret)))


def test_check_request_adds_what_a_hook_already_cut() -> None:
    request = check_request(user="u", tool="t", args={"a": "x" * 70_000}, args_cut=["b"])
    assert request.args_cut == ["b", "a"]
