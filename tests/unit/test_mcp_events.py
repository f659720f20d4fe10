"""The event-stream reader of the gateway's upstream client (ratewarden.http.sse), held
to the WHATWG format and against a whole-stream oracle, however the bytes are cut."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratewarden.http.sse import MAX_RETRY_S, EventReader


def read(*chunks: bytes) -> list[bytes]:
    reader = EventReader()
    return [data for chunk in chunks for data in reader.feed(chunk)] + reader.end()


def test_an_event_ends_at_a_blank_line_and_its_data_lines_join() -> None:
    stream = b'event: message\ndata: {"a":\ndata: 1}\n\ndata: two\n\n'
    assert read(stream) == [b'{"a":\n1}', b"two"]


def test_an_unfinished_event_is_held_until_its_blank_line() -> None:
    reader = EventReader()
    assert reader.feed(b"data: one\n") == []
    assert reader.feed(b"\n") == [b"one"]
    assert reader.feed(b"data: cut off") == []
    assert reader.end() == []  # a stream ending mid-event drops it, as specified


@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending_of_the_format_is_read(end: bytes) -> None:
    stream = b"data: x" + end + end + b"data: y" + end + end
    assert read(stream) == [b"x", b"y"]


def test_a_crlf_cut_between_its_cr_and_lf_is_one_line_end() -> None:
    # Were the CR taken for a line end on its own, the LF would end the event early.
    assert read(b"data: a\r", b"\ndata: b\r\n\r\n") == [b"a\nb"]


def test_comments_priming_events_and_unknown_fields_give_nothing() -> None:
    reader = EventReader()
    stream = b": ping\n\nid: 7\ndata\n\nid: 8\n\nfoo: bar\ndata:x\n\n"
    assert reader.feed(stream) == [b"x"]  # the space after the colon is optional
    assert reader.last_id == "8"


def test_id_and_retry_are_noted_within_bounds() -> None:
    reader = EventReader()
    reader.feed(b"id: a\x00b\nretry: 2500\n\n")
    assert reader.last_id is None  # an id holding NUL is ignored, as specified
    assert reader.retry_s == 2.5
    reader.feed(b"retry: 99999999\nretry: 1e3\nretry: " + b"9" * 5000 + b"\n\n")
    assert reader.retry_s == MAX_RETRY_S  # a huge delay is capped; non-digits ignored


def test_an_event_past_the_bound_is_refused() -> None:
    reader = EventReader(max_bytes=100)
    with pytest.raises(ValueError, match="longer than 100 bytes"):
        reader.feed(b"data: " + b"x" * 60 + b"\ndata: " + b"y" * 60 + b"\n")
    with pytest.raises(ValueError, match="longer than 100 bytes"):
        EventReader(max_bytes=100).feed(b"data: " + b"z" * 200)  # no line end yet


events = st.lists(
    st.lists(st.binary(max_size=20).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b"")),
             min_size=1, max_size=3),
    max_size=5,
)  # fmt: skip


@given(events=events, ending=st.sampled_from([b"\n", b"\r\n", b"\r"]), cuts=st.data())
def test_however_the_stream_is_cut_the_events_are_the_same(
    events: list[list[bytes]], ending: bytes, cuts: st.DataObject
) -> None:
    stream = b"".join(
        b"".join(b"data: " + line + ending for line in lines) + ending for lines in events
    )
    expected = [b"\n".join(lines) for lines in events if b"\n".join(lines)]
    points = sorted(cuts.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    chunks = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    assert read(*chunks) == expected
