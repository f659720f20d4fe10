"""A gRPC load generator as cheap as bench/loadgen.py's HTTP one: unary calls on one
cleartext HTTP/2 connection (as Envoy keeps one per worker), every frame prebuilt.

grpcio's client cost 164-270 µs of CPU a call on this machine against 30-40 µs for
bench/loadgen.py's raw HTTP; on two cores shared with the daemon and Redis, that client
took the CPU the daemon needed, and the gRPC / HTTP ratio measured the clients as much as
the daemon. Here a call costs a HEADERS and a DATA frame written from bytes built once
(the header block never indexed, so it is the same bytes on every stream), and its answer
a read of frames; an answer is OK when its trailers say `grpc-status: 0` and its message
starts with `ok_prefix`. It shares no code with the server it measures (http/grpc.py), so
a mistake in one cannot hide in the other; hpack decodes what the server sends.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEAD = struct.Struct(">HBBBL")
DATA, HEADERS, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 4, 6, 7, 8
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
WINDOW = 1 << 30  # the connection window offered to the server, replenished as read


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return FRAME_HEAD.pack(n >> 8, n & 0xFF, kind, flags, stream) + payload


def header_block(authority: str, path: str) -> bytes:
    """A unary call's request headers, literal and never indexed: the same on every stream."""
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path),
              (":authority", authority), ("content-type", "application/grpc"),
              ("te", "trailers")]  # fmt: skip
    never = [hpack.NeverIndexedHeaderTuple(name, value) for name, value in fields]
    return bytes(hpack.Encoder().encode(never, huffman=False))


@dataclass
class Pending:
    sent: float
    message: bytearray = field(default_factory=bytearray)


class GrpcLoad(asyncio.Protocol):
    """Keeps `in_flight` calls going until `stop` (perf_counter); `done(sent, ok)` is told
    of every answer."""

    def __init__(
        self,
        block: bytes,
        messages: Sequence[bytes],
        in_flight: int,
        stop: float,
        ok_prefix: bytes,
        done: Callable[[float, bool], None],
    ) -> None:
        self.block = block
        self.bodies = [b"\x00" + len(m).to_bytes(4, "big") + m for m in messages]
        self.in_flight = in_flight
        self.stop = stop
        self.ok_prefix = ok_prefix
        self.done = done
        self.decoder = hpack.Decoder()
        self.pending: dict[int, Pending] = {}
        self.next_stream = 1
        self.sent = 0
        self.unacked = 0
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        opening = (
            PREFACE
            + frame(SETTINGS, 0, 0)
            + frame(WINDOW_UPDATE, 0, 0, (WINDOW - 65535).to_bytes(4, "big"))
        )
        transport.write(opening + b"".join(self.call() for _ in range(self.in_flight)))

    def call(self) -> bytes:
        stream, self.next_stream = self.next_stream, self.next_stream + 2
        body = self.bodies[self.sent % len(self.bodies)]
        self.sent += 1
        self.pending[stream] = Pending(time.perf_counter())
        return frame(HEADERS, END_HEADERS, stream, self.block) + frame(
            DATA, END_STREAM, stream, body
        )

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        at, out = 0, []
        while len(buffer) - at >= 9:
            high, low, kind, flags, stream = FRAME_HEAD.unpack_from(buffer, at)
            length = high << 8 | low
            if len(buffer) - at - 9 < length:
                break
            payload = bytes(buffer[at + 9 : at + 9 + length])
            at += 9 + length
            out.append(self.frame(kind, flags, stream, payload))
        del buffer[:at]
        if self.transport is not None:
            self.transport.write(b"".join(out))
        if not self.pending and not self.finished.done():
            self.finished.set_result(None)

    def frame(self, kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        if kind == DATA:
            self.pending[stream].message += payload
            self.unacked += len(payload)
            if self.unacked >= 1 << 20:
                update, self.unacked = self.unacked, 0
                return frame(WINDOW_UPDATE, 0, 0, update.to_bytes(4, "big"))
        elif kind == HEADERS:
            fields = dict(self.decoder.decode(payload, raw=True))
            if flags & END_STREAM:
                return self.answered(stream, fields.get(b"grpc-status") == b"0")
        elif kind == SETTINGS and not flags & ACK:
            return frame(SETTINGS, ACK, 0)
        elif kind == PING and not flags & ACK:
            return frame(PING, ACK, 0, payload)
        elif kind == GOAWAY:
            self.stop = 0.0
        return b""

    def answered(self, stream: int, ok: bool) -> bytes:
        call = self.pending.pop(stream)
        self.done(call.sent, ok and call.message[5:].startswith(self.ok_prefix))
        return self.call() if time.perf_counter() < self.stop else b""

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self.finished.set_result(None)
