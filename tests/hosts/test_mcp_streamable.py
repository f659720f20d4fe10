"""The gateway's own client of a plain http:// upstream (`ratewarden.mcp.http_upstream`)
against scripted servers answering as careless or hostile upstreams would: every request
gets an answer (so the relay can settle its call), and the session's headers are kept.

The real SDK server behind it is in test_mcp_gateway.py (the `web` upstream); here each
case is a server written to misbehave one way (drivers/mcp_streamable_upstreams.py, in the
mcp venv, where the SDK's types parse the messages)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.hosts.scenario import host_python, run_driver

DRIVER = Path(__file__).parent / "drivers" / "mcp_streamable_upstreams.py"
CALL_RESULT = {"content": [{"type": "text", "text": "ok"}], "isError": False}


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return run_driver(host_python("mcp"), DRIVER)


def answer_to_the_call(report: dict[str, Any], case: str) -> dict[str, Any]:
    last: dict[str, Any] = report[case]["got"][-1]
    assert last["id"] == 1
    return last


@pytest.mark.parametrize("case", ["json", "sse"])
def test_an_answer_as_json_or_as_events_reaches_the_client(
    report: dict[str, Any], case: str
) -> None:
    assert answer_to_the_call(report, case)["result"] == CALL_RESULT
    # Comments and a priming event (an id, no data) gave nothing.
    assert len(report[case]["got"]) == 2


def test_the_session_id_and_version_go_with_every_later_request(report: dict[str, Any]) -> None:
    sent = [
        (seen["line"].split()[0], seen["headers"].get("mcp-session-id"),
         seen["headers"].get("mcp-protocol-version"))
        for seen in report["sse"]["seen"]
    ]  # fmt: skip
    assert sent[0] == ("POST", None, None)  # initialize
    later = sent[1:]
    assert {(session, version) for _, session, version in later} == {("s-1", "2025-11-25")}
    methods = [method for method, _, _ in later]
    assert methods.count("GET") == 1  # the stream for what the server sends unasked: 405
    assert methods[-1] == "DELETE"  # the session ended with the client's


@pytest.mark.parametrize(
    ("case", "code", "message"),
    [
        ("accepted", -32600, "server answered 202"),
        ("gone", -32600, "Session terminated"),
        ("jsonrpc_error", -32602, "bad"),  # the server's own error, given the call's id
        ("huge_event", -32603, "upstream: an event longer than 1048576 bytes"),
        ("unanswered", -32603, "stream ended unanswered"),
        ("garbage", -32603, "upstream: a malformed answer: Invalid character in Content-Length"),
    ],
)
def test_a_request_the_upstream_does_not_answer_properly_gets_an_error(
    report: dict[str, Any], case: str, code: int, message: str
) -> None:
    assert answer_to_the_call(report, case)["error"] == {"code": code, "message": message}


def test_what_comes_before_the_answer_is_passed_on(report: dict[str, Any]) -> None:
    assert report["unanswered"]["got"][1] == "JSONRPCNotification"
