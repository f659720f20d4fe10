"""A scripted Anthropic Messages API on 127.0.0.1, enough for the real Claude Code CLI.

The CLI streams (`POST /v1/messages?beta=true`, server-sent events). The fake model asks
for `Bash` with one command, `calls` times in a row (one tool call per turn), then ends
its turn with "done". Every tool result the CLI sends back is recorded by tool_use_id, so
a test can read what the model was told. `FakeMcpModel` asks for an MCP tool instead.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.helpers.fake_api import FakeApiHandler, serving_api


@dataclass
class FakeModel:
    command: str
    calls: int
    tool_results: dict[str, str] = field(default_factory=dict)  # tool_use_id -> text
    tool_use_ids: list[str] = field(default_factory=list)  # in the order they were asked
    paths: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """The next content block and stop reason for a request."""
        messages = body.get("messages", [])
        with self.lock:
            for message in messages:
                for block in _blocks(message):
                    if message["role"] == "user" and block.get("type") == "tool_result":
                        self.tool_results[block["tool_use_id"]] = _text(block.get("content"))
            asked = sum(
                1
                for message in messages
                if message["role"] == "assistant"
                for block in _blocks(message)
                if block.get("type") == "tool_use"
            )
            offers_bash = any(tool.get("name") == "Bash" for tool in body.get("tools") or [])
            if not offers_bash or asked >= self.calls:
                return {"type": "text", "text": "done"}, "end_turn"
            call_id = f"toolu_{uuid.uuid4().hex[:24]}"
            self.tool_use_ids.append(call_id)
        command = {"command": self.command, "description": "Append a line"}
        return {"type": "tool_use", "id": call_id, "name": "Bash", "input": command}, "tool_use"


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _events(model: str, block: dict[str, Any], stop_reason: str) -> bytes:
    """One assistant message as the streaming API sends it."""
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    if block["type"] == "tool_use":
        start = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    else:
        start = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": block["text"]}
    usage = {"input_tokens": 10, "output_tokens": 1}
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": usage,
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": start},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
        {"type": "message_stop"},
    ]
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def _handler(fake: FakeModel) -> type[FakeApiHandler]:
    class Handler(FakeApiHandler):
        def post(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
            fake.paths.append(f"POST {self.path}")
            if self.path.startswith("/v1/messages/count_tokens"):
                self.reply(200, "application/json", json.dumps({"input_tokens": 10}).encode())
            elif self.path.startswith("/v1/messages"):
                block, stop = fake.answer(body)
                if body.get("stream"):
                    self.reply(200, "text/event-stream", _events(body["model"], block, stop))
                else:
                    message = {
                        "id": "msg_x",
                        "type": "message",
                        "role": "assistant",
                        "model": body["model"],
                        "content": [block],
                        "stop_reason": stop,
                        "stop_sequence": None,
                        "usage": {"input_tokens": 10, "output_tokens": 5},
                    }
                    self.reply(200, "application/json", json.dumps(message).encode())
            else:
                self.reply(404, "application/json", b"{}")

        def get(self) -> None:
            fake.paths.append(f"GET {self.path}")
            self.reply(404, "application/json", b"{}")

    return Handler


@contextlib.contextmanager
def fake_messages_api(command: str, calls: int) -> Iterator[tuple[str, FakeModel]]:
    """Serve the fake model on a free loopback port; yields (base URL, model)."""
    fake = FakeModel(command, calls)
    with serving_api(_handler(fake)) as url:
        yield url, fake


class FakeMcpModel(FakeModel):
    """The scripted model above, asking for the MCP tool `tool` (Claude Code names a
    server's tool `mcp__<server>__<tool>`) with `arguments` instead of Bash."""

    def __init__(self, tool: str, arguments: dict[str, Any], calls: int) -> None:
        super().__init__("", calls)
        self.tool, self.arguments = tool, arguments

    def answer(self, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
        offered = [tool.get("name") for tool in body.get("tools") or []]
        renamed = {**body, "tools": [{"name": "Bash"}] if self.tool in offered else []}
        block, stop = super().answer(renamed)  # records the tool results, counts the calls
        if block["type"] == "tool_use":
            block = {**block, "name": self.tool, "input": self.arguments}
        return block, stop


@contextlib.contextmanager
def fake_mcp_model(fake: FakeMcpModel) -> Iterator[str]:
    """Serve `fake` on a free loopback port; yields its base URL."""
    with serving_api(_handler(fake)) as url:
        yield url
