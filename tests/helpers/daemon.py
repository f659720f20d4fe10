"""A real `ratewarden serve` process for a test to talk to over real sockets.

One way to start it, wait for it and stop it, so every test that needs a daemon gets the
same clean environment, the same bounded wait and the same cleanup.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.redis_server import free_port

START_TIMEOUT_S = 20.0  # for a `ratewarden serve` process to answer /healthz
RATEWARDEN = (sys.executable, "-m", "ratewarden")


def clean_environment(**extra: str) -> dict[str, str]:
    """The environment without RATEWARDEN_*, proxy or multiprocess-metrics settings (the
    daemon under test is local and configured by the test), plus `extra`.

    Its data directory is its working directory (the test's own), never the user's
    ~/.local/state/ratewarden, which every test's daemon would share."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.upper().startswith("RATEWARDEN_")
        and "proxy" not in k.lower()
        and k != "PROMETHEUS_MULTIPROC_DIR"
    }
    env["RATEWARDEN_DATA_DIR"] = "."
    env.update(extra)
    return env


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`ratewarden ARGS` in a process of its own, as a shell runs it (a clean environment
    unless `env`), its output as text; never raises on its exit code."""
    return subprocess.run(
        [*RATEWARDEN, *args],
        env=env if env is not None else clean_environment(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@dataclass
class Daemon:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def running_daemon(
    cwd: Path,
    *flags: str,
    env: dict[str, str] | None = None,
    command: Sequence[str] = RATEWARDEN,
    ready: str = "/healthz",
    start_timeout_s: float = START_TIMEOUT_S,
) -> Iterator[Daemon]:
    """`<command> serve --port <free port> <flags>` in `cwd` with `env` (a clean
    environment if None), its output in a log file in `cwd`; yields once `ready` answers
    200 and stops the process (and any workers it forked) when the block ends."""
    port = free_port()
    log = cwd / f"serve-{port}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*command, "serve", "--port", str(port), *flags],
            cwd=cwd,
            env=clean_environment() if env is None else env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: workers are killed with it
        )
    daemon = Daemon(f"http://127.0.0.1:{port}", port, process, log)
    try:
        wait_until_healthy(daemon, ready, start_timeout_s)
        yield daemon
    finally:
        stop(process)


def wait_until_healthy(
    daemon: Daemon, path: str = "/healthz", timeout_s: float = START_TIMEOUT_S
) -> None:
    """Polls `path` until it answers 200; fails the test if the daemon exits or never does."""
    wait_until_answering(daemon.process, f"{daemon.url}{path}", "serve", daemon.log_text, timeout_s)


def wait_until_answering(
    process: subprocess.Popen[bytes],
    url: str,
    name: str,
    said: Callable[[], str],
    timeout_s: float = START_TIMEOUT_S,
) -> None:
    """Polls `url` until it answers 200; fails the test, with what the process `said`, if
    the process exits first or the time runs out."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(trust_env=False, timeout=1.0) as http:
        while True:
            if process.poll() is not None:
                pytest.fail(f"{name} exited with {process.returncode}:\n{said()}")
            with contextlib.suppress(httpx.TransportError):
                if http.get(url).status_code == 200:
                    return
            if time.monotonic() > deadline:
                pytest.fail(f"{name} did not answer {url} in {timeout_s}s:\n{said()}")
            time.sleep(0.05)  # bounded polling for the subprocess to listen


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL to the whole group if it has not exited within 10 s (a test
    may already have stopped it itself)."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def read_usage(url: str, user: str, tool: str | None = None) -> dict[str, dict[str, Any]]:
    """GET /v1/usage on the daemon at `url`: `user`'s counters (for `tool`), by rule."""
    params = {"user": user} if tool is None else {"user": user, "tool": tool}
    with httpx.Client(trust_env=False, timeout=10) as http:
        found = http.get(f"{url}/v1/usage", params=params).raise_for_status().json()
    return {item["rule"]: item for item in found["limits"]}


def read_denials(url: str, user: str | None = None) -> list[dict[str, Any]]:
    """GET /v1/denials on the daemon at `url`: the refusals (of `user`), newest first."""
    params = {} if user is None else {"user": user}
    with httpx.Client(trust_env=False, timeout=10) as http:
        found = http.get(f"{url}/v1/denials", params=params).raise_for_status().json()
    entries: list[dict[str, Any]] = found["denials"]
    return entries
