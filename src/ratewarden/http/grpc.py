"""A unary gRPC server on the daemon's event loop: cleartext HTTP/2 with prior knowledge
(h2c, what Envoy's gRPC clients and grpcio's insecure channels speak), its frames read and
written here, the request headers decoded by `hpack`.

Why not a library: grpcio's Python server costs 222-278 µs of CPU per call answering OK
without deciding anything, more than a whole decision over HTTP (137-167 µs), and hands
calls to the loop one at a time, so the Redis coalescer batched 1.6 decisions a write
against 10 over HTTP; grpclib cost 274 µs, and h2's connection state machine alone 114 µs
per exchange (docs/benchmarks.md, issue 32). Envoy's two services are one unary method
each: a message in, a message out, no compression, no streaming. That subset of RFC 9113
and of gRPC over HTTP/2 is this file. The row that re-checks it: bench/envoy.py (gRPC /
HTTP decisions per second, and the gRPC echo's CPU per call).

What a peer cannot do to it:
- hold memory: a connection's unanswered request bytes are bounded by its receive
  window (CONNECTION_WINDOW; a call gives its bytes back only when answered), one message
  by MAX_MESSAGE_BYTES, a header block by MAX_HEADER_BLOCK_BYTES, calls in flight by
  MAX_STREAMS (a reset stream still counts until its handler ends: no "rapid reset");
- hold a socket: a connection must finish what it starts (the preface, a frame, a header
  block, a request) within `request_timeout_s`, as an HTTP request must
  (http/connections.py); open connections are capped as HTTP's are;
- outrun its writes: while the socket's send buffer is full, nothing more is read;
- keep it busy for nothing: a connection that opens no call for IDLE_S is closed whatever
  else it sends (pings keep nothing open), and one that sends MAX_FRAMES_WITHOUT_A_CALL
  frames in a row without opening a call is ended (ENHANCE_YOUR_CALM): a flood of PINGs,
  SETTINGS or empty frames costs at most that many frames' work per connection;
- break the listener: a protocol error ends its connection only (GOAWAY with the code).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import struct
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import quote

import hpack

from ratewarden.http.connections import ConnectionGate

log = logging.getLogger("ratewarden.grpc")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEAD = struct.Struct(">HBBBL")  # length (24 bits, as 16 + 8), type, flags, stream
SETTING = struct.Struct(">HL")
WORD = struct.Struct(">L")
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME_BYTES = 16_384  # the largest frame either side may send unless raised
MAX_WINDOW = (1 << 31) - 1

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # gRPC's own default for a received message
MAX_STREAMS = 128  # calls in flight on one connection, answered or not
MAX_HEADER_BLOCK_BYTES = 64 * 1024  # one request's header block, HPACK-coded or decoded
STREAM_WINDOW = MAX_MESSAGE_BYTES + 64 * 1024  # a whole message fits: no stream update
CONNECTION_WINDOW = 16 * 1024 * 1024  # a connection's unanswered request bytes, at most
RELEASE_BYTES = 1024 * 1024  # answered bytes given back to the window in steps this big
# A connection with no call in flight that opens none for this long is closed, whatever
# else it sends: a peer gone without a FIN (a half-open socket), or one that only pings,
# would hold a slot of the cap for ever. Gracefully
# (RFC 9113 6.8): a first GOAWAY opens no new calls but still serves those already sent,
# a clock tick later the last one closes; Envoy and gRPC clients open a new connection.
IDLE_S = 300.0
# Frames a peer may send in a row without opening a call. A call is a few (HEADERS, DATA,
# the window and ping acknowledgements) and its message at most 257 DATA frames; a peer
# past this is only making the server work (a PING or SETTINGS flood, empty frames).
MAX_FRAMES_WITHOUT_A_CALL = 10_000


class Frame(enum.IntEnum):
    DATA = 0
    HEADERS = 1
    PRIORITY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PUSH_PROMISE = 5
    PING = 6
    GOAWAY = 7
    WINDOW_UPDATE = 8
    CONTINUATION = 9


END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20


class H2Error(enum.IntEnum):
    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    INTERNAL_ERROR = 2
    FLOW_CONTROL_ERROR = 3
    STREAM_CLOSED = 5
    FRAME_SIZE_ERROR = 6
    REFUSED_STREAM = 7
    CANCEL = 8
    COMPRESSION_ERROR = 9
    ENHANCE_YOUR_CALM = 11


class Status(enum.IntEnum):
    """gRPC's status codes (grpc/doc/statuscodes.md)."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class GrpcError(Exception):
    """A call answered with a status other than OK; `str(exc)` is its grpc-message."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status = status


class ProtocolBroken(Exception):
    """The peer broke the protocol: its connection ends with GOAWAY `code`."""

    def __init__(self, code: H2Error, why: str) -> None:
        super().__init__(why)
        self.code = code


@dataclass(frozen=True, slots=True)
class Call:
    """What a handler is given: the request message (its bytes), the request's metadata
    (header names lower case, values as sent), and the peer's address."""

    message: bytes
    metadata: Mapping[str, str]
    peer: str


