"""A scripted Gemini API on 127.0.0.1, enough for the real Gemini CLI.

Gemini CLI takes the API's address from GOOGLE_GEMINI_BASE_URL and streams
`POST /v1beta/models/<model>:streamGenerateContent?alt=sse`. The fake model asks for
`run_shell_command` `calls` times in a row (one call per response, each with an id of
its own and a command of its own: the CLI stops a turn that repeats one call five times),
then answers "done". Other calls (`generateContent`, `countTokens`) get a plain answer.
Every function response the CLI sends back is recorded by call id, so a test reads what
the model was told.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.helpers.fake_api import FakeApiHandler, serving_api

SHELL_TOOL = "run_shell_command"
USAGE = {"promptTokenCount": 10, "candidatesTokenCount": 1, "totalTokenCount": 11}


@dataclass
class FakeModel:
    command: Callable[[int], str]  # the n-th call's command
    calls: int
    usage: dict[str, int] = field(default_factory=lambda: dict(USAGE))  # each answer's
    chunks: int = 1  # an answer streamed in this many chunks; the last one ends it
    streams: int = 0  # the streamed answers given: the model calls that reached the model
    call_ids: list[str] = field(default_factory=list)  # in the order they were asked
    tool_results: dict[str, str] = field(default_factory=dict)  # call id -> response
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The parts of the next streamed answer."""
        with self.lock:
            for content in body.get("contents") or []:
                for part in content.get("parts") or []:
                    response = part.get("functionResponse") if isinstance(part, dict) else None
                    if isinstance(response, dict) and "id" in response:
                        self.tool_results[response["id"]] = json.dumps(response.get("response"))
            declared = [
                declaration.get("name")
                for tool in body.get("tools") or []
                for declaration in tool.get("functionDeclarations") or []
            ]
            if SHELL_TOOL not in declared or len(self.call_ids) >= self.calls:
                return [{"text": "done"}]
            call_id = f"call_{len(self.call_ids)}"
            command = self.command(len(self.call_ids))
            self.call_ids.append(call_id)
        args = {"command": command, "description": "Append a line"}
        return [{"functionCall": {"id": call_id, "name": SHELL_TOOL, "args": args}}]


def _candidate(parts: list[dict[str, Any]], usage: dict[str, int] = USAGE) -> dict[str, Any]:
    content = {"role": "model", "parts": parts}
    return {
        "candidates": [{"content": content, "finishReason": "STOP", "index": 0}],
        "usageMetadata": usage,
    }


def _handler(fake: FakeModel) -> type[FakeApiHandler]:
    class Handler(FakeApiHandler):
        def post(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            if ":streamGenerateContent" in self.path:
                with fake.lock:
                    fake.streams += 1
                final = _candidate(fake.answer(body), fake.usage)
                # Earlier chunks: no finishReason, and only the prompt's usage so far.
                early = {"candidates": [{"content": {"role": "model", "parts": [{"text": "."}]},
                                         "index": 0}],
                         "usageMetadata": {"promptTokenCount": 1}}  # fmt: skip
                events = [early] * (fake.chunks - 1) + [final]
                data = b"".join(f"data: {json.dumps(e)}\r\n\r\n".encode() for e in events)
                self.reply(200, "text/event-stream", data)
            elif ":countTokens" in self.path:
                self.reply(200, "application/json", json.dumps({"totalTokens": 10}).encode())
            elif ":generateContent" in self.path:  # the CLI's own side questions
                answer = {"next_speaker": "user", "reasoning": "the model is done"}
                data = json.dumps(_candidate([{"text": json.dumps(answer)}])).encode()
                self.reply(200, "application/json", data)
            else:
                self.reply(404, "application/json", b"{}")

    return Handler


@contextlib.contextmanager
def fake_gemini_api(
    command: Callable[[int], str],
    calls: int,
    usage: dict[str, int] | None = None,
    chunks: int = 1,
) -> Iterator[tuple[str, FakeModel]]:
    """Serve the fake model on a free loopback port; yields (base URL, model)."""
    fake = FakeModel(command, calls, dict(usage or USAGE), chunks)
    with serving_api(_handler(fake)) as url:
        yield url, fake
