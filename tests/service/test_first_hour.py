"""The first hour with ratewarden, as a newcomer has it (issue 30, item 5): `serve` in a
terminal, and the README's commands as written, against real `ratewarden serve` processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.daemon import (
    RATEWARDEN,
    Daemon,
    clean_environment,
    running_daemon,
    stop,
    wait_until_healthy,
)
from tests.helpers.redis_server import free_port

DENY_ALL = """\
version: 1
rules:
  - {name: nothing, match: {tool: terminal}, rate: 0/minute}
"""


@contextlib.contextmanager
def serve_in_a_terminal(cwd: Path, **env: str) -> Iterator[tuple[Daemon, list[bytes]]]:
    """`ratewarden serve` with its stdout and stderr on a pseudo-terminal, as someone who
    types it sees it; yields the daemon and what the terminal showed (complete once the
    block ends and the daemon has stopped)."""
    port = free_port()
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [*RATEWARDEN, "serve", "--port", str(port), "--policy", "policy.yaml"],
        cwd=cwd,
        env=clean_environment(**env),
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,
    )
    os.close(terminal)
    shown: list[bytes] = []

    def read() -> None:  # until the daemon closes the terminal (EIO on Linux)
        with contextlib.suppress(OSError):
            while chunk := os.read(controller, 4096):
                shown.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    log = cwd / "unused.log"
    log.write_text("(the output went to a terminal)")
    daemon = Daemon(f"http://127.0.0.1:{port}", port, process, log)
    try:
        wait_until_healthy(daemon)
        yield daemon, shown
    finally:
        stop(process)
        reader.join(timeout=10)
        os.close(controller)


@pytest.mark.parametrize("asked", [False, True])
def test_in_a_terminal_audit_lines_are_printed_only_when_asked(tmp_path: Path, asked: bool) -> None:
    (tmp_path / "policy.yaml").write_text(DENY_ALL)
    env = {"RATEWARDEN_AUDIT_LOG": "-"} if asked else {}
    with (
        serve_in_a_terminal(tmp_path, **env) as (daemon, shown),
        httpx.Client(base_url=daemon.url, trust_env=False) as http,
    ):
        answer = http.post("/v1/check", json={"user": "u", "tool": "terminal"})
        assert answer.json()["decision"] == "deny"
        assert http.get("/v1/denials").json()["denials"]  # audited all the same
    text = b"".join(shown).decode()
    assert " ready on " in text
    assert ('"event": "deny"' in text) is asked, text
    hint = "audit lines are not printed in a terminal: set RATEWARDEN_AUDIT_LOG=-"
    assert (hint in text) is not asked, text


def test_out_of_a_terminal_audit_lines_go_to_stderr_by_default(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(DENY_ALL)
    with (
        running_daemon(tmp_path, "--policy", "policy.yaml") as daemon,
        httpx.Client(base_url=daemon.url, trust_env=False) as http,
    ):
        assert http.post("/v1/check", json={"user": "u", "tool": "terminal"}).status_code == 200
    assert '"event": "deny"' in daemon.log_text()  # a log collector gets them, as before
    assert "not printed in a terminal" not in daemon.log_text()


PER_TOOL = """\
version: 1
rules:
  - {name: per-user, rate: 100/minute}
  - {name: each-tool, per: [user, tool], rate: 10/minute}
  - {name: each-session, per: [user, session], rate: 50/minute}
  - {name: each-tool-in-a-session, per: [user, session, tool], rate: 5/minute}
  - {name: repeats, per: [user, tool, args], rate: 3/minute}
"""


def test_usage_says_how_to_see_the_rules_it_leaves_out(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(PER_TOOL)
    with running_daemon(tmp_path, "--policy", "policy.yaml") as daemon:
        bare = ratewarden_client(daemon, "usage", "--user", "u")
        assert bare.returncode == 0, bare.stderr
        assert bare.stdout.splitlines()[0] == "usage for u"
        assert bare.stdout.splitlines()[2].split()[0] == "per-user"
        assert bare.stdout.splitlines()[3:] == [
            "rules per tool, not shown: each-tool (add --tool NAME)",
            "rules per session, not shown: each-session (add --session ID)",
            "rules per session and tool, not shown: each-tool-in-a-session "
            "(add --session ID --tool NAME)",
        ]
        full = ratewarden_client(daemon, "usage", "--user", "u", "--tool", "t", "--session", "s")
        assert [line.split()[0] for line in full.stdout.splitlines()[2:]] == [
            "per-user", "each-tool", "each-session", "each-tool-in-a-session"
        ]  # fmt: skip
        with httpx.Client(trust_env=False) as http:
            answer = http.get(f"{daemon.url}/v1/usage", params={"user": "u", "tool": "t"}).json()
        assert answer["unshown"] == [
            {"rule": "each-session", "needs": ["session"]},
            {"rule": "each-tool-in-a-session", "needs": ["session"]},
        ]


def ratewarden_client(daemon: Daemon, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RATEWARDEN, command, "--url", daemon.url, *args],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


# -- the README's commands, as written -----------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def readme_shell_lines() -> list[str]:
    """Every line of the README's `sh` blocks, its comment cut off."""
    blocks = re.findall(r"```sh\n(.*?)```", README, re.S)
    return [line.split("   #")[0].strip() for block in blocks for line in block.splitlines()]