Unary = Callable[[Call], Awaitable[bytes]]  # a request's message -> the answer's message


def _length(n: int) -> bytes:
    """An HPACK string length: an integer on a 7-bit prefix, no Huffman (RFC 7541 5.1)."""
    if n < 127:
        return bytes((n,))
    out, n = bytearray((127,)), n - 127
    while n >= 128:
        out.append(n & 127 | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header field literal, never indexed into the peer's table (RFC 7541 6.2.2)."""
    return b"\x00" + _length(len(name)) + name + _length(len(value)) + value


# `:status: 200` is static entry 8; content-type (static name 31) a literal value.
RESPONSE_HEAD = b"\x88\x0f\x10" + _length(16) + b"application/grpc"
OK_TRAILERS = _literal(b"grpc-status", b"0")
# grpc-message is percent-encoded: every byte but printable ASCII, and `%` itself.
MESSAGE_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def _trailers(status: Status, message: str) -> bytes:
    encoded = quote(message, safe=MESSAGE_SAFE).encode("ascii")
    return _literal(b"grpc-status", str(int(status)).encode()) + _literal(b"grpc-message", encoded)


def _frame(kind: Frame, flags: int, stream: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return FRAME_HEAD.pack(n >> 8, n & 0xFF, kind, flags, stream) + payload


def _unpadded(flags: int, payload: bytes) -> bytes:
    if not flags & PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolBroken(H2Error.PROTOCOL_ERROR, "padding longer than its frame")
    return payload[1 : len(payload) - payload[0]]


@dataclass(slots=True)
class Stream:
    """One call: its request while it arrives, its answer's bytes while the windows hold
    them back."""

    id: int
    method: Unary | None
    metadata: dict[str, str]
    window: int  # bytes the peer lets us send on it
    body: bytearray = field(default_factory=bytearray)
    received: int = 0  # flow-controlled bytes, given back to the window once answered
    receiving: bool = True
    running: bool = False  # its handler runs: the stream is kept until it ends
    task: asyncio.Task[None] | None = None  # the handler's (the loop keeps only a weak one)
    reset: bool = False  # by the peer: the answer is not sent
    unsent: bytes = b""  # DATA payload the windows held back, then its trailers
    trailers: bytes = b""


class UnaryServer:
    """The listener: `methods` by path (`/package.Service/Method`), each connection a
    `_Connection`; `start`, then `stop`."""

    def __init__(self, methods: Mapping[str, Unary], gate: ConnectionGate) -> None:
        self.methods = dict(methods)
        self.gate = gate
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int, reuse_port: bool) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self), host, port, reuse_port=reuse_port or None
        )

    async def stop(self, grace: float) -> None:
        """Accept no more; tell every connection to open no more calls (GOAWAY), let
        calls in flight end for up to `grace` seconds, then drop what is left (a peer
        that reads nothing would hold a graceful close, and Python 3.12's wait_closed
        with it, for ever)."""
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.go_away(H2Error.NO_ERROR)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while any(c.busy() for c in self.connections) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            connection.abort()
        if self._server is not None:
            await self._server.wait_closed()


