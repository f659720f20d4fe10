"""An HTTP/1.1 load generator: keep-alive connections, prebuilt requests, two modes.

- Saturation (`--rate 0`): each connection sends its next request as soon as the last
  answer arrives (closed loop); the figure is answers per second.
- Fixed offered load (`--rate R`): requests are due at R per second whatever happens
  (open loop), and latency runs from when a request was *due*, not when a connection
  was free, so a stall shows in the percentiles instead of hiding (no coordinated
  omission).

It runs in its own process (the orchestrator in `bench/run.py` starts it) and prints one
JSON object; `--watch NAME=PID` adds the CPU seconds that process (with its children)
used in the measured window, read at its very start and end. Kept to raw asyncio
protocols: per request it costs about what the kernel's loopback TCP costs any client
(wrk, in C, measured 16 us a request against this one's 18), a fifth of a decision.
Saturation runs on uvloop, the cheapest loop per request.
A fixed load runs on asyncio's own loop over select(), whose timeouts count microseconds:
uvloop's (libuv's) and epoll's count whole milliseconds, so a sleep to the next due time
returned at once and the scheduler spun a whole core, taken from the server it measured,
and sleeping whole milliseconds instead sent requests in bursts that queued behind each
other in the server.

    python -m bench.loadgen --port 8470 --path /v1/check --bodies bodies.jsonl --duration 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import selectors
import sys
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

from bench.procstat import cpu_seconds, family


class Connection(asyncio.Protocol):
    """One keep-alive connection, one request in flight at a time. Each answer goes to
    `answered(connection, status)` as it arrives; a broken connection answers None."""

    def __init__(self, answered: Callable[[Connection, int | None], None]) -> None:
        self.answered = answered
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.due = 0.0  # when the request in flight was due (latency runs from here)
        self.busy = False  # a request in flight
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport

    def send(self, request: bytes, due: float) -> None:
        assert self.transport is not None
        self.due, self.busy = due, True
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        at = head.find(b"content-length:")
        stop = head.find(b"\r\n", at)
        length = int(head[at + 15 : stop if stop >= 0 else len(head)]) if at >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return
        del self.buffer[: end + 4 + length]
        self.busy = False
        self.answered(self, int(head[9:12]))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.busy:  # an answer owed: an error (idle, closed: one connection fewer)
            self.busy = False
            self.answered(self, None)


def build_requests(
    host: str, port: int, path: str, bodies: Sequence[bytes], token: str
) -> list[bytes]:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return [
        (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        + body
        for body in bodies
    ]


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)  # seconds, answered requests
    errors: int = 0  # non-2xx answers and broken connections
    statuses: dict[int, int] = field(default_factory=dict)

    def add(self, status: int, seconds: float) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if 200 <= status < 300:
            self.latencies.append(seconds)
        else:
            self.errors += 1


DRAIN_S = 10.0  # seconds to wait, after the end, for answers still owed


class Meter:
    """CPU seconds that watched processes (each with its children) and this one used
    between `begin()` and `end()`: the measured window, read where it is known."""

    def __init__(self, watch: dict[str, int]) -> None:
        self.pids = {name: family(pid) for name, pid in watch.items()}
        self.began: dict[str, float | None] = {}
        self.used: dict[str, float] = {}

    def read(self) -> dict[str, float | None]:
        found = {name: cpu_seconds(pids) for name, pids in self.pids.items()}
        return found | {"load generator": time.process_time()}

    def begin(self) -> None:
        self.began = self.read()

    def end(self) -> None:
        for name, seconds in self.read().items():
            if seconds is not None and (began := self.began.get(name)) is not None:
                self.used[name] = seconds - began


class Driver(ABC):
    """Sends `requests` in turn over the connections and tallies the answers to those
    sent between `start` and `stop`. Subclasses decide when a request goes out."""

    begin: float  # when the run began; the measured window, `start` to `stop`, follows
    start: float  # the warmup
    stop: float

    def __init__(self, requests: list[bytes], warmup: float, duration: float, meter: Meter) -> None:
        self.requests = requests
        self.warmup, self.duration, self.meter = warmup, duration, meter
        self.sent = 0
        self.in_flight = 0
        self.tally = Tally()

    async def run(self, connections: list[Connection]) -> Tally:
        """Start the clock (and the meter's window), send until `stop`, then wait for
        the answers owed (a server that hangs: counted as errors)."""
        self.begin = time.perf_counter()
        self.start = self.begin + self.warmup
        self.stop = self.start + self.duration
        loop = asyncio.get_running_loop()
        measured = asyncio.Event()
        loop.call_later(self.warmup, self.meter.begin)

        def end_window() -> None:
            self.meter.end()
            measured.set()

        loop.call_later(self.warmup + self.duration, end_window)
        await self.send_until_stop(connections)
        deadline = time.perf_counter() + DRAIN_S
        while self.in_flight > 0 and time.perf_counter() < deadline:
            await asyncio.sleep(0.005)
        self.tally.errors += max(0, self.in_flight)
        # The loop's clock is not perf_counter: the sending can end (and, at a low rate,
        # every answer be in) a moment before the meter's window closes.
        await measured.wait()
        return self.tally

    def send(self, conn: Connection, due: float) -> None:
        conn.send(self.requests[self.sent % len(self.requests)], due)
        self.sent += 1
        self.in_flight += 1

    def answered(self, conn: Connection, status: int | None) -> None:
        now = time.perf_counter()
        self.in_flight -= 1
        if status is None:
            self.tally.errors += 1
        elif self.start <= conn.due < self.stop:
            self.tally.add(status, now - conn.due)
        if status is not None and now < self.stop:
            self.next(conn, now)

    @abstractmethod
    def next(self, conn: Connection, now: float) -> None:
        """`conn` has its answer (at `now`) and is free."""

    @abstractmethod
    async def send_until_stop(self, connections: list[Connection]) -> None:
        """The first requests, then whatever this mode sends until `stop`."""


class Saturate(Driver):
    """Closed loop: each connection sends again as soon as it has its answer."""

    def next(self, conn: Connection, now: float) -> None:
        self.send(conn, now)

    async def send_until_stop(self, connections: list[Connection]) -> None:
        for conn in connections:
            self.send(conn, self.begin)
        await asyncio.sleep(self.stop - time.perf_counter())


class Offer(Driver):
    """Open loop at `rate` requests per second: each request is due at its time whatever
    happens, waits for a free connection if none is, and its latency counts from when it
    was due, so a stall shows in the percentiles instead of hiding (no coordinated
    omission)."""

    def __init__(
        self, requests: list[bytes], rate: float, warmup: float, duration: float, meter: Meter
    ) -> None:
        super().__init__(requests, warmup, duration, meter)
        self.rate = rate
        self.idle: deque[Connection] = deque()  # first in, first out: each is used in turn,
        # so none stays idle past the server's keep-alive timeout
        self.waiting: deque[float] = deque()  # due times of requests with no connection yet

    def next(self, conn: Connection, now: float) -> None:
        if self.waiting:
            self.send(conn, self.waiting.popleft())
        else:
            self.idle.append(conn)

    def free(self) -> Connection | None:
        while self.idle:
            conn = self.idle.popleft()
            if not conn.lost:
                return conn
        return None

    async def send_until_stop(self, connections: list[Connection]) -> None:
        self.idle.extend(connections)
        n = 0
        while (now := time.perf_counter()) < self.stop:
            while (due := self.begin + n / self.rate) <= now:  # all due by now, even after a stall
                if conn := self.free():
                    self.send(conn, due)
                else:
                    self.waiting.append(due)
                n += 1
            await asyncio.sleep(self.begin + n / self.rate - time.perf_counter())
        self.waiting.clear()  # due after the end: never sent


async def open_connections(
    host: str, port: int, count: int, answered: Callable[[Connection, int | None], None]
) -> list[Connection]:
    loop = asyncio.get_running_loop()
    made = [
        await loop.create_connection(lambda: Connection(answered), host, port) for _ in range(count)
    ]
    return [protocol for _, protocol in made]


def percentile(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(tally: Tally, seconds: float) -> dict[str, object]:
    ordered = sorted(tally.latencies)
    ms = 1000.0
    return {
        "answered": len(ordered),
        "errors": tally.errors,
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "per_second": len(ordered) / seconds,
        "p50_ms": percentile(ordered, 0.50) * ms,
        "p99_ms": percentile(ordered, 0.99) * ms,
        "p999_ms": percentile(ordered, 0.999) * ms,
        "max_ms": (ordered[-1] if ordered else float("nan")) * ms,
    }


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    bodies = [line.encode() for line in Path(args.bodies).read_text().splitlines() if line]
    requests = build_requests(args.host, args.port, args.path, bodies, args.token)
    return await drive(requests, args)


async def drive(requests: list[bytes], args: argparse.Namespace) -> dict[str, Any]:
    """`requests` offered at `args.rate` (0: saturated) over `args.connections`, for
    `args.duration` after `args.warmup`: the summary, and the watched processes' CPU."""
    meter = Meter(dict(args.watch))
    driver: Driver
    if args.rate > 0:
        driver = Offer(requests, args.rate, args.warmup, args.duration, meter)
    else:
        driver = Saturate(requests, args.warmup, args.duration, meter)
    connections = await open_connections(args.host, args.port, args.connections, driver.answered)
    try:
        tally = await driver.run(connections)
    finally:
        for conn in connections:
            if conn.transport is not None:
                conn.transport.close()
    return summary(tally, args.duration) | {"cpu_s": meter.used}


def _watched(text: str) -> tuple[str, int]:
    name, _, pid = text.partition("=")
    if not name or not pid.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=PID, got {text!r}")
    return name, int(pid)


def _timely() -> asyncio.AbstractEventLoop:
    """An event loop whose timers keep to the microsecond (see the module's docstring)."""
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/v1/check")
    parser.add_argument("--bodies", required=True, help="file of JSON bodies, one per line")
    parser.add_argument("--token", default="", help="bearer token to send")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rate", type=float, default=0.0, help="requests/s; 0: saturate")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds not counted")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds counted")
    parser.add_argument(
        "--watch",
        type=_watched,
        action="append",
        default=[],
        metavar="NAME=PID",
        help="report the CPU seconds this process and its children used while measured",
    )
    args = parser.parse_args(argv)
    for name in ("connections", "duration"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive")
    if args.rate < 0 or args.warmup < 0:
        parser.error("--rate and --warmup cannot be negative")
    with asyncio.Runner(
        loop_factory=uvloop.new_event_loop if args.rate == 0 else _timely
    ) as runner:
        result = runner.run(main_async(args))
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
