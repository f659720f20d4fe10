"""http/grpc.py, the daemon's unary gRPC server, driven over real sockets by h2 (a strict
HTTP/2 peer that checks every frame the server sends) and by raw bytes for what no
well-behaved client sends: each protection in the module's docstring is tried here, and
after each attack the listener still answers a well-formed call."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest

from ratewarden.http import grpc
from ratewarden.http.connections import ConnectionGate, ConnectionLimits
from ratewarden.http.grpc import Call, GrpcError, Status, UnaryServer
from tests.helpers.debian import ensure_command
from tests.helpers.redis_server import free_port

ECHO = "/test.Echo/Echo"
SLOW = "/test.Echo/Slow"
BROKEN = "/test.Echo/Broken"
REFUSING = "/test.Echo/Refusing"
TIMEOUT_S = 0.5
OPENED: list[asyncio.StreamWriter] = []  # every client socket, closed after its test


class Handlers:
    """What the server calls: an echo, a slow one (counting how many run at once), a
    broken one, one refusing with a status."""

    def __init__(self) -> None:
        self.running = 0
        self.most_running = 0
        self.release = asyncio.Event()

    async def echo(self, call: Call) -> bytes:
        return call.message + call.metadata.get("x-tag", "").encode()

    async def slow(self, call: Call) -> bytes:
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        return call.message

    async def broken(self, call: Call) -> bytes:
        raise ZeroDivisionError("a bug")

    async def refusing(self, call: Call) -> bytes:
        raise GrpcError(Status.PERMISSION_DENIED, "no: 100%\nforged line é")


@asynccontextmanager
async def listening(
    max_connections: int = 64, timeout_s: float = TIMEOUT_S
) -> AsyncIterator[tuple[int, Handlers, UnaryServer]]:
    handlers = Handlers()
    methods = {ECHO: handlers.echo, SLOW: handlers.slow, BROKEN: handlers.broken,
               REFUSING: handlers.refusing}  # fmt: skip
    server = UnaryServer(methods, ConnectionGate(ConnectionLimits(timeout_s, max_connections)))
    port = free_port()
    await server.start("127.0.0.1", port, reuse_port=False)
    try:
        yield port, handlers, server
    finally:
        handlers.release.set()
        await server.stop(grace=0.5)
        while OPENED:
            writer = OPENED.pop()
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def framed(message: bytes, compressed: int = 0) -> bytes:
    return bytes((compressed,)) + len(message).to_bytes(4, "big") + message


class Peer:
    """One HTTP/2 connection driven by h2: calls, and the events they bring back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        OPENED.append(writer)
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config)
        self.answers: dict[int, dict[str, Any]] = {}
        self.events: list[Any] = []

    @classmethod
    async def open(
        cls, port: int, settings: dict[h2.settings.SettingCodes, int] | None = None
    ) -> Peer:
        peer = cls(*await asyncio.open_connection("127.0.0.1", port))
        peer.h2.local_settings = h2.settings.Settings(client=True, initial_values=settings)
        peer.h2.initiate_connection()
        await peer.flush()
        await peer.read()  # the server's SETTINGS and window
        return peer

    async def flush(self) -> None:
        self.writer.write(self.h2.data_to_send())
        await self.writer.drain()

    def start(self, path: str, body: bytes | None, **headers: str) -> int:
        """A call opened; its message sent whole unless `body` is None."""
        stream = self.h2.get_next_available_stream_id()
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path),
                  (":authority", "test"), ("content-type", "application/grpc"),
                  ("te", "trailers"), *headers.items()]  # fmt: skip
        self.h2.send_headers(stream, fields, end_stream=body == b"")
        if body:
            self.h2.send_data(stream, body, end_stream=True)
        self.answers[stream] = {"data": b"", "headers": {}, "ended": False}
        return stream

    async def send_large(self, path: str, body: bytes) -> int:
        """A call whose message is sent frame by frame as the server's windows allow,
        until it is all sent or the server ends the stream."""
        stream = self.start(path, None)
        sent = 0
        while sent < len(body) and not self.answers[stream]["ended"]:
            room = min(self.h2.local_flow_control_window(stream), self.h2.max_outbound_frame_size)
            if room == 0:
                await self.read()
                continue
            chunk = body[sent : sent + room]
            sent += len(chunk)
            self.h2.send_data(stream, chunk, end_stream=sent == len(body))
            await self.flush()
        return stream

    async def call(self, path: str, body: bytes, **headers: str) -> dict[str, Any]:
        stream = self.start(path, body, **headers)
        await self.flush()
        return await self.answer(stream)

    async def answer(self, stream: int, timeout: float = 5.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while not self.answers[stream]["ended"]:
                assert await self.read(), "the server closed the connection unanswered"
        return self.answers[stream]

    async def read(self) -> bool:
        """One read from the socket, its events handled; False once the server closed."""
        data = await self.reader.read(65536)
        if not data:
            return False
        for event in self.h2.receive_data(data):
            self.events.append(event)
            answer = self.answers.get(getattr(event, "stream_id", 0))
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                assert answer is not None
                answer["headers"].update(dict(event.headers))
            elif isinstance(event, h2.events.DataReceived):
                assert answer is not None
                answer["data"] += event.data
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset):
                assert answer is not None
                answer["ended"] = True
        await self.flush()
        return True

    async def closed(self, timeout: float = 5.0) -> bool:
        async with asyncio.timeout(timeout):
            while await self.read():
                pass
        return True


