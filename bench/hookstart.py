"""How long a command hook takes, per tool call, next to a bare interpreter (issue 18).

A coding agent runs `ratewarden hook HOST` once per tool call and waits for it. Timed
here: the median wall time of `ratewarden hook claude-code` answering a PreToolUse that
the daemon allows (a real `ratewarden serve` on the memory store, so the time includes a
real round trip), against `python -c pass` with the same interpreter, the two run
alternately in one run. The target: the hook at most 4 times the bare interpreter.

Both run as an installed package does: with its modules' bytecode cached (pip compiles it
at install; an editable checkout writes it on first run). So PYTHONDONTWRITEBYTECODE,
which this project's machines set, is left out of their environment, and the warm-up run
writes the cache: with it set, every hook would compile its modules from source again
(about a third of its start).

    python -m bench.hookstart --runs 41
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.redis_server import free_port

POLICY = "version: 1\nrules:\n  - {name: per-user, per: [user], rate: 100000/minute}\n"


def payload(n: int) -> bytes:
    """Claude Code's PreToolUse for call `n` (each its own id: a reused one is a note)."""
    call = {
        "hook_event_name": "PreToolUse",
        "tool_name": "Bash",
        "tool_input": {"command": "cargo test"},
        "tool_use_id": f"toolu_bench_{n}",
        "session_id": "bench",
    }
    return json.dumps(call).encode()


def measure(runs: int = 41) -> dict[str, Any]:
    """Median wall ms of a bare interpreter and of an allowed hook call, and their ratio."""
    script = Path(sys.executable).with_name("ratewarden")
    with (
        tempfile.TemporaryDirectory(prefix="ratewarden-hookstart-") as tmp,
        daemon(Path(tmp), POLICY) as url,
    ):
        hook = [str(script), "hook", "claude-code", "--url", url, "--user", "bench"]
        bare = [sys.executable, "-c", "pass"]
        _wall(hook, payload(-1))  # the daemon and the file cache warm
        timed: dict[str, list[float]] = {"pass": [], "hook": []}
        for n in range(runs):
            timed["pass"].append(_wall(bare))
            timed["hook"].append(_wall(hook, payload(n)))
    medians = {name: statistics.median(times) for name, times in timed.items()}
    return {
        "runs": runs,
        "python_pass_ms": medians["pass"],
        "hook_ms": medians["hook"],
        "ratio": medians["hook"] / medians["pass"],
    }


_ENVIRONMENT = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _wall(command: list[str], stdin: bytes = b"") -> float:
    started = time.perf_counter()
    done = subprocess.run(command, input=stdin, capture_output=True, check=False, env=_ENVIRONMENT)
    elapsed = (time.perf_counter() - started) * 1000
    if done.returncode != 0 or done.stdout or done.stderr:  # allowed: silent, exit 0
        raise RuntimeError(f"{command[0]} answered {done.returncode}: {done.stderr!r}")
    return elapsed


@contextmanager
def daemon(workdir: Path, policy_text: str) -> Iterator[str]:
    """A real `ratewarden serve` with `policy_text`, on the memory store; its URL."""
    policy = workdir / "policy.yaml"
    policy.write_text(policy_text)
    port = free_port()
    env = {**os.environ, "RATEWARDEN_STATE_FILE": "off"}
    server = subprocess.Popen(
        [sys.executable, "-m", "ratewarden", "serve", "--port", str(port), "--policy",
         str(policy), "--insecure-no-auth", "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, server)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def _wait_ready(url: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("the daemon exited before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the daemon was not ready within 30 s")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hookstart")
    parser.add_argument("--runs", type=int, default=41, help="runs of each (default 41)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    print(json.dumps(measure(args.runs), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
