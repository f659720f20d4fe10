"""Environments for the host frameworks and CLIs, and a daemon for them to ask.

The hosts' pinned dependencies conflict with each other (hermes-agent pins openai 2.x,
openai-agents needs openai 3.x), so each Python host gets its own venv under
`.hosts/<name>`, with ratewarden installed from this checkout *with its dependencies*
(the base package, as a host installs it: no daemon): that install is itself the proof
that ratewarden co-installs with the host's pins. A
host CLI from the npm registry gets its own `node_modules` under `.hosts/<name>`.

The pins live in one place, `tests/hosts/requirements/`: `<name>.txt` for a venv (pip
requirement lines), `<name>.npm` for npm packages (one `package@version` per line). An
environment is reused while its pins (and, for a venv, ratewarden's pyproject) are
unchanged. Building them all takes minutes, most of it waiting on downloads and
unpacking, so `prebuild` starts those the collected host tests name all at once, in threads
(tests/conftest.py); each test then waits only for its own. A file lock per environment
keeps two processes (two pytest runs) from building one at the same time.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.helpers.daemon import START_TIMEOUT_S, Daemon, clean_environment
from tests.helpers.daemon import running_daemon as serving

# The daemon helpers are re-exported: they lived here first.
__all__ = [
    "HOSTS_DIR", "ROOT", "START_TIMEOUT_S", "TERMINAL_POLICY",
    "Daemon", "clean_environment", "host_node_modules", "host_python", "prebuild",
    "running_daemon",
]  # fmt: skip

ROOT = Path(__file__).resolve().parents[2]
HOSTS_DIR = ROOT / ".hosts"
PINS_DIR = ROOT / "tests" / "hosts" / "requirements"

_builds: dict[str, Future[Path]] = {}  # name -> its build, started once per run
_builds_lock = threading.Lock()


def pins(name: str, suffix: str = ".txt") -> list[str]:
    """Host `name`'s pinned requirements (tests/hosts/requirements/<name><suffix>)."""
    lines = (PINS_DIR / f"{name}{suffix}").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def host_python(name: str) -> Path:
    """The python of host `name`'s venv, built (or being built by `prebuild`) as needed."""
    return _built(name, lambda: _build_venv(name, pins(name)))


def host_node_modules(name: str) -> Path:
    """Host `name`'s node_modules (its `.npm` pins installed), built as needed."""
    return _built(f"{name}.npm", lambda: _build_node(name, pins(name, ".npm")))


def prebuild(names: Iterable[str]) -> None:
    """Start building the environments of hosts `names` at once, each in a thread."""
    pool = ThreadPoolExecutor(thread_name_prefix="hostenv")
    for name in sorted(set(names)):
        if (PINS_DIR / f"{name}.txt").exists():
            _start(name, pool, functools.partial(_build_venv, name, pins(name)))
        if (PINS_DIR / f"{name}.npm").exists():
            _start(f"{name}.npm", pool, functools.partial(_build_node, name, pins(name, ".npm")))
    pool.shutdown(wait=False)


# How a test module names the environments it uses: `host_python("strands")`, or through
# tests/hosts/scenario.py, `host_scenario("strands", ...)` and `host_cli("codex")`.
_NAMED = re.compile(r"""host_(?:python|node_modules|scenario|cli)\(\s*["'](\w+)["']""")