def status_of(answer: dict[str, Any]) -> tuple[int, str]:
    headers = answer["headers"]
    return int(headers["grpc-status"]), unquote(headers.get("grpc-message", ""))


async def still_serving(port: int) -> None:
    peer = await Peer.open(port)
    answer = await peer.call(ECHO, framed(b"after"))
    assert status_of(answer) == (0, "")
    assert answer["data"] == framed(b"after")


async def test_a_strict_peer_reads_every_answer_of_many_interleaved_calls() -> None:
    async with listening() as (port, _, _):
        peer = await Peer.open(port)
        streams = [peer.start(ECHO, framed(b"m%d" % i), **{"x-tag": f"-{i}"}) for i in range(40)]
        await peer.flush()
        for i, stream in enumerate(streams):
            answer = await peer.answer(stream)
            assert answer["headers"][":status"] == "200"
            assert answer["headers"]["content-type"] == "application/grpc"
            assert status_of(answer) == (0, "")
            assert answer["data"] == framed(b"m%d-%d" % (i, i))


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/test.Echo/Missing", framed(b"x"), Status.UNIMPLEMENTED),
        (ECHO, framed(b"x", compressed=1), Status.UNIMPLEMENTED),
        (ECHO, b"", Status.INTERNAL),  # no message at all
        (ECHO, b"\x00\x00\x00", Status.INTERNAL),  # half a prefix
        (ECHO, framed(b"x") + framed(b"y"), Status.INTERNAL),  # two messages in a unary
        (ECHO, b"\x00\x00\x00\x00\x09short", Status.INTERNAL),  # a length that lies
        (BROKEN, framed(b"x"), Status.INTERNAL),
    ],
)
async def test_a_call_the_server_cannot_take_is_a_status_not_a_dead_connection(
    path: str, body: bytes, status: Status
) -> None:
    async with listening() as (port, _, _):
        peer = await Peer.open(port)
        answer = await peer.call(path, body)
        assert status_of(answer)[0] == status
        assert answer["data"] == b""  # trailers only
        again = await peer.call(ECHO, framed(b"next"))  # the same connection goes on
        assert again["data"] == framed(b"next")


async def test_a_status_message_is_percent_encoded_and_cannot_forge_a_header() -> None:
    async with listening() as (port, _, _):
        peer = await Peer.open(port)
        answer = await peer.call(REFUSING, framed(b"x"))
        assert status_of(answer) == (Status.PERMISSION_DENIED, "no: 100%\nforged line é")
        assert "\n" not in answer["headers"]["grpc-message"]


async def test_a_message_past_four_mib_is_refused_and_the_connection_goes_on() -> None:
    async with listening() as (port, _, _):
        peer = await Peer.open(port)
        stream = await peer.send_large(ECHO, framed(b"x" * (grpc.MAX_MESSAGE_BYTES + 1)))
        answer = await peer.answer(stream)
        assert status_of(answer)[0] == Status.RESOURCE_EXHAUSTED
        again = await peer.call(ECHO, framed(b"next"))
        assert again["data"] == framed(b"next")


