"""A refusal's one-line detail in each host's own answer (issue #29, item 4): where the
host shows its user something beside the model's reason, the detail goes there; where
it has one message only (agent-code's first line, hermes' block), the model's sentence
stays alone."""

from __future__ import annotations

import json

import pytest

from ratewarden.engine.decision import Verdict, detail_line
from ratewarden.hooks import agent_code, claude_code, codex, cursor, gemini, hermes

SENTENCE = "Rate limit: max 10 terminal calls per minute (retry in 41s)"
DETAIL = "ratewarden: rule per-user (rate) refused the call for user=alice: 10 of 10 used"


@pytest.mark.parametrize(
    ("host", "where"),
    [(claude_code, "systemMessage"), (codex, "systemMessage"), (gemini, "systemMessage")],
)
def test_hosts_with_a_system_message_show_the_detail_there(host: object, where: str) -> None:
    with_detail = json.loads(host.refuse("deny", SENTENCE, DETAIL).stdout)  # type: ignore[attr-defined]
    without = json.loads(host.refuse("deny", SENTENCE, "").stdout)  # type: ignore[attr-defined]
    assert with_detail[where] == DETAIL
    assert where not in without
    assert {k: v for k, v in with_detail.items() if k != where} == without  # the rest as before


def test_cursor_shows_the_detail_to_the_user_and_the_sentence_to_the_agent() -> None:
    answer = json.loads(cursor.refuse("deny", SENTENCE, DETAIL).stdout)
    assert answer["agent_message"] == SENTENCE
    assert answer["user_message"] == f"{SENTENCE}\n{DETAIL}"
    assert json.loads(cursor.refuse("deny", SENTENCE, "").stdout)["user_message"] == SENTENCE


@pytest.mark.parametrize("host", [agent_code, hermes])
def test_hosts_with_one_message_keep_the_sentence_alone(host: object) -> None:
    assert host.refuse("deny", SENTENCE, DETAIL) == host.refuse("deny", SENTENCE, "")  # type: ignore[attr-defined]
    assert DETAIL not in repr(host.refuse("deny", SENTENCE, DETAIL))  # type: ignore[attr-defined]


def verdict(**fields: object) -> Verdict:
    base: dict[str, object] = {
        "rule": "per-user",
        "kind": "rate",
        "admitted": False,
        "limit": 10,
        "remaining": 0,
        "retry_after": 41.0,
        "reset_after": 41.0,
    }
    return Verdict(**(base | fields))  # type: ignore[arg-type]


def test_the_detail_line_names_each_part_the_verdict_has() -> None:
    assert detail_line(verdict(scope={"user": "alice", "tool": "terminal"}, used=10)) == (
        "ratewarden: rule per-user (rate) refused the call for user=alice, tool=terminal: "
        "10 of 10 used; retry in 41s"
    )
    assert detail_line(
        verdict(kind="access", retry_after=None, condition="tool in ['terminal']")
    ) == (
        "ratewarden: rule per-user (access) refused the call; it applies when tool in ['terminal']"
    )
    assert detail_line(verdict(scope={"session": None}, retry_after=None, used=10)) == (
        "ratewarden: rule per-user (rate) refused the call for session=-: 10 of 10 used"
    )


def test_the_detail_line_escapes_what_would_make_it_read_otherwise() -> None:
    """A user's name is the caller's text: a right-to-left override or a zero-width space
    in it reaches the user's terminal escaped, never acting on the line."""
    line = detail_line(verdict(scope={"user": "alice\u202egnp.exe", "tool": "t\u200b"}, used=10))
    assert "\u202e" not in line
    assert "\u200b" not in line
    assert "user=alice\\u202egnp.exe, tool=t\\u200b" in line
    assert line.isprintable()