def environments_named_in(sources: Iterable[Path]) -> set[str]:
    """The host environments these test modules name (what `prebuild` starts early; one
    named otherwise is simply built when first asked for)."""
    return {name for path in sources for name in _NAMED.findall(path.read_text())}


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """One build of `name` at a time across processes (two pytest runs, or helpers)."""
    HOSTS_DIR.mkdir(exist_ok=True)
    with (HOSTS_DIR / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _start(key: str, pool: ThreadPoolExecutor, build: Callable[[], Path]) -> Future[Path]:
    with _builds_lock:
        if key not in _builds:
            _builds[key] = pool.submit(build)
        return _builds[key]


def _built(key: str, build: Callable[[], Path]) -> Path:
    with _builds_lock:
        future = _builds.get(key)
        if future is None:
            future = _builds[key] = Future()
            future.set_running_or_notify_cancel()
            try:
                future.set_result(build())
            except BaseException as exc:
                future.set_exception(exc)
    return future.result()


def _build_node(name: str, packages: list[str]) -> Path:
    """`npm install` of `packages` into .hosts/<name>, reused while they are unchanged."""
    with _locked(name):
        return _build_node_locked(name, packages)


def _build_node_locked(name: str, packages: list[str]) -> Path:
    home = HOSTS_DIR / name
    stamp = home / "ratewarden-stamp.json"
    wanted = {"npm": packages}
    modules = home / "node_modules"
    if stamp.exists() and json.loads(stamp.read_text()) == wanted and modules.exists():
        return modules
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    (home / "package.json").write_text(json.dumps({"name": f"{name}-host", "private": True}))
    npm = shutil.which("npm") or "npm"
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", *packages],
        cwd=home, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"cannot install {name}'s npm packages:\n{done.stdout}\n{done.stderr}")
    stamp.write_text(json.dumps(wanted))
    return modules


def _build_venv(name: str, requirements: list[str]) -> Path:
    """The python of a venv .hosts/<name> holding `requirements` and ratewarden."""
    with _locked(name):
        return _build_venv_locked(name, requirements)


def _build_venv_locked(name: str, requirements: list[str]) -> Path:
    venv = HOSTS_DIR / name
    stamp = venv / "ratewarden-stamp.json"
    wanted = {
        "requirements": requirements,
        "pyproject": hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest(),
        "python": sys.version,
        # The checkout the editable install points at: a venv another checkout (a git
        # worktree sharing .hosts) installed into would run that checkout's code, or none.
        "source": str(ROOT),
    }
    python = venv / "bin" / "python"
    built = json.loads(stamp.read_text()) if stamp.exists() and python.exists() else None
    if built == wanted:
        return python
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if built is None or {**built, "source": None} != {**wanted, "source": None}:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        _pip(name, [*pip, *requirements])  # the host alone: the long part, run side by side
    # Then ratewarden with its dependencies, resolved against the host's pins: the base
    # package (the client, adapters and hooks: no daemon), plus the extra the host runs.
    # One at a time: an editable install writes its build metadata into this checkout.
    with _editable_lock:
        _pip(name, [*pip, *requirements, "-e", f"{ROOT}{EXTRAS.get(name, '')}"])
    stamp.write_text(json.dumps(wanted))
    return python


_editable_lock = threading.Lock()
# Hosts that run more of ratewarden than the client: the mcp venv runs `ratewarden mcp`.
EXTRAS = {"mcp": "[mcp]"}


def _pip(name: str, command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"cannot install {name}'s venv:\n{done.stdout}\n{done.stderr}")


@contextlib.contextmanager
def running_daemon(
    policy: str, directory: Path, *flags: str, env: dict[str, str] | None = None
) -> Iterator[Daemon]:
    """`ratewarden serve` on a free port with `policy` (and `env`, a clean environment if
    None), until the block ends."""
    directory.mkdir(parents=True, exist_ok=True)
    policy_path = directory / "policy.yaml"
    policy_path.write_text(policy)
    with serving(directory, "--policy", str(policy_path), *flags, env=env) as daemon:
        yield daemon


TERMINAL_POLICY = """\
version: 1
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 10/minute
"""


def run_driver(
    python: Path,
    driver: Path,
    config: Mapping[str, Any] | None = None,
    *,
    timeout: float = 120,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
) -> dict[str, Any]:
    """Run `driver` with a host's `python`, `config` as its one JSON argument: the report
    it prints as its last line. A driver that fails fails the test, showing its output."""
    command = [str(python), str(driver), *([json.dumps(config)] if config is not None else [])]
    done = subprocess.run(
        command,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env) if env is not None else clean_environment(),
        check=False,
    )
    assert done.returncode == 0, f"{driver.name} failed:\n{done.stdout}\n{done.stderr}"
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report
