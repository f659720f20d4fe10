"""hermes-agent 0.19 runs `ratewarden hook hermes` as a shell hook (`hooks:` in its
config.yaml), through its own agent/shell_hooks.py and tool dispatch.

The hook command is the console script installed in hermes' venv, as a user would
install it; tests/hosts/drivers/hermes_shell_hook.py does what hermes' CLI does at start-up and
then dispatches terminal calls. Each call that runs appends a line to a file.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.hosts.scenario import (
    clean_environment,
    host_python,
    lines,
    nowhere,
    running_daemon,
    usage_of,
)

pytestmark = pytest.mark.timeout(900)  # the first run builds hermes' venv

DRIVER = Path(__file__).parent / "drivers" / "hermes_shell_hook.py"
POLICY = """\
version: 1
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 10/minute
  - name: one-terminal-at-a-time   # call after call passes only if post_tool_call settles
    match: {tool: terminal}
    per: [user]
    concurrency: 1
"""
CONFIG = """\
security:
  tirith_enabled: false
hooks:
  pre_tool_call:
    - matcher: terminal
      command: {command}
      timeout: 10
  post_tool_call:
    - matcher: terminal
      command: {command}
      timeout: 10
"""


@pytest.fixture(scope="module")
def hermes_python() -> Path:
    return host_python("hermes")


def run_hermes(python: Path, tmp_path: Path, hook_flags: str, calls: int) -> dict[str, Any]:
    home = tmp_path / "hermes-home"
    home.mkdir(exist_ok=True)
    command = f"{shlex.quote(str(python.with_name('ratewarden')))} hook hermes {hook_flags}"
    (home / "config.yaml").write_text(CONFIG.format(command=json.dumps(command)))
    out = tmp_path / "report.json"
    done = subprocess.run(
        [str(python), str(DRIVER), str(out), str(tmp_path / "ran.txt"), str(calls)],
        cwd=tmp_path,
        env=clean_environment(HERMES_HOME=str(home), HOME=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"driver failed:\n{done.stdout}\n{done.stderr}"
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["registered"] == ["pre_tool_call", "post_tool_call"]
    return report


def ran(tmp_path: Path) -> int:
    return lines(tmp_path / "ran.txt")


def test_hermes_shell_hook_blocks_the_11th_terminal_call(
    hermes_python: Path, tmp_path: Path
) -> None:
    with running_daemon(POLICY, tmp_path / "daemon") as daemon:
        report = run_hermes(hermes_python, tmp_path, f"--url {daemon.url} --user dana", 11)
        usage = usage_of(daemon, "dana", "terminal")
    results = report["results"]
    assert ran(tmp_path) == 10
    assert all(result.get("error") is None for result in results[:10])
    # hermes hands the model our message as the tool result {"error": ...}.
    assert results[10]["error"].startswith("Rate limit: max 10 terminal calls per minute")
    # Every post_tool_call settled its call, or the concurrency cap would have refused the
    # second; the ids were all `call_0`, told apart by hermes' api_request_id.
    assert usage == {"terminal-per-minute": 10, "one-terminal-at-a-time": 0}


def test_hermes_shell_hook_with_the_daemon_down(hermes_python: Path, tmp_path: Path) -> None:
    dead = nowhere()
    opened = run_hermes(hermes_python, tmp_path, f"--url {dead}", 1)
    assert ran(tmp_path) == 1
    assert opened["results"][0].get("error") is None
    closed = run_hermes(hermes_python, tmp_path, f"--url {dead} --fail closed", 1)
    assert ran(tmp_path) == 1
    assert closed["results"][0]["error"] == "Tool guard unavailable; terminal calls are paused"


def test_hermes_post_tool_call_payload_carries_the_result_the_hook_digests(
    hermes_python: Path, tmp_path: Path
) -> None:
    """Issue #29 item 2: hermes' post_tool_call payload holds the tool's `result` (in
    `extra`), so the hook settles with its digest. The hook command tees each payload to
    a file on its way to `ratewarden hook hermes`."""
    from ratewarden.arguments import result_digest
    from ratewarden.hooks import hermes
    from ratewarden.hooks.contract import PostCall

    payloads = tmp_path / "payloads.jsonl"
    with running_daemon(POLICY, tmp_path / "daemon") as daemon:
        hook = f"{shlex.quote(str(hermes_python.with_name('ratewarden')))} hook hermes"
        tee = f"tee -a {shlex.quote(str(payloads))} | {hook} --url {daemon.url} --user erin"
        home = tmp_path / "hermes-home"
        home.mkdir()
        (home / "config.yaml").write_text(
            CONFIG.format(command=json.dumps(f"sh -c {shlex.quote(tee)}"))
        )
        out = tmp_path / "report.json"
        done = subprocess.run(
            [str(hermes_python), str(DRIVER), str(out), str(tmp_path / "ran.txt"), "2"],
            cwd=tmp_path,
            env=clean_environment(HERMES_HOME=str(home), HOME=str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, f"driver failed:\n{done.stdout}\n{done.stderr}"
        usage = usage_of(daemon, "erin", "terminal")
    results = json.loads(out.read_text())["results"]
    # The hook reads one JSON object per payload; tee appended them one after another.
    decoder, text, found = json.JSONDecoder(), payloads.read_text(), []
    index = 0
    while index < len(text.rstrip()):
        payload, index = decoder.raw_decode(text, index)
        found.append(payload)
        while index < len(text) and text[index].isspace():
            index += 1
    posts = [p for p in found if p["hook_event_name"] == "post_tool_call"]
    assert len(posts) == 2
    for payload, result in zip(posts, results, strict=True):
        assert json.loads(payload["extra"]["result"]) == result  # what the model got
        event = hermes.read(json.dumps(payload).encode(), {})
        assert isinstance(event, PostCall)
        assert event.result_digest == result_digest(payload["extra"]["result"])
    assert usage == {"terminal-per-minute": 2, "one-terminal-at-a-time": 0}
