"""What a decision costs the daemon, counted in instructions: one code against another.

Decisions per second on this project's machines move by up to 10 % between two rounds of
the same server (a shared 2-core VM), so two codes a few per cent apart cannot be told
apart by timing them. Instructions can: valgrind's callgrind counts every instruction the
daemon's process runs, the same count for the same work whatever else the machine does
(repeated runs here agree within 0.3 %). What it leaves out is the kernel's part (system
calls), which `bench/run`'s CPU columns measure with the rest.

Each named interpreter runs `ratewarden serve` (its installed or checked-out version) on a
redis-server of its own, both under callgrind with their counting off; after a warm-up,
counting is switched on for exactly `--decisions` one-rule (or five-rule) checks sent over
32 kept-alive connections, the same bodies as bench/run's, then switched off and read. The
report: instructions per decision for each daemon and its Redis (the script's cost), and
each against the first.

    .venv/bin/python -m bench.instructions old=/tmp/old-venv/bin/python new=.venv/bin/python
    .venv/bin/python -m bench.instructions --policy five old=... new=...

(from the project root; each NAME=PYTHON is an interpreter with some version of ratewarden
installed, for example a venv with `pip install "ratewarden[daemon] @ git+file://$PWD@COMMIT"`;
a commit from before the `daemon` extra, such as bd4a06f, needs no extra).

Needs valgrind (`apt-get install valgrind`). Under callgrind a process runs tens of times
slower; a run of 6 000 decisions takes about a minute, the interpreters counted side by
side.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.redis_server import free_port
from bench.workload import FIVE_RULES, ONE_RULE, check_calls, server_environment

POLICIES = {"one": ONE_RULE, "five": FIVE_RULES}
CONNECTIONS = 32
WARMUP = 2_000
START_TIMEOUT_S = 600  # under callgrind, importing FastAPI and pydantic takes a while
REDIS = "redis-server"


@dataclass(frozen=True)
class Cost:
    """Instructions per decision: the daemon's process, and its Redis's."""

    daemon: float
    redis: float


def bodies() -> list[bytes]:
    return [json.dumps(call).encode() for call in check_calls()]


async def _connection(port: int, calls: Sequence[bytes]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for body in calls:
            writer.write(
                b"POST /v1/check HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"the daemon answered {head[:40]!r}")
            length = re.search(rb"(?i)content-length:\s*(\d+)", head)
            await reader.readexactly(int(length.group(1)) if length else 0)
    finally:
        writer.close()


def send(port: int, count: int, offset: int = 0) -> int:
    """`count` checks (rounded down to a multiple of the connections), spread over the
    connections, each answered before the next; how many were sent."""
    every = bodies()
    per = count // CONNECTIONS
    shares = [
        [every[(offset + c * per + i) % len(every)] for i in range(per)] for c in range(CONNECTIONS)
    ]

    async def all_of_them() -> None:
        await asyncio.gather(*(_connection(port, share) for share in shares))

    asyncio.run(all_of_them())
    return per * CONNECTIONS


class Counted:
    """A process under callgrind, counting only between `on()` and `off()`."""

    def __init__(self, name: str, command: list[str], workdir: Path, **popen: Any) -> None:
        self.name, self.workdir = name, workdir
        self.out = workdir / f"{name}.callgrind"
        self.log = workdir / f"{name}.log"
        counted = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        counted += [f"--callgrind-out-file={self.out}", *command]
        with self.log.open("wb") as output:
            self.process = subprocess.Popen(
                counted, cwd=workdir, stdout=output, stderr=output, start_new_session=True, **popen
            )

    def wait_listening(self, port: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                said = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{said}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not listen on port {port} in {START_TIMEOUT_S} s")

    def on(self) -> None:
        self._control("--instr=on")

    def off(self) -> None:
        """Stop counting and write the count out."""
        self._control("--instr=off")
        self._control("--dump")

    def instructions(self) -> int:
        """What was counted (the dumps' totals; the part written at exit counted nothing)."""
        return sum(_totals(dump) for dump in self.workdir.glob(f"{self.out.name}*"))

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=120)

    def _control(self, action: str) -> None:
        command = ["callgrind_control", action, str(self.process.pid)]
        subprocess.run(command, check=True, capture_output=True)