def test_the_readme_policy_is_the_file_it_names() -> None:
    [block] = re.findall(r"```yaml\n(.*?)```", README, re.S)
    assert (ROOT / "examples" / "ratewarden.yaml").read_text() == block


def test_the_readme_policy_commands_work_on_a_clone() -> None:
    commands = [line for line in readme_shell_lines() if " policy " in line]
    assert [c.split()[:3] for c in commands] == [
        [".venv/bin/ratewarden", "policy", "check"],
        [".venv/bin/ratewarden", "policy", "explain"],
    ]
    for command in commands:
        argv = shlex.split(command)
        done = subprocess.run(
            [*RATEWARDEN, *argv[1:]],
            cwd=ROOT,
            env=clean_environment(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        named = argv[3]
        if (ROOT / ".git").exists():  # in a clone: the file is one git gives it
            tracked = subprocess.run(
                ["git", "ls-files", "--error-unmatch", named], cwd=ROOT, capture_output=True,
                check=False,
            )  # fmt: skip
            assert tracked.returncode == 0, f"{named} is not in the repository"


def test_the_readme_check_settle_and_curl_work_as_written(tmp_path: Path) -> None:
    """The README's client lines against a real daemon: check, then settle with the id it
    printed, then the curl line with the system's curl (no `--json`: curl 7.82+ only)."""
    lines = readme_shell_lines()
    [check, settle] = [line for line in lines if line.split()[1:2] in (["check"], ["settle"])]
    [curl, model_check, model_settle] = [line for line in lines if line.startswith("curl ")]
    for text in (README, *(p.read_text() for p in (ROOT / "docs").glob("*.md"))):
        assert not re.search(r"curl [^\n]*--json", text)
    with running_daemon(tmp_path) as daemon:
        env = clean_environment(RATEWARDEN_URL=daemon.url)
        checked = subprocess.run(
            [*RATEWARDEN, *shlex.split(check)[1:]], env=env, capture_output=True, text=True,
            timeout=30, check=False,
        )  # fmt: skip
        assert checked.returncode == 0, checked.stderr
        call_id = re.fullmatch(r"allow call_id=(\S+)\n", checked.stdout)
        assert call_id is not None, checked.stdout
        argv = shlex.split(settle.replace("rw-…", call_id[1]))
        settled = subprocess.run(
            [*RATEWARDEN, *argv[1:]], env=env, capture_output=True, text=True, timeout=30,
            check=False,
        )  # fmt: skip
        assert (settled.returncode, settled.stdout) == (
            0,
            f"{call_id[1]}: settled (daily-spend 0.00)\n",
        )
        if shutil.which("curl") is None:
            pytest.skip("no curl here")
        posted = subprocess.run(
            shlex.split(curl.replace("localhost:8470", f"127.0.0.1:{daemon.port}")),
            env=env, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert posted.returncode == 0, posted.stderr
        assert json.loads(posted.stdout)["decision"] == "allow"

        def run_curl(line: str) -> Any:
            line = line.replace("localhost:8470", f"127.0.0.1:{daemon.port}")
            done = subprocess.run(
                shlex.split(line), env=env, capture_output=True, text=True, timeout=30,
                check=False,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)

        # The model call: checked, then settled with the id it got; charged its usage.
        model_call = run_curl(model_check)
        assert model_call["decision"] == "allow", model_call
        settled_model = run_curl(model_settle.replace("rw-…", model_call["call_id"]))
        assert settled_model["outcome"] == "settled", settled_model
        # 1 180 input tokens at 2.5 USD per million, 350 output at 10
        assert settled_model["charged"] == {"daily-spend": 0.00645}
