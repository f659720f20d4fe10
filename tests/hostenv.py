"""Virtual environments for the host frameworks, and a daemon for them to ask.

The hosts' pinned dependencies conflict with each other (hermes-agent pins openai 2.x,
openai-agents needs openai 3.x), so each host gets its own venv under `.hosts/<name>`,
with ratewarden installed from this checkout *with its dependencies*: that install is
itself the proof that ratewarden co-installs with the host's pins. A venv is reused
while its requirements and ratewarden's pyproject are unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent
HOSTS_DIR = ROOT / ".hosts"


def host_python(name: str, requirements: list[str]) -> Path:
    """The python of host `name`'s venv, created or refreshed as needed."""
    venv = HOSTS_DIR / name
    stamp = venv / "ratewarden-stamp.json"
    wanted = {
        "requirements": requirements,
        "pyproject": hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest(),
        "python": sys.version,
    }
    python = venv / "bin" / "python"
    if stamp.exists() and json.loads(stamp.read_text()) == wanted and python.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run(
        [*pip, *requirements, "-e", str(ROOT)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"cannot install {name}'s venv:\n{done.stdout}\n{done.stderr}")
    stamp.write_text(json.dumps(wanted))
    return python


def clean_environment(**extra: str) -> dict[str, str]:
    """The environment without RATEWARDEN_* and proxy settings, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("RATEWARDEN_") and "proxy" not in k.lower()
    }
    env.update(extra)
    return env


@dataclass
class Daemon:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def running_daemon(policy: str, directory: Path, *flags: str) -> Iterator[Daemon]:
    """`ratewarden serve` on a free port with `policy`, until the block ends."""
    directory.mkdir(parents=True, exist_ok=True)
    policy_path = directory / "policy.yaml"
    policy_path.write_text(policy)
    port = free_port()
    log = directory / "daemon.log"
    command = [sys.executable, "-m", "ratewarden", "serve", "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--policy", str(policy_path), *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=clean_environment(),
            cwd=directory,
        )
    daemon = Daemon(f"http://127.0.0.1:{port}", process, log)
    try:
        _wait_ready(daemon)
        yield daemon
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(daemon: Daemon) -> None:
    deadline = time.monotonic() + 20
    with httpx.Client(trust_env=False) as http:
        while time.monotonic() < deadline:
            if daemon.process.poll() is not None:
                raise RuntimeError(f"daemon exited:\n{daemon.log_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if http.get(f"{daemon.url}/healthz", timeout=0.5).status_code == 200:
                    return
            time.sleep(0.05)
    raise RuntimeError(f"daemon not ready:\n{daemon.log_text()}")


TERMINAL_POLICY = """\
version: 1
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 10/minute
"""
