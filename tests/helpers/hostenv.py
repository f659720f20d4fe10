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
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.daemon import START_TIMEOUT_S, Daemon, clean_environment
from tests.helpers.daemon import running_daemon as serving

# The daemon helpers are re-exported: they lived here first.
__all__ = [
    "HOSTS_DIR", "ROOT", "START_TIMEOUT_S", "TERMINAL_POLICY",
    "Daemon", "clean_environment", "host_python", "running_daemon",
]  # fmt: skip

ROOT = Path(__file__).resolve().parents[2]
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


@contextlib.contextmanager
def running_daemon(policy: str, directory: Path, *flags: str) -> Iterator[Daemon]:
    """`ratewarden serve` on a free port with `policy`, until the block ends."""
    directory.mkdir(parents=True, exist_ok=True)
    policy_path = directory / "policy.yaml"
    policy_path.write_text(policy)
    with serving(directory, "--policy", str(policy_path), *flags) as daemon:
        yield daemon


TERMINAL_POLICY = """\
version: 1
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 10/minute
"""
