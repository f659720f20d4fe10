"""The benchmark's own redis-server: private, on a free port, never the machine's."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_PORT = 6379  # the machine's shared Redis: the benchmark flushes, so never that one


def refuse_shared(url: str) -> None:
    """Raise unless `url` names a private Redis: the benchmark parts FLUSH what they use."""
    parts = urlsplit(url)
    if parts.scheme in ("redis", "rediss") and (parts.port or DEFAULT_PORT) == DEFAULT_PORT:
        raise ValueError("refusing the default Redis port 6379: pass a private redis-server")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def redis_server(workdir: Path) -> Iterator[int]:
    """A private redis-server, nothing persisted; never the machine's own."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: apt-get install redis-server")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on port {port} after {timeout} s")


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to `process`'s group (a server and the workers it forked), SIGKILL if it
    has not exited within 15 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
