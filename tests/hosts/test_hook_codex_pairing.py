"""`ratewarden hook codex` processes started at once, as Codex starts them for parallel
tool calls, against a real `ratewarden serve`, with a model that gives every call the id
`call_0`: each PostToolUse settles a call of its own (hooks/ledger.py), and a call the
daemon refused leaves nothing behind. The real Codex CLI drives the same hooks in
tests/hosts/test_host_codex.py."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.hosts.scenario import Daemon, clean_environment, daemon_fixture, settles, usage_of

POLICY = """\
version: 1
tools:
  Bash: {label: terminal}
rules:
  - name: at-a-time
    match: {tool: Bash}
    per: [user]
    concurrency: {slots}
"""
PRE = {
    "session_id": "01a20fa4-b660-7922-a51a-a9deae433ae4",
    "turn_id": "01a20fa4-b676-70b1-9fe5-66c1e98ff7cd",
    "transcript_path": None,
    "cwd": "/work",
    "hook_event_name": "PreToolUse",
    "model": "local-model",
    "permission_mode": "bypassPermissions",
    "tool_name": "Bash",
    "tool_use_id": "call_0",
}


eight = daemon_fixture(POLICY.replace("{slots}", "8"), name="eight")
one = daemon_fixture(POLICY.replace("{slots}", "1"), name="one")


def payload(event: str, command: str) -> str:
    return json.dumps({**PRE, "hook_event_name": event, "tool_input": {"command": command}})


def hooks_at_once(daemon: Daemon, home: Path, payloads: list[str]) -> list[str]:
    """One `ratewarden hook codex` process per payload, all at once (a thread each); their
    stdout, in the same order."""
    env = clean_environment(HOME=str(home))
    for name in ("XDG_RUNTIME_DIR", "XDG_CACHE_HOME"):
        env.pop(name, None)
    flags = ["--url", daemon.url, "--user", "erin", "--timeout", "10"]

    def hook(stdin: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "ratewarden", "hook", "codex", *flags],
            input=stdin,
            capture_output=True,
            env=env,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    with ThreadPoolExecutor(len(payloads)) as pool:
        return list(pool.map(hook, payloads))


def used(daemon: Daemon) -> dict[str, Any]:
    return usage_of(daemon, "erin", "Bash")


def ledger_of(home: Path) -> list[str]:
    folder = home / ".cache" / "ratewarden" / "codex"
    return sorted(path.name for path in folder.iterdir()) if folder.exists() else []


def test_eight_parallel_calls_of_call_0_are_eight_calls_each_settled(
    eight: Daemon, tmp_path: Path
) -> None:
    commands = ["make a"] * 4 + ["make b"] * 4  # alike in fours, apart by their input
    pres = hooks_at_once(eight, tmp_path, [payload("PreToolUse", c) for c in commands])
    assert pres == [""] * 8  # all allowed: nothing printed
    assert used(eight) == {"at-a-time": 8}
    hooks_at_once(eight, tmp_path, [payload("PostToolUse", c) for c in commands])
    assert settles(eight) == {"settled": 8}
    assert used(eight) == {"at-a-time": 0}
    assert ledger_of(tmp_path) == [".lock"]


def test_a_refused_call_leaves_nothing_and_the_next_call_is_settled(
    one: Daemon, tmp_path: Path
) -> None:
    # Two calls at once under a cap of one: the second is refused and gets no
    # PostToolUse; the first's PostToolUse settles the first, and the next call runs.
    pres = hooks_at_once(one, tmp_path, [payload("PreToolUse", "make a")] * 2)
    assert sorted(bool(output) for output in pres) == [False, True]  # one refusal printed
    hooks_at_once(one, tmp_path, [payload("PostToolUse", "make a")])
    assert used(one) == {"at-a-time": 0}
    assert hooks_at_once(one, tmp_path, [payload("PreToolUse", "make a")]) == [""]
    hooks_at_once(one, tmp_path, [payload("PostToolUse", "make a")])
    assert settles(one) == {"settled": 2}
    assert used(one) == {"at-a-time": 0}
    assert ledger_of(tmp_path) == [".lock"]  # the refused call kept nothing