async def test_an_answer_waits_for_the_peers_window_and_arrives_whole() -> None:
    """A peer offering 7 bytes of window per stream gets the answer 7 bytes at a time, as
    its WINDOW_UPDATEs allow; nothing is lost or sent past the window (h2 would raise)."""
    async with listening() as (port, _, _):
        peer = await Peer.open(port, {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 7})
        body = framed(b"0123456789" * 50)
        answer = await peer.call(ECHO, body)
        assert answer["data"] == body
        assert status_of(answer) == (0, "")
        pieces = [e for e in peer.events if isinstance(e, h2.events.DataReceived)]
        assert len(pieces) >= len(body) // 7


async def test_a_reset_call_is_forgotten_and_resets_cannot_outrun_the_stream_cap() -> None:
    """Rapid reset: calls opened and reset at once still count until their handlers end,
    so no more than MAX_STREAMS handlers ever run for one connection."""
    async with listening() as (port, handlers, _):
        peer = await Peer.open(port)
        peer.h2.remote_settings.max_concurrent_streams = 10_000  # h2 would hold us back
        peer.h2.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 10_000})
        for _ in range(grpc.MAX_STREAMS * 3):
            stream = peer.start(SLOW, framed(b"x"))
            peer.h2.reset_stream(stream)
        await peer.flush()
        for _ in range(20):  # the server reads it all
            await asyncio.sleep(0.02)
        assert handlers.most_running == grpc.MAX_STREAMS
        handlers.release.set()
        await asyncio.sleep(0.1)
        assert handlers.running == 0
        await still_serving(port)