class _Connection(asyncio.Protocol):
    """One HTTP/2 connection: frames in, calls to their handlers, answers out."""

    def __init__(self, server: UnaryServer) -> None:
        self.server = server
        self.streams: dict[int, Stream] = {}
        self.transport: asyncio.Transport | None = None
        self.peer = ""
        self._buffer = bytearray()
        self._preface = False
        self._decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_BLOCK_BYTES)
        self._continued: tuple[int, int, bytearray] | None = None  # (stream, flags, block)
        self._last_stream = 0
        self._going_away = False
        self._window = DEFAULT_WINDOW  # bytes the peer lets us send on the connection
        self._stream_window = DEFAULT_WINDOW  # its initial window for each stream
        self._frame_bytes = DEFAULT_FRAME_BYTES  # the largest frame it accepts
        self._table_resized = b""  # a table size update owed to its decoder (RFC 7541 4.2)
        self._answered = 0  # request bytes answered, not yet given back to the window
        self._receivable = CONNECTION_WINDOW  # what the peer may still send: its window
        self._blocked: list[Stream] = []  # answers waiting for window
        self._waiting_since: float | None = None  # since something is left unfinished
        self._finished_one = False  # a read finished something: the deadline starts again
        self._closing = False
        self._timer: asyncio.TimerHandle | None = None
        self._called = False  # a call opened since the last clock tick (else: idle)
        self._frames_since_call = 0  # frames since the last call opened (a flood's bound)
        self._idle_s = 0.0  # seconds idle, in whole clock ticks
        self._draining = False  # told GOAWAY for being idle: closes at the next tick

    # -- the socket ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport = transport
        gate = self.server.gate
        if len(self.server.connections) >= gate.limits.max_connections:
            gate.refuse(len(self.server.connections))
            transport.abort()
            return
        self.server.connections.add(self)
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if isinstance(peer, tuple) else ""
        settings = b"".join(
            SETTING.pack(key, value)
            for key, value in (
                (2, 0),  # ENABLE_PUSH: no
                (3, MAX_STREAMS),  # MAX_CONCURRENT_STREAMS
                (4, STREAM_WINDOW),  # INITIAL_WINDOW_SIZE
                (6, MAX_HEADER_BLOCK_BYTES),  # MAX_HEADER_LIST_SIZE
            )
        )
        transport.write(
            _frame(Frame.SETTINGS, 0, 0, settings)
            + _frame(Frame.WINDOW_UPDATE, 0, 0, WORD.pack(CONNECTION_WINDOW - DEFAULT_WINDOW))
        )
        self._waiting_since = asyncio.get_running_loop().time()  # for the preface
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.server.gate.closed(len(self.server.connections))
        if self._timer is not None:
            self._timer.cancel()
        for stream in self.streams.values():
            stream.reset = True  # handlers still running end unanswered
        self.transport = None
        self._closing = True

    def pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        try:
            if not self._preface:
                if len(buffer) < len(PREFACE):
                    if not PREFACE.startswith(buffer):
                        raise ProtocolBroken(H2Error.PROTOCOL_ERROR, "not HTTP/2")
                    return
                if buffer[: len(PREFACE)] != PREFACE:
                    raise ProtocolBroken(H2Error.PROTOCOL_ERROR, "not HTTP/2")
                del buffer[: len(PREFACE)]
                self._preface = self._finished_one = True
            self._frames(buffer)
        except ProtocolBroken as exc:
            self._fail(exc)
            return
        self._note_progress()

    def _frames(self, buffer: bytearray) -> None:
        at, size = 0, len(buffer)
        while size - at >= 9 and not self._closing:
            high, low, kind, flags, stream = FRAME_HEAD.unpack_from(buffer, at)
            length = high << 8 | low
            if length > DEFAULT_FRAME_BYTES:  # we never raise SETTINGS_MAX_FRAME_SIZE
                raise ProtocolBroken(H2Error.FRAME_SIZE_ERROR, "a frame past 16 KiB")
            if size - at - 9 < length:
                break
            payload = bytes(buffer[at + 9 : at + 9 + length])
            at += 9 + length
            self._frame(kind, flags, stream & MAX_WINDOW, payload)
        del buffer[:at]

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        self._frames_since_call += 1  # a HEADERS that opens a call sets it back to 0
        if self._continued is not None and kind != Frame.CONTINUATION:
            raise ProtocolBroken(H2Error.PROTOCOL_ERROR, "a header block left unfinished")
        if kind == Frame.DATA:
            self._data(flags, stream, payload)
        elif kind == Frame.HEADERS:
            self._headers(flags, stream, payload)
        elif kind == Frame.CONTINUATION:
            self._continuation(flags, stream, payload)
        elif kind == Frame.SETTINGS:
            self._settings(flags, stream, payload)
        elif kind == Frame.WINDOW_UPDATE:
            self._window_update(stream, payload)
        elif kind == Frame.PING:
            self._ping(flags, stream, payload)
        elif kind == Frame.RST_STREAM:
            self._reset(stream, payload)
        elif kind == Frame.GOAWAY:
            self.go_away(H2Error.NO_ERROR)
        elif kind == Frame.PUSH_PROMISE:
            raise ProtocolBroken(H2Error.PROTOCOL_ERROR, "a client cannot push")
        # PRIORITY and frame types this server does not know are ignored (RFC 9113 5.5).
        if self._frames_since_call > MAX_FRAMES_WITHOUT_A_CALL:
            raise ProtocolBroken(
                H2Error.ENHANCE_YOUR_CALM, f"{MAX_FRAMES_WITHOUT_A_CALL} frames without a call"
            )

    # -- frames in -----------------------------------------------------------------------

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ProtocolBroken(H2Error.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = _unpadded(flags, payload)
        if flags & PRIORITY:
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block(stream_id, flags, block)
        else:
            self._continued = (stream_id, flags, bytearray(block))

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continued is None or self._continued[0] != stream_id:
            raise ProtocolBroken(H2Error.PROTOCOL_ERROR, "CONTINUATION out of place")
        _, first_flags, block = self._continued
        block += payload
        if len(block) > MAX_HEADER_BLOCK_BYTES:
            raise ProtocolBroken(H2Error.ENHANCE_YOUR_CALM, "a header block past 64 KiB")
        if flags & END_HEADERS:
            self._continued = None
            self._header_block(stream_id, first_flags, bytes(block))

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        try:  # decoded even for a stream refused below: the table is the connection's
            fields = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            raise ProtocolBroken(H2Error.COMPRESSION_ERROR, f"headers: {exc}") from None
        known = self.streams.get(stream_id)
        if known is not None:  # a client's trailers: they end its request
            if not flags & END_STREAM or not known.receiving:
                raise ProtocolBroken(H2Error.PROTOCOL_ERROR, "HEADERS mid-request")
            self._received_all(known)
            return
        if stream_id % 2 == 0 or stream_id <= self._last_stream:
            raise ProtocolBroken(H2Error.PROTOCOL_ERROR, "a stream id out of order")
        self._last_stream = stream_id
        if self._going_away or len(self.streams) >= MAX_STREAMS:
            self._write(_frame(Frame.RST_STREAM, 0, stream_id, WORD.pack(H2Error.REFUSED_STREAM)))
            return
        headers = {bytes(k).decode("latin-1"): bytes(v).decode("latin-1") for k, v in fields}
        stream = Stream(stream_id, self._method(headers), headers, self._stream_window)
        self.streams[stream_id] = stream
        self._called, self._frames_since_call = True, 0
        if flags & END_STREAM:
            self._received_all(stream)

    def _method(self, headers: dict[str, str]) -> Unary | None:
        if headers.get(":method") != "POST":
            return None
        if not headers.get("content-type", "").startswith("application/grpc"):
            return None
        return self.server.methods.get(headers.get(":path", ""))

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        self._receivable -= len(payload)
        if self._receivable < 0:  # a peer ignoring flow control would hold any memory
            raise ProtocolBroken(H2Error.FLOW_CONTROL_ERROR, "DATA past the window")
        stream = self.streams.get(stream_id)
        if stream is None or not stream.receiving:
            if stream_id == 0 or stream_id > self._last_stream:
                raise ProtocolBroken(H2Error.PROTOCOL_ERROR, "DATA on an idle stream")
            self._give_back(len(payload))  # a stream already ended or refused
            return
        stream.received += len(payload)
        stream.body += _unpadded(flags, payload)
        if len(stream.body) > MAX_MESSAGE_BYTES + 5:
            stream.receiving = False
            self._answer(stream, None, Status.RESOURCE_EXHAUSTED, "the message is too large")
            self._write(_frame(Frame.RST_STREAM, 0, stream_id, WORD.pack(H2Error.NO_ERROR)))
            return
        if flags & END_STREAM:
            self._received_all(stream)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0 or len(payload) % 6 or (flags & ACK and payload):
            raise ProtocolBroken(H2Error.PROTOCOL_ERROR, "a malformed SETTINGS")
        if flags & ACK:
            return
        for at in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, at)
            if key == 4:  # INITIAL_WINDOW_SIZE: every open stream's window moves with it
                if value > MAX_WINDOW:
                    raise ProtocolBroken(H2Error.FLOW_CONTROL_ERROR, "a window past 2^31")
                for stream in self.streams.values():
                    stream.window += value - self._stream_window
                self._stream_window = value
            elif key == 1:  # HEADER_TABLE_SIZE: nothing is indexed, but the change must be
                self._table_resized = b"\x20"  # acknowledged in the next block: size 0
            elif key == 5:  # MAX_FRAME_SIZE
                if not DEFAULT_FRAME_BYTES <= value <= (1 << 24) - 1:
                    raise ProtocolBroken(H2Error.PROTOCOL_ERROR, "a frame size out of range")
                self._frame_bytes = value
        self._write(_frame(Frame.SETTINGS, ACK, 0))
        self._flush_blocked()

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolBroken(H2Error.FRAME_SIZE_ERROR, "a malformed WINDOW_UPDATE")
        increment = WORD.unpack(payload)[0] & MAX_WINDOW
        if increment == 0:
            raise ProtocolBroken(H2Error.PROTOCOL_ERROR, "a window update of 0")
        if stream_id == 0:
            self._window += increment
            if self._window > MAX_WINDOW:
                raise ProtocolBroken(H2Error.FLOW_CONTROL_ERROR, "a window past 2^31")
        elif (stream := self.streams.get(stream_id)) is not None:
            stream.window = min(stream.window + increment, MAX_WINDOW)
        self._flush_blocked()

    def _ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0 or len(payload) != 8:
            raise ProtocolBroken(H2Error.FRAME_SIZE_ERROR, "a malformed PING")
        if not flags & ACK:
            self._write(_frame(Frame.PING, ACK, 0, payload))

    def _reset(self, stream_id: int, payload: bytes) -> None:
        if stream_id == 0 or len(payload) != 4:
            raise ProtocolBroken(H2Error.PROTOCOL_ERROR, "a malformed RST_STREAM")
        stream = self.streams.get(stream_id)
        if stream is None:
            return
        stream.reset = True
        if not stream.running:  # else it is forgotten when its handler ends
            self._done(stream)

    # -- calls ---------------------------------------------------------------------------

    def _received_all(self, stream: Stream) -> None:
        stream.receiving = False
        self._finished_one = True
        if stream.method is None:
            self._answer(stream, None, Status.UNIMPLEMENTED, "no such method here")
            return
        body = stream.body
        if len(body) < 5 or int.from_bytes(body[1:5]) != len(body) - 5:
            self._answer(stream, None, Status.INTERNAL, "the request is not one gRPC message")
            return
        if body[0] != 0:
            self._answer(stream, None, Status.UNIMPLEMENTED, "compressed messages are not read")
            return
        call = Call(bytes(body[5:]), stream.metadata, self.peer)
        stream.body = bytearray()
        stream.running = True
        stream.task = asyncio.get_running_loop().create_task(self._run(stream, stream.method, call))

    async def _run(self, stream: Stream, method: Unary, call: Call) -> None:
        answer: bytes | None = None
        status, why = Status.OK, ""
        try:
            answer = await method(call)
        except GrpcError as exc:
            status, why = exc.status, str(exc)
        except Exception:  # a handler's bug: answered, logged, never the connection's end
            log.exception("gRPC %s failed", stream.metadata.get(":path"))
            status, why = Status.INTERNAL, "the server failed: see its log"
        stream.running = False
        self._answer(stream, answer, status, why)

    def _answer(self, stream: Stream, message: bytes | None, status: Status, why: str) -> None:
        """Send the answer: its head, the message and the trailers, or, with no message,
        trailers only. What the windows hold back waits for the peer's updates."""
        if stream.reset or self._closing:
            self._done(stream)
            return
        head, self._table_resized = self._table_resized + RESPONSE_HEAD, b""
        if message is None:
            block = head + _trailers(status, why)
            self._write(_frame(Frame.HEADERS, END_HEADERS | END_STREAM, stream.id, block))
            self._done(stream)
            return
        stream.unsent = b"\x00" + len(message).to_bytes(4, "big") + message
        stream.trailers = OK_TRAILERS if status == Status.OK else _trailers(status, why)
        self._write(_frame(Frame.HEADERS, END_HEADERS, stream.id, head) + self._sendable(stream))
        if stream.unsent:
            self._blocked.append(stream)

    def _sendable(self, stream: Stream) -> bytes:
        """The DATA frames the windows allow now, and the trailers once all is sent."""
        frames: list[bytes] = []
        while stream.unsent:
            room = min(self._window, stream.window, self._frame_bytes)
            if room <= 0:
                return b"".join(frames)
            chunk, stream.unsent = stream.unsent[:room], stream.unsent[room:]
            self._window -= len(chunk)
            stream.window -= len(chunk)
            frames.append(_frame(Frame.DATA, 0, stream.id, chunk))
        frames.append(_frame(Frame.HEADERS, END_HEADERS | END_STREAM, stream.id, stream.trailers))
        self._done(stream)
        return b"".join(frames)

    def _flush_blocked(self) -> None:
        blocked = [stream for stream in self._blocked if self.streams.get(stream.id) is stream]
        self._blocked = []
        out = b"".join(self._sendable(stream) for stream in blocked)
        self._blocked = [stream for stream in blocked if stream.unsent] + self._blocked
        if out:
            self._write(out)

    def _done(self, stream: Stream) -> None:
        """The call is over: its request bytes go back to the connection's window."""
        if self.streams.pop(stream.id, None) is None:
            return
        stream.unsent = b""
        self._give_back(stream.received)
        if self._going_away and not self.streams:  # once the answer being built is written
            asyncio.get_running_loop().call_soon(self.close)

    def _give_back(self, received: int) -> None:
        self._answered += received
        if self._answered >= RELEASE_BYTES:
            self._write(_frame(Frame.WINDOW_UPDATE, 0, 0, WORD.pack(self._answered)))
            self._receivable += self._answered
            self._answered = 0

    # -- the connection's end, and its clock ---------------------------------------------

    def go_away(self, code: H2Error) -> None:
        """No more calls on this connection; it closes once those in flight are over."""
        if self._going_away:
            return
        self._going_away = True
        self._write(_frame(Frame.GOAWAY, 0, 0, WORD.pack(self._last_stream) + WORD.pack(code)))
        if not self.streams:
            self.close()

    def busy(self) -> bool:
        """Calls in flight, or answers not yet written to the socket."""
        unwritten = self.transport is not None and self.transport.get_write_buffer_size() > 0
        return bool(self.streams) or unwritten

    def abort(self) -> None:
        if self.transport is not None:
            self._closing = True
            self.transport.abort()

    def close(self) -> None:
        if self.transport is not None and not self._closing:
            self._closing = True
            self.transport.close()  # what is written is still sent

    def _fail(self, exc: ProtocolBroken) -> None:
        log.info("gRPC connection from %s closed: %s", self.peer, exc)
        for stream in self.streams.values():
            stream.reset = True  # handlers still running end unanswered
        self.streams.clear()
        self.go_away(exc.code)
        self.close()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self._closing:
            self.transport.write(data)

    def _unfinished(self) -> bool:
        receiving = any(s.receiving for s in self.streams.values())
        return not self._preface or bool(self._buffer) or self._continued is not None or receiving

    def _note_progress(self) -> None:
        """The request deadline: it runs while something is left unfinished, and starts
        again whenever a read finishes a request (so a busy connection, which always has
        half a frame in flight, is not cut), and stops when nothing is unfinished."""
        if not self._unfinished():
            self._waiting_since = None
        elif self._waiting_since is None or self._finished_one:
            self._waiting_since = asyncio.get_running_loop().time()
        self._finished_one = False

    def _arm(self) -> None:
        timeout = self.server.gate.limits.request_timeout_s
        self._timer = asyncio.get_running_loop().call_later(timeout, self._check_deadline)

    def _check_deadline(self) -> None:
        if self.transport is None:
            return
        since, timeout = self._waiting_since, self.server.gate.limits.request_timeout_s
        if since is not None and asyncio.get_running_loop().time() - since >= timeout:
            log.info("gRPC connection from %s closed: nothing finished in %ss", self.peer, timeout)
            self.transport.abort()
            return
        idle = not self._called and not self.streams
        self._idle_s, self._called = (self._idle_s + timeout if idle else 0.0), False
        if self._draining:
            self.go_away(H2Error.NO_ERROR)  # calls sent meanwhile are served, then it closes
            return
        if self._idle_s >= IDLE_S:
            self._draining = True  # any call already on its way is still served
            self._write(_frame(Frame.GOAWAY, 0, 0, WORD.pack(MAX_WINDOW) + WORD.pack(0)))
        self._arm()
