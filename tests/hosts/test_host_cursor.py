"""`ratewarden hook cursor` as Cursor runs it, against a real daemon.

Cursor's agent cannot be driven offline (tests/hosts/drivers/cursor_runner.py says why),
so these tests run the hook the way Cursor's agent runtime (`@cursor/sdk` 1.0.32) does:
its exact payloads (preToolUse, postToolUse, postToolUseFailure, with `user_email`), its
spawn (a here-document through bash, its environment variables), its reading of the
answer, and its loop around a Shell call (a refused call fires postToolUseFailure and
the model reads `user_message`). Each call that runs appends a line to a file.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from tests.hosts.drivers.cursor_runner import Answer, Session
from tests.hosts.scenario import (
    Daemon,
    appending,
    clean_environment,
    daemon_fixture,
    lines,
    nowhere,
    usage_of,
)

POLICY = """\
version: 1
tools:
  Shell: {label: terminal}
rules:
  - name: terminal-per-minute
    match: {tool: Shell}
    per: [user]
    rate: 10/minute
  - name: one-shell-at-a-time     # call after call passes only if postToolUse settles each
    match: {tool: Shell}
    per: [user]
    concurrency: 1
  - name: interns-ask-first
    match: {tool: Shell, user: "intern-*"}
    rate: 0/minute
    on_exceed: ask
"""
MESSAGE = "Rate limit: max 10 terminal calls per minute"
PAUSED = "Tool guard unavailable; Shell calls are paused"
NO_ANSWER = Answer(None)  # allowed: `{}`, no permission (Cursor's own approval applies)


daemon = daemon_fixture(POLICY)


def session(tmp_path: Path, email: str | None, flags: str, garbage: bool = False) -> Session:
    """A Cursor conversation signed in as `email`, with `ratewarden hook cursor FLAGS`
    from this checkout as its hook (`garbage`: fed that instead of Cursor's payload)."""
    workspace = tmp_path / "work"
    workspace.mkdir(exist_ok=True)
    command = f"{shlex.quote(sys.executable)} -m ratewarden hook cursor {flags}"
    if garbage:  # Cursor's here-document goes to the wrapping shell, which drops it
        command = f"bash -c {shlex.quote(f'cat > /dev/null; echo garbage | {command}')}"
    return Session(command, workspace, email, clean_environment(HOME=str(tmp_path)))


def test_cursor_hook_stops_the_11th_shell_call_of_the_signed_in_user(
    daemon: Daemon, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.txt"
    carol = session(tmp_path, "carol@example.com", f"--url {daemon.url}")  # no --user
    answers = [carol.shell(appending(ran)) for _ in range(11)]
    assert lines(ran) == 10  # the command ran 10 times, not 11
    assert answers[:10] == [NO_ANSWER] * 10  # allowed: `{}`, Cursor runs it
    assert answers[10].permission == "deny"
    results = list(carol.results.values())
    assert MESSAGE in results[10]  # what the model reads
    # The user reads the sentence, then which rule counted what (the refusal's detail).
    sentence, detail = str(answers[10].user_message).split("\n")
    assert sentence == answers[10].agent_message
    assert detail.startswith("ratewarden: rule terminal-per-minute (rate) refused the call")
    assert "user=carol@example.com" in detail
    # Counted for the e-mail Cursor sent; each call settled by postToolUse, or the
    # concurrency cap of 1 would have refused the second.
    assert usage_of(daemon, "carol@example.com", "Shell") == {
        "terminal-per-minute": 10,
        "one-shell-at-a-time": 0,
    }
    # Another user still gets through.
    dave = session(tmp_path, "dave@example.com", f"--url {daemon.url}")
    assert dave.shell(appending(ran)) == NO_ANSWER
    assert lines(ran) == 11


def test_user_flag_wins_over_cursor_email(daemon: Daemon, tmp_path: Path) -> None:
    ran = tmp_path / "ran.txt"
    erin = session(tmp_path, "erin@example.com", f"--url {daemon.url} --user team-erin")
    erin.shell(appending(ran))
    assert lines(ran) == 1
    assert usage_of(daemon, "team-erin", "Shell")["terminal-per-minute"] == 1
    assert usage_of(daemon, "erin@example.com", "Shell")["terminal-per-minute"] == 0


def test_cursor_hook_asks_with_cursor_own_prompt(daemon: Daemon, tmp_path: Path) -> None:
    ran = tmp_path / "ran.txt"
    intern = session(tmp_path, "intern-1@example.com", f"--url {daemon.url}")
    answer = intern.shell(appending(ran))
    assert lines(ran) == 0  # nobody approved it in this loop
    assert answer.permission == "ask"
    assert answer.agent_message is not None
    assert "Rate limit: max 0 terminal calls per minute" in answer.agent_message


def test_cursor_hook_with_the_daemon_down(tmp_path: Path) -> None:
    dead = nowhere()
    ran = tmp_path / "ran.txt"
    # Failing open (the default): no answer, and the call runs.
    opened = session(tmp_path, "carol@example.com", f"--url {dead}")
    assert opened.shell(appending(ran)) == NO_ANSWER
    assert lines(ran) == 1
    # Failing closed: the model is told the guard is unavailable, and nothing runs.
    closed = session(tmp_path, "carol@example.com", f"--url {dead} --fail closed")
    assert closed.shell(appending(ran)).permission == "deny"
    assert lines(ran) == 1
    assert PAUSED in next(iter(closed.results.values()))


def test_cursor_hook_unreadable_input(tmp_path: Path) -> None:
    # A broken installation (the hook fed garbage instead of Cursor's JSON): failing
    # open, a failed hook (exit 1) and the call runs; failing closed, a deny.
    ran = tmp_path / "ran.txt"
    dead = nowhere()
    opened = session(tmp_path, None, f"--url {dead}", garbage=True)
    assert opened.shell(appending(ran)).failed is not None
    assert lines(ran) == 1
    closed = session(tmp_path, None, f"--url {dead} --fail closed", garbage=True)
    assert closed.shell(appending(ran)).permission == "deny"
    assert lines(ran) == 1
    result = next(iter(closed.results.values()))
    assert "Tool guard unavailable: cannot read the cursor hook input" in result


def test_cursor_fail_closed_hook_lets_an_allowed_call_run(daemon: Daemon, tmp_path: Path) -> None:
    ran = tmp_path / "ran.txt"
    carol = session(tmp_path, "carol@example.com", f"--url {daemon.url}")
    carol.fail_closed = True
    carol.shell(appending(ran))
    assert lines(ran) == 1