def count(name: str, python: str, policy: Path, decisions: int, workdir: Path) -> Cost:
    """Instructions per check of the daemon run by `python`, and of its own redis-server."""
    redis_port, port = free_port(), free_port()
    redis = Counted(
        f"{name}-redis",
        [
            REDIS,
            "--port",
            str(redis_port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ],
        workdir,
    )
    daemon: Counted | None = None
    try:
        redis.wait_listening(redis_port)
        command = [
            python,
            "-m",
            "ratewarden",
            "serve",
            "--port",
            str(port),
            "--policy",
            str(policy),
        ]
        command += ["--store-url", f"redis://127.0.0.1:{redis_port}/0", "--log-level", "warning"]
        environment = server_environment() | {"RATEWARDEN_STORE_TIMEOUT_MS": "60000"}
        daemon = Counted(name, command, workdir, env=environment)
        daemon.wait_listening(port)
        send(port, WARMUP)
        daemon.on()
        redis.on()
        sent = send(port, decisions, offset=WARMUP)
        redis.off()
        daemon.off()
        return Cost(daemon.instructions() / sent, redis.instructions() / sent)
    finally:
        for process in (daemon, redis):
            if process is not None:
                process.stop()


def _totals(dump: Path) -> int:
    """The instruction total of one callgrind dump."""
    found = re.findall(r"^totals:\s*(\d+)", dump.read_text(), re.MULTILINE)
    return int(found[-1]) if found else 0


def measure(pythons: dict[str, str], policy: str, decisions: int) -> dict[str, Cost]:
    """Instructions per decision for each named interpreter, counted side by side."""
    for tool in ("valgrind", "redis-server"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: apt-get install {tool}")
    with tempfile.TemporaryDirectory(prefix="rw-instructions-") as tmp:
        workdir = Path(tmp)
        policy_file = workdir / f"{policy}.yaml"
        policy_file.write_text(POLICIES[policy])
        with concurrent.futures.ThreadPoolExecutor() as pool:
            counted = {
                name: pool.submit(count, name, python, policy_file, decisions, workdir)
                for name, python in pythons.items()
            }
            return {name: job.result() for name, job in counted.items()}


def report(per_decision: dict[str, Cost]) -> str:
    first = next(iter(per_decision.values()))
    lines = [
        "| code | daemon instructions per decision | against the first "
        "| Redis instructions per decision | against the first |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {cost.daemon:,.0f} | {cost.daemon / first.daemon:.3f} "
        f"| {cost.redis:,.0f} | {cost.redis / first.redis:.3f} |"
        for name, cost in per_decision.items()
    ]
    return "\n".join(lines)


def _named(text: str) -> tuple[str, str]:
    name, _, python = text.partition("=")
    found = shutil.which(python) if python else None
    if not name or found is None:
        raise argparse.ArgumentTypeError(f"expected NAME=PYTHON (an interpreter), got {text!r}")
    return name, str(Path(found).absolute())  # not resolved: a venv's python is a link


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.instructions",
        description="Instructions per decision of ratewarden daemons, counted by callgrind.",
    )
    parser.add_argument(
        "pythons", nargs="+", type=_named, metavar="NAME=PYTHON", help="interpreters to compare"
    )
    parser.add_argument("--policy", choices=sorted(POLICIES), default="one")
    parser.add_argument("--decisions", type=int, default=6_000)
    args = parser.parse_args(argv)
    if args.decisions < CONNECTIONS:
        parser.error(f"--decisions must be at least {CONNECTIONS} (one per connection)")
    names = [name for name, _ in args.pythons]
    if len(set(names)) != len(names):
        parser.error("each NAME must be different")
    print(report(measure(dict(args.pythons), args.policy, args.decisions)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