async def raw(port: int, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    OPENED.append(writer)
    writer.write(data)
    await writer.drain()
    return reader, writer


async def closed_by_server(reader: asyncio.StreamReader, within: float = 5.0) -> bytes:
    """Everything the server sent until it closed the connection."""
    got = b""
    async with asyncio.timeout(within):
        while chunk := await reader.read(65536):
            got += chunk
    return got


def frames_of(sent: bytes) -> list[tuple[int, int, int, bytes]]:
    """The frames in `sent`: (type, flags, stream, payload)."""
    found, at = [], 0
    while len(sent) - at >= 9:
        length = int.from_bytes(sent[at : at + 3])
        stream = int.from_bytes(sent[at + 5 : at + 9])
        found.append((sent[at + 3], sent[at + 4], stream, sent[at + 9 : at + 9 + length]))
        at += 9 + length
    return found


def goaway_code(sent: bytes) -> int | None:
    """The error code of the GOAWAY among frames the server sent, if any."""
    codes = [int.from_bytes(p[4:8]) for kind, _, _, p in frames_of(sent) if kind == 7]
    return codes[0] if codes else None


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    head = len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big")
    return head + payload


# An ECHO call's request headers, literal and never indexed: the same on every stream.
ECHO_BLOCK = bytes(
    hpack.Encoder().encode(
        [hpack.NeverIndexedHeaderTuple(k, v) for k, v in
         ((":method", "POST"), (":scheme", "http"), (":path", ECHO),
          ("content-type", "application/grpc"))],
        huffman=False,
    )
)  # fmt: skip


@pytest.mark.parametrize(
    ("sent", "code"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", grpc.H2Error.PROTOCOL_ERROR),  # not HTTP/2
        (frame(1, 4, 2, b"\x82"), grpc.H2Error.PROTOCOL_ERROR),  # an even stream id
        (frame(0, 1, 5, b"x"), grpc.H2Error.PROTOCOL_ERROR),  # DATA on a stream never opened
        (frame(1, 4, 1, b"\xff\xff\xff\xff"), grpc.H2Error.COMPRESSION_ERROR),  # bad HPACK
        # An HPACK bomb: 4 KB indexed once, then named 20 times in a byte each (80 KB).
        (
            frame(1, 4, 1, b"\x40\x05x-big\x7f\xa1\x1e" + b"a" * 4000 + b"\xbe" * 20),
            grpc.H2Error.COMPRESSION_ERROR,
        ),
        # A CONTINUATION flood: a header block that never ends.
        (frame(1, 0, 1) + frame(9, 0, 1, b"\x00" * 16_000) * 5, grpc.H2Error.ENHANCE_YOUR_CALM),
        (frame(1, 0, 1, b"") + frame(6, 0, 0, b"\x00" * 8), grpc.H2Error.PROTOCOL_ERROR),
        (frame(6, 0, 0, b"\x00" * 7), grpc.H2Error.FRAME_SIZE_ERROR),  # a short PING
        (frame(8, 0, 0, b"\x00\x00\x00\x00"), grpc.H2Error.PROTOCOL_ERROR),  # window +0
        (frame(8, 0, 0, b"\x7f\xff\xff\xff"), grpc.H2Error.FLOW_CONTROL_ERROR),  # past 2^31
        (frame(4, 0, 0, b"\x00\x05\x00\x00\x00\x01"), grpc.H2Error.PROTOCOL_ERROR),  # frame size
        (frame(5, 4, 1, b"\x00\x00\x00\x02"), grpc.H2Error.PROTOCOL_ERROR),  # a client's push
        (b"\x01\x00\x00" + b"\x00\x00\x00\x00\x00\x00", grpc.H2Error.FRAME_SIZE_ERROR),  # 64 KiB
        (frame(0, 8, 1, b"\x09x"), grpc.H2Error.PROTOCOL_ERROR),  # padding past its frame
    ],
)
async def test_a_broken_peer_loses_its_connection_and_only_that(sent: bytes, code: int) -> None:
    async with listening() as (port, _, _):
        opening = b"" if sent.startswith(b"GET") else grpc.PREFACE + frame(4, 0, 0)
        if sent.startswith(frame(0, 8, 1)[:5]):  # padding needs an open stream first
            opening += frame(1, 4, 1, b"\x83\x86")
        reader, writer = await raw(port, opening + sent)
        got = await closed_by_server(reader)
        assert goaway_code(got) == code
        writer.close()
        await still_serving(port)


async def test_a_peer_sending_past_its_window_loses_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Five calls of 4 MiB each, sent without waiting for a window update: past the 16 MiB
    the connection may hold unanswered, FLOW_CONTROL_ERROR (without the check the server
    would hold each of 128 calls' 4 MiB)."""
    async with listening() as (port, _, _):
        reader, writer = await raw(port, grpc.PREFACE + frame(4, 0, 0))
        chunk = b"x" * 16_000
        for stream in (1, 3, 5, 7, 9):  # each 3.8 MB, under the message cap, never ended
            writer.write(frame(1, 4, stream, ECHO_BLOCK) + frame(0, 0, stream, chunk) * 240)
        # The socket closes with bytes unread, so the kernel may reset it before the
        # GOAWAY is read: the server's log says why.
        with (
            caplog.at_level(logging.INFO, "ratewarden.grpc"),
            contextlib.suppress(ConnectionResetError),
        ):
            await closed_by_server(reader)
        assert "DATA past the window" in caplog.text
        await still_serving(port)


@pytest.mark.parametrize(
    "sent",
    [
        b"",  # silent
        grpc.PREFACE[:10],  # half a preface
        grpc.PREFACE + frame(4, 0, 0) + frame(1, 4, 1, b"\x83")[:6],  # half a frame
        grpc.PREFACE + frame(4, 0, 0) + frame(1, 0, 1, b"\x83"),  # a header block unended
        grpc.PREFACE + frame(4, 0, 0) + frame(1, 4, 1, b"\x83\x86"),  # a request, no body
    ],
)
async def test_a_socket_that_leaves_something_unfinished_is_closed_in_time(sent: bytes) -> None:
    async with listening() as (port, _, _):
        reader, writer = await raw(port, sent)
        await closed_by_server(reader, within=TIMEOUT_S * 4)
        writer.close()
        await still_serving(port)


async def test_an_idle_connection_with_nothing_unfinished_stays_open() -> None:
    async with listening() as (port, _, _):
        peer = await Peer.open(port)
        await peer.call(ECHO, framed(b"x"))
        await asyncio.sleep(TIMEOUT_S * 3)
        assert (await peer.call(ECHO, framed(b"y")))["data"] == framed(b"y")


async def test_a_connection_idle_past_the_idle_limit_is_told_goaway_and_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A peer gone without a FIN looks like one that sends nothing: after IDLE_S without
    a read or a call in flight, a first GOAWAY (any call already sent is still served),
    then the last one and the socket closes; one that keeps calling is never idle."""
    monkeypatch.setattr(grpc, "IDLE_S", TIMEOUT_S * 3)
    async with listening() as (port, _, server):
        idle = await Peer.open(port)
        busy = await Peer.open(port)
        await idle.call(ECHO, framed(b"once"))
        for _ in range(12):  # 2.4 s: past the idle limit of 1.5 s
            assert (await busy.call(ECHO, framed(b"again")))["data"] == framed(b"again")
            await asyncio.sleep(TIMEOUT_S / 2.5)
        goaways = [(p[:4], p[4:8]) for k, _, _, p in frames_of(await closed_by_server(idle.reader))
                   if k == 7]  # fmt: skip
        assert goaways == [(b"\x7f\xff\xff\xff", bytes(4)), ((1).to_bytes(4, "big"), bytes(4))]
        assert len(server.connections) == 1  # the busy one


async def test_a_connection_that_only_pings_is_idle_all_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pings keep nothing open: a connection that opens no call for IDLE_S is told GOAWAY
    and closed however often it pings, as one that sends nothing (a slot of the cap held
    for ever, and the daemon's CPU, by a peer that never asks anything)."""
    monkeypatch.setattr(grpc, "IDLE_S", TIMEOUT_S * 3)
    async with listening() as (port, _, server):
        pinging = await Peer.open(port)
        busy = await Peer.open(port)
        await pinging.call(ECHO, framed(b"once"))
        received = bytearray()
        for _ in range(12):  # 2.4 s: past the idle limit of 1.5 s
            pinging.writer.write(frame(6, 0, 0, b"p" * 8))
            assert (await busy.call(ECHO, framed(b"again")))["data"] == framed(b"again")
            await asyncio.sleep(TIMEOUT_S / 2.5)
        received.extend(await closed_by_server(pinging.reader))
        kinds = [kind for kind, _, _, _ in frames_of(bytes(received))]
        assert kinds.count(6) >= 5  # its pings were answered
        assert kinds.count(7) == 2  # then the graceful GOAWAY, and the last
        assert len(server.connections) == 1  # the busy one


async def read_until(
    reader: asyncio.StreamReader, received: bytearray, wanted: tuple[int, int, int, bytes]
) -> None:
    """Read into `received` until the server has sent the frame `wanted` (5 s at most)."""
    async with asyncio.timeout(5):
        while wanted not in frames_of(bytes(received)):
            chunk = await reader.read(65536)
            assert chunk, f"closed before {wanted}: {frames_of(bytes(received))[-3:]}"
            received.extend(chunk)


@pytest.mark.parametrize(
    "flood",
    [
        frame(6, 0, 0, b"p" * 8),  # PING
        frame(4, 0, 0),  # SETTINGS, empty: each one acknowledged
        frame(2, 0, 1, bytes(5)),  # PRIORITY
        frame(0xFA, 0, 0, b"?"),  # a type nobody knows, ignored
        frame(8, 0, 0, (1).to_bytes(4, "big")),  # WINDOW_UPDATE of 1
    ],
    ids=["ping", "settings", "priority", "unknown", "window_update"],
)
async def test_a_flood_of_frames_without_a_call_is_ended_calmly(
    monkeypatch: pytest.MonkeyPatch, flood: bytes
) -> None:
    """Frames that ask for work but open no call: past MAX_FRAMES_WITHOUT_A_CALL in a row,
    GOAWAY ENHANCE_YOUR_CALM and the connection ends; up to it, calls are served."""
    monkeypatch.setattr(grpc, "MAX_FRAMES_WITHOUT_A_CALL", 50)
    async with listening() as (port, _, _):
        reader, writer = await raw(port, grpc.PREFACE + frame(4, 0, 0) + flood * 48)
        writer.write(frame(1, 4, 1, ECHO_BLOCK) + frame(0, 1, 1, framed(b"within")))
        received = bytearray()
        await read_until(reader, received, (0, 0, 1, framed(b"within")))
        writer.write(flood * 49)  # with the call's DATA, 50 since it opened: still served
        writer.write(frame(1, 4, 3, ECHO_BLOCK) + frame(0, 1, 3, framed(b"again")))
        await read_until(reader, received, (0, 0, 3, framed(b"again")))
        writer.write(flood * 51)  # the 51st in a row ends it
        sent = await closed_by_server(reader)
        assert goaway_code(bytes(received) + sent) == grpc.H2Error.ENHANCE_YOUR_CALM
        writer.close()
        await still_serving(port)


async def test_calls_between_the_frames_start_the_count_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 PINGs over a connection whose cap is 50 in a row: each call opened between
    them starts the count again, and every call is answered."""
    monkeypatch.setattr(grpc, "MAX_FRAMES_WITHOUT_A_CALL", 50)
    async with listening() as (port, _, _):
        peer = await Peer.open(port)
        for i in range(5):
            for n in range(40):
                peer.h2.ping(b"%08d" % (i * 100 + n))
            assert (await peer.call(ECHO, framed(b"%d" % i)))["data"] == framed(b"%d" % i)
        assert sum(isinstance(e, h2.events.PingAckReceived) for e in peer.events) == 200


async def test_a_call_sent_as_the_idle_goaway_crosses_it_is_still_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(grpc, "IDLE_S", TIMEOUT_S)
    async with listening() as (port, _, _):
        reader, writer = await raw(port, grpc.PREFACE + frame(4, 0, 0))
        received = bytearray()
        while not any(f[0] == 7 for f in frames_of(bytes(received))):  # the first GOAWAY
            received.extend(await reader.read(65536))
        writer.write(frame(1, 4, 1, ECHO_BLOCK) + frame(0, 1, 1, framed(b"late")))
        received.extend(await closed_by_server(reader))
        assert (0, 0, 1, framed(b"late")) in frames_of(bytes(received))


async def test_a_busy_connection_is_not_cut_by_the_deadline() -> None:
    """Calls finishing all the time, and always half a frame in flight: each write ends
    one call and starts the next (its last bytes come with the one after), so something
    is always unfinished; the deadline starts again with each finished call."""
    async with listening() as (port, _, _):
        peer = await Peer.open(port)
        loop = asyncio.get_running_loop()
        until, previous, tail = loop.time() + TIMEOUT_S * 4, 0, b""
        while loop.time() < until:
            stream = peer.start(ECHO, framed(b"z" * 100))
            data = peer.h2.data_to_send()
            peer.writer.write(tail + data[:-3])
            tail = data[-3:]
            if previous:
                assert (await peer.answer(previous))["data"] == framed(b"z" * 100)
            previous = stream
            await asyncio.sleep(TIMEOUT_S / 5)
        peer.writer.write(tail)
        await peer.answer(previous)


async def test_open_connections_are_capped() -> None:
    async with listening(max_connections=2) as (port, _, _):
        first, second = await Peer.open(port), await Peer.open(port)
        await first.call(ECHO, framed(b"1"))
        await second.call(ECHO, framed(b"2"))
        reader, writer = await raw(port, grpc.PREFACE)
        assert await closed_by_server(reader) == b""  # refused at once, unanswered
        writer.close()
        first.writer.close()
        await asyncio.sleep(0.1)
        await still_serving(port)


async def test_a_ping_is_answered_and_stop_lets_calls_in_flight_end() -> None:
    async with listening() as (port, handlers, server):
        peer = await Peer.open(port)
        peer.h2.ping(b"12345678")
        stream = peer.start(SLOW, framed(b"last"))
        await peer.flush()
        while handlers.running == 0:
            await asyncio.sleep(0.01)
        await peer.read()  # the ping's answer
        assert any(isinstance(e, h2.events.PingAckReceived) for e in peer.events)
        stopping = asyncio.create_task(server.stop(grace=5.0))
        await asyncio.sleep(0.05)
        handlers.release.set()
        # h2 reads nothing after a GOAWAY (though RFC 9113 lets calls under its last
        # stream id end): the rest is read as raw frames.
        sent = frames_of(await closed_by_server(peer.reader))
        assert [kind for kind, _, _, _ in sent] == [7, 1, 0, 1]  # GOAWAY, the answer
        assert sent[2] == (0, 0, stream, framed(b"last"))
        assert sent[3][1] & 1  # the trailers end the stream
        await stopping


async def test_a_peer_that_shrinks_its_header_table_is_told_so_in_the_next_block() -> None:
    """RFC 7541 4.2: after SETTINGS_HEADER_TABLE_SIZE changes, the next header block opens
    with a table size update (nghttp2, Envoy's HTTP/2 library, refuses one without); the
    server indexes nothing, so it sets the size to 0, once."""
    async with listening() as (port, _, _):
        call = frame(1, 4, 1, ECHO_BLOCK) + frame(0, 1, 1, framed(b"x"))
        again = frame(1, 4, 3, ECHO_BLOCK) + frame(0, 1, 3, framed(b"y"))
        settings = frame(4, 0, 0, (1).to_bytes(2, "big") + (0).to_bytes(4, "big"))
        reader, _ = await raw(port, grpc.PREFACE + settings + call + again)
        received = bytearray()
        while len([f for f in frames_of(bytes(received)) if f[0] == 1 and f[1] & 1]) < 2:
            received.extend(await reader.read(65536))
        heads = [p for kind, flags, _, p in frames_of(bytes(received)) if kind == 1]
        assert heads[0].startswith(b"\x20")  # the first block after the change
        assert not heads[2].startswith(b"\x20")  # and only it


@pytest.mark.parametrize("table_size", [4096, 0])
async def test_nghttp2_reads_every_answer(tmp_path: Path, table_size: int) -> None:
    """nghttp2, the HTTP/2 library of Envoy's and many gRPC clients, as Debian's `nghttp`
    (a client in C, installed when missing): a call and its answer, also after it shrinks
    its header table (without the table size update it ends with COMPRESSION_ERROR)."""
    nghttp = ensure_command("nghttp", "nghttp2-client")
    body = tmp_path / "call.bin"
    body.write_bytes(framed(b"from nghttp2"))
    async with listening() as (port, _, _):
        client = await asyncio.create_subprocess_exec(
            nghttp, "-v", f"--header-table-size={table_size}", "-H", ":method: POST",
            "-H", "content-type: application/grpc", "-H", "te: trailers", "-d", str(body),
            f"http://127.0.0.1:{port}{ECHO}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        said = (await asyncio.wait_for(client.communicate(), 30))[0]
    assert client.returncode == 0, said
    assert b"grpc-status: 0" in said
    assert framed(b"from nghttp2") in said  # the echo, printed as it came
    assert set(re.findall(rb"error_code=(\w+)", said)) == {b"NO_ERROR"}  # its own GOAWAY


async def stall(writer: asyncio.StreamWriter) -> float | None:
    """Send PINGs, reading no answer, until the server stops reading (the seconds it
    took), or None if it read 34 MB of them. The test lifts the cap on frames without a
    call (`unbounded_frames`), which would end such a flood first."""
    began = asyncio.get_running_loop().time()
    pings = frame(6, 0, 0, b"p" * 8) * 10_000  # 170 KB of PINGs, 170 KB of answers
    for _ in range(200):
        writer.write(pings)
        try:
            await asyncio.wait_for(writer.drain(), 0.3)
        except TimeoutError:
            return asyncio.get_running_loop().time() - began
    return None


def unbounded_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    """No cap on frames without a call: what the read pause does alone is tried."""
    monkeypatch.setattr(grpc, "MAX_FRAMES_WITHOUT_A_CALL", 1 << 62)


@pytest.mark.slow  # a few seconds: megabytes of PINGs until the socket stalls
async def test_stopping_does_not_wait_for_a_peer_that_reads_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    unbounded_frames(monkeypatch)
    async with listening(timeout_s=30.0) as (port, _, server):
        _, writer = await raw(port, grpc.PREFACE + frame(4, 0, 0))
        assert await stall(writer) is not None
        await asyncio.wait_for(server.stop(grace=0.3), 5)
        await asyncio.sleep(0.1)
        assert not server.connections  # dropped, its unread answers with it, not left open


@pytest.mark.slow  # about 8 s: megabytes of PINGs until the socket stalls
async def test_a_peer_that_reads_no_answers_is_read_no_further(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PINGs sent without reading a single answer: once the server's answers back up, it
    stops reading (its send buffer stays bounded) and the peer's writes stall; once the
    peer reads, the server reads on, and a call sent after the PINGs is answered."""
    unbounded_frames(monkeypatch)
    async with listening(timeout_s=5.0) as (port, _, _):
        reader, writer = await raw(port, grpc.PREFACE + frame(4, 0, 0))
        stalled = await stall(writer)
        assert stalled is not None, "the server read 34 MB of PINGs nobody read answers to"
        writer.write(frame(1, 4, 1, ECHO_BLOCK) + frame(0, 1, 1, framed(b"after")))
        received = bytearray()

        async def answered() -> None:
            while (0, 0, 1, framed(b"after")) not in frames_of(bytes(received)):
                received.extend(await reader.read(1 << 20))

        await asyncio.wait_for(answered(), 30)
