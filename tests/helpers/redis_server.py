"""Start throwaway redis-server processes for tests: free port, own directory, no persistence.

Never touches the machine's default Redis. Installs Debian's redis-server when missing.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from tests.helpers.debian import ensure_command


def ensure_redis_server() -> str:
    """Path of redis-server, installing Debian's package if it is not there."""
    return ensure_command("redis-server")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen[bytes]
    directory: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)

    def stop(self) -> None:
        self.process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start_redis(directory: Path, *extra: str) -> RedisServer:
    """Start a redis-server on a free port and wait until it answers PING."""
    binary = ensure_redis_server()
    directory.mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(
        [*args, "--dir", str(directory), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = RedisServer(port, process, directory)
    deadline = time.monotonic() + 10
    while True:
        try:
            # Closed here: a client left to the collector leaves its socket open until
            # some later test's collection finds it (a ResourceWarning there, an error).
            with server.client() as client:
                if client.ping():
                    return server
        except redis.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"redis-server did not start on port {port}") from None
            time.sleep(0.02)


@contextlib.contextmanager
def running_redis(directory: Path, *extra: str) -> Iterator[RedisServer]:
    server = start_redis(directory, *extra)
    try:
        yield server
    finally:
        server.stop()
