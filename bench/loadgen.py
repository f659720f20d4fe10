"""An HTTP/1.1 load generator: keep-alive connections, prebuilt requests, two modes.

- Saturation (`--rate 0`): each connection sends its next request as soon as the last
  answer arrives (closed loop); the figure is answers per second.
- Fixed offered load (`--rate R`): requests are due at R per second whatever happens
  (open loop), and latency runs from when a request was *due*, not when a connection
  was free, so a stall shows in the percentiles instead of hiding (no coordinated
  omission).

It runs in its own process (the orchestrator in `bench/run.py` starts it) and prints one
JSON object. Kept to raw asyncio protocols on uvloop: per request it costs a few
microseconds, far less than the daemons it drives.

    python -m bench.loadgen --port 8470 --path /v1/check --bodies bodies.jsonl --duration 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import uvloop


class Connection(asyncio.Protocol):
    """One keep-alive connection; one request in flight at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[int] | None = None
        self.lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        head = bytes(self.buffer[:end]).lower()
        at = head.find(b"content-length:")
        stop = head.find(b"\r\n", at)
        length = int(head[at + 15 : stop if stop >= 0 else len(head)]) if at >= 0 else 0
        if len(self.buffer) < end + 4 + length:
            return
        status = int(head[9:12])
        del self.buffer[: end + 4 + length]
        waiter, self.waiter = self.waiter, None
        if not waiter.done():
            waiter.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = exc or ConnectionError("closed by the server")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.lost)

    async def send(self, request: bytes) -> int:
        """Send one request; the response's status code."""
        assert self.transport is not None
        if self.lost is not None:
            raise self.lost
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return await self.waiter


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


async def open_connections(host: str, port: int, count: int) -> list[Connection]:
    loop = asyncio.get_running_loop()
    made = [await loop.create_connection(Connection, host, port) for _ in range(count)]
    return [protocol for _, protocol in made]


async def saturate(
    connections: list[Connection], requests: list[bytes], warmup: float, duration: float
) -> tuple[Tally, float]:
    """Closed loop: every connection busy all the time. Returns the tally and its seconds."""
    tally = Tally()
    start = time.perf_counter() + warmup
    stop = start + duration

    async def drive(conn: Connection, offset: int) -> None:
        i = offset
        while True:
            sent = time.perf_counter()
            if sent >= stop:
                return
            try:
                status = await conn.send(requests[i % len(requests)])
            except (ConnectionError, OSError):
                tally.errors += 1
                return
            if sent >= start:
                tally.add(status, time.perf_counter() - sent)
            i += len(connections)

    await asyncio.gather(*(drive(c, n) for n, c in enumerate(connections)))
    return tally, duration


async def offer(
    connections: list[Connection],
    requests: list[bytes],
    rate: float,
    warmup: float,
    duration: float,
) -> tuple[Tally, float]:
    """Open loop at `rate` requests per second; latency counted from each request's due time."""
    tally = Tally()
    due: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
    begin = time.perf_counter()
    start, stop = begin + warmup, begin + warmup + duration

    async def schedule() -> None:
        n = 0
        while True:
            now = time.perf_counter()
            while begin + n / rate <= now:  # everything due by now, even after a stall
                at = begin + n / rate
                if at >= stop:
                    for _ in connections:
                        due.put_nowait(None)
                    return
                due.put_nowait((at, requests[n % len(requests)]))
                n += 1
            await asyncio.sleep(max(0.0, begin + n / rate - time.perf_counter()))

    async def drive(conn: Connection) -> None:
        while (item := await due.get()) is not None:
            at, request = item
            try:
                status = await conn.send(request)
            except (ConnectionError, OSError):
                tally.errors += 1
                return
            if at >= start:
                tally.add(status, time.perf_counter() - at)

    await asyncio.gather(schedule(), *(drive(c) for c in connections))
    return tally, duration


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
    connections = await open_connections(args.host, args.port, args.connections)
    try:
        if args.rate > 0:
            tally, seconds = await offer(
                connections, requests, args.rate, args.warmup, args.duration
            )
        else:
            tally, seconds = await saturate(connections, requests, args.warmup, args.duration)
    finally:
        for conn in connections:
            if conn.transport is not None:
                conn.transport.close()
    return summary(tally, seconds)


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
    args = parser.parse_args(argv)
    for name in ("connections", "duration"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive")
    if args.rate < 0 or args.warmup < 0:
        parser.error("--rate and --warmup cannot be negative")
    result = uvloop.run(main_async(args))
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
