"""A transport for a driver's `Guard`: the real daemon, its allowed check answers marked
`send_result` (as the engine marks a call that a loop rule keyed on results counts: a
tool call, never a model call), and the settle bodies sent to it kept, for the test to
read what the adapter sent.

Imported by file name by the drivers beside it (their folder is their sys.path[0]).
"""

from __future__ import annotations

import json
from typing import Any

import httpx


def _tool_check(request: httpx.Request) -> bool:
    """A check of a tool call (a model call's result is not digested)."""
    if request.url.path != "/v1/check":
        return False
    body = json.loads(request.content or b"{}")
    return bool(body.get("kind") != "model")


class SendResult(httpx.HTTPTransport):
    """The real daemon, answering `send_result`; `settles` holds the settle bodies."""

    def __init__(self) -> None:
        super().__init__()
        self.settles: list[dict[str, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/settle"):
            self.settles.append(json.loads(request.content or b"{}"))
        response = super().handle_request(request)
        if not _tool_check(request):
            return response
        response.read()
        answer = response.json()
        answer["send_result"] = answer.get("allowed", False)
        return httpx.Response(response.status_code, json=answer)


class AsyncSendResult(httpx.AsyncHTTPTransport):
    """`SendResult` for an `AsyncGuard`."""

    def __init__(self) -> None:
        super().__init__()
        self.settles: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/settle"):
            self.settles.append(json.loads(request.content or b"{}"))
        response = await super().handle_async_request(request)
        if not _tool_check(request):
            return response
        await response.aread()
        answer = response.json()
        answer["send_result"] = answer.get("allowed", False)
        return httpx.Response(response.status_code, json=answer)
